// SPDX-License-Identifier: Apache-2.0
// Authentication primitives of the wire protocol's handshake (see
// common/wire/channel.h for the exchange and docs/formats/protocol.md for bytes).
//
// Each tenant has a shared secret. Both sides prove they know it without
// sending it, by HMAC-SHA256 over both sides' fresh 32-byte nonces:
//   server_proof = HMAC-SHA256(secret, "server" | client_nonce | server_nonce | tenant [| binding])
//   client_proof = HMAC-SHA256(secret, "client" | server_nonce | client_nonce | tenant [| binding])
// The labels make the two proofs differ, so one side cannot replay the other's
// proof; the nonces make every handshake's proofs differ, so a recorded proof
// is worthless later. Over TLS, `binding` is the session's exporter value
// (common/net/byte_stream.h TlsPeer::binding): the proofs then hold only inside
// that one TLS session, so a handshake relayed between two sessions fails.
//
// Thread safety: all functions are thread-safe (OpenSSL 3 is).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>

#include "common/base/result.h"

namespace cdp::auth {

using Nonce = std::array<uint8_t, 32>;
using Proof = std::array<uint8_t, 32>;

// 32 bytes from OpenSSL's CSPRNG (RAND_bytes). Fails (kIOError) only if the
// generator cannot be seeded; never returns predictable bytes.
Result<Nonce> RandomNonce();

// The proofs above. An empty secret is allowed by the math but refused by the
// handshake (a tenant must have a secret). Fails only if OpenSSL fails.
Result<Proof> ServerProof(std::string_view secret, const Nonce& client_nonce,
                          const Nonce& server_nonce, std::string_view tenant,
                          std::span<const uint8_t> binding = {});
Result<Proof> ClientProof(std::string_view secret, const Nonce& server_nonce,
                          const Nonce& client_nonce, std::string_view tenant,
                          std::span<const uint8_t> binding = {});

// HMAC-SHA256(key, data): the building block, exposed for tests (RFC 4231 vectors).
Result<Proof> HmacSha256(std::string_view key, std::string_view data);

// Compares two proofs in time independent of their contents (CRYPTO_memcmp).
bool ProofsEqual(const Proof& a, const Proof& b);

}  // namespace cdp::auth

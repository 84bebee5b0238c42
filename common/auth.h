// Authentication primitives of the wire protocol's handshake (see
// common/channel.h for the exchange and docs/formats/protocol.md for bytes).
//
// Each tenant has a shared secret. Both sides prove they know it without
// sending it, by HMAC-SHA256 over both sides' fresh 32-byte nonces:
//   server_proof = HMAC-SHA256(secret, "server" | client_nonce | server_nonce | tenant)
//   client_proof = HMAC-SHA256(secret, "client" | server_nonce | client_nonce | tenant)
// The labels make the two proofs differ, so one side cannot replay the other's
// proof; the nonces make every handshake's proofs differ, so a recorded proof
// is worthless later.
//
// Thread safety: all functions are thread-safe (OpenSSL 3 is).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "common/result.h"

namespace cdp::auth {

using Nonce = std::array<uint8_t, 32>;
using Proof = std::array<uint8_t, 32>;

// 32 bytes from OpenSSL's CSPRNG (RAND_bytes). Fails (kIOError) only if the
// generator cannot be seeded; never returns predictable bytes.
Result<Nonce> RandomNonce();

// The proofs above. An empty secret is allowed by the math but refused by the
// handshake (a tenant must have a secret). Fails only if OpenSSL fails.
Result<Proof> ServerProof(std::string_view secret, const Nonce& client_nonce,
                          const Nonce& server_nonce, std::string_view tenant);
Result<Proof> ClientProof(std::string_view secret, const Nonce& server_nonce,
                          const Nonce& client_nonce, std::string_view tenant);

// HMAC-SHA256(key, data): the building block, exposed for tests (RFC 4231 vectors).
Result<Proof> HmacSha256(std::string_view key, std::string_view data);

// Compares two proofs in time independent of their contents (CRYPTO_memcmp).
bool ProofsEqual(const Proof& a, const Proof& b);

}  // namespace cdp::auth

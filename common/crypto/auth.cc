// SPDX-License-Identifier: Apache-2.0
#include "common/crypto/auth.h"

#include <string>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

namespace cdp::auth {
namespace {

Result<Proof> Hmac(std::string_view key, std::string_view label, const Nonce& first, const Nonce& second,
                   std::string_view tenant, std::span<const uint8_t> binding) {
  std::string data;
  data.reserve(label.size() + first.size() + second.size() + tenant.size() + binding.size());
  data.append(label);
  data.append(reinterpret_cast<const char*>(first.data()), first.size());
  data.append(reinterpret_cast<const char*>(second.data()), second.size());
  data.append(tenant);
  data.append(reinterpret_cast<const char*>(binding.data()), binding.size());
  return HmacSha256(key, data);
}

}  // namespace

Result<Nonce> RandomNonce() {
  Nonce n{};
  if (RAND_bytes(n.data(), int(n.size())) != 1) return Status::IOError("RAND_bytes failed");
  return n;
}

Result<Proof> HmacSha256(std::string_view key, std::string_view data) {
  Proof out{};
  unsigned int len = 0;
  // HMAC() with a null key pointer and length 0 is ambiguous in OpenSSL; point at a byte.
  static constexpr unsigned char kEmpty = 0;
  const void* k = key.empty() ? static_cast<const void*>(&kEmpty) : key.data();
  if (HMAC(EVP_sha256(), k, int(key.size()), reinterpret_cast<const unsigned char*>(data.data()),
           data.size(), out.data(), &len) == nullptr ||
      len != out.size()) {
    return Status::IOError("HMAC-SHA256 failed");
  }
  return out;
}

Result<Proof> ServerProof(std::string_view secret, const Nonce& client_nonce, const Nonce& server_nonce,
                          std::string_view tenant, std::span<const uint8_t> binding) {
  return Hmac(secret, "server", client_nonce, server_nonce, tenant, binding);
}

Result<Proof> ClientProof(std::string_view secret, const Nonce& server_nonce, const Nonce& client_nonce,
                          std::string_view tenant, std::span<const uint8_t> binding) {
  return Hmac(secret, "client", server_nonce, client_nonce, tenant, binding);
}

bool ProofsEqual(const Proof& a, const Proof& b) { return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0; }

}  // namespace cdp::auth

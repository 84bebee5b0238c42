// SPDX-License-Identifier: Apache-2.0
#include "common/base/coding.h"
#include "common/crypto/seal.h"

#include <cstring>
#include <utility>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>


namespace cdp::seal {
namespace {

constexpr std::string_view kKeyHeader = "opencdp-tenant-key v1";
constexpr std::string_view kSalt = "opencdp v1";

std::string Hex(const uint8_t* p, size_t n) {
  static const char kDigits[] = "0123456789abcdef";
  std::string s;
  s.reserve(n * 2);
  for (size_t i = 0; i < n; ++i) {
    s.push_back(kDigits[p[i] >> 4]);
    s.push_back(kDigits[p[i] & 15]);
  }
  return s;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool Unhex(std::string_view s, uint8_t* out, size_t n) {
  if (s.size() != n * 2) return false;
  for (size_t i = 0; i < n; ++i) {
    int hi = HexDigit(s[2 * i]), lo = HexDigit(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = uint8_t(hi << 4 | lo);
  }
  return true;
}

ByteSpan View(std::string_view s) { return ByteSpan(reinterpret_cast<const uint8_t*>(s.data()), s.size()); }

struct CipherCtx {
  EVP_CIPHER_CTX* p = EVP_CIPHER_CTX_new();
  CipherCtx() = default;
  CipherCtx(CipherCtx&& o) noexcept : p(std::exchange(o.p, nullptr)) {}
  CipherCtx(const CipherCtx&) = delete;
  CipherCtx& operator=(const CipherCtx&) = delete;
  CipherCtx& operator=(CipherCtx&&) = delete;
  ~CipherCtx() { EVP_CIPHER_CTX_free(p); }
};
struct MacCtx {
  EVP_MAC_CTX* p = nullptr;
  ~MacCtx() { EVP_MAC_CTX_free(p); }
};

void Tweak(uint64_t block, uint8_t iv[16]) {
  std::memset(iv, 0, 16);
  EncodeFixed64(iv, block);
}

}  // namespace

// ---- tenant keys ----

std::string TenantKey::Fingerprint() const {
  std::string in = "opencdp tenant key id";
  in.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  uint8_t md[32];
  unsigned int len = 0;
  if (EVP_Digest(in.data(), in.size(), md, &len, EVP_sha256(), nullptr) != 1) return "";
  OPENSSL_cleanse(in.data(), in.size());
  return Hex(md, 8);
}

Result<TenantKey> GenerateTenantKey() {
  TenantKey k;
  if (RAND_bytes(k.bytes.data(), int(k.bytes.size())) != 1) return Status::IOError("RAND_bytes failed");
  return k;
}

std::string EncodeTenantKey(const TenantKey& key) {
  return std::string(kKeyHeader) + "\n" + Hex(key.bytes.data(), key.bytes.size()) + "\n";
}

Result<TenantKey> ParseTenantKey(std::string_view text) {
  auto line = [&text]() {
    size_t nl = text.find('\n');
    std::string_view l = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    return l;
  };
  if (line() != kKeyHeader) return Status::InvalidArgument("not an OpenCDP tenant key file (want '" + std::string(kKeyHeader) + "')");
  TenantKey k;
  if (!Unhex(line(), k.bytes.data(), k.bytes.size()))
    return Status::InvalidArgument("tenant key file: the key line must be 64 hex digits");
  if (!text.empty()) return Status::InvalidArgument("tenant key file: unexpected text after the key");
  return k;
}

Result<TenantKey> LoadTenantKey(Env* env, const std::string& path) {
  CDP_RETURN_IF_ERROR(CheckPrivateFile(env, path, "key_file"));
  auto bytes = ReadWholeFile(env, path);
  if (!bytes.ok()) return bytes.status().WithContext("tenant key file " + path);
  std::string_view text(reinterpret_cast<const char*>(bytes->data()), bytes->size());
  auto key = ParseTenantKey(text);
  OPENSSL_cleanse(bytes->data(), bytes->size());
  if (!key.ok()) return key.status().WithContext(path);
  return key;
}

Status SaveTenantKey(Env* env, const std::string& path, const TenantKey& key) {
  if (env->Exists(path))
    return Status::AlreadyExists(path + " exists: a tenant key file is never replaced (every replica sealed under it "
                                        "would become unreadable)");
  std::string text = EncodeTenantKey(key);
  Status s = WriteFileAtomic(env, path, View(text), 0600);
  OPENSSL_cleanse(text.data(), text.size());
  return s;
}

Result<Bytes> Hkdf(ByteSpan ikm, ByteSpan salt, ByteSpan info, size_t length) {
  EVP_KDF* kdf = EVP_KDF_fetch(nullptr, "HKDF", nullptr);
  if (kdf == nullptr) return Status::IOError("OpenSSL has no HKDF");
  EVP_KDF_CTX* ctx = EVP_KDF_CTX_new(kdf);
  EVP_KDF_free(kdf);
  if (ctx == nullptr) return Status::IOError("EVP_KDF_CTX_new failed");
  char digest[] = "SHA256";
  OSSL_PARAM params[5];
  int n = 0;
  params[n++] = OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0);
  params[n++] = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, const_cast<uint8_t*>(ikm.data()), ikm.size());
  params[n++] = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, const_cast<uint8_t*>(salt.data()), salt.size());
  params[n++] = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, const_cast<uint8_t*>(info.data()), info.size());
  params[n] = OSSL_PARAM_construct_end();
  Bytes out(length);
  const int ok = EVP_KDF_derive(ctx, out.data(), out.size(), params);
  EVP_KDF_CTX_free(ctx);
  if (ok != 1) return Status::IOError("HKDF derivation failed");
  return out;
}

Result<VolumeKeys> DeriveVolumeKeys(const TenantKey& key, std::string_view volume) {
  VolumeKeys k;
  const ByteSpan ikm(key.bytes.data(), key.bytes.size());
  CDP_ASSIGN_OR_RETURN(Bytes d, Hkdf(ikm, View(kSalt), View("data|" + std::string(volume)), k.data.size()));
  CDP_ASSIGN_OR_RETURN(Bytes i, Hkdf(ikm, View(kSalt), View("integrity|" + std::string(volume)), k.integrity.size()));
  std::memcpy(k.data.data(), d.data(), d.size());
  std::memcpy(k.integrity.data(), i.data(), i.size());
  OPENSSL_cleanse(d.data(), d.size());
  OPENSSL_cleanse(i.data(), i.size());
  return k;
}

// ---- the sealer ----

struct BlockSealer::Impl {
  VolumeKeys keys;
  EVP_MAC_CTX* mac = nullptr;  // HMAC-SHA256 under the integrity key: duplicated per block
  ~Impl() {
    EVP_MAC_CTX_free(mac);
    OPENSSL_cleanse(keys.data.data(), keys.data.size());
    OPENSSL_cleanse(keys.integrity.data(), keys.integrity.size());
  }

  // MAC of block `b` whose stored bytes are `stored` (nullptr: a zero block).
  Status Mac(uint64_t b, const uint8_t* stored, uint8_t out[kMacSize]) const {
    MacCtx c;
    c.p = EVP_MAC_CTX_dup(mac);
    if (c.p == nullptr) return Status::IOError("EVP_MAC_CTX_dup failed");
    uint8_t idx[8];
    EncodeFixed64(idx, b);
    uint8_t full[32];
    size_t len = 0;
    if (EVP_MAC_update(c.p, idx, sizeof idx) != 1 || (stored != nullptr && EVP_MAC_update(c.p, stored, kUnit) != 1) ||
        EVP_MAC_final(c.p, full, &len, sizeof full) != 1 || len != sizeof full) {
      return Status::IOError("HMAC failed");
    }
    std::memcpy(out, full, kMacSize);
    return Status::OK();
  }

  Status Crypt(CipherCtx& c, uint64_t b, uint8_t* p, bool encrypt) const {
    uint8_t iv[16];
    Tweak(b, iv);
    int out = 0;
    if (EVP_CipherInit_ex(c.p, nullptr, nullptr, nullptr, iv, encrypt ? 1 : 0) != 1 ||
        EVP_CipherUpdate(c.p, p, &out, p, int(kUnit)) != 1 || out != int(kUnit)) {
      return Status::IOError("AES-XTS failed");
    }
    return Status::OK();
  }

  Result<CipherCtx> NewCipher(bool encrypt) const {
    CipherCtx c;
    if (c.p == nullptr || EVP_CipherInit_ex(c.p, EVP_aes_256_xts(), nullptr, keys.data.data(), nullptr, encrypt ? 1 : 0) != 1)
      return Status::InvalidArgument("AES-256-XTS refused the data key");
    return c;
  }
};

namespace {
Status CheckAligned(uint64_t offset, uint64_t len) {
  if (offset % kUnit != 0 || len % kUnit != 0)
    return Status::InvalidArgument("sealed ranges are whole 4 KiB blocks (offset " + std::to_string(offset) +
                                   ", length " + std::to_string(len) + ")");
  return Status::OK();
}
}  // namespace

BlockSealer::BlockSealer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BlockSealer::~BlockSealer() = default;

Result<std::shared_ptr<const BlockSealer>> BlockSealer::Create(const VolumeKeys& keys) {
  auto impl = std::make_unique<Impl>();
  impl->keys = keys;
  EVP_MAC* m = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  if (m == nullptr) return Status::IOError("OpenSSL has no HMAC");
  impl->mac = EVP_MAC_CTX_new(m);
  EVP_MAC_free(m);
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0), OSSL_PARAM_construct_end()};
  if (impl->mac == nullptr ||
      EVP_MAC_init(impl->mac, impl->keys.integrity.data(), impl->keys.integrity.size(), params) != 1)
    return Status::IOError("HMAC-SHA256 init failed");
  // XTS refuses a key whose halves are equal: find out now, not at the first block.
  CDP_RETURN_IF_ERROR(impl->NewCipher(true).status());
  return std::shared_ptr<const BlockSealer>(new BlockSealer(std::move(impl)));
}

Status BlockSealer::Seal(uint64_t offset, std::span<uint8_t> buf, uint8_t* macs) const {
  CDP_RETURN_IF_ERROR(CheckAligned(offset, buf.size()));
  CDP_ASSIGN_OR_RETURN(CipherCtx c, impl_->NewCipher(true));
  for (size_t i = 0; i < buf.size() / kUnit; ++i) {
    uint8_t* p = buf.data() + i * kUnit;
    const uint64_t b = offset / kUnit + i;
    const bool zero = IsAllZero(p, kUnit);
    if (!zero) CDP_RETURN_IF_ERROR(impl_->Crypt(c, b, p, true));
    if (macs != nullptr) CDP_RETURN_IF_ERROR(impl_->Mac(b, zero ? nullptr : p, macs + i * kMacSize));
  }
  return Status::OK();
}

Status BlockSealer::ZeroMacs(uint64_t offset, uint64_t len, uint8_t* macs) const {
  CDP_RETURN_IF_ERROR(CheckAligned(offset, len));
  for (uint64_t i = 0; i < len / kUnit; ++i) CDP_RETURN_IF_ERROR(impl_->Mac(offset / kUnit + i, nullptr, macs + i * kMacSize));
  return Status::OK();
}

Status BlockSealer::Open(uint64_t offset, std::span<uint8_t> buf, const uint8_t* macs) const {
  CDP_RETURN_IF_ERROR(CheckAligned(offset, buf.size()));
  CDP_ASSIGN_OR_RETURN(CipherCtx c, impl_->NewCipher(false));
  for (size_t i = 0; i < buf.size() / kUnit; ++i) {
    uint8_t* p = buf.data() + i * kUnit;
    const uint64_t b = offset / kUnit + i;
    const bool zero = IsAllZero(p, kUnit);
    uint8_t want[kMacSize];
    CDP_RETURN_IF_ERROR(impl_->Mac(b, zero ? nullptr : p, want));
    if (CRYPTO_memcmp(want, macs + i * kMacSize, kMacSize) != 0) {
      return Status::Corruption("integrity check failed: block " + std::to_string(b) + " (offset " +
                                std::to_string(b * kUnit) + ") is not what the tenant wrote there");
    }
    if (!zero) CDP_RETURN_IF_ERROR(impl_->Crypt(c, b, p, false));
  }
  return Status::OK();
}

}  // namespace cdp::seal

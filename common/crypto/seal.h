// SPDX-License-Identifier: Apache-2.0
// Tenant-side encryption of a volume's blocks (`encryption = on` at the
// agent; docs/encryption.md for the key hierarchy and what the provider sees,
// docs/formats/tenant-key.md and docs/formats/protocol.md for the bytes).
//
// The unit is a 4 KiB block of the volume (kUnit). The agent seals every block
// before it leaves the protected host:
//
//   stored(b) = 4096 zero bytes                     when the block is all zero
//             = AES-256-XTS(data key, tweak = b, plaintext)   otherwise
//   mac(b)    = HMAC-SHA256(integrity key, le64(b))[0..16)                 zero
//             = HMAC-SHA256(integrity key, le64(b) | stored(b))[0..16)   otherwise
//
// with b the block's index in the volume (offset / 4096). Zero blocks stay
// zero so that they are still eliminated (never travel as data, punch holes
// at the replica), and so that resync and verify compare sealed images by the
// same digests as plain ones. The two MAC inputs differ in length, so a zero
// block's MAC never verifies a data block. XTS is length-preserving and
// deterministic for a block address: the master target applies stored blocks
// by offset and journals them as it does plain ones, and hashes of stored
// blocks compare equal exactly when the plaintext does.
//
// The provider never holds the keys: it can neither read a block nor change
// one (or move one to another address, or to another volume: keys are derived
// per volume) without Open() failing for that block. It can present an older
// version of a block at the same address (the undo journal holds them by
// design): the MACs carry no freshness.
//
// Keys: a tenant key file (32 random bytes, `cdpctl keys init`) at the
// tenant's site; per volume, HKDF-SHA256 derives a 64-byte XTS key and a
// 32-byte integrity key (DeriveVolumeKeys). Only derived keys ever travel (to
// a keyed export at the master target, held in memory there).
//
// Thread safety: all functions are thread-safe; a BlockSealer is immutable
// after Create and may be shared by threads.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "common/base/coding.h"
#include "common/base/result.h"
#include "common/base/status.h"
#include "common/env/env.h"

namespace cdp::seal {

inline constexpr uint32_t kUnit = 4096;   // bytes per sealed block
inline constexpr uint32_t kMacSize = 16;  // bytes per block MAC
inline constexpr size_t kTenantKeySize = 32;

// MAC bytes for `len` bytes of volume (len a multiple of kUnit).
inline constexpr uint64_t MacBytes(uint64_t len) { return len / kUnit * kMacSize; }

struct TenantKey {
  std::array<uint8_t, kTenantKeySize> bytes{};
  // First 8 bytes of SHA-256("opencdp tenant key id" | bytes), hex: names the
  // key (in logs, status and backups) without revealing it.
  std::string Fingerprint() const;
};

// 32 bytes from OpenSSL's CSPRNG.
Result<TenantKey> GenerateTenantKey();
// The key file's text (docs/formats/tenant-key.md) and its parser.
// kInvalidArgument for anything but a well-formed version-1 key file.
std::string EncodeTenantKey(const TenantKey& key);
Result<TenantKey> ParseTenantKey(std::string_view text);
// Reads a key file: the Env's error (kNotFound when missing), kPermissionDenied
// when group or others may read it (CheckPrivateFile), or the parser's.
Result<TenantKey> LoadTenantKey(Env* env, const std::string& path);
// Writes a new key file with mode 0600 (atomically, synced). kAlreadyExists
// when `path` exists: a key file is never replaced (it would orphan every
// replica sealed under the old key).
Status SaveTenantKey(Env* env, const std::string& path, const TenantKey& key);

struct VolumeKeys {
  std::array<uint8_t, 64> data{};       // AES-256-XTS (two 32-byte keys)
  std::array<uint8_t, 32> integrity{};  // HMAC-SHA256
};
// HKDF-SHA256(ikm = tenant key, salt = "opencdp v1", info = "data|" + volume
// or "integrity|" + volume).
Result<VolumeKeys> DeriveVolumeKeys(const TenantKey& key, std::string_view volume);

// HKDF-SHA256 (RFC 5869), exposed for its test vectors.
Result<Bytes> Hkdf(ByteSpan ikm, ByteSpan salt, ByteSpan info, size_t length);

class BlockSealer {
 public:
  // kInvalidArgument when OpenSSL refuses the keys (XTS refuses two equal halves).
  static Result<std::shared_ptr<const BlockSealer>> Create(const VolumeKeys& keys);
  ~BlockSealer();
  BlockSealer(const BlockSealer&) = delete;
  BlockSealer& operator=(const BlockSealer&) = delete;

  // Seals the blocks of `buf` (plaintext of the volume at `offset`; both
  // multiples of kUnit) in place; when `macs` is not null, writes one MAC per
  // block there (MacBytes(buf.size()) bytes). kInvalidArgument for a bad
  // alignment.
  Status Seal(uint64_t offset, std::span<uint8_t> buf, uint8_t* macs) const;
  // The MACs of [offset, offset + len) reading as zeros.
  Status ZeroMacs(uint64_t offset, uint64_t len, uint8_t* macs) const;
  // Checks every block of `buf` (stored bytes at `offset`) against its MAC,
  // then decrypts in place. kCorruption naming the first bad block ("integrity
  // check failed: block B (offset O)"); `buf` is then unspecified and must not
  // be returned to anyone.
  Status Open(uint64_t offset, std::span<uint8_t> buf, const uint8_t* macs) const;

 private:
  struct Impl;
  explicit BlockSealer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cdp::seal

// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the tenant key file (common/crypto/seal.h,
// docs/formats/tenant-key.md): what the agent's `key_file` and cdpctl's
// --key-file read (ParseTenantKey, LoadTenantKey), and a BlockSealer keyed by
// any 96 bytes (the keys `cdpctl serve` derives; they never travel).
//
// Input: the file's text (its first 96 bytes are also used as volume keys).
//
// Properties: no crash, leak or sanitizer report; LoadTenantKey from a MemEnv
// agrees with ParseTenantKey; a key that parses encodes back to the input
// with its hex digits in lower case and a final newline (the parser also takes
// upper-case digits and a missing final newline) and parses again to the same
// key; its fingerprint is 16 hex digits. Derived keys and raw input keys seal a block that opens to
// the plaintext, a zero block stays zero, and a flipped stored byte or MAC bit
// makes Open fail with kCorruption; XTS keys with equal halves are refused by
// BlockSealer::Create with kInvalidArgument.
#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "common/crypto/seal.h"
#include "common/env/env.h"
#include "fuzz/fuzz_util.h"

namespace {

using namespace cdp;
using cdp::fuzz::Check;

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool IsHex(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// Seal and open one block of a pattern taken from `seed`, at block `index`.
void CheckSealer(const seal::VolumeKeys& keys, uint64_t index, uint8_t seed) {
  auto sealer = seal::BlockSealer::Create(keys);
  const bool halves_equal = std::equal(keys.data.begin(), keys.data.begin() + 32, keys.data.begin() + 32);
  if (!sealer.ok()) {
    Check(halves_equal && sealer.status().code() == Code::kInvalidArgument);
    return;
  }
  Check(!halves_equal);
  const uint64_t offset = (index % (1ull << 40)) * seal::kUnit;
  Bytes plain(2 * seal::kUnit, 0);  // a data block, then a zero block
  for (size_t i = 0; i < seal::kUnit; ++i) plain[i] = uint8_t(seed + i * 31 + (i >> 7));
  plain[0] |= 1;
  Bytes stored = plain;
  uint8_t macs[2 * seal::kMacSize];
  Check((*sealer)->Seal(offset, stored, macs).ok());
  Check(std::all_of(stored.begin() + seal::kUnit, stored.end(), [](uint8_t b) { return b == 0; }));
  uint8_t zero_macs[seal::kMacSize];
  Check((*sealer)->ZeroMacs(offset + seal::kUnit, seal::kUnit, zero_macs).ok());
  Check(std::memcmp(zero_macs, macs + seal::kMacSize, seal::kMacSize) == 0);

  Bytes opened = stored;
  Check((*sealer)->Open(offset, opened, macs).ok() && opened == plain);
  Bytes tampered = stored;
  tampered[seed % seal::kUnit] ^= 0x20;
  Check((*sealer)->Open(offset, tampered, macs).code() == Code::kCorruption);
  uint8_t bad_macs[2 * seal::kMacSize];
  std::memcpy(bad_macs, macs, sizeof bad_macs);
  bad_macs[seal::kMacSize + seed % seal::kMacSize] ^= 1;
  opened = stored;
  Check((*sealer)->Open(offset, opened, bad_macs).code() == Code::kCorruption);
  // Misaligned ranges are refused.
  Check((*sealer)->Seal(offset + 512, std::span<uint8_t>(stored.data(), seal::kUnit), macs).code() ==
        Code::kInvalidArgument);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const uint8_t seed = size > 0 ? data[size - 1] : 0;

  auto key = seal::ParseTenantKey(text);
  std::unique_ptr<Env> env = NewMemEnv();
  Check(env->CreateDirs("/etc/opencdp").ok());
  Check(WriteFileAtomic(env.get(), "/etc/opencdp/tenant.key", ByteSpan(data, size), 0600).ok());
  auto loaded = seal::LoadTenantKey(env.get(), "/etc/opencdp/tenant.key");
  Check(loaded.ok() == key.ok());
  if (!key.ok()) {
    Check(key.status().code() == Code::kInvalidArgument && loaded.status().code() == Code::kInvalidArgument);
  } else {
    Check(loaded->bytes == key->bytes);
    std::string canonical = Lower(text);
    if (canonical.empty() || canonical.back() != '\n') canonical += '\n';
    const std::string encoded = seal::EncodeTenantKey(*key);
    Check(encoded == canonical);
    auto again = seal::ParseTenantKey(encoded);
    Check(again.ok() && again->bytes == key->bytes);
    const std::string fp = key->Fingerprint();
    Check(fp.size() == 16 && IsHex(fp));
    auto keys = seal::DeriveVolumeKeys(*key, "db1");
    Check(keys.ok());
    auto other = seal::DeriveVolumeKeys(*key, "db2");
    Check(other.ok() && other->data != keys->data && other->integrity != keys->integrity);
    CheckSealer(*keys, seed, seed);
  }

  seal::VolumeKeys raw;
  if (text.size() >= raw.data.size() + raw.integrity.size()) {
    std::memcpy(raw.data.data(), text.data(), raw.data.size());
    std::memcpy(raw.integrity.data(), text.data() + raw.data.size(), raw.integrity.size());
    CheckSealer(raw, uint64_t(seed) * 977, seed);
  }
  return 0;
}

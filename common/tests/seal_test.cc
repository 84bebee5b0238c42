// SPDX-License-Identifier: Apache-2.0
#include "common/crypto/seal.h"

#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cstring>

#include "common/tests/test_util.h"

namespace cdp::seal {
namespace {

Bytes FromHex(std::string_view h) {
  Bytes b;
  for (size_t i = 0; i + 1 < h.size(); i += 2) b.push_back(uint8_t(std::stoi(std::string(h.substr(i, 2)), nullptr, 16)));
  return b;
}

TenantKey FixedKey(uint8_t v) {
  TenantKey k;
  for (size_t i = 0; i < k.bytes.size(); ++i) k.bytes[i] = uint8_t(v + i);
  return k;
}

std::shared_ptr<const BlockSealer> SealerFor(const TenantKey& k, const std::string& volume) {
  auto keys = DeriveVolumeKeys(k, volume);
  REQUIRE(keys.ok());
  auto s = BlockSealer::Create(*keys);
  REQUIRE(s.ok());
  return *s;
}

// Four blocks: data, zero, data, data (blocks 0 and 3 hold the same bytes).
Bytes Plain() {
  Bytes p(4 * kUnit, 0);
  for (size_t i = 0; i < kUnit; ++i) {
    p[i] = uint8_t('A' + i % 26);
    p[3 * kUnit + i] = uint8_t('A' + i % 26);
    p[2 * kUnit + i] = uint8_t(i * 7);
  }
  return p;
}

}  // namespace

TEST_CASE("seal: HKDF-SHA256 gives RFC 5869 test case 1", "[seal]") {
  Bytes ikm(22, 0x0b);
  Bytes salt = FromHex("000102030405060708090a0b0c");
  Bytes info = FromHex("f0f1f2f3f4f5f6f7f8f9");
  auto okm = Hkdf(ikm, salt, info, 42);
  REQUIRE(okm.ok());
  CHECK(*okm == FromHex("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"));
}

TEST_CASE("seal: a tenant key file round-trips, is written 0600 and never replaced", "[seal]") {
  testing::ScratchDir dir;
  const std::string path = dir.Join("tenant.key");
  auto key = GenerateTenantKey();
  REQUIRE(key.ok());
  REQUIRE(SaveTenantKey(DefaultEnv(), path, *key).ok());
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  auto back = LoadTenantKey(DefaultEnv(), path);
  REQUIRE(back.ok());
  CHECK(back->bytes == key->bytes);
  CHECK(back->Fingerprint() == key->Fingerprint());
  CHECK(back->Fingerprint().size() == 16);
  Status again = SaveTenantKey(DefaultEnv(), path, FixedKey(1));
  CHECK(again.code() == Code::kAlreadyExists);
  CHECK(LoadTenantKey(DefaultEnv(), path)->bytes == key->bytes);
  CHECK(LoadTenantKey(DefaultEnv(), dir.Join("missing")).status().code() == Code::kNotFound);
}

TEST_CASE("seal: a damaged key file is refused with a clear error", "[seal]") {
  const std::string good = EncodeTenantKey(FixedKey(3));
  CHECK(ParseTenantKey(good).ok());
  CHECK(ParseTenantKey("opencdp-tenant-key v2\n" + good.substr(good.find('\n') + 1)).status().message().find(
            "not an OpenCDP tenant key file") != std::string::npos);
  CHECK(ParseTenantKey(good.substr(0, good.size() - 2) + "\n").status().message().find("64 hex digits") !=
        std::string::npos);
  CHECK(ParseTenantKey(good + "x").status().message().find("unexpected text") != std::string::npos);
  std::string bad = good;
  bad[bad.find('\n') + 1] = 'g';
  CHECK(ParseTenantKey(bad).status().code() == Code::kInvalidArgument);
}

TEST_CASE("seal: volume keys are derived per volume and travel as hex", "[seal]") {
  auto a = DeriveVolumeKeys(FixedKey(1), "vol-a");
  auto a2 = DeriveVolumeKeys(FixedKey(1), "vol-a");
  auto b = DeriveVolumeKeys(FixedKey(1), "vol-b");
  auto c = DeriveVolumeKeys(FixedKey(2), "vol-a");
  REQUIRE((a.ok() && a2.ok() && b.ok() && c.ok()));
  CHECK(a->data == a2->data);
  CHECK(a->integrity == a2->integrity);
  CHECK(a->data != b->data);
  CHECK(a->integrity != b->integrity);
  CHECK(a->data != c->data);
}

TEST_CASE("seal: sealed blocks open to the plaintext and zero blocks stay zero", "[seal]") {
  auto s = SealerFor(FixedKey(1), "vol");
  const Bytes plain = Plain();
  Bytes buf = plain;
  Bytes macs(MacBytes(buf.size()));
  REQUIRE(s->Seal(8 * kUnit, buf, macs.data()).ok());
  // No data block is left in the clear; the zero block is zero.
  CHECK(std::memcmp(buf.data(), plain.data(), kUnit) != 0);
  CHECK(std::memcmp(buf.data() + 2 * kUnit, plain.data() + 2 * kUnit, kUnit) != 0);
  CHECK(std::memcmp(buf.data() + 3 * kUnit, plain.data() + 3 * kUnit, kUnit) != 0);
  CHECK(Bytes(buf.begin() + kUnit, buf.begin() + 2 * kUnit) == Bytes(kUnit, 0));
  // The same plaintext at two addresses seals differently (the tweak).
  CHECK(std::memcmp(buf.data(), buf.data() + 3 * kUnit, kUnit) != 0);
  // Deterministic per address: sealing again gives the same bytes and MACs.
  Bytes again = plain;
  Bytes macs2(macs.size());
  REQUIRE(s->Seal(8 * kUnit, again, macs2.data()).ok());
  CHECK(again == buf);
  CHECK(macs2 == macs);
  // A zero block's MAC is ZeroMacs'.
  Bytes zm(kMacSize);
  REQUIRE(s->ZeroMacs(9 * kUnit, kUnit, zm.data()).ok());
  CHECK(std::memcmp(zm.data(), macs.data() + kMacSize, kMacSize) == 0);
  REQUIRE(s->Open(8 * kUnit, buf, macs.data()).ok());
  CHECK(buf == plain);
}

TEST_CASE("seal: a changed, moved, zeroed or foreign block fails its integrity check by name", "[seal]") {
  auto s = SealerFor(FixedKey(1), "vol");
  Bytes sealed = Plain();
  Bytes macs(MacBytes(sealed.size()));
  REQUIRE(s->Seal(0, sealed, macs.data()).ok());

  SECTION("one byte flipped") {
    Bytes b = sealed;
    b[2 * kUnit + 100] ^= 1;
    Status st = s->Open(0, b, macs.data());
    CHECK(st.code() == Code::kCorruption);
    CHECK(st.message().find("integrity check failed: block 2 (offset 8192)") != std::string::npos);
  }
  SECTION("read at another address") {
    Bytes b = sealed;
    Status st = s->Open(kUnit * 4, b, macs.data());
    CHECK(st.message().find("integrity check failed: block 4 (offset 16384)") != std::string::npos);
  }
  SECTION("a data block zeroed, with a zero block's MAC") {
    Bytes b = sealed;
    std::memset(b.data(), 0, kUnit);
    Bytes m = macs;
    REQUIRE(s->ZeroMacs(kUnit, kUnit, m.data()).ok());  // a real zero MAC, but of block 1
    Status st = s->Open(0, b, m.data());
    CHECK(st.message().find("block 0 ") != std::string::npos);
  }
  SECTION("another volume's keys") {
    Bytes b = sealed;
    CHECK(SealerFor(FixedKey(1), "other")->Open(0, b, macs.data()).code() == Code::kCorruption);
  }
  SECTION("ranges are whole blocks") {
    Bytes b(kUnit);
    CHECK(s->Seal(512, b, nullptr).code() == Code::kInvalidArgument);
    Bytes c(kUnit + 512);
    CHECK(s->Seal(0, c, nullptr).code() == Code::kInvalidArgument);
  }
}

}  // namespace cdp::seal

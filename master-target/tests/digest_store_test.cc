// SPDX-License-Identifier: Apache-2.0
#include <catch2/catch.hpp>

#include <cerrno>
#include <random>

#include "common/env/env.h"
#include "common/env/fault_env.h"
#include "common/wire/block_digest.h"
#include "master-target/digest_store.h"

using namespace cdp;
using namespace cdp::mt;

namespace {

constexpr std::array<uint8_t, 16> kUuid{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
// 64 leaves and a short last one of 1024 bytes.
constexpr uint64_t kSize = 64 * 4096 + 1024;
constexpr uint64_t kLeaves = 65;

Bytes Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  Bytes b(n);
  for (auto& x : b) x = uint8_t(rng());
  return b;
}

// The store's view of every leaf: nullopt where unknown.
std::vector<std::optional<proto::Hash128>> View(DigestStore& s) {
  std::vector<proto::Hash128> l;
  std::vector<bool> k;
  s.Get(0, kLeaves, &l, &k);
  std::vector<std::optional<proto::Hash128>> v(kLeaves);
  for (size_t i = 0; i < kLeaves; ++i)
    if (k[i]) v[i] = l[i];
  return v;
}

// A model of the replica: what each known leaf must be.
struct Image {
  Bytes bytes = Bytes(kSize, 0);
  proto::Hash128 Leaf(uint64_t i) const {
    const uint64_t off = i * kLeafSize;
    return LeafDigest(bytes.data() + off, size_t(std::min<uint64_t>(kLeafSize, kSize - off)));
  }
};

// Every leaf the store knows matches the image; returns how many it knows.
size_t CheckAgainst(DigestStore& s, const Image& img) {
  size_t n = 0;
  auto v = View(s);
  for (uint64_t i = 0; i < kLeaves; ++i) {
    if (!v[i]) continue;
    INFO("leaf " << i);
    REQUIRE(*v[i] == img.Leaf(i));
    ++n;
  }
  return n;
}

}  // namespace

TEST_CASE("digest store: writes set the leaves they cover whole and forget the ones they cover in part",
          "[digest_store]") {
  auto env = NewMemEnv();
  auto s = DigestStore::Open(env.get(), "/d", kUuid, kSize);
  REQUIRE(s.ok());
  Image img;
  REQUIRE(CheckAgainst(**s, img) == 0);  // a new store knows nothing

  Bytes a = Random(3 * 4096, 1);
  (*s)->Wrote(4096, a);
  std::copy(a.begin(), a.end(), img.bytes.begin() + 4096);
  REQUIRE(CheckAgainst(**s, img) == 3);

  // Unaligned: leaves 2 and 4 are touched in part, leaf 3 whole.
  Bytes b = Random(1096 + 4096 + 200, 2);
  (*s)->Wrote(2 * 4096 + 3000, b);
  std::copy(b.begin(), b.end(), img.bytes.begin() + 2 * 4096 + 3000);
  auto v = View(**s);
  REQUIRE(v[1]);
  REQUIRE(!v[2]);
  REQUIRE(v[3]);
  REQUIRE(*v[3] == img.Leaf(3));
  REQUIRE(CheckAgainst(**s, img) == 2);

  // The volume's short last leaf counts as whole when the write reaches the end.
  Bytes c = Random(4096 + 1024, 3);
  (*s)->Wrote(63 * 4096, c);
  std::copy(c.begin(), c.end(), img.bytes.begin() + 63 * 4096);
  REQUIRE(CheckAgainst(**s, img) == 4);
  REQUIRE(View(**s)[64]);

  // Zeroed: whole leaves become the zero flag, partial ones unknown.
  (*s)->Zeroed(4096 + 100, 2 * 4096);
  std::fill(img.bytes.begin() + 4096 + 100, img.bytes.begin() + 3 * 4096 + 100, 0);
  v = View(**s);
  REQUIRE(!v[1]);
  REQUIRE(v[2]);
  REQUIRE(*v[2] == kZeroDigest);
  REQUIRE(!v[3]);
  REQUIRE(CheckAgainst(**s, img) == 3);

  // Put remembers digests read from the replica; Forget drops them.
  std::vector<proto::Hash128> all;
  for (uint64_t i = 0; i < kLeaves; ++i) all.push_back(img.Leaf(i));
  (*s)->Put(0, all);
  REQUIRE(CheckAgainst(**s, img) == kLeaves);
  (*s)->Forget(10 * 4096 + 1, 1);
  REQUIRE(!View(**s)[10]);
  REQUIRE(CheckAgainst(**s, img) == kLeaves - 1);
}

TEST_CASE("digest store: kept across a clean close, emptied after a crash or for another volume", "[digest_store]") {
  auto mem = NewMemEnv();
  FaultEnv fault(mem.get());
  Image img;
  Bytes a = Random(kSize, 4);
  img.bytes = a;
  {
    auto s = DigestStore::Open(&fault, "/d", kUuid, kSize);
    REQUIRE(s.ok());
    (*s)->Wrote(0, a);
    REQUIRE(CheckAgainst(**s, img) == kLeaves);
    REQUIRE((*s)->Close().ok());
  }
  REQUIRE(fault.DropUnsyncedData().ok());  // a power cut after a clean close loses nothing
  {
    auto s = DigestStore::Open(&fault, "/d", kUuid, kSize);
    REQUIRE(s.ok());
    REQUIRE(CheckAgainst(**s, img) == kLeaves);
    // The process dies without Close: whatever it did is not trusted.
  }
  {
    auto s = DigestStore::Open(&fault, "/d", kUuid, kSize);
    REQUIRE(s.ok());
    REQUIRE(CheckAgainst(**s, img) == 0);
    (*s)->Wrote(0, a);
    REQUIRE((*s)->Close().ok());
  }
  SECTION("another volume") {
    auto other = kUuid;
    other[0] ^= 1;
    auto s = DigestStore::Open(&fault, "/d", other, kSize);
    REQUIRE(s.ok());
    REQUIRE(CheckAgainst(**s, img) == 0);
  }
  SECTION("another size") {
    auto s = DigestStore::Open(&fault, "/d", kUuid, kSize + 4096);
    REQUIRE(s.ok());
    std::vector<proto::Hash128> l;
    std::vector<bool> k;
    (*s)->Get(0, kLeaves + 1, &l, &k);
    REQUIRE(std::count(k.begin(), k.end(), true) == 0);
  }
  SECTION("a damaged header") {
    {
      auto f = fault.Open("/d", OpenOptions{});
      REQUIRE(f.ok());
      uint8_t x = 0xff;
      REQUIRE((*f)->Write(20, ByteSpan(&x, 1)).ok());
    }
    auto s = DigestStore::Open(&fault, "/d", kUuid, kSize);
    REQUIRE(s.ok());
    REQUIRE(CheckAgainst(**s, img) == 0);
  }
  SECTION("a crash at every sync point of Close keeps either every digest or none") {
    for (uint64_t n = 0;; ++n) {
      {
        auto s = DigestStore::Open(&fault, "/d", kUuid, kSize);
        REQUIRE(s.ok());
        (*s)->Wrote(0, a);
        fault.SetCrashAfterSyncs(n);
        (void)(*s)->Close();
      }
      const bool finished = !fault.crashed();
      fault.ClearErrors();
      REQUIRE(fault.DropUnsyncedData().ok());
      auto s = DigestStore::Open(&fault, "/d", kUuid, kSize);
      REQUIRE(s.ok());
      const size_t known = CheckAgainst(**s, img);
      INFO("crash after " << n << " syncs");
      REQUIRE((known == 0 || known == kLeaves));
      if (finished) {
        REQUIRE(known == kLeaves);
        break;
      }
    }
  }
}

TEST_CASE("digest store: a failed write disables it until the next open, which starts empty", "[digest_store]") {
  auto mem = NewMemEnv();
  FaultEnv fault(mem.get());
  Image img;
  Bytes a = Random(kSize, 5);
  {
    auto s = DigestStore::Open(&fault, "/d", kUuid, kSize);
    REQUIRE(s.ok());
    (*s)->Wrote(0, a);
    img.bytes = a;
    REQUIRE(CheckAgainst(**s, img) == kLeaves);
    // The replica changes, but recording it fails: the store must not go on
    // describing the old bytes.
    fault.InjectError(FaultEnv::Op::kWrite, EIO);
    Bytes b = Random(4096, 6);
    (*s)->Wrote(0, b);
    std::copy(b.begin(), b.end(), img.bytes.begin());
    REQUIRE(!(*s)->enabled());
    REQUIRE(CheckAgainst(**s, img) == 0);
    fault.ClearErrors();
    (*s)->Put(0, std::vector<proto::Hash128>(1, img.Leaf(0)));  // ignored
    REQUIRE(CheckAgainst(**s, img) == 0);
    REQUIRE(!(*s)->Close().ok());  // a disabled store cannot be closed clean
  }
  auto s = DigestStore::Open(&fault, "/d", kUuid, kSize);
  REQUIRE(s.ok());
  REQUIRE(CheckAgainst(**s, img) == 0);
}

TEST_CASE("digest store: a long zeroed or forgotten range costs a hole, not 0.4% of it", "[digest_store]") {
  auto env = NewMemEnv();
  const uint64_t size = 4ull << 30;  // 16 MiB of entries if written
  auto s = DigestStore::Open(env.get(), "/d", kUuid, size);
  REQUIRE(s.ok());
  Bytes a = Random(1 << 20, 7);
  (*s)->Wrote(size / 2, a);
  (*s)->Zeroed(0, size);
  std::vector<proto::Hash128> l;
  std::vector<bool> k;
  (*s)->Get(size / 2 / kLeafSize, 256, &l, &k);
  REQUIRE(std::count(k.begin(), k.end(), true) == 0);
  auto fsize = env->FileSize("/d");
  REQUIRE(fsize.ok());
  // The file grew only as far as the write reached.
  REQUIRE(*fsize == DigestStore::kHeaderSize + (size / 2 + (1 << 20)) / kLeafSize * DigestStore::kEntrySize);
}

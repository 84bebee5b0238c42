// SPDX-License-Identifier: Apache-2.0
// A sealed volume at the master target (tenant-side encryption,
// common/crypto/seal.h): sealed records are applied, journaled, read at every point,
// rolled back and hashed with their MACs; the keyed export serves plaintext
// and refuses a tampered block; plain and sealed writes never mix.
#include <catch2/catch.hpp>

#include <cstring>

#include "common/base/clock.h"
#include "common/crypto/seal.h"
#include "common/env/env.h"
#include "common/wire/block_digest.h"
#include "master-target/export.h"
#include "common/nbd/sealed_device.h"
#include "master-target/replica_volume.h"
#include "master-target/tests/mt_test_util.h"

using namespace cdp;
using namespace cdp::mt;
using namespace cdp::mt::testing;

namespace {

// The upstream every open of these tests comes from.
const cdp::mt::Upstream kPs{"ps", "test-ps"};

constexpr uint64_t kSize = 256 * 1024;  // 64 blocks

VolumeIdentity SealedIdent() {
  VolumeIdentity id;
  id.name = "secret";
  id.size = kSize;
  id.block_size = 4096;
  id.uuid[0] = 0x5e;
  id.generation = 1;
  id.sealed = true;
  return id;
}

VolumeOptions Opts(Env* env, const Clock* clock, const std::string& index) {
  VolumeOptions o;
  o.env = env;
  o.clock = clock;
  o.dir = "/t/secret";
  o.index_path = index;
  o.segment_bytes = 64 * 1024;
  o.point_interval_us = 0;
  return o;
}

seal::VolumeKeys Keys(uint8_t v = 1) {
  seal::TenantKey k;
  for (size_t i = 0; i < k.bytes.size(); ++i) k.bytes[i] = uint8_t(v * 31 + i);
  return *seal::DeriveVolumeKeys(k, "secret");
}

// Turns plain batches into the sealed batches an agent would send: each write
// widened to whole blocks of the plaintext image after it, sealed; a range of
// whole zero blocks as a sealed zero record.
class Sealer {
 public:
  explicit Sealer(std::shared_ptr<const seal::BlockSealer> s) : s_(std::move(s)), image_(kSize, 0) {}

  std::vector<proto::Record> Seal(const std::vector<proto::Record>& plain) {
    std::vector<proto::Record> out;
    for (const proto::Record& r : plain) {
      if (!proto::IsWriteKind(r.kind)) {
        out.push_back(r);
        continue;
      }
      if (r.kind == proto::RecordKind::kData) {
        std::memcpy(image_.data() + r.offset, r.data.data(), r.length);
      } else {
        std::memset(image_.data() + r.offset, 0, r.length);
      }
      const uint64_t first = r.offset / seal::kUnit * seal::kUnit;
      const uint64_t end = (r.offset + r.length + seal::kUnit - 1) / seal::kUnit * seal::kUnit;
      proto::Record s;
      s.seq = r.seq;
      s.offset = first;
      s.length = uint32_t(end - first);
      s.timestamp_us = r.timestamp_us;
      Bytes blocks(image_.begin() + long(first), image_.begin() + long(end));
      if (IsAllZero(blocks.data(), blocks.size())) {
        s.kind = proto::RecordKind::kSealedZero;
        s.data.resize(seal::MacBytes(s.length));
        REQUIRE(s_->ZeroMacs(first, s.length, s.data.data()).ok());
      } else {
        s.kind = proto::RecordKind::kSealed;
        Bytes macs(seal::MacBytes(s.length));
        REQUIRE(s_->Seal(first, blocks, macs.data()).ok());
        s.data = std::move(blocks);
        s.data.insert(s.data.end(), macs.begin(), macs.end());
      }
      out.push_back(std::move(s));
    }
    return out;
  }

 private:
  std::shared_ptr<const seal::BlockSealer> s_;
  Bytes image_;
};

// The plaintext of the volume at `seq`, opened with the volume's keys.
Result<Bytes> Plaintext(ReplicaVolume& v, const seal::BlockSealer& s, uint64_t seq) {
  Bytes stored(kSize), macs(seal::MacBytes(kSize));
  CDP_RETURN_IF_ERROR(v.ReadAt(seq, 0, kSize, stored.data()));
  CDP_RETURN_IF_ERROR(v.ReadMacsAt(seq, 0, kSize, macs.data()));
  CDP_RETURN_IF_ERROR(s.Open(0, stored, macs.data()));
  return stored;
}

}  // namespace

TEST_CASE("sealed volume: every point opens to its plaintext, a rollback restores blocks and MACs, a reopen keeps "
          "the sealing",
          "[volume][sealed]") {
  TempDir tmp;
  auto env = NewMemEnv();
  ManualClock clock;
  auto sealer = *seal::BlockSealer::Create(Keys());
  StreamGen gen(kSize, 21);
  // The initial sync, as the agent's resync sends it: every block's MAC.
  Sealer seal(sealer);
  std::vector<proto::Record> init{ZeroRecord(1, 0, uint32_t(kSize))};
  auto plain = gen.Batches(30, 6);
  // The generator numbers from 1: shift by the initial record.
  for (auto& b : plain) {
    for (auto& r : b) ++r.seq;
  }
  auto v = ReplicaVolume::Open(Opts(env.get(), &clock, tmp.path() + "/i.db"), nullptr);
  CHECK(v.status().IsNotFound());
  const VolumeIdentity id = SealedIdent();
  v = ReplicaVolume::Open(Opts(env.get(), &clock, tmp.path() + "/i.db"), &id);
  REQUIRE(v.ok());
  REQUIRE((*v)->ApplyBatch(seal.Seal(init))->ack);
  std::vector<uint64_t> points{1};
  for (const auto& b : plain) {
    auto sealed = seal.Seal(b);
    auto o = (*v)->ApplyBatch(sealed);
    REQUIRE(o.ok());
    REQUIRE(o->ack);
    points.push_back(b.back().seq);
  }
  const Reference& ref = gen.reference();
  // Every point opens to the reference image (the generator's sequence s is ours s + 1).
  for (uint64_t p : points) {
    INFO("point " << p);
    auto got = Plaintext(**v, *sealer, p);
    REQUIRE(got.ok());
    CHECK(*got == ref.ImageAt(p - 1));
  }
  // The stored image holds no plaintext block of the current image.
  Bytes stored(kSize);
  REQUIRE((*v)->ReadAt(points.back(), 0, kSize, stored.data()).ok());
  for (uint64_t b = 0; b < kSize / 4096; ++b) {
    if (IsAllZero(ref.image().data() + b * 4096, 4096)) continue;
    CHECK(std::memcmp(stored.data() + b * 4096, ref.image().data() + b * 4096, 4096) != 0);
  }
  // Reopen: still sealed, still the same.
  v->reset();
  v = ReplicaVolume::Open(Opts(env.get(), &clock, tmp.path() + "/i.db"), nullptr);
  REQUIRE(v.ok());
  CHECK((*v)->identity().sealed);
  REQUIRE(Plaintext(**v, *sealer, points.back()).ok());
  // Roll back to a middle point: blocks and MACs of that point.
  const uint64_t mid = points[points.size() / 2];
  REQUIRE((*v)->Rollback(mid).ok());
  auto back = Plaintext(**v, *sealer, (*v)->applied_seq());
  REQUIRE(back.ok());
  CHECK(*back == ref.ImageAt(mid - 1));
}

TEST_CASE("sealed volume: plain writes are refused, and a stream of the other sealing is another volume",
          "[volume][sealed]") {
  TempDir tmp;
  auto env = NewMemEnv();
  ManualClock clock;
  const VolumeIdentity id = SealedIdent();
  auto v = ReplicaVolume::Open(Opts(env.get(), &clock, tmp.path() + "/i.db"), &id);
  REQUIRE(v.ok());
  auto o = (*v)->ApplyBatch({DataRecord(1, 0, Bytes(4096, 'p'))});
  REQUIRE(o.ok());
  CHECK(!o->ack);
  CHECK(o->reason == proto::NackReason::kBadRecord);
  CHECK(o->message == "record seq 1: a plain write on a sealed volume");
  o = (*v)->ApplyBatch({ZeroRecord(1, 0, 4096)});
  CHECK(o->message == "record seq 1: a plain write on a sealed volume");
  // A sealed record off the 4 KiB grid, or with its MACs missing.
  proto::Record r;
  r.seq = 1;
  r.offset = 512;
  r.length = 4096;
  r.kind = proto::RecordKind::kSealed;
  r.data.resize(4096 + 16);
  CHECK((*v)->ApplyBatch({r})->message == "record seq 1: sealed range not on whole 4 KiB blocks");
  r.offset = 0;
  r.data.resize(4096);
  CHECK((*v)->ApplyBatch({r})->message == "record seq 1: sealed data size != blocks + MACs");
  CHECK((*v)->applied_seq() == 0);
  VolumeIdentity plain = id;
  plain.sealed = false;
  auto co = (*v)->CheckOpen(plain, kPs);
  REQUIRE(co.ok());
  CHECK(!co->ack);
  CHECK(co->reason == proto::NackReason::kWrongGeneration);
  CHECK(co->message.find("the volume is sealed (tenant-side encryption) and the stream is not") == 0);
}

TEST_CASE("sealed volume: a zero block never sent has its own digest, so the source sends its MAC",
          "[volume][sealed]") {
  TempDir tmp;
  auto env = NewMemEnv();
  ManualClock clock;
  auto sealer = *seal::BlockSealer::Create(Keys());
  const VolumeIdentity id = SealedIdent();
  auto v = ReplicaVolume::Open(Opts(env.get(), &clock, tmp.path() + "/i.db"), &id);
  REQUIRE(v.ok());
  ReplicaVolume::DigestQuery q;
  q.unit = 4096;
  q.first = 0;
  q.count = 4;
  auto d = (*v)->Digests(q);
  REQUIRE(d.ok());
  CHECK(d->digests == std::vector<proto::Hash128>(4, kUnsealedZeroDigest));
  // Block 1 gets its sealed zero, block 2 data: their digests are the source's.
  Sealer seal(sealer);
  Bytes data(4096, 'x');
  auto batch = seal.Seal({ZeroRecord(1, 4096, 4096), DataRecord(2, 8192, data)});
  REQUIRE((*v)->ApplyBatch(batch)->ack);
  Bytes sealed_data = data;
  REQUIRE(sealer->Seal(8192, sealed_data, nullptr).ok());
  d = (*v)->Digests(q);
  REQUIRE(d.ok());
  CHECK(d->digests[0] == kUnsealedZeroDigest);
  CHECK(d->digests[1] == kZeroDigest);
  CHECK(d->digests[2] == LeafDigest(sealed_data.data(), 4096));
  CHECK(d->digests[3] == kUnsealedZeroDigest);
  // Block 1 overwritten with data at sequence 3: at sequence 2, through the
  // journal, it is still a sent zero block, and block 0 a never-sent one.
  REQUIRE((*v)->ApplyBatch(seal.Seal({DataRecord(3, 4096, data)}))->ack);
  q.at_seq = 2;
  auto past = (*v)->Digests(q);
  REQUIRE(past.ok());
  CHECK(past->seq == 2);
  CHECK(past->digests[0] == kUnsealedZeroDigest);
  CHECK(past->digests[1] == kZeroDigest);
  CHECK(past->digests[2] == LeafDigest(sealed_data.data(), 4096));
}

TEST_CASE("sealed export: the tenant's SealedDevice over a point's stored blocks and MACs reads the plaintext, and a flipped byte of the replica fails the read by name",
          "[volume][sealed][export]") {
  TempDir tmp;
  auto env = NewMemEnv();
  ManualClock clock;
  auto sealer = *seal::BlockSealer::Create(Keys());
  const VolumeIdentity id = SealedIdent();
  auto vo = ReplicaVolume::Open(Opts(env.get(), &clock, tmp.path() + "/i.db"), &id);
  REQUIRE(vo.ok());
  std::shared_ptr<ReplicaVolume> v(std::move(*vo));
  Sealer seal(sealer);
  Bytes a = RandomBytes(3 * 4096, 1), b = RandomBytes(4096, 2);
  REQUIRE(v->ApplyBatch(seal.Seal({ZeroRecord(1, 0, uint32_t(kSize)), DataRecord(2, 4096, a)}))->ack);
  REQUIRE(v->ApplyBatch(seal.Seal({DataRecord(3, 8192, b)}))->ack);
  Bytes at2(kSize, 0);
  std::memcpy(at2.data() + 4096, a.data(), a.size());

  auto plain_dev = PointInTimeDevice::Open(v, 2, env.get(), "");
  REQUIRE(plain_dev.ok());
  CHECK((*plain_dev)->size() == DeviceSize(id));  // the stored blocks, then their MACs
  auto keyed = SealedDevice::Open(*plain_dev, kSize, sealer, "secret");
  REQUIRE(keyed.ok());
  Bytes got(kSize);
  REQUIRE((*keyed)->Read(0, uint32_t(kSize), got.data()).ok());
  CHECK(got == at2);
  // An unaligned read inside a block.
  Bytes part(100);
  REQUIRE((*keyed)->Read(4096 + 10, 100, part.data()).ok());
  CHECK(std::memcmp(part.data(), a.data() + 10, 100) == 0);
  // Without the keys: the stored blocks, never the plaintext.
  REQUIRE((*plain_dev)->Read(0, uint32_t(kSize), got.data()).ok());
  CHECK(std::memcmp(got.data() + 4096, a.data(), 4096) != 0);
  // The provider flips one byte of block 3 (offset 12288) in the replica.
  {
    auto f = env->Open("/t/secret/replica.img", OpenOptions{});
    REQUIRE(f.ok());
    uint8_t c = 0;
    REQUIRE((*f)->Read(12288 + 7, 1, &c).ok());
    c ^= 0x40;
    REQUIRE((*f)->Write(12288 + 7, ByteSpan(&c, 1)).ok());
  }
  Status s = (*keyed)->Read(12288, 4096, got.data());
  CHECK(s.IsCorruption());
  CHECK(s.message() == "secret: integrity check failed: block 3 (offset 12288) is not what the tenant wrote there");
  CHECK((*keyed)->integrity_failures() == 1);
  // Other blocks still read.
  REQUIRE((*keyed)->Read(4096, 4096, got.data()).ok());
  CHECK(std::memcmp(got.data(), a.data(), 4096) == 0);
  // Another volume's keys open nothing.
  seal::TenantKey other;
  auto wrong = *seal::BlockSealer::Create(*seal::DeriveVolumeKeys(other, "secret"));
  auto bad = SealedDevice::Open(*plain_dev, kSize, wrong, "secret");
  REQUIRE(bad.ok());
  CHECK((*bad)->Read(0, 4096, got.data()).IsCorruption());
}

TEST_CASE("sealed writable export: through the tenant's SealedDevice partial writes and zeroes read back as written, the "
          "overlay holds no plaintext, and it reopens the same",
          "[volume][sealed][export]") {
  TempDir tmp;
  auto env = NewMemEnv();
  ManualClock clock;
  auto sealer = *seal::BlockSealer::Create(Keys());
  const VolumeIdentity id = SealedIdent();
  auto vo = ReplicaVolume::Open(Opts(env.get(), &clock, tmp.path() + "/i.db"), &id);
  REQUIRE(vo.ok());
  std::shared_ptr<ReplicaVolume> v(std::move(*vo));
  Sealer seal(sealer);
  Bytes base = RandomBytes(kSize, 5);
  REQUIRE(v->ApplyBatch(seal.Seal({DataRecord(1, 0, base)}))->ack);
  REQUIRE(v->ApplyBatch({FlushRecord(2)})->ack);

  auto inner = PointInTimeDevice::OpenPersistent(v, 2, env.get(), "/t/secret/failover.cow", "/t/secret/failover.bitmap",
                                                 true);
  REQUIRE(inner.ok());
  CHECK((*inner)->size() == DeviceSize(id));
  auto dev = SealedDevice::Open(*inner, kSize, sealer, "secret");
  REQUIRE(dev.ok());
  CHECK((*dev)->size() == kSize);
  CHECK(!(*dev)->read_only());
  Bytes model = base;
  auto write = [&](uint64_t off, const Bytes& data) {
    REQUIRE((*dev)->Write(off, data, false).ok());
    std::copy(data.begin(), data.end(), model.begin() + long(off));
  };
  auto zero = [&](uint64_t off, uint64_t len) {
    REQUIRE((*dev)->WriteZeroes(off, len, false, true).ok());
    std::fill(model.begin() + long(off), model.begin() + long(off + len), 0);
  };
  const std::string marker = "PLAINTEXT-OF-THE-PROVIDER-SIDE--";
  Bytes marked;
  while (marked.size() < 3000) marked.insert(marked.end(), marker.begin(), marker.end());
  write(100, marked);                      // inside block 0
  write(4096 * 3 - 10, Bytes(20, 'x'));    // across blocks 2 and 3
  write(4096 * 8, RandomBytes(3 * 4096, 6));  // whole blocks
  zero(4096 * 12 + 512, 4096 * 3);         // a partial head, two whole blocks, a partial tail
  zero(4096 * 20 + 1, 10);                 // inside one block
  REQUIRE((*dev)->Flush().ok());
  Bytes got(kSize);
  REQUIRE((*dev)->Read(0, uint32_t(kSize), got.data()).ok());
  CHECK(got == model);
  // The overlay holds ciphertext only.
  auto cow = ReadWholeFile(env.get(), "/t/secret/failover.cow");
  REQUIRE(cow.ok());
  const std::string overlay(cow->begin(), cow->end());
  CHECK(overlay.find(marker) == std::string::npos);
  // Reopened (a restart): the same image with the same keys.
  dev->reset();
  inner->reset();
  inner = PointInTimeDevice::OpenPersistent(v, 2, env.get(), "/t/secret/failover.cow", "/t/secret/failover.bitmap",
                                            false);
  REQUIRE(inner.ok());
  dev = SealedDevice::Open(*inner, kSize, sealer, "secret");
  REQUIRE(dev.ok());
  REQUIRE((*dev)->Read(0, uint32_t(kSize), got.data()).ok());
  CHECK(got == model);
  // A read-only export's stored space cannot be written through.
  auto ro = PointInTimeDevice::Open(v, 2, env.get(), "");
  REQUIRE(ro.ok());
  auto keyed_ro = SealedDevice::Open(*ro, kSize, sealer, "secret");
  REQUIRE(keyed_ro.ok());
  CHECK((*keyed_ro)->Write(0, Bytes(4096, 1), false).code() == Code::kPermissionDenied);
}

// SPDX-License-Identifier: Apache-2.0
// ReplicaIo and apply through O_DIRECT (issue #15): byte equality against a
// reference after random aligned and unaligned records, on a strict
// in-memory direct Env (alignment enforced, crash at every sync point) and
// on real files opened with O_DIRECT.
#include "master-target/replica_io.h"

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <map>
#include <random>
#include <set>

#include "common/base/clock.h"
#include "common/env/env.h"
#include "common/env/fault_env.h"
#include "master-target/replica_volume.h"
#include "master-target/tests/mt_test_util.h"

using namespace cdp;
using namespace cdp::mt;
using namespace cdp::mt::testing;

namespace {

// The Env a test runs on: the strict in-memory direct Env, or the real one
// (O_DIRECT on the scratch directory's file system).
struct TestEnv {
  explicit TestEnv(bool posix) : posix(posix) {
    base = posix ? NewPosixEnv() : NewMemEnv();
    strict = std::make_unique<StrictDirectEnv>(base.get(), &violations);
    root = posix ? tmp.path() : "/t";
  }
  Env* env() { return posix ? base.get() : strict.get(); }
  bool posix;
  TempDir tmp;
  std::unique_ptr<Env> base;
  std::atomic<uint64_t> violations{0};
  std::unique_ptr<StrictDirectEnv> strict;
  std::string root;
};

// A direct and a buffered handle of `path` (created with `size` zeros).
struct Handles {
  std::unique_ptr<File> buffered;
  std::unique_ptr<ReplicaIo> io;
};

Handles OpenHandles(Env* env, const std::string& path, uint64_t size) {
  REQUIRE(env->CreateDirs(DirName(path)).ok());
  OpenOptions c;
  c.create = true;
  auto b = env->Open(path, c);
  REQUIRE(b.ok());
  REQUIRE((*b)->Truncate(size).ok());
  OpenOptions d;
  d.direct = true;
  auto f = env->Open(path, d);
  REQUIRE(f.ok());
  Handles h;
  h.buffered = std::move(*b);
  h.io = std::make_unique<ReplicaIo>(h.buffered.get(), std::move(*f));
  REQUIRE(h.io->direct());
  return h;
}

// A range: half of them 4 KiB-aligned in offset and length, the rest any
// byte; now and then one longer than a direct piece (1 MiB).
std::pair<uint64_t, size_t> RandomRange(std::mt19937_64& rng, uint64_t size) {
  size_t n;
  const int shape = int(rng() % 10);
  if (shape == 0) {
    n = 1 + size_t(rng() % (3u << 20));
  } else if (shape < 5) {
    n = 4096 * (1 + size_t(rng() % 16));
  } else {
    n = 1 + size_t(rng() % 40000);
  }
  n = std::min<size_t>(n, size);
  uint64_t off = rng() % (size - n + 1);
  if (rng() % 2 && off % 4096 != 0) off = off / 4096 * 4096;
  return {off, n};
}

}  // namespace

TEST_CASE(
    "ReplicaIo: random aligned and unaligned writes and reads through a direct and a buffered handle equal "
    "a reference",
    "[replica_io]") {
  const bool posix = GENERATE(false, true);
  CAPTURE(posix);
  TestEnv te(posix);
  const uint64_t size = 24u << 20;
  Handles h = OpenHandles(te.env(), te.root + "/replica.img", size);
  Bytes ref(size, 0);
  std::mt19937_64 rng(posix ? 11 : 12);
  for (int round = 0; round < 40; ++round) {
    CAPTURE(round);
    // A batch of disjoint writes (round 7: one longer than a staging window).
    std::map<uint64_t, uint64_t> taken;  // begin -> end
    const int count = round == 7 ? 1 : 1 + int(rng() % 40);
    for (int i = 0; i < count; ++i) {
      auto [off, n] = round == 7 ? std::pair<uint64_t, size_t>{4096 + 512, (20u << 20) + 100} : RandomRange(rng, size);
      auto it = taken.lower_bound(off + n);
      if (it != taken.begin() && std::prev(it)->second > off) continue;  // overlaps one taken
      taken[off] = off + n;
    }
    std::vector<Bytes> data;
    std::vector<WriteOp> writes;
    for (const auto& [off, end] : taken) data.push_back(RandomBytes(size_t(end - off), rng()));
    size_t k = 0;
    for (const auto& [off, end] : taken) writes.push_back(WriteOp{off, ByteSpan(data[k++])});
    std::shuffle(writes.begin(), writes.end(), rng);
    REQUIRE(h.io->Write(writes).ok());
    for (const WriteOp& w : writes) std::copy(w.data.begin(), w.data.end(), ref.begin() + long(w.offset));
    // Now and then a buffered write behind the direct handle's back (as undo does).
    if (round % 3 == 0) {
      auto [off, n] = RandomRange(rng, size);
      Bytes b = RandomBytes(n, rng());
      REQUIRE(h.buffered->Write(off, b).ok());
      std::copy(b.begin(), b.end(), ref.begin() + long(off));
    }
    // Reads (overlaps allowed) through ReplicaIo and through the buffered handle.
    std::vector<Bytes> bufs;
    std::vector<ReadOp> reads;
    for (int i = 0; i < 1 + int(rng() % 30); ++i) {
      auto [off, n] = RandomRange(rng, size);
      bufs.emplace_back(n);
      reads.push_back(ReadOp{off, n, nullptr});
    }
    for (size_t i = 0; i < reads.size(); ++i) reads[i].buf = bufs[i].data();
    REQUIRE(h.io->Read(reads).ok());
    for (const ReadOp& r : reads) {
      REQUIRE(std::equal(r.buf, r.buf + r.n, ref.begin() + long(r.offset)));
      Bytes b(r.n);
      REQUIRE(h.buffered->Read(r.offset, r.n, b.data()).ok());
      REQUIRE(std::equal(b.begin(), b.end(), ref.begin() + long(r.offset)));
    }
  }
  REQUIRE(h.buffered->Sync().ok());
  Bytes all(size);
  REQUIRE(h.buffered->Read(0, size, all.data()).ok());
  REQUIRE(all == ref);
  REQUIRE(te.violations.load() == 0);
}

namespace {

constexpr uint64_t kDirectVolSize = 1u << 20;

VolumeIdentity DirectIdent() {
  VolumeIdentity id;
  id.name = "dvol";
  id.size = kDirectVolSize;
  id.block_size = 4096;
  id.uuid[0] = 0x42;
  id.generation = 1;
  return id;
}

VolumeOptions DirectOpts(Env* env, const std::string& root, const std::string& index, const Clock* clock) {
  VolumeOptions o;
  o.env = env;
  o.clock = clock;
  o.dir = root + "/dvol";
  o.index_path = index;
  o.segment_bytes = 256 * 1024;
  o.point_interval_us = 0;
  o.replica_direct_io = true;
  return o;
}

// Batches of records at 4 KiB-aligned and at any offsets, of whole blocks and
// of any length (overlapping each other within a batch), zero and trim
// records, and a flush ending each batch.
std::vector<std::vector<proto::Record>> MixedBatches(uint64_t seed, int count, Reference* ref) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<proto::Record>> out;
  uint64_t seq = 0;
  for (int b = 0; b < count; ++b) {
    std::vector<proto::Record> batch;
    const int n = 1 + int(rng() % 24);
    for (int i = 0; i < n; ++i) {
      const bool aligned = rng() % 2;
      uint32_t len = aligned ? 4096u * uint32_t(1 + rng() % 12) : uint32_t(1 + rng() % 30000);
      uint64_t off = rng() % (kDirectVolSize - len + 1);
      if (aligned) off = off / 4096 * 4096;
      const int kind = int(rng() % 10);
      if (kind < 7) {
        batch.push_back(DataRecord(++seq, off, RandomBytes(len, rng())));
      } else {
        batch.push_back(ZeroRecord(++seq, off, len, kind == 9));
      }
    }
    batch.push_back(FlushRecord(++seq));
    ref->Apply(batch);
    out.push_back(std::move(batch));
  }
  return out;
}

// The first offset where `a` and `b` differ, or -1 (a readable failure for images).
int64_t FirstDiff(const Bytes& a, const Bytes& b) {
  if (a.size() != b.size()) return int64_t(std::min(a.size(), b.size()));
  auto m = std::mismatch(a.begin(), a.end(), b.begin());
  return m.first == a.end() ? -1 : int64_t(m.first - a.begin());
}

Bytes FileBytes(Env* env, const std::string& path, uint64_t size) {
  auto f = env->Open(path, OpenOptions{});
  REQUIRE(f.ok());
  Bytes b(size);
  REQUIRE((*f)->Read(0, size, b.data()).ok());
  return b;
}

}  // namespace

TEST_CASE(
    "direct I/O apply of aligned and unaligned records, zero and trim included: the replica, every point "
    "and rollbacks equal the reference",
    "[replica_io][volume]") {
  const bool posix = GENERATE(false, true);
  CAPTURE(posix);
  TestEnv te(posix);
  TempDir idx;
  ManualClock clock;
  Reference ref(kDirectVolSize);
  auto batches = MixedBatches(posix ? 21 : 22, 40, &ref);
  const VolumeIdentity id = DirectIdent();
  auto opts = DirectOpts(te.env(), te.root, idx.Join("index.db"), &clock);
  const std::string replica = opts.dir + "/replica.img";
  auto v = ReplicaVolume::Open(opts, &id);
  REQUIRE(v.ok());
  for (const auto& b : batches) {
    CAPTURE(b.back().seq);
    clock.Advance(1000);
    auto o = (*v)->ApplyBatch(b);
    REQUIRE(o.ok());
    REQUIRE(o->ack);
    // The replica file, read through a buffered handle, after every batch.
    REQUIRE(FirstDiff(FileBytes(te.env(), replica, kDirectVolSize), ref.ImageAt(b.back().seq)) == -1);
  }
  REQUIRE(te.violations.load() == 0);
  // Point reads: every sequence, whole and in part.
  std::mt19937_64 rng(3);
  for (uint64_t s = 0; s <= ref.last_seq(); s += 1 + rng() % 5) {
    Bytes img(kDirectVolSize);
    REQUIRE((*v)->ReadAt(s, 0, kDirectVolSize, img.data()).ok());
    REQUIRE(FirstDiff(img, ref.ImageAt(s)) == -1);
    const uint64_t off = rng() % kDirectVolSize, len = 1 + rng() % (kDirectVolSize - off);
    Bytes part(len);
    REQUIRE((*v)->ReadAt(s, off, len, part.data()).ok());
    REQUIRE(std::equal(part.begin(), part.end(), ref.ImageAt(s).begin() + long(off)));
  }
  // Rollback, then the replica is the image at the point; then a reopen still reads it.
  const uint64_t point = batches[batches.size() / 2].back().seq;
  REQUIRE((*v)->Rollback(point).ok());
  REQUIRE(FirstDiff(FileBytes(te.env(), replica, kDirectVolSize), ref.ImageAt(point)) == -1);
  v->reset();
  v = ReplicaVolume::Open(opts, nullptr);
  REQUIRE(v.ok());
  Bytes img(kDirectVolSize);
  REQUIRE((*v)->ReadAt(point, 0, kDirectVolSize, img.data()).ok());
  REQUIRE(FirstDiff(img, ref.ImageAt(point)) == -1);
  REQUIRE(te.violations.load() == 0);
}

TEST_CASE(
    "regression: records of one batch that overlap land in their order although direct writes are batched "
    "out of order",
    "[replica_io][volume]") {
  // Batched writes are not ordered (several in flight): a batch that writes
  // a block twice, or zeros part of what an earlier record wrote, must still
  // leave the last record's bytes. Apply writes the batch's final image.
  const bool posix = GENERATE(false, true);
  CAPTURE(posix);
  TestEnv te(posix);
  TempDir idx;
  ManualClock clock;
  const VolumeIdentity id = DirectIdent();
  auto opts = DirectOpts(te.env(), te.root, idx.Join("index.db"), &clock);
  auto v = ReplicaVolume::Open(opts, &id);
  REQUIRE(v.ok());
  Reference ref(kDirectVolSize);
  std::vector<proto::Record> b1{DataRecord(1, 0, RandomBytes(64 * 1024, 1)), FlushRecord(2)};
  std::vector<proto::Record> b2{DataRecord(3, 0, RandomBytes(16 * 1024, 2)),    // whole blocks over b1
                                DataRecord(4, 4096, RandomBytes(4096, 3)),      // the same block again
                                ZeroRecord(5, 4096 + 100, 200),                 // zeros inside it
                                DataRecord(6, 4096 + 150, RandomBytes(20, 4)),  // data inside the zeros
                                ZeroRecord(7, 8192, 3 * 4096, true),            // a trim over blocks 2-4
                                DataRecord(8, 3 * 4096 + 7, RandomBytes(9000, 5)),
                                DataRecord(9, 12 * 4096, RandomBytes(8192, 6)),
                                DataRecord(10, 12 * 4096, RandomBytes(8192, 7)),  // the same two blocks again
                                FlushRecord(11)};
  for (const auto* b : {&b1, &b2}) {
    ref.Apply(*b);
    auto o = (*v)->ApplyBatch(*b);
    REQUIRE(o.ok());
    REQUIRE(o->ack);
  }
  REQUIRE(FileBytes(te.env(), opts.dir + "/replica.img", kDirectVolSize) == ref.image());
  for (uint64_t s = 0; s <= 11; ++s) {
    Bytes img(kDirectVolSize);
    REQUIRE((*v)->ReadAt(s, 0, kDirectVolSize, img.data()).ok());
    REQUIRE(FirstDiff(img, ref.ImageAt(s)) == -1);
  }
  REQUIRE((*v)->Rollback(2).ok());
  REQUIRE(FileBytes(te.env(), opts.dir + "/replica.img", kDirectVolSize) == ref.ImageAt(2));
  REQUIRE(te.violations.load() == 0);
}

TEST_CASE("direct I/O apply: crash at every sync point, restart and resend, the replica equals the reference",
          "[replica_io][crash]") {
  Reference ref(kDirectVolSize);
  auto batches = MixedBatches(99, 10, &ref);
  const VolumeIdentity id = DirectIdent();
  bool finished = false;
  for (uint64_t n = 0; n < 200 && !finished; ++n) {
    CAPTURE(n);
    TempDir idx;
    auto mem = NewMemEnv();
    FaultEnv fault(mem.get());
    std::atomic<uint64_t> violations{0};
    StrictDirectEnv env(&fault, &violations);
    ManualClock clock;
    fault.SetCrashAfterSyncs(n);
    auto opts = DirectOpts(&env, "/t", idx.Join("i.db"), &clock);
    bool crashed = false;
    {
      auto v = ReplicaVolume::Open(opts, &id);
      if (!v.ok()) {
        crashed = true;
      } else {
        for (const auto& b : batches) {
          auto o = (*v)->ApplyBatch(b);
          if (!o.ok()) {
            crashed = true;
            break;
          }
          REQUIRE(o->ack);
        }
      }
    }
    crashed = crashed || fault.crashed();
    finished = !crashed;
    REQUIRE(fault.DropUnsyncedData().ok());
    fault.ClearErrors();
    auto v = ReplicaVolume::Open(opts, &id);
    REQUIRE(v.ok());
    const uint64_t durable = (*v)->applied_seq();
    REQUIRE(FileBytes(&env, "/t/dvol/replica.img", kDirectVolSize) == ref.ImageAt(durable));
    for (const auto& b : batches) {
      if (b.back().seq <= durable) continue;
      auto o = (*v)->ApplyBatch(b);
      REQUIRE(o.ok());
      REQUIRE(o->ack);
    }
    REQUIRE(FileBytes(&env, "/t/dvol/replica.img", kDirectVolSize) == ref.image());
    for (uint64_t s = 0; s <= ref.last_seq(); s += 7) {
      Bytes img(kDirectVolSize);
      REQUIRE((*v)->ReadAt(s, 0, kDirectVolSize, img.data()).ok());
      REQUIRE(FirstDiff(img, ref.ImageAt(s)) == -1);
    }
    REQUIRE(violations.load() == 0);
  }
  REQUIRE(finished);
}

// SPDX-License-Identifier: Apache-2.0
// Failover at the master target (issue 14, first slice): the volume's
// failed-over state and the promoted export's persistent overlay.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <set>

#include "common/base/clock.h"
#include "common/env/env.h"
#include "common/env/fault_env.h"
#include "master-target/export.h"
#include "master-target/replica_volume.h"
#include "master-target/tests/mt_test_util.h"

using namespace cdp;
using namespace cdp::mt;
using namespace cdp::mt::testing;

namespace {

// The upstream every open of these tests comes from.
const cdp::mt::Upstream kPs{"ps", "test-ps"};

constexpr uint64_t kVolSize = 256 * 1024;
constexpr uint32_t kBlock = 4096;

VolumeIdentity Ident() {
  VolumeIdentity id;
  id.name = "vol1";
  id.size = kVolSize;
  id.block_size = kBlock;
  id.uuid[0] = 0x5a;
  id.generation = 1;
  return id;
}

VolumeOptions Opts(Env* env, const Clock* clock, const std::string& index) {
  VolumeOptions o;
  o.env = env;
  o.clock = clock;
  o.dir = "/t/vol1";
  o.index_path = index;
  o.segment_bytes = 64 * 1024;
  o.point_interval_us = 0;
  return o;
}

Bytes ReplicaFile(Env* env) {
  auto f = env->Open("/t/vol1/replica.img", OpenOptions{});
  REQUIRE(f.ok());
  Bytes b(kVolSize);
  REQUIRE((*f)->Read(0, kVolSize, b.data()).ok());
  return b;
}

Bytes ReadDevice(PointInTimeDevice& d) {
  Bytes b(d.size());
  for (uint64_t off = 0; off < b.size(); off += 64 * 1024) {
    REQUIRE(d.Read(off, uint32_t(std::min<uint64_t>(64 * 1024, b.size() - off)), b.data() + off).ok());
  }
  return b;
}

// A protected volume with a tag point "before" at sequence 3 and more writes after it.
struct Protected {
  TempDir tmp;
  std::unique_ptr<Env> env = NewMemEnv();
  ManualClock clock;
  std::shared_ptr<ReplicaVolume> v;
  Reference ref{kVolSize};

  Protected() {
    auto o = ReplicaVolume::Open(Opts(env.get(), &clock, tmp.path() + "/index.db"), &kIdent());
    REQUIRE(o.ok());
    v = std::shared_ptr<ReplicaVolume>(std::move(*o));
    Apply({DataRecord(1, 0, Bytes(3 * kBlock, 0x11)), DataRecord(2, 8 * kBlock, Bytes(kBlock, 0x22)),
           TagRecord(3, "before")});
    Apply({DataRecord(4, kBlock, Bytes(kBlock, 0x44)), DataRecord(5, 20 * kBlock, Bytes(2 * kBlock, 0x55)),
           FlushRecord(6)});
  }
  void Apply(const std::vector<proto::Record>& b) {
    clock.Advance(1000);
    auto out = v->ApplyBatch(b);
    REQUIRE(out.ok());
    REQUIRE(out->ack);
    ref.Apply(b);
  }
  void Reopen() {
    v.reset();
    auto o = ReplicaVolume::Open(Opts(env.get(), &clock, tmp.path() + "/index.db"), nullptr);
    REQUIRE(o.ok());
    v = std::shared_ptr<ReplicaVolume>(std::move(*o));
  }
  static const VolumeIdentity& kIdent() {
    static const VolumeIdentity id = Ident();
    return id;
  }
};

}  // namespace

TEST_CASE("failover: the state persists across reopen, fences the old primary, and is idempotent", "[failover]") {
  Protected p;
  const Bytes replica_before = ReplicaFile(p.env.get());
  const int64_t tag_id = p.v->points().List().front().id;
  REQUIRE(p.v->points().List().front().seq == 3);

  auto f = p.v->Failover(3, tag_id);
  REQUIRE(f.ok());
  CHECK(*f);
  CHECK(p.v->fence().state() == VolumeState::kFailedOver);
  CHECK(std::string(StateName(p.v->fence().state())) == "failed-over");
  // Again at the same point: nothing changes; at another: a clear error.
  f = p.v->Failover(3, tag_id);
  REQUIRE(f.ok());
  CHECK_FALSE(*f);
  f = p.v->Failover(6, 0);
  REQUIRE_FALSE(f.ok());
  CHECK(f.status().code() == Code::kAlreadyExists);
  CHECK(f.status().message() == "vol1 is already failed over at sequence 3; undo it first (cdpctl failover vol1 --undo)");

  // Fenced: the old primary's open and batches are refused, nothing applied.
  const std::string fence =
      "failed over: volume vol1 failed over at the master target (point " + std::to_string(tag_id) +
      ", sequence 3); this stream is fenced and nothing of it is applied (an operator may undo: cdpctl failover vol1 "
      "--undo)";
  auto o = p.v->CheckOpen(Protected::kIdent(), kPs);
  REQUIRE(o.ok());
  REQUIRE_FALSE(o->ack);
  CHECK(o->reason == proto::NackReason::kWrongGeneration);
  CHECK(o->message == fence);
  CHECK(proto::IsFailedOverNack(proto::Nack{0, o->reason, 0, o->message}));
  auto a = p.v->ApplyBatch({DataRecord(7, 0, Bytes(kBlock, 0x77))});
  REQUIRE(a.ok());
  REQUIRE_FALSE(a->ack);
  CHECK(a->message == fence);
  CHECK(p.v->applied_seq() == 6);
  CHECK(ReplicaFile(p.env.get()) == replica_before);
  // Neither a rollback nor a re-protect can rewrite the kept branch meanwhile.
  CHECK(p.v->Rollback(3).code() == Code::kInvalidArgument);
  CHECK(p.v->ArmReprotect().status().code() == Code::kInvalidArgument);
  // Retention keeps the promoted point even when the policy would drop it.
  REQUIRE(p.v->SetRetention(RetentionPolicy{0, 1}).ok());
  REQUIRE(p.v->ApplyRetention().ok());
  Bytes img(kVolSize);
  REQUIRE(p.v->ReadAt(3, 0, kVolSize, img.data()).ok());
  CHECK(img == p.ref.ImageAt(3));

  // Survives a restart (the index is reopened as after a kill -9: nothing is
  // written at close).
  p.Reopen();
  CHECK(p.v->fence().state() == VolumeState::kFailedOver);
  auto info = p.v->fence().failover();
  REQUIRE(info);
  CHECK(info->point_seq == 3);
  CHECK(info->point_id == tag_id);
  CHECK_FALSE(info->committed);
  CHECK(p.v->GetStatus().failover->point_seq == 3);
  o = p.v->CheckOpen(Protected::kIdent(), kPs);
  REQUIRE((o.ok() && !o->ack && o->message == fence));

  // Undo: protecting again, replication resumes where it stood.
  auto u = p.v->UndoFailover();
  REQUIRE(u.ok());
  CHECK(*u);
  CHECK(p.v->fence().state() == VolumeState::kReplicating);
  CHECK(std::string(StateName(p.v->fence().state())) == "protecting");
  CHECK_FALSE(p.v->fence().failover());
  u = p.v->UndoFailover();
  REQUIRE(u.ok());
  CHECK_FALSE(*u);
  o = p.v->CheckOpen(Protected::kIdent(), kPs);
  REQUIRE((o.ok() && o->ack && o->durable_seq == 6));
  p.Apply({DataRecord(7, 0, Bytes(kBlock, 0x77))});
  CHECK(ReplicaFile(p.env.get()) == p.ref.image());
  p.Reopen();
  CHECK(p.v->fence().state() == VolumeState::kReplicating);
  CHECK_FALSE(p.v->fence().failover());

  // Commit: final; undo is refused from then on, also after a restart.
  CHECK(p.v->CommitFailover().status().code() == Code::kInvalidArgument);
  REQUIRE(p.v->Failover(7, 0).ok());
  auto c = p.v->CommitFailover();
  REQUIRE(c.ok());
  CHECK(*c);
  c = p.v->CommitFailover();
  REQUIRE(c.ok());
  CHECK_FALSE(*c);
  p.Reopen();
  REQUIRE(p.v->fence().failover());
  CHECK(p.v->fence().failover()->committed);
  u = p.v->UndoFailover();
  REQUIRE_FALSE(u.ok());
  CHECK(u.status().code() == Code::kAlreadyExists);
  CHECK(u.status().message() ==
        "vol1: the failover at sequence 7 is committed; undo is refused (failback brings the volume home)");
  CHECK(p.v->fence().state() == VolumeState::kFailedOver);
}

TEST_CASE("failover overlay: reads are the point's image plus the provider's writes, kept across reopen",
          "[failover][export]") {
  Protected p;
  Env* env = p.env.get();
  const Bytes replica_before = ReplicaFile(env);
  const std::string data = "/t/vol1/failover.cow", bitmap = "/t/vol1/failover.bitmap";
  auto d = PointInTimeDevice::OpenPersistent(p.v, 3, env, data, bitmap, true);
  REQUIRE(d.ok());
  CHECK((*d)->persistent());
  CHECK_FALSE((*d)->read_only());
  Bytes model = p.ref.ImageAt(3);
  REQUIRE(ReadDevice(**d) == model);

  std::mt19937_64 rng(7);
  std::set<uint64_t> touched;
  for (int i = 0; i < 200; ++i) {
    uint64_t off = 512 * (rng() % (kVolSize / 512));
    uint64_t len = std::min<uint64_t>(512 * (1 + rng() % 24), kVolSize - off);
    const int kind = int(rng() % 10);
    if (kind < 7) {
      Bytes b(len);
      for (auto& x : b) x = uint8_t(rng());
      REQUIRE((*d)->Write(off, b, rng() % 5 == 0).ok());
      std::memcpy(model.data() + off, b.data(), len);
    } else if (kind < 9) {
      REQUIRE((*d)->WriteZeroes(off, len, false, true).ok());
      std::memset(model.data() + off, 0, len);
    } else {
      REQUIRE((*d)->Trim(off, len, false).ok());
      std::memset(model.data() + off, 0, len);
    }
    for (uint64_t b = off / kBlock; b <= (off + len - 1) / kBlock; ++b) touched.insert(b);
    if (i % 50 == 0) REQUIRE(ReadDevice(**d) == model);
  }
  REQUIRE(ReadDevice(**d) == model);
  CHECK((*d)->overlay_blocks() == touched.size());
  REQUIRE((*d)->Flush().ok());
  // Nothing reached the replica; the current image is what was replicated.
  CHECK(ReplicaFile(env) == replica_before);
  d->reset();

  auto again = PointInTimeDevice::OpenPersistent(p.v, 3, env, data, bitmap, false);
  REQUIRE(again.ok());
  CHECK(ReadDevice(**again) == model);
  CHECK((*again)->overlay_blocks() == touched.size());
  again->reset();
  // An overlay is bound to its point and volume.
  auto wrong = PointInTimeDevice::OpenPersistent(p.v, 6, env, data, bitmap, false);
  REQUIRE_FALSE(wrong.ok());
  CHECK(wrong.status().code() == Code::kCorruption);
  // Undo discards it.
  REQUIRE(PointInTimeDevice::RemoveOverlay(env, data, bitmap).ok());
  CHECK_FALSE(env->Exists(data));
  CHECK_FALSE(env->Exists(bitmap));
  auto gone = PointInTimeDevice::OpenPersistent(p.v, 3, env, data, bitmap, false);
  CHECK_FALSE(gone.ok());
  auto fresh = PointInTimeDevice::OpenPersistent(p.v, 3, env, data, bitmap, true);
  REQUIRE(fresh.ok());
  CHECK(ReadDevice(**fresh) == p.ref.ImageAt(3));
  CHECK((*fresh)->overlay_blocks() == 0);
}

TEST_CASE("failover overlay: an acknowledged flush survives a power cut at every sync point", "[failover][fault]") {
  Protected p;  // the volume lives on its own env; the overlay on a FaultEnv
  const Bytes point = p.ref.ImageAt(3);
  // Writes, each followed (or not) by a flush; blocks 0-1 are rewritten.
  struct W {
    uint64_t off;
    uint64_t len;
    uint8_t fill;
    bool flush;
  };
  const std::vector<W> ws = {{100, 300, 0xa1, true},          {kBlock * 3, kBlock * 2, 0xa2, false},
                             {kBlock * 10 + 512, 1024, 0xa3, true}, {0, kBlock * 2, 0xa4, true},
                             {kBlock * 30, kBlock, 0xa5, false}};
  bool finished = false;
  uint64_t runs = 0;
  for (uint64_t n = 0; !finished; ++n) {
    auto mem = NewMemEnv();
    FaultEnv fault(mem.get());
    REQUIRE(fault.CreateDirs("/o").ok());
    fault.SetCrashAfterSyncs(n);
    size_t acked = 0;     // writes covered by a successful flush
    size_t attempted = 0;  // writes that returned ok
    bool created = false;
    {
      auto d = PointInTimeDevice::OpenPersistent(p.v, 3, &fault, "/o/failover.cow", "/o/failover.bitmap", true);
      if (d.ok()) {
        created = true;
        for (size_t i = 0; i < ws.size(); ++i) {
          if (!(*d)->Write(ws[i].off, Bytes(ws[i].len, ws[i].fill), false).ok()) break;
          attempted = i + 1;
          if (ws[i].flush) {
            if (!(*d)->Flush().ok()) break;
            acked = i + 1;
          }
        }
      }
    }
    finished = !fault.crashed();
    REQUIRE(fault.DropUnsyncedData().ok());
    ++runs;
    if (!created) continue;  // the failover never committed: nothing to find
    auto d = PointInTimeDevice::OpenPersistent(p.v, 3, &fault, "/o/failover.cow", "/o/failover.bitmap", false);
    REQUIRE(d.ok());
    const Bytes got = ReadDevice(**d);
    // Every byte is the point's, or written by a write that returned ok; a
    // byte last written by an acknowledged write holds exactly that.
    for (uint64_t off = 0; off < kVolSize; ++off) {
      std::vector<uint8_t> allowed{point[off]};
      for (size_t i = 0; i < ws.size(); ++i) {
        if (off < ws[i].off || off >= ws[i].off + ws[i].len) continue;
        if (i < acked) {
          allowed = {ws[i].fill};
        } else if (i < attempted) {
          allowed.push_back(ws[i].fill);
        }
      }
      INFO("n=" << n << " off=" << off << " acked=" << acked << " attempted=" << attempted);
      REQUIRE(std::find(allowed.begin(), allowed.end(), got[off]) != allowed.end());
    }
    // After the last flush, everything it covered is there exactly.
    if (finished) {
      Bytes model = point;
      for (const W& w : ws) std::memset(model.data() + w.off, w.fill, w.len);
      for (const W& w : ws) {
        if (!w.flush) continue;
        Bytes want(model.begin() + long(w.off), model.begin() + long(w.off + w.len));
        Bytes have(got.begin() + long(w.off), got.begin() + long(w.off + w.len));
        CHECK(have == want);
      }
    }
  }
  CHECK(runs > 6);  // creation's syncs, and two per flush
}

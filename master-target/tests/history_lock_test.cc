// SPDX-License-Identifier: Apache-2.0
// The history lock (master-target/history_lock.h) and the rollback that keeps
// what it rewinds (ReplicaVolume::Rollback): DESIGN.md invariants 9 and 10,
// issue #37.
#include <catch2/catch.hpp>

#include <random>

#include "common/base/clock.h"
#include "common/env/env.h"
#include "common/env/fault_env.h"
#include "common/store/sqlite.h"
#include "common/store/sqlite_vfs.h"
#include "master-target/history_lock.h"
#include "master-target/replica_volume.h"
#include "master-target/tests/mt_test_util.h"

using namespace cdp;
using namespace cdp::mt;
using namespace cdp::mt::testing;

namespace {

constexpr uint64_t kSize = 256 * 1024;
constexpr uint64_t kHour = 3'600'000'000ull;

VolumeIdentity LockIdent() {
  VolumeIdentity id;
  id.name = "locked";
  id.size = kSize;
  id.block_size = 4096;
  id.uuid[0] = 0x37;
  id.generation = 1;
  return id;
}

VolumeOptions LockOpts(Env* env, const Clock* clock, const std::string& index, RetentionPolicy pol) {
  VolumeOptions o;
  o.env = env;
  o.clock = clock;
  o.dir = "/t/locked";
  o.index_path = index;
  o.segment_bytes = 32 * 1024;
  o.point_interval_us = 0;
  o.retention = pol;
  return o;
}

Bytes Image(ReplicaVolume& v, uint64_t seq) {
  Bytes b(v.size());
  REQUIRE(v.ReadAt(seq, 0, b.size(), b.data()).ok());
  return b;
}

// Writes `n` batches of 16 KiB of fresh data at rotating offsets, each ending
// in a flush (a point), `step_us` apart. Returns false at the first batch
// the volume refuses (the nack is left in *refused).
bool Write(ReplicaVolume& v, ManualClock& clock, Reference& ref, uint64_t* seq, int n, std::mt19937_64& rng,
           ApplyOutcome* refused = nullptr, uint64_t step_us = 1'000'000) {
  for (int i = 0; i < n; ++i) {
    clock.Advance(step_us);
    Bytes d(16 * 1024);
    for (auto& x : d) x = uint8_t(rng() | 1);
    const uint64_t off = (rng() % (kSize / d.size())) * d.size();
    std::vector<proto::Record> b{DataRecord(*seq + 1, off, d), FlushRecord(*seq + 2)};
    auto o = v.ApplyBatch(b);
    REQUIRE(o.ok());
    if (!o->ack) {
      if (refused) *refused = *o;
      return false;
    }
    *seq += 2;
    ref.Apply(b);
  }
  return true;
}

uint64_t JournalBytes(ReplicaVolume& v) { return v.GetStatus().journal_bytes; }

}  // namespace

TEST_CASE("history lock: longer at once, shorter only after the old lock has passed, kept across reloads",
          "[lock]") {
  TempDir tmp;
  auto db = sqlite::Db::Open(tmp.path() + "/lock.db");
  REQUIRE(db.ok());
  uint64_t now = 1'000 * kHour;
  auto l = HistoryLock::Load(**db, 24 * kHour, now, "v");
  REQUIRE(l.ok());
  CHECK(l->EffectiveUs(now) == 24 * kHour);
  CHECK(l->Holds(now - 23 * kHour, now));
  CHECK_FALSE(l->Holds(now - 25 * kHour, now));
  // Longer: at once.
  REQUIRE(l->Configure(**db, 48 * kHour, now).ok());
  CHECK(l->EffectiveUs(now) == 48 * kHour);
  CHECK(l->pending_until_us(now) == 0);
  // Shorter: the 48 h lock holds for 48 h more.
  REQUIRE(l->Configure(**db, 1 * kHour, now).ok());
  CHECK(l->configured_us() == 1 * kHour);
  CHECK(l->EffectiveUs(now + 47 * kHour) == 48 * kHour);
  CHECK(l->pending_until_us(now) == now + 48 * kHour);
  CHECK(l->EffectiveUs(now + 48 * kHour) == 1 * kHour);
  // Reloaded with the short config (a restart): still waiting it out.
  auto again = HistoryLock::Load(**db, 1 * kHour, now + 10 * kHour, "v");
  REQUIRE(again.ok());
  CHECK(again->EffectiveUs(now + 10 * kHour) == 48 * kHour);
  // Shortened again meanwhile, to none: the longest pending window still holds.
  REQUIRE(again->Configure(**db, 0, now + 20 * kHour).ok());
  CHECK(again->EffectiveUs(now + 47 * kHour) == 48 * kHour);
  CHECK(again->EffectiveUs(now + 48 * kHour) == 0);
  CHECK_FALSE(again->Holds(now, now + 48 * kHour));
  // An index without a lock row (older than the lock) takes the config at once.
  auto fresh_db = sqlite::Db::Open(tmp.path() + "/old.db");
  REQUIRE(fresh_db.ok());
  auto fresh = HistoryLock::Load(**fresh_db, 2 * kHour, now, "v");
  REQUIRE(fresh.ok());
  CHECK(fresh->EffectiveUs(now) == 2 * kHour);
}

TEST_CASE("a flood of writes never drops a point inside the history lock: apply stops instead", "[lock][retention]") {
  TempDir tmp;
  auto env = NewMemEnv();
  ManualClock clock;
  clock.Set(1'000 * kHour);
  const uint64_t max_bytes = 128 * 1024;
  RetentionPolicy pol{0, max_bytes, kHour};
  auto opts = LockOpts(env.get(), &clock, tmp.path() + "/i.db", pol);
  const VolumeIdentity id = LockIdent();
  auto v = ReplicaVolume::Open(opts, &id);
  REQUIRE(v.ok());
  Reference ref(kSize);
  std::mt19937_64 rng(37);
  uint64_t seq = 0;
  // 10x the budget: the volume refuses before it is written, at the budget.
  ApplyOutcome refused;
  REQUIRE_FALSE(Write(**v, clock, ref, &seq, 10 * int(max_bytes / (16 * 1024)), rng, &refused));
  CHECK(refused.reason == proto::NackReason::kBusy);
  CHECK(refused.message.rfind("LOCKED: journal full inside the history lock", 0) == 0);
  const auto points = (*v)->points().List();
  REQUIRE(points.size() == seq / 2);  // every point written is kept
  CHECK(JournalBytes(**v) > max_bytes);
  CHECK(JournalBytes(**v) < max_bytes + 64 * 1024);  // over by at most a batch and a segment
  VolumeStatus st = (*v)->GetStatus();
  REQUIRE(st.stall);
  CHECK(st.stall->cause == StallCause::kHistoryLock);
  CHECK(ShownState(st) == "LOCKED: journal full inside the history lock");
  CHECK(st.lock_us == kHour);
  // Retention drops nothing either, and every point reads as it was.
  auto r = (*v)->ApplyRetention();
  REQUIRE(r.ok());
  CHECK(r->dropped_points.empty());
  CHECK(r->locked_over_budget);
  for (const auto& p : points) REQUIRE(Image(**v, p.seq) == ref.ImageAt(p.seq));

  SECTION("the admin raises the budget: apply resumes") {
    REQUIRE((*v)->SetRetention(RetentionPolicy{0, 100 * max_bytes, kHour}).ok());
    REQUIRE(Write(**v, clock, ref, &seq, 4, rng));
    CHECK_FALSE((*v)->GetStatus().stall);
    CHECK((*v)->points().List().size() == points.size() + 4);
  }
  SECTION("the lock window moves on: the oldest points go, apply resumes, the replica follows") {
    clock.Advance(kHour);
    REQUIRE(Write(**v, clock, ref, &seq, 4, rng));
    CHECK_FALSE((*v)->GetStatus().stall);
    CHECK(JournalBytes(**v) <= max_bytes + 64 * 1024);
    // What was dropped was outside the lock; what is left reads as it was.
    for (const auto& p : (*v)->points().List()) REQUIRE(Image(**v, p.seq) == ref.ImageAt(p.seq));
  }
  REQUIRE(Image(**v, (*v)->applied_seq()) == ref.image());
}

TEST_CASE("the lock survives a restart, and a shorter lock in the config drops nothing before the old one ends",
          "[lock][retention]") {
  TempDir tmp;
  auto env = NewMemEnv();
  ManualClock clock;
  clock.Set(1'000 * kHour);
  auto opts = LockOpts(env.get(), &clock, tmp.path() + "/i.db", RetentionPolicy{1'000'000, 0, 2 * kHour});
  const VolumeIdentity id = LockIdent();
  Reference ref(kSize);
  std::mt19937_64 rng(5);
  uint64_t seq = 0;
  {
    auto v = ReplicaVolume::Open(opts, &id);
    REQUIRE(v.ok());
    REQUIRE(Write(**v, clock, ref, &seq, 12, rng, nullptr, 60'000'000));
  }
  // Restarted with max_age 1 s and the lock cut to nothing.
  opts.retention.lock_us = 0;
  auto v = ReplicaVolume::Open(opts, &id);
  REQUIRE(v.ok());
  const auto points = (*v)->points().List();
  REQUIRE(points.size() == 12);
  CHECK((*v)->GetStatus().lock_us == 2 * kHour);
  CHECK((*v)->GetStatus().lock_pending_until_us == clock.WallMicros() + 2 * kHour);
  REQUIRE((*v)->ApplyRetention().ok());
  CHECK((*v)->points().List().size() == 12);
  // An hour later every point (the oldest is 71 minutes old) is still inside
  // the old 2 h lock, whatever the new config says.
  clock.Advance(kHour);
  REQUIRE((*v)->ApplyRetention().ok());
  CHECK((*v)->points().List().size() == 12);
  for (const auto& p : points) REQUIRE(Image(**v, p.seq) == ref.ImageAt(p.seq));
  // The old window has passed: max_age applies again.
  clock.Advance(kHour);
  auto r = (*v)->ApplyRetention();
  REQUIRE(r.ok());
  CHECK_FALSE(r->dropped_points.empty());
}

TEST_CASE("rollback keeps the branch it rewinds, and only an explicit discard outside the lock forgets it",
          "[lock][rollback]") {
  TempDir tmp;
  auto env = NewMemEnv();
  ManualClock clock;
  clock.Set(1'000 * kHour);
  auto opts = LockOpts(env.get(), &clock, tmp.path() + "/i.db", RetentionPolicy{0, 0, kHour});
  const VolumeIdentity id = LockIdent();
  auto v = ReplicaVolume::Open(opts, &id);
  REQUIRE(v.ok());
  Reference ref(kSize);
  std::mt19937_64 rng(9);
  uint64_t seq = 0;
  REQUIRE(Write(**v, clock, ref, &seq, 6, rng));
  const auto points = (*v)->points().List();
  REQUIRE(points.size() == 6);
  const RecoveryPoint target = points[1];

  // Discarding inside the lock is refused before anything is done.
  Status d = (*v)->Rollback(target.seq, true);
  REQUIRE(d.code() == Code::kAlreadyExists);
  CHECK((*v)->fence().state() == VolumeState::kReplicating);
  CHECK((*v)->applied_seq() == seq);

  REQUIRE((*v)->Rollback(target.seq).ok());
  CHECK((*v)->fence().state() == VolumeState::kFailedOver);
  CHECK(Image(**v, (*v)->applied_seq()) == ref.ImageAt(target.seq));
  auto after = (*v)->points().List();
  REQUIRE(after.size() == points.size() + 1);
  for (size_t i = 0; i < points.size(); ++i) {
    CHECK(after[i].id == points[i].id);
    CHECK(after[i].rolled_back == (points[i].seq > target.seq));
    REQUIRE(Image(**v, after[i].seq) == ref.ImageAt(after[i].seq));
  }
  CHECK(after.back().name == "rollback-to-" + std::to_string(target.seq));
  CHECK((*v)->GetStatus().rolled_back_points == 4);
  REQUIRE((*v)->points().Rollbacks().size() == 1);
  CHECK((*v)->points().Rollbacks()[0].from_seq == seq);

  // Reopened: the branch is still marked and readable.
  v->reset();
  v = ReplicaVolume::Open(opts, nullptr);
  REQUIRE(v.ok());
  after = (*v)->points().List();
  REQUIRE(after.size() == points.size() + 1);
  for (size_t i = 0; i < points.size(); ++i) CHECK(after[i].rolled_back == (points[i].seq > target.seq));

  // A second rollback, further back, with an explicit discard outside the
  // lock: the branch's points go, the older ones stay.
  clock.Advance(kHour + 1);
  REQUIRE((*v)->Rollback(points[0].seq, true).ok());
  after = (*v)->points().List();
  REQUIRE(after.size() == 2);
  CHECK(after[0].id == points[0].id);
  CHECK(after[1].name == "rollback-to-" + std::to_string(points[0].seq));
  CHECK(Image(**v, (*v)->applied_seq()) == ref.ImageAt(points[0].seq));
}

TEST_CASE("a power cut in the middle of a rollback: after restart it completed, with the branch intact",
          "[lock][rollback][fault]") {
  // Enough changed blocks that the rollback applies several batches.
  bool finished_once = false;
  int finished_at_restart = 0, never_started = 0;
  for (uint64_t n = 0; !finished_once && n < 400; ++n) {
    CAPTURE(n);
    TempDir tmp;
    auto mem = NewMemEnv();
    FaultEnv fault(mem.get());
    sqlite::EnvVfs vfs(&fault);
    ManualClock clock;
    clock.Set(1'000 * kHour);
    auto opts = LockOpts(&fault, &clock, "/t/locked/index.db", RetentionPolicy{0, 0, kHour});
    opts.index_vfs = vfs.name();
    opts.segment_bytes = 1 << 20;
    opts.rollback_batch_bytes = 64 * 1024;  // the rewind of 256 KiB is four batches
    const VolumeIdentity id = LockIdent();
    Reference ref(kSize);
    std::mt19937_64 rng(n);
    uint64_t seq = 0;
    std::vector<RecoveryPoint> points;
    uint64_t target = 0;
    {
      auto v = ReplicaVolume::Open(opts, &id);
      REQUIRE(v.ok());
      REQUIRE(Write(**v, clock, ref, &seq, 2, rng));
      target = seq;
      // The whole volume rewritten twice after the target: 512 KiB to rewind.
      for (int i = 0; i < 2; ++i) {
        Bytes all = RandomBytes(kSize, n * 7 + i);
        std::vector<proto::Record> b{DataRecord(seq + 1, 0, all), FlushRecord(seq + 2)};
        REQUIRE((*v)->ApplyBatch(b)->ack);
        ref.Apply(b);
        seq += 2;
      }
      points = (*v)->points().List();
      fault.SetCrashAfterSyncs(n);
      Status s = (*v)->Rollback(target);
      finished_once = s.ok() && !fault.crashed();
    }
    const bool crashed = !finished_once;
    REQUIRE(fault.DropUnsyncedData().ok());
    fault.ClearErrors();
    auto v = ReplicaVolume::Open(opts, nullptr);
    INFO(v.status().ToString());
    REQUIRE(v.ok());
    // Either the rollback never started (no row committed) or it is complete.
    const VolumeState state = (*v)->fence().state();
    if (state == VolumeState::kReplicating) {
      ++never_started;
      CHECK((*v)->applied_seq() == seq);
      CHECK(Image(**v, seq) == ref.image());
    } else {
      REQUIRE(state == VolumeState::kFailedOver);
      if (crashed) ++finished_at_restart;
      CHECK(Image(**v, (*v)->applied_seq()) == ref.ImageAt(target));
      REQUIRE((*v)->points().Rollbacks().size() == 1);
      CHECK((*v)->points().Rollbacks()[0].end_seq == (*v)->applied_seq());
    }
    // No point is lost either way, and each reads its image.
    auto after = (*v)->points().List();
    REQUIRE(after.size() >= points.size());
    for (size_t i = 0; i < points.size(); ++i) {
      REQUIRE(after[i].id == points[i].id);
      REQUIRE(Image(**v, points[i].seq) == ref.ImageAt(points[i].seq));
    }
  }
  REQUIRE(finished_once);
  CHECK(never_started > 0);
  CHECK(finished_at_restart > 4);  // cut inside the rewind's batches, and finished by the next Open
}

TEST_CASE("an anomaly record keeps the image before the attack as suspect-clean, held beyond retention until "
          "acknowledged",
          "[lock][anomaly]") {
  TempDir tmp;
  auto env = NewMemEnv();
  ManualClock clock;
  clock.Set(1'000 * kHour);
  // max_age 1 s and no lock: only the anomaly's hold keeps the point.
  auto opts = LockOpts(env.get(), &clock, tmp.path() + "/i.db", RetentionPolicy{1'000'000, 0, 0});
  opts.anomaly_hold_us = 2 * kHour;
  const VolumeIdentity id = LockIdent();
  auto v = ReplicaVolume::Open(opts, &id);
  REQUIRE(v.ok());
  Reference ref(kSize);
  std::mt19937_64 rng(41);
  uint64_t seq = 0;
  REQUIRE(Write(**v, clock, ref, &seq, 3, rng));
  // The attack: three random writes, the anomaly record names the image
  // before them (back = 4: the record is seq + 4, the clean image seq).
  const uint64_t clean = seq;
  std::vector<proto::Record> attack;
  for (int i = 0; i < 3; ++i) attack.push_back(DataRecord(seq + 1 + i, uint64_t(i) * 16384, RandomBytes(16384, i)));
  proto::Record anomaly;
  anomaly.seq = seq + 4;
  anomaly.kind = proto::RecordKind::kAnomaly;
  anomaly.data = proto::EncodeAnomaly(4, "change rate 52.3 MB/s (baseline 4.1 MB/s), 97% incompressible (baseline 31%)");
  attack.push_back(anomaly);
  {
    // A record pointing before the volume's first record is refused, nothing applied.
    std::vector<proto::Record> bad = attack;
    bad.back().data = proto::EncodeAnomaly(seq + 5, "x");
    auto o = (*v)->ApplyBatch(bad);
    REQUIRE(o.ok());
    REQUIRE_FALSE(o->ack);
    CHECK(o->reason == proto::NackReason::kBadRecord);
    CHECK((*v)->applied_seq() == seq);
  }
  ref.Apply(attack);
  auto o = (*v)->ApplyBatch(attack);
  REQUIRE((o.ok() && o->ack));
  seq += 4;
  auto anomalies = (*v)->points().Anomalies();
  REQUIRE(anomalies.size() == 1);
  CHECK(anomalies[0].clean_seq == clean);
  CHECK(anomalies[0].seq == seq);
  CHECK(anomalies[0].message.rfind("change rate 52.3 MB/s", 0) == 0);
  auto point = (*v)->points().Find(anomalies[0].point_id);
  REQUIRE(point);
  CHECK(point->name == "suspect-clean");
  CHECK(point->seq == clean);
  CHECK(Image(**v, point->seq) == ref.ImageAt(clean));
  // The points stay in sequence order, the suspect-clean one among them.
  const auto pts = (*v)->points().List();
  for (size_t i = 1; i < pts.size(); ++i) CHECK(pts[i - 1].seq <= pts[i].seq);
  CHECK((*v)->GetStatus().anomalies_open == 1);

  // An hour on, retention (max_age 1 s) drops every other point, not it.
  REQUIRE(Write(**v, clock, ref, &seq, 2, rng, nullptr, kHour));
  REQUIRE((*v)->ApplyRetention().ok());
  REQUIRE((*v)->points().Find(anomalies[0].point_id));
  CHECK(Image(**v, clean) == ref.ImageAt(clean));
  // Kept across a restart.
  v->reset();
  v = ReplicaVolume::Open(opts, nullptr);
  REQUIRE(v.ok());
  REQUIRE((*v)->points().Anomalies().size() == 1);
  REQUIRE((*v)->ApplyRetention().ok());
  REQUIRE((*v)->points().Find(anomalies[0].point_id));
  // Acknowledged by the admin: retention may take it.
  REQUIRE((*v)->AcknowledgeAnomaly(anomalies[0].id).value());
  CHECK_FALSE((*v)->AcknowledgeAnomaly(anomalies[0].id).value());
  CHECK((*v)->AcknowledgeAnomaly(99).status().code() == Code::kNotFound);
  CHECK((*v)->GetStatus().anomalies_open == 0);
  REQUIRE(Write(**v, clock, ref, &seq, 4, rng));  // the journal moves on a few segments
  REQUIRE((*v)->ApplyRetention().ok());
  CHECK_FALSE((*v)->points().Find(anomalies[0].point_id));
}

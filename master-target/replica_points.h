// SPDX-License-Identifier: Apache-2.0
// PointCatalogue: the recovery points of one replicated volume and what
// keeps them. A part of ReplicaVolume (master-target/replica_volume.h): the
// points (crash-consistent, tags, suspect-clean), the exports' pins, the
// rollbacks and the branches they left, the ransomware anomalies with their
// holds, the retention policy and the history lock
// (master-target/history_lock.h). Persisted in the volume's sqlite index
// (`points`, `rollbacks`, `anomalies`, `history_lock`; docs/formats/mt-index.md).
//
//   apply (a batch)  -- PointsOf --> NewPoints -- StageNew (in the batch's
//                                                  transaction) -- PublishNew
//   retention        -- Promised: the lowest sequence a point, pin, held
//                       anomaly or the lock keeps -- StageDropBelow / DropBelow
//   rollback         -- CheckRollback -- StageRollback / RollingBack ...
//                       StageRolledBack / RolledBack; DiscardBranch (admin)
//   exports          -- PointPin (AddPin / RemovePin)
//   operators        -- Acknowledge (an anomaly), SetPolicy, List, Find, ...
//
// Thread safety: every mutation but the pins runs with the owning
// ReplicaVolume's apply lock held (the one writer of the index); the state
// is published under this part's mutex, which every reader and the pins
// take. A leaf lock: nothing else is taken under it.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/base/clock.h"
#include "common/base/result.h"
#include "common/base/status.h"
#include "common/store/sqlite.h"
#include "common/wire/protocol.h"
#include "master-target/history_lock.h"
#include "master-target/replica_types.h"

namespace cdp::mt {

class PointCatalogue {
 public:
  struct Options {
    uint64_t point_interval_us = 5'000'000;  // VolumeOptions::point_interval_us
    bool points_require_flush = false;       // VolumeOptions::points_require_flush
    uint64_t anomaly_hold_us = 0;            // VolumeOptions::anomaly_hold_us
    RetentionPolicy retention;               // VolumeOptions::retention
  };
  // `db` and `clock` must outlive the catalogue.
  PointCatalogue(sqlite::Db* db, const Clock* clock, Options o) : db_(db), clock_(clock), o_(o) {}
  PointCatalogue(const PointCatalogue&) = delete;
  PointCatalogue& operator=(const PointCatalogue&) = delete;

  // At Open: the points, rollbacks and anomalies, and the history lock
  // (HistoryLock::Load with the policy's lock_us). sqlite's Status on failure.
  Status Load(const std::string& volume);

  // ---- Readers.
  std::vector<RecoveryPoint> List() const;  // ascending sequence
  std::optional<RecoveryPoint> Find(int64_t id) const;
  size_t count() const;
  std::vector<RollbackInfo> Rollbacks() const;
  std::vector<AnomalyEvent> Anomalies() const;  // oldest first
  RetentionPolicy policy() const;
  // The history lock in force at `now_us` (HistoryLock::EffectiveUs).
  uint64_t LockUs(uint64_t now_us) const;
  // Fills points, active_exports, lock_us, lock_pending_until_us,
  // rolled_back_points, anomalies_open and last_anomaly.
  void FillStatus(VolumeStatus* s, uint64_t now_us) const;
  struct Gauges {
    size_t points = 0;
    uint64_t oldest_applied_us = 0;  // 0: no point
    uint64_t lock_us = 0;
    int64_t anomalies_open = 0;
  };
  Gauges gauges(uint64_t now_us) const;

  // ---- Pins (any thread; PointPin). A pinned sequence is promised to
  // retention and refuses a rollback.
  void AddPin(uint64_t seq);
  void RemovePin(uint64_t seq);

  // ---- Apply lock held.
  // The points and anomalies of a batch's records recs[first..] (apply step
  // 5): crash-consistent points spaced point_interval_us apart by the host's
  // clock (a clock stepped back starts the spacing again), each at the first
  // flush -- or write, unless points_require_flush or the interval is 0 --
  // captured at least the interval after the last one; tags; and a
  // suspect-clean point per anomaly record (at its clean sequence, not below
  // `horizon`). `wall` is this MT's clock (applied_us). Only the records
  // decide, not how they were batched: every copy of the stream makes the
  // same points. A point at a write is as consistent as one at a flush: the
  // agent writes each write to the volume and numbers it under one lock,
  // before the write completes, so every prefix of the stream is the volume
  // as it was at one instant, a state a power cut could have left
  // (docs/recovery.md, "Points without flushes").
  struct NewPoints {
    std::vector<RecoveryPoint> points;
    // Each anomaly's point_id is the index of its point in `points` until
    // StageNew makes it the point's id.
    std::vector<AnomalyEvent> anomalies;
  };
  NewPoints PointsOf(const std::vector<proto::Record>& recs, size_t first, uint64_t wall, uint64_t horizon) const;
  // Inside the batch's transaction: inserts them and fills in their ids.
  Status StageNew(const sqlite::Transaction& tx, NewPoints* n);
  // After the commit: they are listed.
  void PublishNew(NewPoints n);

  // An admin's acknowledgement (ReplicaVolume::AcknowledgeAnomaly).
  Result<bool> Acknowledge(int64_t id);
  // Replaces the policy (the lock as HistoryLock::Configure says). The lock's
  // sqlite Status on failure, and then the old policy stays.
  Status SetPolicy(const RetentionPolicy& p);

  // Retention: the lowest sequence promised given the journal's segments
  // (ascending; `current` is the one being written) at `wall` -- a point
  // younger than max_age whose journal fits max_bytes, a point inside the
  // history lock, a pin, a held anomaly's suspect-clean point -- and whether a
  // point inside the lock keeps the journal over max_bytes.
  struct Promise {
    uint64_t min_seq = UINT64_MAX;
    bool locked_over_budget = false;
  };
  Promise Promised(const std::vector<SegmentInfo>& segs, uint64_t current, uint64_t wall) const;
  // Ids of the points below `seq` (what a horizon at `seq` breaks).
  std::vector<int64_t> Below(uint64_t seq) const;
  Status StageDropBelow(const sqlite::Transaction& tx, uint64_t seq);
  void DropBelow(uint64_t seq);

  // Rollback to `to` from the applied sequence `from`: kBusy while exports
  // are pinned; with `discard`, kAlreadyExists when a point of the branch is
  // inside the history lock or a held anomaly's point is on it.
  Status CheckRollback(uint64_t to, uint64_t from, bool discard, uint64_t wall) const;
  // Inside the rollback's first transaction / after its commit: the rollback
  // is recorded, its branch's points are marked rolled back.
  Status StageRollback(const sqlite::Transaction& tx, const RollbackInfo& r);
  void RollingBack(const RollbackInfo& r);
  // Inside its last transaction / after its commit: the rollback ended at `end_seq`.
  Status StageRolledBack(const sqlite::Transaction& tx, uint64_t end_seq);
  void RolledBack(uint64_t end_seq);
  // An admin's discard of the branch (to, from]: its points go (autocommit).
  // Returns how many.
  Result<size_t> DiscardBranch(uint64_t to, uint64_t from);

 private:
  void MarkRolledBack();  // mu_ held

  sqlite::Db* const db_;
  const Clock* const clock_;
  std::string name_;  // the volume's, for messages (set by Load)

  mutable std::mutex mu_;  // readers and pins; writers hold the apply lock too
  Options o_;
  std::vector<RecoveryPoint> points_;  // ascending seq (a suspect-clean point is older than its id)
  std::multiset<uint64_t> pins_;
  HistoryLock lock_;
  std::vector<RollbackInfo> rollbacks_;
  std::vector<AnomalyEvent> anomalies_;
};

// Keeps a point readable (retention will not drop what it needs, rollback is
// refused) while alive. Must not outlive its catalogue (its ReplicaVolume).
class PointPin {
 public:
  PointPin(PointCatalogue* c, uint64_t seq) : c_(c), seq_(seq) { c_->AddPin(seq_); }
  ~PointPin() { c_->RemovePin(seq_); }
  PointPin(const PointPin&) = delete;
  PointPin& operator=(const PointPin&) = delete;
  uint64_t seq() const { return seq_; }

 private:
  PointCatalogue* c_;
  uint64_t seq_;
};

}  // namespace cdp::mt

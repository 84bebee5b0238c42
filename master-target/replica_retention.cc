#include "master-target/replica_volume.h"

#include <algorithm>
#include <limits>

#include "common/log.h"
#include "common/sqlite.h"

namespace cdp::mt {

Result<RetentionResult> ReplicaVolume::ApplyRetention() {
  std::lock_guard<std::mutex> lk(apply_mu_);
  RetentionResult res;
  res.horizon_seq = horizon_;
  const RetentionPolicy& pol = o_.retention;
  CDP_RETURN_IF_ERROR(HealLocked());
  if (pol.max_age_us == 0 && pol.max_bytes == 0) return res;
  const uint64_t wall = o_.clock->WallMicros();
  const uint64_t cur = writer_->segment();
  std::map<uint64_t, SegmentInfo> segs;
  std::vector<RecoveryPoint> points;
  std::multiset<uint64_t> pins;
  {
    std::lock_guard<std::mutex> mk(meta_mu_);
    segs = segments_;
    points = points_;
    pins = pins_;
  }
  uint64_t promised_min = std::numeric_limits<uint64_t>::max();
  for (const RecoveryPoint& p : points) {
    bool time_ok = pol.max_age_us == 0 || p.time_us + pol.max_age_us >= wall;
    uint64_t need = 0;
    for (const auto& [seg, si] : segs) {
      if (seg == cur || si.max_seq > p.seq) need += si.bytes;
    }
    bool bytes_ok = pol.max_bytes == 0 || need <= pol.max_bytes;
    if (time_ok && bytes_ok) promised_min = std::min(promised_min, p.seq);
  }
  for (uint64_t pin : pins) promised_min = std::min(promised_min, pin);
  if (failover_) promised_min = std::min(promised_min, failover_->point_seq);
  uint64_t last_dropped = 0, new_horizon = horizon_;
  for (const auto& [seg, si] : segs) {
    if (seg == cur || si.max_seq > promised_min) break;
    res.dropped_segments.push_back(seg);
    last_dropped = seg;
    new_horizon = std::max(new_horizon, si.max_seq);
  }
  if (res.dropped_segments.empty()) return res;
  for (const RecoveryPoint& p : points) {
    if (p.seq < new_horizon) res.dropped_points.push_back(p.id);
  }
  {
    // Readers of points below the new horizon are refused from now on, before
    // the undo records they would need leave the index. (The points promised
    // or pinned are all at or above it.)
    auto ik = LockIndexExclusive();
    horizon_ = new_horizon;
  }
  {
    Status s = [&]() -> Status {
      CDP_ASSIGN_OR_RETURN(auto tx, sqlite::Transaction::Begin(*db_));
      // Records at or below the horizon are never read again (a record's undo
      // chunks may also lie in the first segment kept).
      CDP_RETURN_IF_ERROR(undo_->RemoveUpTo(new_horizon));
      CDP_ASSIGN_OR_RETURN(auto d1, db_->Prepare("DELETE FROM segments WHERE segment <= ?1"));
      CDP_RETURN_IF_ERROR(d1.BindAll(last_dropped));
      CDP_RETURN_IF_ERROR(d1.Run());
      CDP_ASSIGN_OR_RETURN(auto d2, db_->Prepare("DELETE FROM points WHERE seq < ?1"));
      CDP_RETURN_IF_ERROR(d2.BindAll(new_horizon));
      CDP_RETURN_IF_ERROR(d2.Run());
      CDP_ASSIGN_OR_RETURN(auto up, db_->Prepare("UPDATE volume SET horizon_seq = ?1 WHERE id = 1"));
      CDP_RETURN_IF_ERROR(up.BindAll(new_horizon));
      CDP_RETURN_IF_ERROR(up.Run());
      return tx.Commit();
    }();
    if (!s.ok()) {
      auto ik = LockIndexExclusive();
      undo_->Discarded();
      return s;
    }
  }
  {
    auto ik = LockIndexExclusive();
    undo_->Committed();
    for (uint64_t seg : res.dropped_segments) seg_files_.erase(seg);
  }
  {
    std::lock_guard<std::mutex> mk(meta_mu_);
    for (uint64_t seg : res.dropped_segments) segments_.erase(seg);
    points_.erase(std::remove_if(points_.begin(), points_.end(),
                                 [&](const RecoveryPoint& x) { return x.seq < new_horizon; }),
                  points_.end());
  }
  for (uint64_t seg : res.dropped_segments) {
    CDP_RETURN_IF_ERROR(o_.env->Remove(JoinPath(JournalDir(), SegmentFileName(seg))));
  }
  CDP_RETURN_IF_ERROR(o_.env->SyncDir(JournalDir()));
  res.horizon_seq = new_horizon;
  log::Get("mt.volume")->info("{} retention dropped {} segments and {} points; horizon {}",
                              log::Where{id_.name, "", applied_.load()}, res.dropped_segments.size(),
                              res.dropped_points.size(), new_horizon);
  UpdateGauges();
  return res;
}

void ReplicaVolume::SetRetention(const RetentionPolicy& policy) {
  std::lock_guard<std::mutex> lk(apply_mu_);
  o_.retention = policy;
}

RetentionPolicy ReplicaVolume::retention() const {
  std::lock_guard<std::mutex> lk(apply_mu_);
  return o_.retention;
}

}  // namespace cdp::mt

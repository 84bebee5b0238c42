// SPDX-License-Identifier: Apache-2.0
#include "master-target/replica_points.h"

#include <algorithm>

#include "common/base/log.h"

namespace cdp::mt {

Status PointCatalogue::Load(const std::string& volume) {
  name_ = volume;
  std::vector<RecoveryPoint> points;
  {
    CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare("SELECT id, seq, time_us, kind, name, applied_us FROM points ORDER BY seq, id"));
    for (;;) {
      CDP_ASSIGN_OR_RETURN(bool row, st.Step());
      if (!row) break;
      RecoveryPoint p;
      p.id = st.ColumnInt64(0);
      p.seq = uint64_t(st.ColumnInt64(1));
      p.time_us = uint64_t(st.ColumnInt64(2));
      p.kind = st.ColumnInt64(3) == int64_t(PointKind::kTag) ? PointKind::kTag : PointKind::kCrash;
      p.name = st.ColumnText(4);
      p.applied_us = uint64_t(st.ColumnInt64(5));
      if (p.applied_us == 0) p.applied_us = p.time_us;  // made before the column
      points.push_back(std::move(p));
    }
  }
  std::vector<RollbackInfo> rollbacks;
  {
    // CreateIndexSchema made the table for indexes older than non-destructive rollback.
    CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare("SELECT to_seq, from_seq, end_seq, time_us FROM rollbacks ORDER BY id"));
    for (;;) {
      CDP_ASSIGN_OR_RETURN(bool row, st.Step());
      if (!row) break;
      rollbacks.push_back(RollbackInfo{uint64_t(st.ColumnInt64(0)), uint64_t(st.ColumnInt64(1)),
                                       uint64_t(st.ColumnInt64(2)), uint64_t(st.ColumnInt64(3))});
    }
  }
  std::vector<AnomalyEvent> anomalies;
  {
    CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare(
        "SELECT id, seq, clean_seq, point_id, time_us, message, acknowledged, hold_until_us FROM anomalies ORDER BY id"));
    for (;;) {
      CDP_ASSIGN_OR_RETURN(bool row, st.Step());
      if (!row) break;
      AnomalyEvent a;
      a.id = st.ColumnInt64(0);
      a.seq = uint64_t(st.ColumnInt64(1));
      a.clean_seq = uint64_t(st.ColumnInt64(2));
      a.point_id = st.ColumnInt64(3);
      a.time_us = uint64_t(st.ColumnInt64(4));
      a.message = st.ColumnText(5);
      a.acknowledged = st.ColumnInt64(6) != 0;
      a.hold_until_us = uint64_t(st.ColumnInt64(7));
      anomalies.push_back(std::move(a));
    }
  }
  CDP_ASSIGN_OR_RETURN(HistoryLock lock, HistoryLock::Load(*db_, o_.retention.lock_us, clock_->WallMicros(), volume));
  std::lock_guard<std::mutex> lk(mu_);
  points_ = std::move(points);
  rollbacks_ = std::move(rollbacks);
  anomalies_ = std::move(anomalies);
  lock_ = std::move(lock);
  MarkRolledBack();
  return Status::OK();
}

std::vector<RecoveryPoint> PointCatalogue::List() const {
  std::lock_guard<std::mutex> lk(mu_);
  return points_;
}

std::optional<RecoveryPoint> PointCatalogue::Find(int64_t id) const {
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& p : points_) {
    if (p.id == id) return p;
  }
  return std::nullopt;
}

size_t PointCatalogue::count() const {
  std::lock_guard<std::mutex> lk(mu_);
  return points_.size();
}

std::vector<RollbackInfo> PointCatalogue::Rollbacks() const {
  std::lock_guard<std::mutex> lk(mu_);
  return rollbacks_;
}

std::vector<AnomalyEvent> PointCatalogue::Anomalies() const {
  std::lock_guard<std::mutex> lk(mu_);
  return anomalies_;
}

RetentionPolicy PointCatalogue::policy() const {
  std::lock_guard<std::mutex> lk(mu_);
  return o_.retention;
}

uint64_t PointCatalogue::LockUs(uint64_t now_us) const {
  std::lock_guard<std::mutex> lk(mu_);
  return lock_.EffectiveUs(now_us);
}

void PointCatalogue::FillStatus(VolumeStatus* s, uint64_t now) const {
  std::lock_guard<std::mutex> lk(mu_);
  s->points = points_.size();
  s->active_exports = pins_.size();
  s->lock_us = lock_.EffectiveUs(now);
  s->lock_pending_until_us = lock_.pending_until_us(now);
  for (const RecoveryPoint& p : points_) s->rolled_back_points += p.rolled_back ? 1 : 0;
  for (const AnomalyEvent& a : anomalies_) s->anomalies_open += a.Holds(now) ? 1 : 0;
  if (!anomalies_.empty()) s->last_anomaly = anomalies_.back().message;
}

PointCatalogue::Gauges PointCatalogue::gauges(uint64_t now) const {
  Gauges g;
  std::lock_guard<std::mutex> lk(mu_);
  g.points = points_.size();
  if (!points_.empty()) g.oldest_applied_us = points_.front().applied_us;
  g.lock_us = lock_.EffectiveUs(now);
  for (const AnomalyEvent& a : anomalies_) g.anomalies_open += a.Holds(now) ? 1 : 0;
  return g;
}

void PointCatalogue::AddPin(uint64_t seq) {
  std::lock_guard<std::mutex> lk(mu_);
  pins_.insert(seq);
}

void PointCatalogue::RemovePin(uint64_t seq) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = pins_.find(seq);
  if (it != pins_.end()) pins_.erase(it);
}

PointCatalogue::NewPoints PointCatalogue::PointsOf(const std::vector<proto::Record>& recs, size_t first, uint64_t wall,
                                                   uint64_t horizon) const {
  NewPoints n;
  // A point carries the time the protected host wrote it (the record's
  // capture time, from the agent's clock; issue 38 F4) and, beside it, the
  // time it was applied here. Crash-consistent points are spaced by the
  // host's clock too, so every copy of the volume makes the same points from
  // the same stream, whatever its backlog was. Retention and the history
  // lock go by the apply time: a host's clock cannot age its own history.
  uint64_t last_crash = 0;  // host time of the newest crash-consistent point
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto it = points_.rbegin(); it != points_.rend(); ++it) {
      if (it->kind == PointKind::kCrash) {
        last_crash = it->time_us;
        break;
      }
    }
  }
  auto written = [&](const proto::Record& r) { return r.timestamp_us != 0 ? r.timestamp_us : wall; };
  const bool at_writes = !o_.points_require_flush && o_.point_interval_us > 0;
  for (size_t i = first; i < recs.size(); ++i) {
    const proto::Record& r = recs[i];
    const uint64_t when = written(r);
    if (r.kind == proto::RecordKind::kFlush || (at_writes && proto::IsWriteKind(r.kind))) {
      // A host clock stepped back starts the spacing again.
      if (last_crash == 0 || when >= last_crash + o_.point_interval_us || when < last_crash) {
        n.points.push_back(RecoveryPoint{0, r.seq, when, PointKind::kCrash, "", false, wall});
        last_crash = when;
      }
    } else if (r.kind == proto::RecordKind::kTag) {
      n.points.push_back(RecoveryPoint{0, r.seq, when, PointKind::kTag,
                                       std::string(reinterpret_cast<const char*>(r.data.data()), r.data.size()),
                                       false, wall});
    } else if (r.kind == proto::RecordKind::kAnomaly) {
      AnomalyEvent a;
      uint64_t back = 0;
      (void)proto::DecodeAnomaly(r.data, &back, &a.message);  // checked by ApplyBatch
      a.seq = r.seq;
      a.clean_seq = std::max(r.seq - std::min(back, r.seq), horizon);
      a.point_id = int64_t(n.points.size());  // StageNew makes it the point's id
      a.time_us = wall;
      a.hold_until_us = wall + o_.anomaly_hold_us;
      n.points.push_back(RecoveryPoint{0, a.clean_seq, when, PointKind::kTag, "suspect-clean", false, wall});
      log::Get("mt.volume")->warn("{} possible ransomware at the protected host: {}; the image at sequence {} is "
                                  "kept as the point suspect-clean",
                                  log::Where{name_, "", r.seq}, a.message, a.clean_seq);
      n.anomalies.push_back(std::move(a));
    }
  }
  return n;
}

Status PointCatalogue::StageNew(const sqlite::Transaction&, NewPoints* n) {
  if (!n->points.empty()) {
    CDP_ASSIGN_OR_RETURN(auto ins, db_->Prepare(
        "INSERT INTO points(seq, time_us, kind, name, applied_us) VALUES(?1, ?2, ?3, ?4, ?5)"));
    for (RecoveryPoint& p : n->points) {
      CDP_RETURN_IF_ERROR(ins.Reset());
      CDP_RETURN_IF_ERROR(ins.BindAll(p.seq, p.time_us, int64_t(p.kind), p.name, p.applied_us));
      CDP_RETURN_IF_ERROR(ins.Run());
      p.id = db_->LastInsertRowId();
    }
  }
  if (!n->anomalies.empty()) {
    CDP_ASSIGN_OR_RETURN(auto ins, db_->Prepare(
        "INSERT INTO anomalies(seq, clean_seq, point_id, time_us, message, acknowledged, hold_until_us)"
        " VALUES(?1, ?2, ?3, ?4, ?5, 0, ?6)"));
    for (AnomalyEvent& a : n->anomalies) {
      a.point_id = n->points[size_t(a.point_id)].id;
      CDP_RETURN_IF_ERROR(ins.Reset());
      CDP_RETURN_IF_ERROR(ins.BindAll(a.seq, a.clean_seq, a.point_id, a.time_us, a.message, a.hold_until_us));
      CDP_RETURN_IF_ERROR(ins.Run());
      a.id = db_->LastInsertRowId();
    }
  }
  return Status::OK();
}

void PointCatalogue::PublishNew(NewPoints n) {
  if (n.points.empty() && n.anomalies.empty()) return;
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& p : n.points) {
    auto at = std::upper_bound(points_.begin(), points_.end(), p.seq,
                               [](uint64_t seq, const RecoveryPoint& q) { return seq < q.seq; });
    points_.insert(at, std::move(p));
  }
  for (auto& a : n.anomalies) anomalies_.push_back(std::move(a));
}

Result<bool> PointCatalogue::Acknowledge(int64_t id) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = std::find_if(anomalies_.begin(), anomalies_.end(), [&](const AnomalyEvent& a) { return a.id == id; });
    if (it == anomalies_.end()) return Status::NotFound(name_ + ": no anomaly " + std::to_string(id));
    if (it->acknowledged) return false;
  }
  CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare("UPDATE anomalies SET acknowledged = 1 WHERE id = ?1"));
  CDP_RETURN_IF_ERROR(st.BindAll(id));
  CDP_RETURN_IF_ERROR(st.Run());
  std::lock_guard<std::mutex> lk(mu_);
  for (AnomalyEvent& a : anomalies_) {
    if (a.id == id) a.acknowledged = true;
  }
  return true;
}

Status PointCatalogue::SetPolicy(const RetentionPolicy& p) {
  std::lock_guard<std::mutex> lk(mu_);
  CDP_RETURN_IF_ERROR(lock_.Configure(*db_, p.lock_us, clock_->WallMicros()));
  o_.retention = p;
  return Status::OK();
}

PointCatalogue::Promise PointCatalogue::Promised(const std::vector<SegmentInfo>& segs, uint64_t cur,
                                                 uint64_t wall) const {
  Promise res;
  std::lock_guard<std::mutex> lk(mu_);
  const RetentionPolicy& pol = o_.retention;
  // need(p): the bytes of every segment holding a record newer than p, the
  // current one included. Segments and points both ascend by sequence, so
  // one pass over each (the current segment is the last).
  std::vector<uint64_t> suffix(segs.size() + 1, 0);
  for (size_t i = segs.size(); i-- > 0;) suffix[i] = suffix[i + 1] + segs[i].bytes;
  size_t first_needed = 0;  // the first segment with a record newer than the point
  for (const RecoveryPoint& p : points_) {
    while (first_needed < segs.size() && segs[first_needed].segment != cur && segs[first_needed].max_seq <= p.seq)
      ++first_needed;
    const bool time_ok = pol.max_age_us == 0 || p.applied_us + pol.max_age_us >= wall;
    const bool bytes_ok = pol.max_bytes == 0 || suffix[first_needed] <= pol.max_bytes;
    const bool locked = lock_.Holds(p.applied_us, wall);
    if ((time_ok && bytes_ok) || locked) res.min_seq = std::min(res.min_seq, p.seq);
    if (locked && !bytes_ok) res.locked_over_budget = true;
  }
  for (uint64_t pin : pins_) res.min_seq = std::min(res.min_seq, pin);
  // A suspect-clean point is held for anomaly_hold unless acknowledged.
  for (const AnomalyEvent& a : anomalies_) {
    if (a.Holds(wall)) res.min_seq = std::min(res.min_seq, a.clean_seq);
  }
  return res;
}

std::vector<int64_t> PointCatalogue::Below(uint64_t seq) const {
  std::vector<int64_t> ids;
  std::lock_guard<std::mutex> lk(mu_);
  for (const RecoveryPoint& p : points_) {
    if (p.seq < seq) ids.push_back(p.id);
  }
  return ids;
}

Status PointCatalogue::StageDropBelow(const sqlite::Transaction&, uint64_t seq) {
  CDP_ASSIGN_OR_RETURN(auto d, db_->Prepare("DELETE FROM points WHERE seq < ?1"));
  CDP_RETURN_IF_ERROR(d.BindAll(seq));
  return d.Run();
}

void PointCatalogue::DropBelow(uint64_t seq) {
  std::lock_guard<std::mutex> lk(mu_);
  points_.erase(std::remove_if(points_.begin(), points_.end(), [&](const RecoveryPoint& x) { return x.seq < seq; }),
                points_.end());
}

Status PointCatalogue::CheckRollback(uint64_t to, uint64_t from, bool discard, uint64_t wall) const {
  std::lock_guard<std::mutex> lk(mu_);
  if (!pins_.empty()) return Status::Busy(name_ + ": exports are open; remove them before a rollback");
  if (!discard) return Status::OK();
  for (const RecoveryPoint& p : points_) {
    if (p.seq > to && p.seq <= from && lock_.Holds(p.applied_us, wall))
      return Status::AlreadyExists(name_ + ": point " + std::to_string(p.id) + " after sequence " + std::to_string(to) +
                                   " is inside the history lock (" + std::to_string(lock_.EffectiveUs(wall) / 1'000'000) +
                                   " s); its history cannot be discarded before the lock lets it go");
  }
  for (const AnomalyEvent& a : anomalies_) {
    if (a.Holds(wall) && a.clean_seq > to && a.clean_seq <= from)
      return Status::AlreadyExists(name_ + ": the suspect-clean point of anomaly " + std::to_string(a.id) +
                                   " is after sequence " + std::to_string(to) +
                                   "; acknowledge the anomaly before discarding its history");
  }
  return Status::OK();
}

Status PointCatalogue::StageRollback(const sqlite::Transaction&, const RollbackInfo& r) {
  CDP_ASSIGN_OR_RETURN(auto ins, db_->Prepare(
      "INSERT INTO rollbacks(to_seq, from_seq, end_seq, time_us) VALUES(?1, ?2, 0, ?3)"));
  CDP_RETURN_IF_ERROR(ins.BindAll(r.to_seq, r.from_seq, r.time_us));
  return ins.Run();
}

void PointCatalogue::RollingBack(const RollbackInfo& r) {
  std::lock_guard<std::mutex> lk(mu_);
  rollbacks_.push_back(r);
  MarkRolledBack();
}

Status PointCatalogue::StageRolledBack(const sqlite::Transaction&, uint64_t end_seq) {
  CDP_ASSIGN_OR_RETURN(auto up, db_->Prepare("UPDATE rollbacks SET end_seq = ?1 WHERE end_seq = 0"));
  CDP_RETURN_IF_ERROR(up.BindAll(end_seq));
  return up.Run();
}

void PointCatalogue::RolledBack(uint64_t end_seq) {
  std::lock_guard<std::mutex> lk(mu_);
  for (RollbackInfo& r : rollbacks_) {
    if (r.end_seq == 0) r.end_seq = end_seq;
  }
}

Result<size_t> PointCatalogue::DiscardBranch(uint64_t to, uint64_t from) {
  {
    CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare("DELETE FROM points WHERE seq > ?1 AND seq <= ?2"));
    CDP_RETURN_IF_ERROR(st.BindAll(to, from));
    CDP_RETURN_IF_ERROR(st.Run());
  }
  std::lock_guard<std::mutex> lk(mu_);
  const size_t before = points_.size();
  points_.erase(std::remove_if(points_.begin(), points_.end(),
                               [&](const RecoveryPoint& x) { return x.seq > to && x.seq <= from; }),
                points_.end());
  return before - points_.size();
}

void PointCatalogue::MarkRolledBack() {
  for (RecoveryPoint& p : points_) {
    p.rolled_back = std::any_of(rollbacks_.begin(), rollbacks_.end(),
                                [&](const RollbackInfo& r) { return p.seq > r.to_seq && p.seq <= r.from_seq; });
  }
}

}  // namespace cdp::mt

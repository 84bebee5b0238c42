// SPDX-License-Identifier: Apache-2.0
#include "master-target/replica_volume.h"

#include <algorithm>

#include "common/base/log.h"
#include "common/store/sqlite.h"

namespace cdp::mt {

namespace {
constexpr uint64_t kRollbackRecordBytes = 64u << 10;  // one record: at most this much of the image at the point

bool AllZero(const Bytes& b) {
  return std::all_of(b.begin(), b.end(), [](uint8_t x) { return x == 0; });
}
}  // namespace

Status ReplicaVolume::Rollback(uint64_t point_seq, bool discard_history) {
  std::lock_guard<std::mutex> lk(apply_mu_);
  if (broken_) return Status::IOError(id_.name + ": volume needs to be reopened after an I/O failure");
  if (failover_)
    return Status::InvalidArgument(id_.name + " is failed over at sequence " + std::to_string(failover_->point_seq) +
                                   " (cdpctl failover); a rollback would rewrite the kept branch");
  if (state_ == VolumeState::kFailingBack || state_ == VolumeState::kFailedBack)
    return Status::InvalidArgument(id_.name + " is " + StateName(state_) + "; re-protect it before a rollback");
  const uint64_t from = applied_.load();
  const uint64_t wall = o_.clock->WallMicros();
  {
    std::lock_guard<std::mutex> mk(meta_mu_);
    if (!pins_.empty()) return Status::Busy(id_.name + ": exports are open; remove them before a rollback");
    if (discard_history) {
      for (const RecoveryPoint& p : points_) {
        if (p.seq > point_seq && p.seq <= from && lock_.Holds(p.applied_us, wall))
          return Status::AlreadyExists(id_.name + ": point " + std::to_string(p.id) + " after sequence " +
                                       std::to_string(point_seq) + " is inside the history lock (" +
                                       std::to_string(lock_.EffectiveUs(wall) / 1'000'000) +
                                       " s); its history cannot be discarded before the lock lets it go");
      }
      for (const AnomalyEvent& a : anomalies_) {
        if (a.Holds(wall) && a.clean_seq > point_seq && a.clean_seq <= from)
          return Status::AlreadyExists(id_.name + ": the suspect-clean point of anomaly " + std::to_string(a.id) +
                                       " is after sequence " + std::to_string(point_seq) +
                                       "; acknowledge the anomaly before discarding its history");
      }
    }
  }
  if (point_seq < horizon_ || point_seq > from)
    return Status::OutOfRange(id_.name + ": sequence " + std::to_string(point_seq) + " is not reachable");
  {
    CDP_ASSIGN_OR_RETURN(auto tx, sqlite::Transaction::Begin(*db_));
    CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare("UPDATE volume SET state = ?1, rollback_to = ?2 WHERE id = 1"));
    CDP_RETURN_IF_ERROR(st.BindAll(int64_t(VolumeState::kRollingBack), point_seq));
    CDP_RETURN_IF_ERROR(st.Run());
    CDP_ASSIGN_OR_RETURN(auto ins, db_->Prepare(
        "INSERT INTO rollbacks(to_seq, from_seq, end_seq, time_us) VALUES(?1, ?2, 0, ?3)"));
    CDP_RETURN_IF_ERROR(ins.BindAll(point_seq, from, wall));
    CDP_RETURN_IF_ERROR(ins.Run());
    CDP_RETURN_IF_ERROR(tx.Commit());
  }
  {
    std::lock_guard<std::mutex> mk(meta_mu_);
    state_ = VolumeState::kRollingBack;
    rollbacks_.push_back(RollbackInfo{point_seq, from, 0, wall});
    MarkRolledBack();
  }
  rollback_to_ = point_seq;
  if (Status s = FinishRollback(); !s.ok()) {
    broken_ = true;  // reopening finishes the rollback
    return s;
  }
  if (!discard_history) return Status::OK();
  // An admin's explicit discard, outside the lock (checked above): the
  // branch's points go; retention then drops their journal as any other.
  {
    CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare("DELETE FROM points WHERE seq > ?1 AND seq <= ?2"));
    CDP_RETURN_IF_ERROR(st.BindAll(point_seq, from));
    CDP_RETURN_IF_ERROR(st.Run());
  }
  size_t gone = 0;
  {
    std::lock_guard<std::mutex> mk(meta_mu_);
    const size_t before = points_.size();
    points_.erase(std::remove_if(points_.begin(), points_.end(),
                                 [&](const RecoveryPoint& x) { return x.seq > point_seq && x.seq <= from; }),
                  points_.end());
    gone = before - points_.size();
  }
  log::Get("mt.volume")->warn("{} rollback to sequence {}: {} points of the rolled-back branch discarded (admin)",
                              log::Where{id_.name, "", point_seq}, point_seq, gone);
  UpdateGauges();
  return Status::OK();
}

Status ReplicaVolume::FinishRollback() {
  const uint64_t p = rollback_to_;
  log::Get("mt.volume")->warn("{} rolling back to sequence {}: the {} sequences after it stay as a branch",
                              log::Where{id_.name, "", p}, p, applied_.load() - std::min(p, applied_.load()));
  // Every block changed after the point (by the branch, and by the part of
  // this rollback a crash interrupted) is written back to its image at the
  // point, as new history: apply journals what it overwrites, so the branch
  // stays readable. Idempotent: a rerun writes the same image again.
  CDP_ASSIGN_OR_RETURN(std::vector<proto::BlockExtent> extents, JournalBlocksAfter(p));
  const uint64_t device = DeviceSize(id_), bs = id_.block_size;
  std::vector<proto::Record> batch;
  uint64_t batch_bytes = 0, rewritten = 0;
  auto apply = [&]() -> Status {
    if (batch.empty()) return Status::OK();
    ApplyOutcome out;
    Status s = ApplyLocked(batch, 0, &out);
    if (!s.ok()) {
      if (Status r = RecoverUncommitted(); !r.ok()) return r;
      return s;
    }
    batch.clear();
    batch_bytes = 0;
    return Status::OK();
  };
  for (const proto::BlockExtent& e : extents) {
    const uint64_t start = e.first_block * bs, end = std::min(device, (e.first_block + e.count) * bs);
    for (uint64_t off = start; off < end;) {
      const uint64_t len = std::min(kRollbackRecordBytes, end - off);
      proto::Record r;
      r.seq = applied_.load() + batch.size() + 1;
      r.offset = off;
      r.length = uint32_t(len);
      r.data.resize(len);
      CDP_RETURN_IF_ERROR(ReadDeviceAt(p, off, len, r.data.data()));
      if (AllZero(r.data)) {
        r.kind = proto::RecordKind::kZero;
        r.data.clear();
      } else {
        r.kind = proto::RecordKind::kData;
      }
      batch.push_back(std::move(r));
      batch_bytes += len;
      rewritten += len;
      off += len;
      if (batch_bytes >= o_.rollback_batch_bytes) CDP_RETURN_IF_ERROR(apply());
    }
  }
  {
    // The end of the rollback, as a tag: its image is the point's.
    const std::string name = "rollback-to-" + std::to_string(p);
    proto::Record tag;
    tag.seq = applied_.load() + batch.size() + 1;
    tag.kind = proto::RecordKind::kTag;
    tag.data.assign(name.begin(), name.end());
    batch.push_back(std::move(tag));
  }
  CDP_RETURN_IF_ERROR(apply());
  const uint64_t end_seq = applied_.load();
  {
    CDP_ASSIGN_OR_RETURN(auto tx, sqlite::Transaction::Begin(*db_));
    CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare("UPDATE volume SET state = ?1 WHERE id = 1"));
    CDP_RETURN_IF_ERROR(st.BindAll(int64_t(VolumeState::kFailedOver)));
    CDP_RETURN_IF_ERROR(st.Run());
    CDP_ASSIGN_OR_RETURN(auto up, db_->Prepare("UPDATE rollbacks SET end_seq = ?1 WHERE end_seq = 0"));
    CDP_RETURN_IF_ERROR(up.BindAll(end_seq));
    CDP_RETURN_IF_ERROR(up.Run());
    CDP_RETURN_IF_ERROR(tx.Commit());
  }
  {
    std::lock_guard<std::mutex> mk(meta_mu_);
    for (RollbackInfo& r : rollbacks_) {
      if (r.end_seq == 0) r.end_seq = end_seq;
    }
    state_ = VolumeState::kFailedOver;
  }
  log::Get("mt.volume")->warn("{} failed over: rolled back to sequence {} ({} bytes rewritten as sequences up to {})",
                              log::Where{id_.name, "", p}, p, rewritten, end_seq);
  UpdateGauges();
  return Status::OK();
}

void ReplicaVolume::MarkRolledBack() {
  for (RecoveryPoint& p : points_) {
    p.rolled_back = std::any_of(rollbacks_.begin(), rollbacks_.end(),
                                [&](const RollbackInfo& r) { return p.seq > r.to_seq && p.seq <= r.from_seq; });
  }
}

}  // namespace cdp::mt

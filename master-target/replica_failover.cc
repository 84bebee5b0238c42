// SPDX-License-Identifier: Apache-2.0
#include "master-target/replica_volume.h"

#include <algorithm>

#include "common/base/log.h"
#include "common/daemon/metrics.h"
#include "common/store/sqlite.h"

namespace cdp::mt {

std::string ReplicaVolume::FencedMessage() const { return FencedMessage(*failover_); }

std::string ReplicaVolume::FencedMessage(const FailoverInfo& f) const {
  std::string point = f.point_id != 0 ? "point " + std::to_string(f.point_id) + ", " : "";
  return std::string(proto::kFailedOverText) + ": volume " + id_.name + " failed over at the master target (" + point +
         "sequence " + std::to_string(numbering().Wire(f.point_seq)) +
         "); this stream is fenced and nothing of it is applied" +
         (f.committed ? " (the failover is committed)"
                               : " (an operator may undo: cdpctl failover " + id_.name + " --undo)");
}

std::string ReplicaVolume::FailedBackMessage() const {
  return std::string(proto::kFailedOverText) + ": volume " + id_.name +
         " was failed back from the master target; generation " + std::to_string(generation()) +
         " is fenced until the operator re-protects it (cdpctl reprotect " + id_.name + ")";
}

std::string ReplicaVolume::Fence() const {
  if (std::optional<FailoverInfo> f = failover()) return FencedMessage(*f);
  if (state() == VolumeState::kFailedBack) return FailedBackMessage();
  return "";
}

std::optional<FailoverInfo> ReplicaVolume::failover() const {
  std::lock_guard<std::mutex> lk(meta_mu_);
  return failover_;
}

Result<bool> ReplicaVolume::Failover(uint64_t point_seq, int64_t point_id) {
  std::lock_guard<std::mutex> lk(apply_mu_);
  if (broken_) return Status::IOError(id_.name + ": volume needs to be reopened after an I/O failure");
  if (failover_) {
    if (failover_->point_seq == point_seq) return false;
    return Status::AlreadyExists(id_.name + " is already failed over at sequence " +
                                 std::to_string(failover_->point_seq) + "; undo it first (cdpctl failover " +
                                 id_.name + " --undo)");
  }
  if (state_ != VolumeState::kReplicating)
    return Status::InvalidArgument(id_.name + " is " + StateName(state_) +
                                   " (rolled back); a failover promotes a point of a protected volume");
  if (point_seq < horizon_ || point_seq > applied_.load())
    return Status::OutOfRange(id_.name + ": sequence " + std::to_string(point_seq) + " is not reachable");
  FailoverInfo f;
  f.point_seq = point_seq;
  f.point_id = point_id;
  f.time_us = o_.clock->WallMicros();
  {
    CDP_ASSIGN_OR_RETURN(auto tx, sqlite::Transaction::Begin(*db_));
    CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare(
        "INSERT OR REPLACE INTO failover(id, point_seq, point_id, committed, time_us) VALUES(1, ?1, ?2, 0, ?3)"));
    CDP_RETURN_IF_ERROR(st.BindAll(f.point_seq, f.point_id, f.time_us));
    CDP_RETURN_IF_ERROR(st.Run());
    CDP_ASSIGN_OR_RETURN(auto up, db_->Prepare("UPDATE volume SET state = ?1 WHERE id = 1"));
    CDP_RETURN_IF_ERROR(up.BindAll(int64_t(VolumeState::kFailedOver)));
    CDP_RETURN_IF_ERROR(up.Run());
    CDP_RETURN_IF_ERROR(tx.Commit());
  }
  {
    std::lock_guard<std::mutex> mk(meta_mu_);
    state_ = VolumeState::kFailedOver;
    failover_ = f;
  }
  log::Get("mt.volume")->warn("{} failed over: sequence {} promoted; the journal after it is kept as a branch, "
                              "the old primary is fenced",
                              log::Where{id_.name, "", point_seq}, point_seq);
  return true;
}

Result<bool> ReplicaVolume::CommitFailover() {
  std::lock_guard<std::mutex> lk(apply_mu_);
  if (!failover_) return Status::InvalidArgument(id_.name + " is not failed over (cdpctl failover VOLUME --to POINT)");
  if (failover_->committed) return false;
  {
    CDP_ASSIGN_OR_RETURN(auto tx, sqlite::Transaction::Begin(*db_));
    CDP_RETURN_IF_ERROR(db_->Exec("UPDATE failover SET committed = 1 WHERE id = 1"));
    CDP_RETURN_IF_ERROR(tx.Commit());
  }
  {
    std::lock_guard<std::mutex> mk(meta_mu_);
    failover_->committed = true;
  }
  log::Get("mt.volume")->warn("{} failover at sequence {} committed: undo is refused from now on",
                              log::Where{id_.name, "", failover_->point_seq}, failover_->point_seq);
  return true;
}

Result<bool> ReplicaVolume::UndoFailover() {
  std::lock_guard<std::mutex> lk(apply_mu_);
  if (broken_) return Status::IOError(id_.name + ": volume needs to be reopened after an I/O failure");
  if (!failover_) {
    if (state_ == VolumeState::kReplicating) return false;
    return Status::InvalidArgument(id_.name + " is " + StateName(state_) +
                                   " by a rollback, not by cdpctl failover: nothing to undo");
  }
  if (failover_->committed)
    return Status::AlreadyExists(id_.name + ": the failover at sequence " + std::to_string(failover_->point_seq) +
                                 " is committed; undo is refused (failback brings the volume home)");
  {
    CDP_ASSIGN_OR_RETURN(auto tx, sqlite::Transaction::Begin(*db_));
    CDP_RETURN_IF_ERROR(db_->Exec("DELETE FROM failover"));
    CDP_ASSIGN_OR_RETURN(auto up, db_->Prepare("UPDATE volume SET state = ?1 WHERE id = 1"));
    CDP_RETURN_IF_ERROR(up.BindAll(int64_t(VolumeState::kReplicating)));
    CDP_RETURN_IF_ERROR(up.Run());
    CDP_RETURN_IF_ERROR(tx.Commit());
  }
  const uint64_t p = failover_->point_seq;
  {
    std::lock_guard<std::mutex> mk(meta_mu_);
    state_ = VolumeState::kReplicating;
    failover_.reset();
  }
  log::Get("mt.volume")->warn("{} failover at sequence {} undone: protecting again from applied sequence {}",
                              log::Where{id_.name, "", p}, p, applied_.load());
  return true;
}

}  // namespace cdp::mt

namespace cdp::mt {

Result<bool> ReplicaVolume::StartFailback() {
  std::lock_guard<std::mutex> lk(apply_mu_);
  if (broken_) return Status::IOError(id_.name + ": volume needs to be reopened after an I/O failure");
  if (state_ == VolumeState::kFailingBack) return false;
  if (!failover_)
    return Status::InvalidArgument(id_.name + " is " + StateName(state_) +
                                   ": failback brings home a volume failed over by cdpctl failover");
  const uint64_t now = o_.clock->WallMicros();
  {
    CDP_ASSIGN_OR_RETURN(auto tx, sqlite::Transaction::Begin(*db_));
    CDP_RETURN_IF_ERROR(db_->Exec("UPDATE failover SET committed = 1 WHERE id = 1"));
    CDP_ASSIGN_OR_RETURN(auto fb, db_->Prepare("INSERT OR REPLACE INTO failback(id, quiesced, time_us) VALUES(1, 0, ?1)"));
    CDP_RETURN_IF_ERROR(fb.BindAll(now));
    CDP_RETURN_IF_ERROR(fb.Run());
    CDP_ASSIGN_OR_RETURN(auto up, db_->Prepare("UPDATE volume SET state = ?1 WHERE id = 1"));
    CDP_RETURN_IF_ERROR(up.BindAll(int64_t(VolumeState::kFailingBack)));
    CDP_RETURN_IF_ERROR(up.Run());
    CDP_RETURN_IF_ERROR(tx.Commit());
  }
  {
    std::lock_guard<std::mutex> mk(meta_mu_);
    state_ = VolumeState::kFailingBack;
    failover_->committed = true;
    failover_->quiesced = false;
  }
  log::Get("mt.volume")->warn("{} failing back: the failover at sequence {} is committed; the original site pulls "
                              "what differs",
                              log::Where{id_.name, "", failover_->point_seq}, failover_->point_seq);
  return true;
}

Result<bool> ReplicaVolume::QuiesceFailback() {
  std::lock_guard<std::mutex> lk(apply_mu_);
  if (state_ != VolumeState::kFailingBack)
    return Status::InvalidArgument(id_.name + " is " + StateName(state_) + ", not failing back (cdpctl failback)");
  if (failover_->quiesced) return false;
  {
    CDP_ASSIGN_OR_RETURN(auto tx, sqlite::Transaction::Begin(*db_));
    CDP_RETURN_IF_ERROR(db_->Exec("UPDATE failback SET quiesced = 1 WHERE id = 1"));
    CDP_RETURN_IF_ERROR(tx.Commit());
  }
  std::lock_guard<std::mutex> mk(meta_mu_);
  failover_->quiesced = true;
  return true;
}

Result<std::vector<proto::BlockExtent>> ReplicaVolume::JournalBlocksAfter(uint64_t point_seq) const {
  const uint64_t applied = applied_.load();
  const uint64_t window = std::max<uint64_t>(1, o_.rollback_window);
  const uint64_t bs = id_.block_size;
  std::vector<proto::BlockExtent> out;
  for (uint64_t lo = point_seq; lo < applied;) {
    const uint64_t hi = std::min(applied, lo + window);
    std::vector<UndoEntry> entries;
    {
      auto lk = LockIndexShared();
      CDP_ASSIGN_OR_RETURN(entries, undo_->EntriesBetween(lo, hi));
    }
    for (const UndoEntry& e : entries) {
      if (e.length == 0) continue;
      const uint64_t first = e.offset / bs, end = (e.offset + e.length + bs - 1) / bs;
      out.push_back(proto::BlockExtent{first, uint32_t(end - first)});  // <= 1 MiB / block_size
    }
    out = proto::MergeExtents(std::move(out));
    lo = hi;
  }
  return out;
}

Result<uint64_t> ReplicaVolume::ApplyFailback(std::vector<proto::Record> records) {
  std::lock_guard<std::mutex> lk(apply_mu_);
  CDP_RETURN_IF_ERROR(HealLocked());
  if (state_ != VolumeState::kFailingBack || !failover_->quiesced)
    return Status::InvalidArgument(id_.name + " is not failing back with its export quiesced");
  const uint64_t applied = applied_.load();
  if (records.empty()) return applied;
  for (size_t i = 0; i < records.size(); ++i) {
    proto::Record& r = records[i];
    r.seq = applied + 1 + i;
    if (r.kind == proto::RecordKind::kTag && r.offset == 0 && r.length == 0 &&
        ValidName(std::string_view(reinterpret_cast<const char*>(r.data.data()), r.data.size())))
      continue;
    const bool plain_ok = !id_.sealed && (r.kind == proto::RecordKind::kData ? r.data.size() == r.length
                                          : r.kind == proto::RecordKind::kZero && r.data.empty());
    const bool sealed_ok =
        id_.sealed && r.offset % proto::kSealUnit == 0 && r.length % proto::kSealUnit == 0 &&
        (r.kind == proto::RecordKind::kSealed ? r.data.size() == r.length + proto::SealMacBytes(r.length)
                                              : r.kind == proto::RecordKind::kSealedZero &&
                                                    r.data.size() == proto::SealMacBytes(r.length));
    if ((!plain_ok && !sealed_ok) || r.length == 0 || r.offset > id_.size || r.length > id_.size - r.offset)
      return Status::InvalidArgument(id_.name + ": bad failback record at offset " + std::to_string(r.offset));
  }
  ApplyOutcome out;
  Status s = id_.sealed ? ApplyLocked(UnsealRecords(records, 0, id_.size), 0, &out) : ApplyLocked(records, 0, &out);
  NoteApply(s);
  if (s.ok() && o_.metrics.records_applied) o_.metrics.records_applied->Inc(records.size());
  if (!s.ok()) {
    Status r = RecoverUncommitted();
    if (!r.ok()) {
      broken_ = true;
      heal_by_recovery_ = true;
    }
    return s;
  }
  return applied_.load();
}

Result<bool> ReplicaVolume::EndFailback() {
  std::lock_guard<std::mutex> lk(apply_mu_);
  if (state_ == VolumeState::kFailedBack) return false;
  if (state_ != VolumeState::kFailingBack || !failover_->quiesced)
    return Status::InvalidArgument(id_.name + " is not failing back with its export quiesced");
  {
    CDP_ASSIGN_OR_RETURN(auto tx, sqlite::Transaction::Begin(*db_));
    CDP_RETURN_IF_ERROR(db_->Exec("DELETE FROM failover"));
    CDP_RETURN_IF_ERROR(db_->Exec("DELETE FROM failback"));
    CDP_ASSIGN_OR_RETURN(auto up, db_->Prepare("UPDATE volume SET state = ?1 WHERE id = 1"));
    CDP_RETURN_IF_ERROR(up.BindAll(int64_t(VolumeState::kFailedBack)));
    CDP_RETURN_IF_ERROR(up.Run());
    CDP_RETURN_IF_ERROR(tx.Commit());
  }
  const uint64_t p = failover_->point_seq;
  {
    std::lock_guard<std::mutex> mk(meta_mu_);
    state_ = VolumeState::kFailedBack;
    failover_.reset();
  }
  log::Get("mt.volume")->warn("{} failed back: the replica equals the promoted image at sequence {}; generation {} "
                              "stays fenced until cdpctl reprotect",
                              log::Where{id_.name, "", p}, applied_.load(), id_.generation);
  return true;
}


}  // namespace cdp::mt

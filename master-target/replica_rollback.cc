#include "master-target/replica_volume.h"

#include <algorithm>

#include "common/log.h"
#include "common/sqlite.h"

namespace cdp::mt {

Status ReplicaVolume::Rollback(uint64_t point_seq) {
  std::lock_guard<std::mutex> lk(apply_mu_);
  if (broken_) return Status::IOError(id_.name + ": volume needs to be reopened after an I/O failure");
  if (failover_)
    return Status::InvalidArgument(id_.name + " is failed over at sequence " + std::to_string(failover_->point_seq) +
                                   " (cdpctl failover); a rollback would rewrite the kept branch");
  {
    std::lock_guard<std::mutex> mk(meta_mu_);
    if (!pins_.empty()) return Status::Busy(id_.name + ": exports are open; remove them before a rollback");
  }
  if (point_seq < horizon_ || point_seq > applied_.load())
    return Status::OutOfRange(id_.name + ": sequence " + std::to_string(point_seq) + " is not reachable");
  {
    CDP_ASSIGN_OR_RETURN(auto tx, sqlite::Transaction::Begin(*db_));
    CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare("UPDATE volume SET state = ?1, rollback_to = ?2 WHERE id = 1"));
    CDP_RETURN_IF_ERROR(st.BindAll(int64_t(VolumeState::kRollingBack), point_seq));
    CDP_RETURN_IF_ERROR(st.Run());
    CDP_RETURN_IF_ERROR(tx.Commit());
  }
  {
    std::lock_guard<std::mutex> mk(meta_mu_);
    state_ = VolumeState::kRollingBack;
  }
  rollback_to_ = point_seq;
  Status s = FinishRollback();
  if (!s.ok()) broken_ = true;  // reopening finishes the rollback
  return s;
}

Status ReplicaVolume::FinishRollback() {
  const uint64_t p = rollback_to_;
  log::Get("mt.volume")->warn("{} rolling back {} sequences to sequence {}", log::Where{id_.name, "", p},
                              applied_.load() - std::min(p, applied_.load()), p);
  // Newest first, a window of sequences at a time (memory stays bounded
  // however long the journal past the point). The journal ends where the
  // first record past the point begins.
  const uint64_t window = std::max<uint64_t>(1, o_.rollback_window);
  uint64_t cut_seg = committed_segment_, cut_off = committed_offset_, undone = 0;
  for (uint64_t hi = applied_.load(); hi > p;) {
    const uint64_t lo = hi - std::min(hi - p, window);
    std::vector<UndoEntry> entries;
    {
      std::shared_lock<std::shared_mutex> lk(index_mu_);
      CDP_ASSIGN_OR_RETURN(entries, undo_->EntriesBetween(lo, hi));
    }
    CDP_RETURN_IF_ERROR(UndoEntries(entries));
    for (const UndoEntry& e : entries) {
      if (e.segment < cut_seg || (e.segment == cut_seg && e.file_offset < cut_off)) {
        cut_seg = e.segment;
        cut_off = e.file_offset;
      }
    }
    undone += entries.size();
    hi = lo;
  }
  log::Get("mt.volume")->info("{} undid {} undo records", log::Where{id_.name, "", p}, undone);
  SegmentInfo cut_info;
  {
    std::lock_guard<std::mutex> mk(meta_mu_);
    auto it = segments_.find(cut_seg);
    if (it != segments_.end()) cut_info = it->second;
  }
  cut_info.segment = cut_seg;
  cut_info.bytes = cut_off;
  cut_info.max_seq = std::min(cut_info.max_seq, p);
  if (cut_info.min_seq > p) cut_info = SegmentInfo{cut_seg, 0, 0, 0, 0, cut_off};
  {
    CDP_ASSIGN_OR_RETURN(auto tx, sqlite::Transaction::Begin(*db_));
    CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare(
        "UPDATE volume SET applied_seq = ?1, journal_segment = ?2, journal_offset = ?3, state = ?4 WHERE id = 1"));
    CDP_RETURN_IF_ERROR(st.BindAll(p, cut_seg, cut_off, int64_t(VolumeState::kFailedOver)));
    CDP_RETURN_IF_ERROR(st.Run());
    CDP_ASSIGN_OR_RETURN(auto d1, db_->Prepare("DELETE FROM points WHERE seq > ?1"));
    CDP_RETURN_IF_ERROR(d1.BindAll(p));
    CDP_RETURN_IF_ERROR(d1.Run());
    CDP_ASSIGN_OR_RETURN(auto d2, db_->Prepare("DELETE FROM segments WHERE segment > ?1"));
    CDP_RETURN_IF_ERROR(d2.BindAll(cut_seg));
    CDP_RETURN_IF_ERROR(d2.Run());
    CDP_ASSIGN_OR_RETURN(auto up, db_->Prepare("INSERT OR REPLACE INTO segments VALUES(?1, ?2, ?3, ?4, ?5, ?6)"));
    CDP_RETURN_IF_ERROR(up.BindAll(cut_seg, cut_info.min_seq, cut_info.max_seq, cut_info.first_time_us,
                                   cut_info.last_time_us, cut_info.bytes));
    CDP_RETURN_IF_ERROR(up.Run());
    CDP_RETURN_IF_ERROR(tx.Commit());
  }
  {
    std::lock_guard<std::mutex> mk(meta_mu_);
    for (auto it = segments_.begin(); it != segments_.end();) {
      it = it->first > cut_seg ? segments_.erase(it) : std::next(it);
    }
    segments_[cut_seg] = cut_info;
    points_.erase(std::remove_if(points_.begin(), points_.end(), [&](const RecoveryPoint& x) { return x.seq > p; }),
                  points_.end());
    state_ = VolumeState::kFailedOver;
  }
  applied_.store(p);
  committed_segment_ = cut_seg;
  committed_offset_ = cut_off;
  // Removes the journal past the cut (already undone above).
  CDP_RETURN_IF_ERROR(RecoverUncommitted(false));
  log::Get("mt.volume")->warn("{} failed over at sequence {}", log::Where{id_.name, "", p}, p);
  UpdateGauges();
  return Status::OK();
}

}  // namespace cdp::mt

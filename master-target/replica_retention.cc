// SPDX-License-Identifier: Apache-2.0
#include "master-target/replica_volume.h"

#include <algorithm>
#include <limits>

#include "common/base/log.h"
#include "common/store/sqlite.h"

namespace cdp::mt {

Result<RetentionResult> ReplicaVolume::ApplyRetention() {
  std::lock_guard<std::mutex> lk(apply_mu_);
  return ApplyRetentionLocked();
}

Result<RetentionResult> ReplicaVolume::ApplyRetentionLocked() {
  RetentionResult res;
  res.horizon_seq = journal_->horizon();
  const RetentionPolicy pol = catalogue_->policy();
  CDP_RETURN_IF_ERROR(HealLocked());
  if (pol.max_age_us == 0 && pol.max_bytes == 0) return res;
  const uint64_t wall = o_.clock->WallMicros();
  const uint64_t cur = journal_->current_segment();
  const std::vector<SegmentInfo> segs = journal_->Segments();
  const PointCatalogue::Promise promise = catalogue_->Promised(segs, cur, wall);
  res.locked_over_budget = promise.locked_over_budget;
  uint64_t promised_min = promise.min_seq;
  if (std::optional<FailoverInfo> f = fence_->failover()) promised_min = std::min(promised_min, f->point_seq);
  uint64_t last_dropped = 0, new_horizon = res.horizon_seq;
  for (const SegmentInfo& si : segs) {
    if (si.segment == cur || si.max_seq > promised_min) break;
    res.dropped_segments.push_back(si.segment);
    last_dropped = si.segment;
    new_horizon = std::max(new_horizon, si.max_seq);
  }
  if (res.dropped_segments.empty()) return res;
  res.dropped_points = catalogue_->Below(new_horizon);
  // Readers of points below the new horizon are refused from now on, before
  // the undo records they would need leave the index. (The points promised
  // or pinned are all at or above it.)
  journal_->RaiseHorizon(new_horizon);
  Status s = [&]() -> Status {
    CDP_ASSIGN_OR_RETURN(auto tx, sqlite::Transaction::Begin(*db_));
    CDP_RETURN_IF_ERROR(journal_->StageDrop(tx, last_dropped, new_horizon));
    CDP_RETURN_IF_ERROR(catalogue_->StageDropBelow(tx, new_horizon));
    return tx.Commit();
  }();
  if (!s.ok()) {
    journal_->Discard();
    return s;
  }
  catalogue_->DropBelow(new_horizon);
  CDP_RETURN_IF_ERROR(journal_->Dropped(res.dropped_segments));
  res.horizon_seq = new_horizon;
  log::Get("mt.volume")->info("{} retention dropped {} segments and {} points; horizon {}",
                              log::Where{id_.name, "", applied_.load()}, res.dropped_segments.size(),
                              res.dropped_points.size(), new_horizon);
  UpdateGauges();
  return res;
}

Status ReplicaVolume::SetRetention(const RetentionPolicy& policy) {
  std::lock_guard<std::mutex> lk(apply_mu_);
  CDP_RETURN_IF_ERROR(catalogue_->SetPolicy(policy));
  UpdateGauges();
  return Status::OK();
}

Result<std::optional<ApplyOutcome>> ReplicaVolume::CheckHistoryLock() {
  const RetentionPolicy pol = catalogue_->policy();
  if (pol.max_bytes == 0 || catalogue_->LockUs(o_.clock->WallMicros()) == 0) return std::optional<ApplyOutcome>();
  uint64_t jbytes = journal_->bytes();
  if (jbytes <= pol.max_bytes) return std::optional<ApplyOutcome>();
  CDP_ASSIGN_OR_RETURN(RetentionResult r, ApplyRetentionLocked());
  if (!r.locked_over_budget) return std::optional<ApplyOutcome>();
  jbytes = journal_->bytes();
  ApplyOutcome out;
  out.ack = false;
  out.reason = proto::NackReason::kBusy;
  out.message = "LOCKED: journal full inside the history lock (" + std::to_string(jbytes) + " journal bytes > " +
                "retention.max_bytes " + std::to_string(pol.max_bytes) + "; the lock keeps every point younger than " +
                std::to_string(catalogue_->LockUs(o_.clock->WallMicros()) / 1'000'000) +
                " s): apply waits for the lock window to move on or a larger budget";
  out.expected_seq = applied_.load() + 1;
  NoteApply(Status::Busy(out.message), StallCause::kHistoryLock);
  return std::optional<ApplyOutcome>(out);
}

void ReplicaVolume::NoteTenantCapHold(const std::string& why) {
  std::lock_guard<std::mutex> lk(apply_mu_);
  if (catalogue_->LockUs(o_.clock->WallMicros()) == 0) return;
  NoteApply(Status::Busy("LOCKED: journal full inside the history lock (" + why + ")"), StallCause::kHistoryLock);
}

}  // namespace cdp::mt

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
  CDP_RETURN_IF_ERROR(fence_->CheckRollback());
  const uint64_t from = applied_.load();
  const uint64_t wall = o_.clock->WallMicros();
  CDP_RETURN_IF_ERROR(catalogue_->CheckRollback(point_seq, from, discard_history, wall));
  if (point_seq < journal_->horizon() || point_seq > from)
    return Status::OutOfRange(id_.name + ": sequence " + std::to_string(point_seq) + " is not reachable");
  const RollbackInfo rollback{point_seq, from, 0, wall};
  {
    CDP_ASSIGN_OR_RETURN(auto tx, sqlite::Transaction::Begin(*db_));
    CDP_RETURN_IF_ERROR(fence_->StageRollback(tx, point_seq));
    CDP_RETURN_IF_ERROR(catalogue_->StageRollback(tx, rollback));
    CDP_RETURN_IF_ERROR(tx.Commit());
  }
  catalogue_->RollingBack(rollback);
  fence_->RollingBack(point_seq);
  if (Status s = FinishRollback(); !s.ok()) {
    broken_ = true;  // reopening finishes the rollback
    return s;
  }
  if (!discard_history) return Status::OK();
  // An admin's explicit discard, outside the lock (checked above): the
  // branch's points go; retention then drops their journal as any other.
  CDP_ASSIGN_OR_RETURN(size_t gone, catalogue_->DiscardBranch(point_seq, from));
  log::Get("mt.volume")->warn("{} rollback to sequence {}: {} points of the rolled-back branch discarded (admin)",
                              log::Where{id_.name, "", point_seq}, point_seq, gone);
  UpdateGauges();
  return Status::OK();
}

Status ReplicaVolume::FinishRollback() {
  const uint64_t p = fence_->rollback_to();
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
      if (Status r = journal_->Recover(applied_.load()); !r.ok()) return r;
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
    CDP_RETURN_IF_ERROR(fence_->StageRolledBack(tx));
    CDP_RETURN_IF_ERROR(catalogue_->StageRolledBack(tx, end_seq));
    CDP_RETURN_IF_ERROR(tx.Commit());
  }
  catalogue_->RolledBack(end_seq);
  fence_->RolledBack();
  log::Get("mt.volume")->warn("{} failed over: rolled back to sequence {} ({} bytes rewritten as sequences up to {})",
                              log::Where{id_.name, "", p}, p, rewritten, end_seq);
  UpdateGauges();
  return Status::OK();
}

}  // namespace cdp::mt

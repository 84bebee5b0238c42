// SPDX-License-Identifier: Apache-2.0
#include "master-target/replica_volume.h"

#include <algorithm>

#include "common/base/log.h"
#include "common/daemon/metrics.h"
#include "common/store/sqlite.h"
#include "master-target/replica_batch.h"

namespace cdp::mt {

namespace {
Status Broken(const std::string& name) {
  return Status::IOError(name + ": volume needs to be reopened after an I/O failure");
}
}  // namespace

Result<bool> ReplicaVolume::Failover(uint64_t point_seq, int64_t point_id) {
  std::lock_guard<std::mutex> lk(apply_mu_);
  if (broken_) return Broken(id_.name);
  return fence_->Failover(point_seq, point_id, journal_->horizon(), applied_.load());
}

Result<bool> ReplicaVolume::CommitFailover() {
  std::lock_guard<std::mutex> lk(apply_mu_);
  return fence_->CommitFailover();
}

Result<bool> ReplicaVolume::UndoFailover() {
  std::lock_guard<std::mutex> lk(apply_mu_);
  if (broken_) return Broken(id_.name);
  return fence_->UndoFailover(applied_.load());
}

Result<bool> ReplicaVolume::StartFailback() {
  std::lock_guard<std::mutex> lk(apply_mu_);
  if (broken_) return Broken(id_.name);
  return fence_->StartFailback();
}

Result<bool> ReplicaVolume::QuiesceFailback() {
  std::lock_guard<std::mutex> lk(apply_mu_);
  return fence_->QuiesceFailback();
}

Result<std::vector<proto::BlockExtent>> ReplicaVolume::JournalBlocksAfter(uint64_t point_seq) const {
  const uint64_t applied = applied_.load();
  const uint64_t window = std::max<uint64_t>(1, o_.rollback_window);
  const uint64_t bs = id_.block_size;
  std::vector<proto::BlockExtent> out;
  for (uint64_t lo = point_seq; lo < applied;) {
    const uint64_t hi = std::min(applied, lo + window);
    CDP_ASSIGN_OR_RETURN(std::vector<UndoEntry> entries, journal_->EntriesBetween(lo, hi));
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
  CDP_RETURN_IF_ERROR(fence_->CheckFailbackApply());
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
    Status r = journal_->Recover(applied_.load());
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
  return fence_->EndFailback(applied_.load());
}

}  // namespace cdp::mt

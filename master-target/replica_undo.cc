// SPDX-License-Identifier: Apache-2.0
#include "master-target/replica_undo.h"

#include <algorithm>

namespace cdp::mt {

Status UndoLog::CreateJournal(Env* env, const std::string& dir, uint64_t segment_bytes) {
  CDP_RETURN_IF_ERROR(env->CreateDirs(dir));
  // A creation interrupted before its index row was committed left files that
  // nothing refers to: start over.
  CDP_ASSIGN_OR_RETURN(auto names, env->ListDir(dir));
  for (const auto& n : names) {
    uint64_t seg;
    if (ParseSegmentName(n, &seg)) CDP_RETURN_IF_ERROR(env->Remove(JoinPath(dir, n)));
  }
  CDP_ASSIGN_OR_RETURN(auto w, SegmentWriter::Open(env, dir, 1, true, 1, 0, segment_bytes));
  return w->Sync();
}

Status UndoLog::Load(const Row& row, const std::string& index_path) {
  committed_segment_ = row.committed_segment;
  committed_offset_ = row.committed_offset;
  horizon_ = row.horizon;
  index_version_ = row.index_version;
  std::map<uint64_t, SegmentInfo> segments;
  {
    CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare(
        "SELECT segment, min_seq, max_seq, first_time_us, last_time_us, bytes FROM segments ORDER BY segment"));
    for (;;) {
      CDP_ASSIGN_OR_RETURN(bool row, st.Step());
      if (!row) break;
      SegmentInfo s;
      s.segment = uint64_t(st.ColumnInt64(0));
      s.min_seq = uint64_t(st.ColumnInt64(1));
      s.max_seq = uint64_t(st.ColumnInt64(2));
      s.first_time_us = uint64_t(st.ColumnInt64(3));
      s.last_time_us = uint64_t(st.ColumnInt64(4));
      s.bytes = uint64_t(st.ColumnInt64(5));
      segments[s.segment] = s;
    }
  }
  if (!segments.count(committed_segment_))
    return Status::Corruption(index_path + ": committed journal segment is not in the index");
  std::lock_guard<std::mutex> lk(seg_mu_);
  segments_ = std::move(segments);
  return Status::OK();
}

Status UndoLog::OpenIndex(const std::string& index_path, uint64_t device_size, const std::string& vfs) {
  CDP_ASSIGN_OR_RETURN(undo_, UndoIndex::Open(db_, index_path, device_size, vfs));
  return Status::OK();
}

std::unique_lock<std::shared_mutex> UndoLog::LockIndexExclusive() const {
  std::unique_lock<std::mutex> gate(turnstile_);
  return std::unique_lock<std::shared_mutex>(index_mu_);
}

std::shared_lock<std::shared_mutex> UndoLog::LockIndexShared() const {
  { std::lock_guard<std::mutex> gate(turnstile_); }
  return std::shared_lock<std::shared_mutex>(index_mu_);
}

std::shared_ptr<File> UndoLog::SegmentFile(uint64_t segment) const {
  auto it = seg_files_.find(segment);
  return it == seg_files_.end() ? nullptr : it->second;
}

std::string UndoLog::SegmentPath(uint64_t segment) const { return JoinPath(o_.dir, SegmentFileName(segment)); }

Status UndoLog::ReadAt(uint64_t point_seq, uint64_t offset, uint64_t len, uint8_t* buf) const {
  std::shared_lock<std::shared_mutex> lk = LockIndexShared();
  if (point_seq < horizon_)
    return Status::OutOfRange(o_.name + ": point " + std::to_string(point_seq) + " is below the retention horizon");
  CDP_ASSIGN_OR_RETURN(std::vector<ReadPiece> pieces, undo_->Lookup(point_seq, offset, len));
  // The replica's pieces in one read, from the first to the end of the last,
  // when there are several: the bytes between them (the journal's pieces,
  // overwritten below) cost less to read than a system call each
  // (docs/benchmarks.md, "An io_context per thread, and an older point's
  // reads").
  const ReadPiece* first = nullptr;
  const ReadPiece* last = nullptr;
  for (const ReadPiece& p : pieces) {
    if (p.from_undo) continue;
    if (!first) first = &p;
    last = &p;
  }
  const bool one_read = first != last;
  if (one_read) {
    CDP_RETURN_IF_ERROR(store_->Read(first->offset, last->offset + last->length - first->offset,
                                     buf + (first->offset - offset)));
  }
  for (const ReadPiece& p : pieces) {
    uint8_t* dst = buf + (p.offset - offset);
    if (!p.from_undo && one_read) continue;
    if (p.from_undo) {
      std::shared_ptr<File> f = SegmentFile(p.entry.segment);
      if (!f) return Status::Corruption(o_.name + ": journal segment of an indexed record is gone");
      if (p.offset == p.entry.offset && p.length == p.entry.length) {
        // A whole record: read it with its CRC check.
        CDP_RETURN_IF_ERROR(ReadUndoData(*f, p.entry.header(), p.entry.location(), dst));
      } else {
        CDP_RETURN_IF_ERROR(ReadUndoSlice(*f, p.entry.header(), p.entry.location(),
                                          uint32_t(p.offset - p.entry.offset), p.length, dst));
      }
    } else {
      CDP_RETURN_IF_ERROR(store_->Read(p.offset, p.length, dst));
    }
  }
  return Status::OK();
}

Status UndoLog::ExtentsAt(uint64_t point_seq, uint64_t offset, uint64_t len, std::vector<DeviceExtent>* out) const {
  std::shared_lock<std::shared_mutex> lk = LockIndexShared();
  if (point_seq < horizon_)
    return Status::OutOfRange(o_.name + ": point " + std::to_string(point_seq) + " is below the retention horizon");
  CDP_ASSIGN_OR_RETURN(std::vector<ReadPiece> pieces, undo_->Lookup(point_seq, offset, len));
  const size_t first = out->size();
  for (const ReadPiece& p : pieces) {
    if (out->size() - first >= kMaxDeviceExtents) break;
    if (p.from_undo) {
      AppendExtent(out, DeviceExtent{p.length, false, false});
    } else {
      CDP_RETURN_IF_ERROR(FileExtents(*store_->file(), p.offset, p.length, out));
    }
  }
  return Status::OK();
}

Result<std::vector<UndoEntry>> UndoLog::EntriesBetween(uint64_t lo, uint64_t hi) const {
  auto lk = LockIndexShared();
  return undo_->EntriesBetween(lo, hi);
}

Status UndoLog::WhileReachable(uint64_t seq, const std::atomic<uint64_t>& applied,
                               const std::function<void()>& fn) const {
  auto lk = LockIndexShared();
  if (seq < horizon_ || seq > applied.load())
    return Status::OutOfRange(o_.name + ": sequence " + std::to_string(seq) + " is not reachable");
  fn();
  return Status::OK();
}

uint64_t UndoLog::horizon() const {
  auto lk = LockIndexShared();
  return horizon_;
}

void UndoLog::FillStatus(VolumeStatus* s) const {
  {
    auto lk = LockIndexShared();
    s->horizon_seq = horizon_;
    s->undo_records = undo_->size();
  }
  std::lock_guard<std::mutex> lk(seg_mu_);
  s->journal_segments = segments_.size();
  for (const auto& [seg, si] : segments_) s->journal_bytes += si.bytes;
}

std::vector<SegmentInfo> UndoLog::Segments() const {
  std::lock_guard<std::mutex> lk(seg_mu_);
  std::vector<SegmentInfo> v;
  for (const auto& [seg, si] : segments_) v.push_back(si);
  return v;
}

uint64_t UndoLog::bytes() const {
  std::lock_guard<std::mutex> lk(seg_mu_);
  uint64_t bytes = 0;
  for (const auto& [seg, si] : segments_) bytes += si.bytes;
  return bytes;
}

void UndoLog::Stage(const std::vector<UndoEntry>& added) {
  if (added.empty()) return;
  auto lk = LockIndexExclusive();
  for (const UndoEntry& e : added) undo_->Stage(e);
}

Result<std::map<uint64_t, SegmentInfo>> UndoLog::Touched(const std::vector<UndoEntry>& added) const {
  std::map<uint64_t, SegmentInfo> touched;
  {
    std::lock_guard<std::mutex> lk(seg_mu_);
    for (const UndoEntry& e : added) {
      if (!touched.count(e.segment)) {
        auto it = segments_.find(e.segment);
        SegmentInfo si;
        si.segment = e.segment;
        if (it != segments_.end()) si = it->second;
        touched[e.segment] = si;
      }
      SegmentInfo& si = touched[e.segment];
      if (si.min_seq == 0) si.min_seq = e.seq;
      si.max_seq = std::max(si.max_seq, e.seq);
      if (si.first_time_us == 0) si.first_time_us = e.time_us;
      si.last_time_us = e.time_us;
    }
  }
  for (auto& [seg, si] : touched) {
    if (seg == writer_->segment()) {
      si.bytes = writer_->end();
    } else {
      CDP_ASSIGN_OR_RETURN(si.bytes, o_.env->FileSize(SegmentPath(seg)));
    }
  }
  return touched;
}

Status UndoLog::StageCommit(const sqlite::Transaction&, const std::vector<UndoEntry>& added,
                            const std::map<uint64_t, SegmentInfo>& touched) {
  CDP_RETURN_IF_ERROR(undo_->Insert(added));
  if (touched.empty()) return Status::OK();
  CDP_ASSIGN_OR_RETURN(auto up, db_->Prepare("INSERT OR REPLACE INTO segments VALUES(?1, ?2, ?3, ?4, ?5, ?6)"));
  for (const auto& [seg, si] : touched) {
    CDP_RETURN_IF_ERROR(up.Reset());
    CDP_RETURN_IF_ERROR(up.BindAll(seg, si.min_seq, si.max_seq, si.first_time_us, si.last_time_us, si.bytes));
    CDP_RETURN_IF_ERROR(up.Run());
  }
  return Status::OK();
}

void UndoLog::Committed(const std::map<uint64_t, SegmentInfo>& touched, Position pos) {
  {
    auto lk = LockIndexExclusive();
    undo_->Committed();
  }
  {
    std::lock_guard<std::mutex> lk(seg_mu_);
    for (const auto& [seg, si] : touched) segments_[seg] = si;
  }
  committed_segment_ = pos.segment;
  committed_offset_ = pos.offset;
}

void UndoLog::RaiseHorizon(uint64_t h) {
  auto lk = LockIndexExclusive();
  horizon_ = h;
}

Status UndoLog::StageDrop(const sqlite::Transaction&, uint64_t last_dropped, uint64_t h) {
  // Records at or below the horizon are never read again (a record's undo
  // chunks may also lie in the first segment kept).
  CDP_RETURN_IF_ERROR(undo_->RemoveUpTo(h));
  CDP_ASSIGN_OR_RETURN(auto d, db_->Prepare("DELETE FROM segments WHERE segment <= ?1"));
  CDP_RETURN_IF_ERROR(d.BindAll(last_dropped));
  CDP_RETURN_IF_ERROR(d.Run());
  CDP_ASSIGN_OR_RETURN(auto up, db_->Prepare("UPDATE volume SET horizon_seq = ?1 WHERE id = 1"));
  CDP_RETURN_IF_ERROR(up.BindAll(h));
  return up.Run();
}

Status UndoLog::Dropped(const std::vector<uint64_t>& segments) {
  {
    auto lk = LockIndexExclusive();
    undo_->Committed();
    for (uint64_t seg : segments) seg_files_.erase(seg);
  }
  {
    std::lock_guard<std::mutex> lk(seg_mu_);
    for (uint64_t seg : segments) segments_.erase(seg);
  }
  for (uint64_t seg : segments) CDP_RETURN_IF_ERROR(o_.env->Remove(SegmentPath(seg)));
  return o_.env->SyncDir(o_.dir);
}

void UndoLog::Discard() {
  auto lk = LockIndexExclusive();
  undo_->Discarded();
}

}  // namespace cdp::mt

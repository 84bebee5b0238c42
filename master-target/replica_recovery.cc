// SPDX-License-Identifier: Apache-2.0
#include "master-target/replica_undo.h"

#include <algorithm>
#include <limits>

#include "common/base/log.h"
#include "common/daemon/metrics.h"
#include "common/store/sqlite.h"

namespace cdp::mt {

Status UndoLog::UndoEntries(const std::vector<UndoEntry>& entries) {
  Bytes buf;
  std::map<uint64_t, std::shared_ptr<File>> files;
  for (const UndoEntry& e : entries) {
    if (e.kind == UndoKind::kZeroes) {
      // Zeros are restored by punching a hole (ReplicaStore::Zero): the undo of a
      // batch that failed on a full disk must not need new blocks itself.
      CDP_RETURN_IF_ERROR(store_->Zero(e.offset, e.length));
      continue;
    }
    std::shared_ptr<File> f;
    auto it = files.find(e.segment);
    if (it != files.end()) {
      f = it->second;
    } else {
      OpenOptions ro;
      ro.read_only = true;
      CDP_ASSIGN_OR_RETURN(auto nf, o_.env->Open(SegmentPath(e.segment), ro));
      f = std::shared_ptr<File>(std::move(nf));
      files[e.segment] = f;
    }
    buf.resize(e.length);
    CDP_RETURN_IF_ERROR(ReadUndoData(*f, e.header(), e.location(), buf.data()));
    CDP_RETURN_IF_ERROR(store_->Write(e.offset, buf));
    if (o_.metrics && o_.metrics->disk_read_bytes) o_.metrics->disk_read_bytes->Inc(e.kind == UndoKind::kZeroes ? 0 : e.length);
    if (o_.metrics && o_.metrics->disk_write_bytes) o_.metrics->disk_write_bytes->Inc(e.length);
  }
  if (!entries.empty()) CDP_RETURN_IF_ERROR(store_->Sync());
  return Status::OK();
}

Status UndoLog::Recover(uint64_t applied, bool undo_records) {
  writer_.reset();
  Env* env = o_.env;
  const std::string& jdir = o_.dir;
  CDP_ASSIGN_OR_RETURN(auto names, env->ListDir(jdir));
  std::vector<uint64_t> on_disk;
  for (const auto& n : names) {
    uint64_t seg;
    if (ParseSegmentName(n, &seg)) on_disk.push_back(seg);
  }
  std::vector<UndoEntry> undo;
  for (uint64_t seg : on_disk) {
    if (seg < committed_segment_ || !undo_records) continue;
    OpenOptions ro;
    ro.read_only = true;
    CDP_ASSIGN_OR_RETURN(auto f, env->Open(JoinPath(jdir, SegmentFileName(seg)), ro));
    uint64_t start = seg == committed_segment_ ? committed_offset_ : 0;
    auto scan = ScanSegment(*f, seg, start, true, std::numeric_limits<uint64_t>::max(),
                            [&](const UndoHeader& h, const UndoLocation& loc) {
                              if (h.seq <= applied) return Status::OK();  // cannot be ours: never undo it
                              UndoEntry e{h.seq, h.offset, h.length, h.kind, loc.segment, loc.file_offset,
                                          h.data_crc, h.time_us};
                              undo.push_back(e);
                              return Status::OK();
                            });
    if (!scan.ok()) {
      // A segment created after the commit point whose header never became
      // durable holds nothing to undo; the committed segment must be sound.
      if (seg == committed_segment_) return scan.status();
    }
  }
  std::sort(undo.begin(), undo.end(), [](const UndoEntry& a, const UndoEntry& b) {
    if (a.seq != b.seq) return a.seq > b.seq;
    if (a.segment != b.segment) return a.segment > b.segment;
    return a.file_offset > b.file_offset;
  });
  if (!undo.empty()) {
    log::Get("mt.volume")->warn("{} undoing {} uncommitted undo records after a crash",
                                log::Where{o_.name, "", applied}, undo.size());
  }
  CDP_RETURN_IF_ERROR(UndoEntries(undo));

  // The replica is back at the committed image; cut the journal to match.
  bool dir_dirty = false;
  std::map<uint64_t, SegmentInfo> known;
  {
    std::lock_guard<std::mutex> lk(seg_mu_);
    known = segments_;
  }
  for (uint64_t seg : on_disk) {
    bool drop = seg > committed_segment_ || (seg < committed_segment_ && !known.count(seg));
    if (drop) {
      CDP_RETURN_IF_ERROR(env->Remove(JoinPath(jdir, SegmentFileName(seg))));
      dir_dirty = true;
    }
  }
  for (const auto& [seg, info] : known) {
    if (std::find(on_disk.begin(), on_disk.end(), seg) == on_disk.end())
      return Status::Corruption(jdir + ": journal segment " + SegmentFileName(seg) + " is missing");
  }
  if (dir_dirty) CDP_RETURN_IF_ERROR(env->SyncDir(jdir));
  CDP_ASSIGN_OR_RETURN(writer_, SegmentWriter::Open(env, jdir, committed_segment_, false, 0, committed_offset_,
                                                    o_.segment_bytes));
  writer_->on_new_segment = [this](uint64_t seg, std::shared_ptr<File> f) {
    auto lk = LockIndexExclusive();
    seg_files_[seg] = std::move(f);
  };
  {
    // Undo records past the applied sequence: staged by an apply that failed
    // (never in the database), or committed before a rollback cut them off.
    auto lk = LockIndexExclusive();
    undo_->Discarded();
  }
  {
    CDP_ASSIGN_OR_RETURN(auto tx, sqlite::Transaction::Begin(*db_));
    CDP_RETURN_IF_ERROR(undo_->RemoveAbove(applied));
    CDP_RETURN_IF_ERROR(tx.Commit());
  }
  {
    auto lk = LockIndexExclusive();
    undo_->Committed();
    for (auto it = seg_files_.begin(); it != seg_files_.end();) {
      it = it->first >= committed_segment_ ? seg_files_.erase(it) : std::next(it);
    }
    seg_files_[committed_segment_] = writer_->shared_file();
  }
  return Status::OK();
}

Status UndoLog::RebuildIndex() {
  std::map<uint64_t, SegmentInfo> segs;
  {
    std::lock_guard<std::mutex> lk(seg_mu_);
    segs = segments_;
  }
  std::map<uint64_t, std::shared_ptr<File>> files;
  for (const auto& [seg, info] : segs) {
    if (seg == committed_segment_) {
      files[seg] = writer_->shared_file();
      continue;
    }
    OpenOptions ro;
    ro.read_only = true;
    CDP_ASSIGN_OR_RETURN(auto nf, o_.env->Open(SegmentPath(seg), ro));
    files[seg] = std::shared_ptr<File>(std::move(nf));
  }
  if (!undo_->built() || index_version_ < 2) {
    // An index of version 1 (made before the undo tables), or a new one: fill
    // them from the committed journal, in one transaction.
    constexpr size_t kChunk = 1 << 16;
    CDP_ASSIGN_OR_RETURN(auto tx, sqlite::Transaction::Begin(*db_));
    CDP_RETURN_IF_ERROR(undo_->Clear());
    std::vector<UndoEntry> chunk;
    for (const auto& [seg, info] : segs) {
      File& f = *files[seg];
      uint64_t limit = seg == committed_segment_ ? committed_offset_ : info.bytes;
      CDP_ASSIGN_OR_RETURN(auto scan, ScanSegment(f, seg, 0, false, limit,
                                                  [&](const UndoHeader& h, const UndoLocation& loc) {
                                                    chunk.push_back(UndoEntry{h.seq, h.offset, h.length, h.kind,
                                                                              loc.segment, loc.file_offset,
                                                                              h.data_crc, h.time_us});
                                                    if (chunk.size() < kChunk) return Status::OK();
                                                    Status s = undo_->Insert(chunk);
                                                    chunk.clear();
                                                    return s;
                                                  }));
      if (scan.valid_end < limit) {
        return Status::Corruption(f.path() + ": committed journal records are damaged at " +
                                  std::to_string(scan.valid_end));
      }
    }
    CDP_RETURN_IF_ERROR(undo_->Insert(chunk));
    CDP_RETURN_IF_ERROR(undo_->MarkBuilt());
    CDP_RETURN_IF_ERROR(db_->Exec("UPDATE volume SET format_version = " + std::to_string(kIndexFormatVersion) +
                                  " WHERE id = 1"));
    Status s = tx.Commit();
    auto lk = LockIndexExclusive();
    if (!s.ok()) {
      undo_->Discarded();
      return s;
    }
    undo_->Committed();
    index_version_ = kIndexFormatVersion;
  }
  auto lk = LockIndexExclusive();
  seg_files_ = std::move(files);
  return Status::OK();
}

}  // namespace cdp::mt

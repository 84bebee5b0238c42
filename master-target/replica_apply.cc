// SPDX-License-Identifier: Apache-2.0
#include "master-target/replica_volume.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "common/base/log.h"
#include "common/daemon/metrics.h"
#include "common/store/sqlite.h"
#include "master-target/replica_batch.h"

namespace cdp::mt {

namespace {

constexpr size_t kJournalFlushBytes = 8u << 20;  // encoded undo bytes buffered before an Append
constexpr size_t kReadWindowBytes = 4u << 20;  // old data read in one ReplicaIo::Read (at least one chunk)

ApplyOutcome Nack(proto::NackReason reason, std::string msg, uint64_t expected = 0) {
  ApplyOutcome o;
  o.ack = false;
  o.reason = reason;
  o.message = std::move(msg);
  o.expected_seq = expected;
  return o;
}

}  // namespace

Status ReplicaVolume::HealLocked() {
  if (!broken_) return Status::OK();
  if (!heal_by_recovery_) return Status::IOError(id_.name + ": volume needs to be reopened after an I/O failure");
  Status r = journal_->Recover(applied_.load());
  if (!r.ok()) return r.WithContext(id_.name + ": undo of a failed apply (retried at each batch)");
  broken_ = false;
  heal_by_recovery_ = false;
  log::Get("mt.volume")->info("{} the failed apply is undone now: the volume works again",
                              log::Where{id_.name, "", applied_.load()});
  return Status::OK();
}

Result<ApplyOutcome> ReplicaVolume::CheckOpen(const VolumeIdentity& id, const Upstream& from) {
  std::lock_guard<std::mutex> lk(apply_mu_);
  CDP_RETURN_IF_ERROR(HealLocked());
  // Another disk under this name never replaces the replica or its history.
  const std::string keep = ": the replica and its recovery points are kept; another disk needs another volume name";
  if (id.uuid != id_.uuid) return Nack(proto::NackReason::kWrongGeneration, "volume uuid differs" + keep);
  if (id.size != id_.size)
    return Nack(proto::NackReason::kWrongGeneration,
                "volume size differs: " + std::to_string(id.size) + " != " + std::to_string(id_.size) + keep);
  if (id.block_size != id_.block_size)
    return Nack(proto::NackReason::kWrongGeneration,
                "block size differs: " + std::to_string(id.block_size) + " != " + std::to_string(id_.block_size) + keep);
  if (id.sealed != id_.sealed)
    return Nack(proto::NackReason::kWrongGeneration,
                std::string(id_.sealed ? "the volume is sealed (tenant-side encryption) and the stream is not"
                                       : "the stream is sealed (tenant-side encryption) and the volume is not") +
                    "; encryption is chosen when a volume is first protected" + keep);
  const uint64_t generation = fence_->generation();
  Result<std::optional<VolumeFence::Refusal>> refused = fence_->Admit(id.generation, from, applied_.load());
  if (fence_->generation() != generation) {  // re-protected
    id_.generation = fence_->generation();
    UpdateGauges();
  }
  if (!refused.ok()) return refused.status();
  if (*refused) return Nack((*refused)->reason, std::move((*refused)->message));
  ApplyOutcome o;
  o.durable_seq = fence_->numbering().Wire(applied_.load());
  return o;
}

Result<uint64_t> ReplicaVolume::ArmReprotect() {
  std::lock_guard<std::mutex> lk(apply_mu_);
  if (broken_) return Status::IOError(id_.name + ": volume needs to be reopened after an I/O failure");
  return fence_->ArmReprotect(applied_.load());
}

Result<ApplyOutcome> ReplicaVolume::ApplyBatch(const std::vector<proto::Record>& recs) {
  std::lock_guard<std::mutex> lk(apply_mu_);
  if (Status h = HealLocked(); !h.ok()) {
    NoteApply(h);
    return h;
  }
  if (std::optional<VolumeFence::Refusal> refused = fence_->RefuseBatch())
    return Nack(refused->reason, std::move(refused->message));
  const uint64_t applied = applied_.load();
  ApplyOutcome out;
  for (size_t i = 1; i < recs.size(); ++i) {
    if (recs[i].seq != recs[i - 1].seq + 1)
      return Nack(proto::NackReason::kBadRecord, "sequences in the batch are not contiguous");
  }
  size_t first = 0;
  while (first < recs.size() && recs[first].seq <= applied) ++first;
  out.duplicates = first;
  if (first == recs.size()) {
    out.durable_seq = applied;
    return out;
  }
  if (recs[first].seq != applied + 1) {
    return Nack(proto::NackReason::kGap,
                "expected sequence " + std::to_string(applied + 1) + ", got " + std::to_string(recs[first].seq),
                applied + 1);
  }
  {
    CDP_ASSIGN_OR_RETURN(std::optional<ApplyOutcome> locked, CheckHistoryLock());
    if (locked) return *locked;
  }
  if (uint64_t work = proto::BatchWork(std::span<const proto::Record>(recs).subspan(first));
      work > o_.max_batch_work) {
    return Nack(proto::NackReason::kBadRecord, "batch asks " + std::to_string(work) + " bytes of work, over the cap of " +
                                                   std::to_string(o_.max_batch_work) + " (max_batch_work)");
  }
  for (size_t i = first; i < recs.size(); ++i) {
    const proto::Record& r = recs[i];
    const std::string at = "record seq " + std::to_string(r.seq) + ": ";
    if (proto::IsWriteKind(r.kind) && IsSealedKind(r.kind) != id_.sealed)
      return Nack(proto::NackReason::kBadRecord,
                  at + (id_.sealed ? "a plain write on a sealed volume" : "a sealed write on a plain volume"));
    switch (r.kind) {
      case proto::RecordKind::kSealed:
      case proto::RecordKind::kSealedZero:
        if (r.length == 0 || r.length > proto::kMaxRecordLength)
          return Nack(proto::NackReason::kBadRecord, at + "sealed length out of range");
        if (r.offset % proto::kSealUnit != 0 || r.length % proto::kSealUnit != 0)
          return Nack(proto::NackReason::kBadRecord, at + "sealed range not on whole 4 KiB blocks");
        if (r.offset > id_.size || r.length > id_.size - r.offset)
          return Nack(proto::NackReason::kBadRecord, at + "range past the end of the volume");
        if (r.data.size() != proto::SealMacBytes(r.length) + (r.kind == proto::RecordKind::kSealed ? r.length : 0))
          return Nack(proto::NackReason::kBadRecord, at + "sealed data size != blocks + MACs");
        break;
      case proto::RecordKind::kData:
        if (r.length == 0) return Nack(proto::NackReason::kBadRecord, at + "zero length");
        if (r.length > proto::kMaxRecordLength) return Nack(proto::NackReason::kBadRecord, at + "absurd length");
        if (r.data.size() != r.length) return Nack(proto::NackReason::kBadRecord, at + "data size != length");
        [[fallthrough]];
      case proto::RecordKind::kZero:
      case proto::RecordKind::kTrim:
        if (r.length == 0) return Nack(proto::NackReason::kBadRecord, at + "zero length");
        if (r.length > proto::kMaxRecordLength) return Nack(proto::NackReason::kBadRecord, at + "absurd length");
        if (r.offset > id_.size || r.length > id_.size - r.offset)
          return Nack(proto::NackReason::kBadRecord, at + "range past the end of the volume");
        if (r.kind != proto::RecordKind::kData && !r.data.empty())
          return Nack(proto::NackReason::kBadRecord, at + "zero/trim record with data");
        break;
      case proto::RecordKind::kFlush:
        if (r.offset != 0 || r.length != 0 || !r.data.empty())
          return Nack(proto::NackReason::kBadRecord, at + "flush with a range");
        break;
      case proto::RecordKind::kTag:
        if (!ValidName(std::string_view(reinterpret_cast<const char*>(r.data.data()), r.data.size())))
          return Nack(proto::NackReason::kBadRecord, at + "bad tag name");
        break;
      case proto::RecordKind::kAnomaly: {
        uint64_t back = 0;
        std::string message;
        if (r.offset != 0 || r.length != 0 || !proto::DecodeAnomaly(r.data, &back, &message) ||
            back > fence_->numbering().Wire(r.seq))
          return Nack(proto::NackReason::kBadRecord, at + "bad anomaly record");
        break;
      }
      default:
        return Nack(proto::NackReason::kBadRecord, at + "unknown kind");
    }
  }
  Status s = id_.sealed ? ApplyLocked(UnsealRecords(recs, first, id_.size), 0, &out) : ApplyLocked(recs, first, &out);
  NoteApply(s);
  if (!s.ok()) {
    log::Get("mt.volume")->error("{} apply failed: {}; undoing the partial batch", log::Where{id_.name, "", applied + 1},
                                 s.ToString());
    Status r = journal_->Recover(applied_.load());
    if (!r.ok()) {
      broken_ = true;
      heal_by_recovery_ = true;  // HealLocked() tries again at the next batch
      log::Get("mt.volume")->error("{} undo after failed apply failed: {}", log::Where{id_.name, "", applied},
                                   r.ToString());
    }
    return s;
  }
  out.applied = recs.size() - first;
  if (o_.metrics.records_applied) o_.metrics.records_applied->Inc(out.applied);
  return out;
}

void ReplicaVolume::NoteApply(const Status& s, StallCause cause) {
  {
    std::lock_guard<std::mutex> lk(stall_mu_);
    if (s.ok()) {
      if (!stall_) return;
      log::Get("mt.volume")->info("{} apply resumed after {} failed attempt(s) ({})",
                                  log::Where{id_.name, "", applied_.load()}, stall_->failures,
                                  StallCauseName(stall_->cause));
      stall_.reset();
    } else {
      if (cause == StallCause::kNone) cause = s.IsNoSpace() ? StallCause::kNoSpace : StallCause::kIOError;
      if (!stall_ || stall_->cause != cause) stall_ = ApplyStall{cause, "", o_.clock->WallMicros(), 0};
      stall_->message = s.ToString();
      ++stall_->failures;
    }
  }
  if (o_.metrics.stalled_no_space) o_.metrics.stalled_no_space->Set(cause == StallCause::kNoSpace ? 1 : 0);
  if (o_.metrics.stalled_io_error) o_.metrics.stalled_io_error->Set(cause == StallCause::kIOError ? 1 : 0);
  if (o_.metrics.stalled_history_lock)
    o_.metrics.stalled_history_lock->Set(cause == StallCause::kHistoryLock ? 1 : 0);
}

Status ReplicaVolume::ApplyLocked(const std::vector<proto::Record>& recs, size_t first, ApplyOutcome* out) {
  const uint64_t wall = o_.clock->WallMicros();
  BatchOverlay overlay;
  Bytes jbuf;
  struct Pending {
    UndoEntry e;
    size_t buf_off;
  };
  std::vector<Pending> pend;
  std::vector<UndoEntry> added;
  Bytes old;
  uint64_t read_bytes = 0, write_bytes = 0, change_bytes = 0;

  auto flush_buf = [&]() -> Status {
    if (jbuf.empty()) return Status::OK();
    CDP_ASSIGN_OR_RETURN(UndoLocation loc, journal_->Append(jbuf, pend.front().e.seq));
    for (Pending& p : pend) {
      p.e.segment = loc.segment;
      p.e.file_offset = loc.file_offset + p.buf_off;
      added.push_back(p.e);
    }
    write_bytes += jbuf.size();
    jbuf.clear();
    pend.clear();
    return Status::OK();
  };

  // 1. Undo records: the bytes each write overwrites, in order. The chunks
  // of a window are read from the replica together (the replica does not
  // change before step 4), then each gets the batch's earlier records laid
  // over it, record by record.
  struct Chunk {
    size_t rec;  // index in recs
    uint64_t off;
    uint32_t n;
    bool last;       // the record's last chunk
    bool hole;       // the replica has no data there: zeros, not read
    size_t buf_off;  // in `old`
  };
  std::vector<Chunk> chunks;
  std::vector<ReadOp> reads;
  KnownHoles holes(store_->file());
  size_t next_rec = first;
  uint64_t next_done = 0;
  while (next_rec < recs.size()) {
    // Gather a window of chunks.
    chunks.clear();
    reads.clear();
    size_t window = 0;
    while (next_rec < recs.size()) {
      const proto::Record& r = recs[next_rec];
      if (!proto::IsWriteKind(r.kind)) {  // records are plain here (UnsealRecords)
        ++next_rec;
        continue;
      }
      const uint32_t n = uint32_t(std::min<uint64_t>(kMaxUndoChunk, r.length - next_done));
      if (!chunks.empty() && window + n > kReadWindowBytes) break;
      const uint64_t off = r.offset + next_done;
      // A hole of the replica reads as zeros without being read: an initial
      // sync onto a fresh replica reads nothing (reading a hole costs the
      // kernel a zeroed page-cache page per 4 KiB: most of the master
      // target's CPU in that case).
      CDP_ASSIGN_OR_RETURN(bool hole, holes.IsHole(off, n));
      next_done += n;
      const bool last = next_done == r.length;
      chunks.push_back(Chunk{next_rec, off, n, last, hole, window});
      window += n;
      if (last) {
        ++next_rec;
        next_done = 0;
      }
    }
    if (chunks.empty()) break;
    old.resize(window);
    for (const Chunk& c : chunks) {
      if (c.hole) continue;  // zeros: filled below only if the batch wrote there
      reads.push_back(ReadOp{c.off, c.n, old.data() + c.buf_off});
      read_bytes += c.n;
    }
    CDP_RETURN_IF_ERROR(store_->ReadBatch(reads));
    for (const Chunk& c : chunks) {
      const proto::Record& r = recs[c.rec];
      uint8_t* buf = old.data() + c.buf_off;
      size_t at = jbuf.size();
      UndoKind kind;
      if (c.hole && !overlay.Touches(c.off, c.n)) {
        // Zeros, known without filling a buffer and scanning it (an initial
        // sync onto a fresh replica is all this).
        EncodeUndoRecord(UndoKind::kZeroes, r.seq, c.off, c.n, wall, ByteSpan(), &jbuf);
        kind = UndoKind::kZeroes;
      } else {
        if (c.hole) std::memset(buf, 0, c.n);
        overlay.Patch(c.off, c.n, buf);
        kind = EncodeOldData(r.seq, c.off, wall, ByteSpan(buf, c.n), o_.journal_zstd_level, &jbuf);
      }
      pend.push_back(Pending{UndoEntry{r.seq, c.off, c.n, kind, 0, 0, DecodeFixed32(jbuf.data() + at), wall}, at});
      if (jbuf.size() >= kJournalFlushBytes) CDP_RETURN_IF_ERROR(flush_buf());
      if (c.last) {
        change_bytes += r.length;
        overlay.Insert(r.offset, r.length, r.kind == proto::RecordKind::kData ? r.data.data() : nullptr);
      }
    }
  }
  CDP_RETURN_IF_ERROR(flush_buf());
  // 2. Journal durable (sync point 1).
  CDP_RETURN_IF_ERROR(journal_->Sync());
  // 3. Exports see the undo records before the replica changes.
  journal_->Stage(added);
  // 4. The replica (sync point 2): the batch's final image, `overlay`, as
  // disjoint extents. Zeros first (holes punched), then every data extent in
  // one batched write (replica_io.h). Zeros where step 1 found a hole are
  // there already (nothing has written the replica since), and the digest
  // store's entries for them stay right.
  bool replica_dirty = false;
  std::vector<WriteOp> writes;
  Status zs;
  overlay.ForEach([&](uint64_t off, uint64_t len, const uint8_t* data) {
    if (data) {
      writes.push_back(WriteOp{off, ByteSpan(data, len)});
      replica_dirty = true;
    } else if (zs.ok() && !holes.Covers(off, len)) {
      zs = store_->Zero(off, len);
      replica_dirty = true;
    }
  });
  CDP_RETURN_IF_ERROR(zs);
  if (!writes.empty()) {
    CDP_RETURN_IF_ERROR(store_->WriteBatch(writes));
    for (const WriteOp& w : writes) write_bytes += w.data.size();
  }
  if (replica_dirty) CDP_RETURN_IF_ERROR(store_->Sync());

  // 5. Recovery points of this batch, and the suspect-clean points of its
  // anomalies (older than the batch: they take their place by sequence).
  PointCatalogue::NewPoints new_points = catalogue_->PointsOf(recs, first, wall, journal_->horizon());

  // 6. Segment bookkeeping.
  using Segments = std::map<uint64_t, SegmentInfo>;
  CDP_ASSIGN_OR_RETURN(const Segments touched, journal_->Touched(added));
  const uint64_t last_seq = recs.back().seq;
  const UndoLog::Position pos = journal_->position();

  if (o_.before_commit) CDP_RETURN_IF_ERROR(o_.before_commit());
  // 7. Commit point.
  CDP_RETURN_IF_ERROR(CommitBatch(last_seq, pos, touched, added, &new_points));
  // 8. Publish (the applied sequence last: a reader that sees it finds its points).
  journal_->Committed(touched, pos);
  catalogue_->PublishNew(std::move(new_points));
  applied_.store(last_seq);
  out->durable_seq = last_seq;
  const VolumeMetrics& m = o_.metrics;
  if (m.bytes_applied) m.bytes_applied->Inc(change_bytes);
  if (m.disk_read_bytes) m.disk_read_bytes->Inc(read_bytes);
  if (m.disk_write_bytes) m.disk_write_bytes->Inc(write_bytes);
  if (m.apply_lag_seconds && recs.back().timestamp_us) {
    uint64_t now = o_.clock->WallMicros(), ts = recs.back().timestamp_us;
    m.apply_lag_seconds->Set(now > ts ? double(now - ts) / 1e6 : 0.0);
  }
  UpdateGauges();
  return Status::OK();
}

}  // namespace cdp::mt

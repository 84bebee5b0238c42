// SPDX-License-Identifier: Apache-2.0
#include "master-target/replica_volume.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "common/base/log.h"
#include "common/daemon/metrics.h"
#include "common/store/sqlite.h"

namespace cdp::mt {

namespace {

constexpr size_t kJournalFlushBytes = 8u << 20;  // encoded undo bytes buffered before an Append
constexpr uint64_t kZeroChunk = 1u << 20;
constexpr size_t kReadWindowBytes = 4u << 20;  // old data read in one ReplicaIo::Read (at least one chunk)

// The bytes a batch's earlier records wrote, so that a later record in the same
// batch journals the bytes it really overwrites. Non-overlapping extents;
// `data == nullptr` means zeros. Pointers refer into the batch's records.
class BatchOverlay {
 public:
  void Insert(uint64_t off, uint64_t len, const uint8_t* data) {
    const uint64_t end = off + len;
    auto it = m_.lower_bound(off);
    if (it != m_.begin()) {
      auto p = std::prev(it);
      if (p->second.end > off) {
        Ext tail = p->second;
        uint64_t pstart = p->first;
        p->second.end = off;
        if (tail.end > end) m_[end] = Ext{tail.end, tail.data ? tail.data + (end - pstart) : nullptr};
      }
    }
    it = m_.lower_bound(off);
    while (it != m_.end() && it->first < end) {
      if (it->second.end > end) {
        Ext e = it->second;
        uint64_t s = it->first;
        m_.erase(it);
        m_[end] = Ext{e.end, e.data ? e.data + (end - s) : nullptr};
        break;
      }
      it = m_.erase(it);
    }
    m_[off] = Ext{end, data};
  }

  // Calls fn(offset, length, data) for every extent, ascending; data ==
  // nullptr: zeros.
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (const auto& [off, e] : m_) fn(off, e.end - off, e.data);
  }

  // Whether any extent overlaps [off, off + len).
  bool Touches(uint64_t off, uint64_t len) const {
    auto it = m_.upper_bound(off);
    if (it != m_.begin() && std::prev(it)->second.end > off) return true;
    return it != m_.end() && it->first < off + len;
  }

  void Patch(uint64_t off, uint64_t len, uint8_t* buf) const {
    const uint64_t end = off + len;
    auto it = m_.upper_bound(off);
    if (it != m_.begin()) --it;
    for (; it != m_.end() && it->first < end; ++it) {
      uint64_t s = std::max(it->first, off), t = std::min(it->second.end, end);
      if (s >= t) continue;
      if (it->second.data) {
        std::memcpy(buf + (s - off), it->second.data + (s - it->first), t - s);
      } else {
        std::memset(buf + (s - off), 0, t - s);
      }
    }
  }

 private:
  struct Ext {
    uint64_t end;
    const uint8_t* data;
  };
  std::map<uint64_t, Ext> m_;
};

// What the replica read as zeros before the batch: disjoint ranges [start,
// end) learnt from File::NextData (SEEK_DATA) as step 1 of apply asks. The
// records of a batch at scattered offsets of a sparse replica then cost a few
// seeks instead of one each, and a zero record over a range that was a hole
// needs no hole punched. Valid until the batch writes the replica.
class KnownHoles {
 public:
  explicit KnownHoles(const File* replica) : replica_(replica) {}

  // True when [off, off + n) read as zeros before the batch; asks the replica
  // unless what was learnt already answers.
  Result<bool> IsHole(uint64_t off, uint64_t n) {
    if (Covers(off, n)) return true;
    CDP_ASSIGN_OR_RETURN(uint64_t data, replica_->NextData(off));
    if (data > off) Add(off, data);
    return data >= off + n;
  }

  // From what was learnt only: true when [off, off + n) is known to read as zeros.
  bool Covers(uint64_t off, uint64_t n) const {
    auto it = m_.upper_bound(off);
    if (it == m_.begin()) return false;
    return std::prev(it)->second >= off + n;
  }

 private:
  void Add(uint64_t start, uint64_t end) {
    auto it = m_.upper_bound(start);
    if (it != m_.begin() && std::prev(it)->second >= start) {
      it = std::prev(it);
      start = it->first;
      end = std::max(end, it->second);
      it = m_.erase(it);
    }
    while (it != m_.end() && it->first <= end) {
      end = std::max(end, it->second);
      it = m_.erase(it);
    }
    m_[start] = end;
  }

  const File* replica_;
  std::map<uint64_t, uint64_t> m_;  // start -> end
};

bool IsSealedKind(proto::RecordKind k) {
  return k == proto::RecordKind::kSealed || k == proto::RecordKind::kSealedZero;
}

}  // namespace

std::vector<proto::Record> UnsealRecords(const std::vector<proto::Record>& recs, size_t first, uint64_t volume_size) {
  std::vector<proto::Record> out;
  out.reserve(2 * (recs.size() - first));
  for (size_t i = first; i < recs.size(); ++i) {
    const proto::Record& r = recs[i];
    if (!IsSealedKind(r.kind)) {
      out.push_back(r);
      continue;
    }
    const uint64_t macs = proto::SealMacBytes(r.length);
    const bool zero = r.kind == proto::RecordKind::kSealedZero;
    proto::Record blocks{r.seq, r.offset, r.length, zero ? proto::RecordKind::kZero : proto::RecordKind::kData,
                         r.timestamp_us, {}};
    if (!zero) blocks.data.assign(r.data.begin(), r.data.begin() + r.length);
    out.push_back(std::move(blocks));
    out.push_back(proto::Record{r.seq, volume_size + proto::SealMacBytes(r.offset), uint32_t(macs),
                                proto::RecordKind::kData, r.timestamp_us, Bytes(r.data.end() - macs, r.data.end())});
  }
  return out;
}

namespace {

ApplyOutcome Nack(proto::NackReason reason, std::string msg, uint64_t expected = 0) {
  ApplyOutcome o;
  o.ack = false;
  o.reason = reason;
  o.message = std::move(msg);
  o.expected_seq = expected;
  return o;
}

}  // namespace

Status ReplicaVolume::ZeroReplica(uint64_t offset, uint64_t len) {
  Status s = replica_->PunchHole(offset, len);
  if (s.ok()) {
    digests_->Zeroed(offset, len);
    return s;
  }
  digests_->Forget(offset, len);  // the punch may have changed part of the range
  static const std::vector<uint8_t> zeros(kZeroChunk, 0);
  while (len > 0) {
    uint64_t n = std::min(len, kZeroChunk);
    CDP_RETURN_IF_ERROR(replica_->Write(offset, ByteSpan(zeros.data(), n)));
    if (o_.metrics.disk_write_bytes) o_.metrics.disk_write_bytes->Inc(n);
    offset += n;
    len -= n;
  }
  return Status::OK();
}

Status ReplicaVolume::HealLocked() {
  if (!broken_) return Status::OK();
  if (!heal_by_recovery_) return Status::IOError(id_.name + ": volume needs to be reopened after an I/O failure");
  Status r = RecoverUncommitted();
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
  // Fenced: whatever generation the old primary speaks, nothing it sends is taken.
  if (failover_) return Nack(proto::NackReason::kWrongGeneration, FencedMessage());
  if (state_ == VolumeState::kFailedBack && id.generation <= id_.generation)
    return Nack(proto::NackReason::kWrongGeneration, FailedBackMessage());
  if (id.generation < id_.generation)
    return Nack(proto::NackReason::kWrongGeneration,
                "stale generation " + std::to_string(id.generation) + " < " + std::to_string(id_.generation));
  if (id.generation == id_.generation && state_ != VolumeState::kReplicating)
    return Nack(proto::NackReason::kWrongGeneration, std::string("volume is ") + StateName(state_) +
                                                         "; re-protect is an operator command (cdpctl reprotect)");
  if (id.generation > id_.generation) {
    if (id.generation != reprotect_armed_.load()) {
      return Nack(proto::NackReason::kPermissionDenied,
                  "generation " + std::to_string(id.generation) + " > " + std::to_string(id_.generation) +
                      ": re-protect is an operator command (cdpctl reprotect at the master target)");
    }
    CDP_RETURN_IF_ERROR(Reprotect(id.generation));
  }
  if (upstream_generation_ == id_.generation && !(upstream_ == from)) {
    return Nack(proto::NackReason::kPermissionDenied,
                "volume " + id_.name + " replicates through " + upstream_.Describe() + " in generation " +
                    std::to_string(id_.generation) + ", not through " + from.Describe() +
                    ": records still held there would interleave with this stream. To move the volume, re-protect "
                    "it (cdpctl reprotect " + id_.name + "): the old path is fenced and every region is compared");
  }
  if (upstream_generation_ != id_.generation) CDP_RETURN_IF_ERROR(BindUpstream(from));
  ApplyOutcome o;
  o.durable_seq = numbering().Wire(applied_.load());
  return o;
}

Status ReplicaVolume::BindUpstream(const Upstream& from) {
  CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare("INSERT OR REPLACE INTO upstream(id, generation, role, name) VALUES(1, ?1, ?2, ?3)"));
  CDP_RETURN_IF_ERROR(st.BindAll(id_.generation, from.role, from.name));
  CDP_RETURN_IF_ERROR(st.Run());
  {
    std::lock_guard<std::mutex> lk(meta_mu_);
    upstream_generation_ = id_.generation;
    upstream_ = from;
  }
  log::Get("mt.volume")->info("{} generation {} replicates through {}", log::Where{id_.name, "", applied_.load()},
                              id_.generation, from.Describe());
  return Status::OK();
}

Result<uint64_t> ReplicaVolume::ArmReprotect() {
  std::lock_guard<std::mutex> lk(apply_mu_);
  if (broken_) return Status::IOError(id_.name + ": volume needs to be reopened after an I/O failure");
  if (failover_)
    return Status::InvalidArgument(id_.name + " is failed over at sequence " + std::to_string(failover_->point_seq) +
                                   ": re-protect after a failover needs a failback first (cdpctl failback); before a "
                                   "commit, cdpctl failover " + id_.name + " --undo returns to protecting");
  reprotect_armed_.store(id_.generation + 1);
  log::Get("mt.volume")->warn("{} re-protect armed by the operator: generation {} will be accepted",
                              log::Where{id_.name, "", applied_.load()}, id_.generation + 1);
  return id_.generation + 1;
}

Status ReplicaVolume::Reprotect(uint64_t gen) {
  const uint64_t base = applied_.load();
  {
    CDP_ASSIGN_OR_RETURN(auto tx, sqlite::Transaction::Begin(*db_));
    CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare("UPDATE volume SET generation = ?1, state = 0, rollback_to = 0 WHERE id = 1"));
    CDP_RETURN_IF_ERROR(st.BindAll(gen));
    CDP_RETURN_IF_ERROR(st.Run());
    CDP_ASSIGN_OR_RETURN(auto hs, db_->Prepare("INSERT OR REPLACE INTO history(id, seq_base) VALUES(1, ?1)"));
    CDP_RETURN_IF_ERROR(hs.BindAll(base));
    CDP_RETURN_IF_ERROR(hs.Run());
    CDP_RETURN_IF_ERROR(tx.Commit());
  }
  {
    std::lock_guard<std::mutex> lk(meta_mu_);
    state_ = VolumeState::kReplicating;
  }
  id_.generation = gen;
  generation_.store(gen);
  seq_base_.store(base);
  rollback_to_ = 0;
  reprotect_armed_.store(0);
  log::Get("mt.volume")->info("{} re-protected under generation {}: its sequence 1 follows history sequence {}; "
                              "every recovery point is kept", log::Where{id_.name, "", base}, gen, base);
  UpdateGauges();
  return Status::OK();
}

Result<ApplyOutcome> ReplicaVolume::ApplyBatch(const std::vector<proto::Record>& recs) {
  std::lock_guard<std::mutex> lk(apply_mu_);
  if (Status h = HealLocked(); !h.ok()) {
    NoteApply(h);
    return h;
  }
  if (failover_) return Nack(proto::NackReason::kWrongGeneration, FencedMessage());
  if (state_ == VolumeState::kFailedBack) return Nack(proto::NackReason::kWrongGeneration, FailedBackMessage());
  if (state_ != VolumeState::kReplicating)
    return Nack(proto::NackReason::kWrongGeneration,
                std::string("volume is ") + StateName(state_) + "; re-protect is an operator command (cdpctl reprotect)");
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
            back > numbering().Wire(r.seq))
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
    Status r = RecoverUncommitted();
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
    std::lock_guard<std::mutex> lk(meta_mu_);
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
    CDP_ASSIGN_OR_RETURN(UndoLocation loc, writer_->Append(jbuf, pend.front().e.seq));
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
  KnownHoles holes(replica_.get());
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
    CDP_RETURN_IF_ERROR(replica_io_->Read(reads));
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
  CDP_RETURN_IF_ERROR(writer_->Sync());
  // 3. Exports see the undo records before the replica changes.
  if (!added.empty()) {
    auto lk = LockIndexExclusive();
    for (const UndoEntry& e : added) undo_->Stage(e);
  }
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
      zs = ZeroReplica(off, len);
      replica_dirty = true;
    }
  });
  CDP_RETURN_IF_ERROR(zs);
  if (!writes.empty()) {
    if (Status ws = replica_io_->Write(writes); !ws.ok()) {
      for (const WriteOp& w : writes) digests_->Forget(w.offset, w.data.size());  // any may have landed in part
      return ws;
    }
    for (const WriteOp& w : writes) {
      digests_->Wrote(w.offset, w.data);
      write_bytes += w.data.size();
    }
  }
  if (replica_dirty) CDP_RETURN_IF_ERROR(replica_->Sync());

  // 5. Recovery points of this batch, and the suspect-clean points of its
  // anomalies (older than the batch: they take their place by sequence).
  std::vector<RecoveryPoint> new_points;
  std::vector<AnomalyEvent> new_anomalies;
  // A point carries the time the protected host wrote it (the record's
  // capture time, from the agent's clock; issue 38 F4) and, beside it, the
  // time it was applied here. Crash-consistent points are spaced by the
  // host's clock too, so every copy of the volume makes the same points from
  // the same stream, whatever its backlog was. Retention and the history
  // lock go by the apply time: a host's clock cannot age its own history.
  uint64_t last_crash = 0;  // host time of the newest crash-consistent point
  {
    std::lock_guard<std::mutex> lk(meta_mu_);
    for (auto it = points_.rbegin(); it != points_.rend(); ++it) {
      if (it->kind == PointKind::kCrash) {
        last_crash = it->time_us;
        break;
      }
    }
  }
  auto written = [&](const proto::Record& r) { return r.timestamp_us != 0 ? r.timestamp_us : wall; };
  for (size_t i = first; i < recs.size(); ++i) {
    const proto::Record& r = recs[i];
    const uint64_t when = written(r);
    if (r.kind == proto::RecordKind::kFlush) {
      // A host clock stepped back starts the spacing again.
      if (last_crash == 0 || when >= last_crash + o_.point_interval_us || when < last_crash) {
        new_points.push_back(RecoveryPoint{0, r.seq, when, PointKind::kCrash, "", false, wall});
        last_crash = when;
      }
    } else if (r.kind == proto::RecordKind::kTag) {
      new_points.push_back(RecoveryPoint{0, r.seq, when, PointKind::kTag,
                                         std::string(reinterpret_cast<const char*>(r.data.data()), r.data.size()),
                                         false, wall});
    } else if (r.kind == proto::RecordKind::kAnomaly) {
      AnomalyEvent a;
      uint64_t back = 0;
      (void)proto::DecodeAnomaly(r.data, &back, &a.message);  // checked by ApplyBatch
      a.seq = r.seq;
      a.clean_seq = std::max(r.seq - std::min(back, r.seq), horizon_);
      a.point_id = int64_t(new_points.size());  // CommitBatch makes it the point's id
      a.time_us = wall;
      a.hold_until_us = wall + o_.anomaly_hold_us;
      new_points.push_back(RecoveryPoint{0, a.clean_seq, when, PointKind::kTag, "suspect-clean", false, wall});
      log::Get("mt.volume")->warn("{} possible ransomware at the protected host: {}; the image at sequence {} is "
                                  "kept as the point suspect-clean",
                                  log::Where{id_.name, "", r.seq}, a.message, a.clean_seq);
      new_anomalies.push_back(std::move(a));
    }
  }

  // 6. Segment bookkeeping.
  std::map<uint64_t, SegmentInfo> touched;
  {
    std::lock_guard<std::mutex> lk(meta_mu_);
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
      CDP_ASSIGN_OR_RETURN(si.bytes, o_.env->FileSize(JoinPath(JournalDir(), SegmentFileName(seg))));
    }
  }
  const uint64_t last_seq = recs.back().seq;
  const uint64_t new_seg = writer_->segment(), new_off = writer_->end();

  if (o_.before_commit) CDP_RETURN_IF_ERROR(o_.before_commit());
  // 7. Commit point.
  CDP_RETURN_IF_ERROR(CommitBatch(last_seq, new_seg, new_off, touched, added, &new_points, &new_anomalies));
  // 8. Publish.
  {
    std::lock_guard<std::mutex> lk(meta_mu_);
    for (const auto& [seg, si] : touched) segments_[seg] = si;
    for (auto& p : new_points) {
      auto at = std::upper_bound(points_.begin(), points_.end(), p.seq,
                                 [](uint64_t seq, const RecoveryPoint& q) { return seq < q.seq; });
      points_.insert(at, std::move(p));
    }
    for (auto& a : new_anomalies) anomalies_.push_back(std::move(a));
  }
  committed_segment_ = new_seg;
  committed_offset_ = new_off;
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

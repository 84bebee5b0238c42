#include "master-target/volume.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "common/hash.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/sqlite.h"

namespace cdp::mt {

namespace {

constexpr int kIndexFormatVersion = 1;
constexpr size_t kJournalFlushBytes = 8u << 20;  // encoded undo bytes buffered before an Append
constexpr uint64_t kZeroChunk = 1u << 20;

const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS volume(
  id INTEGER PRIMARY KEY CHECK (id = 1),
  format_version INTEGER NOT NULL,
  name TEXT NOT NULL,
  size INTEGER NOT NULL,
  block_size INTEGER NOT NULL,
  uuid BLOB NOT NULL,
  generation INTEGER NOT NULL,
  applied_seq INTEGER NOT NULL,
  journal_segment INTEGER NOT NULL,
  journal_offset INTEGER NOT NULL,
  horizon_seq INTEGER NOT NULL,
  state INTEGER NOT NULL,
  rollback_to INTEGER NOT NULL,
  created_us INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS segments(
  segment INTEGER PRIMARY KEY,
  min_seq INTEGER NOT NULL,
  max_seq INTEGER NOT NULL,
  first_time_us INTEGER NOT NULL,
  last_time_us INTEGER NOT NULL,
  bytes INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS points(
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  seq INTEGER NOT NULL,
  time_us INTEGER NOT NULL,
  kind INTEGER NOT NULL,
  name TEXT NOT NULL);
)sql";

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

bool IsWrite(proto::RecordKind k) {
  return k == proto::RecordKind::kData || k == proto::RecordKind::kZero || k == proto::RecordKind::kTrim;
}

ApplyOutcome Nack(proto::NackReason reason, std::string msg, uint64_t expected = 0) {
  ApplyOutcome o;
  o.ack = false;
  o.reason = reason;
  o.message = std::move(msg);
  o.expected_seq = expected;
  return o;
}

bool PowerOfTwo(uint64_t v) { return v && (v & (v - 1)) == 0; }

}  // namespace

const char* StateName(VolumeState s) {
  switch (s) {
    case VolumeState::kReplicating: return "replicating";
    case VolumeState::kRollingBack: return "rolling-back";
    case VolumeState::kFailedOver: return "failed-over";
  }
  return "unknown";
}

const char* PointKindName(PointKind k) { return k == PointKind::kTag ? "tag" : "crash-consistent"; }

PointPin::~PointPin() { v_->Unpin(seq_); }

Volume::~Volume() = default;

std::string Volume::JournalDir() const { return JoinPath(o_.dir, "journal"); }
std::string Volume::ReplicaPath() const { return JoinPath(o_.dir, "replica.img"); }

Result<std::unique_ptr<Volume>> Volume::Open(VolumeOptions opts, const VolumeIdentity* create) {
  if (!opts.env || !opts.clock) return Status::InvalidArgument("volume: env and clock are required");
  if (opts.segment_bytes < kSegmentHeaderSize + kRecordHeaderSize)
    return Status::InvalidArgument("volume: segment_bytes too small");
  std::unique_ptr<Volume> v(new Volume(std::move(opts)));
  CDP_RETURN_IF_ERROR(v->Init(create));
  return v;
}

Status Volume::Init(const VolumeIdentity* create) {
  CDP_ASSIGN_OR_RETURN(db_, sqlite::Db::Open(o_.index_path));
  CDP_RETURN_IF_ERROR(db_->Exec(kSchema));
  bool exists = false;
  {
    CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare("SELECT count(*) FROM volume"));
    CDP_ASSIGN_OR_RETURN(bool row, st.Step());
    exists = row && st.ColumnInt64(0) > 0;
  }
  if (!exists) {
    if (!create) return Status::NotFound("volume index " + o_.index_path + " holds no volume");
    CDP_RETURN_IF_ERROR(CreateFiles(*create));
  }
  CDP_RETURN_IF_ERROR(LoadIndex());
  OpenOptions ro;
  CDP_ASSIGN_OR_RETURN(replica_, o_.env->Open(ReplicaPath(), ro));
  CDP_ASSIGN_OR_RETURN(uint64_t rsize, replica_->Size());
  if (rsize < id_.size) return Status::Corruption(ReplicaPath() + ": replica shorter than the volume");
  CDP_RETURN_IF_ERROR(RecoverUncommitted());
  CDP_RETURN_IF_ERROR(RebuildUndoIndex());
  if (state_ == VolumeState::kRollingBack) CDP_RETURN_IF_ERROR(FinishRollback());
  UpdateGauges();
  return Status::OK();
}

Status Volume::CreateFiles(const VolumeIdentity& id) {
  if (!proto::ValidName(id.name)) return Status::InvalidArgument("bad volume name");
  if (!PowerOfTwo(id.block_size) || id.block_size < 512 || id.block_size > (1u << 20))
    return Status::InvalidArgument("bad block size " + std::to_string(id.block_size));
  if (id.size == 0 || id.size % id.block_size != 0)
    return Status::InvalidArgument("volume size must be a non-zero multiple of the block size");
  Env* env = o_.env;
  CDP_RETURN_IF_ERROR(env->CreateDirs(JournalDir()));
  // A creation interrupted before its index row was committed left files that
  // nothing refers to: start over.
  CDP_ASSIGN_OR_RETURN(auto names, env->ListDir(JournalDir()));
  for (const auto& n : names) {
    uint64_t seg;
    if (ParseSegmentName(n, &seg)) CDP_RETURN_IF_ERROR(env->Remove(JoinPath(JournalDir(), n)));
  }
  {
    OpenOptions oo;
    oo.create = true;
    CDP_ASSIGN_OR_RETURN(auto f, env->Open(ReplicaPath(), oo));
    CDP_RETURN_IF_ERROR(f->Truncate(0));
    CDP_RETURN_IF_ERROR(f->Truncate(id.size));
    CDP_RETURN_IF_ERROR(f->Sync());
  }
  CDP_RETURN_IF_ERROR(env->SyncDir(o_.dir));
  {
    CDP_ASSIGN_OR_RETURN(auto w, SegmentWriter::Open(env, JournalDir(), 1, true, 1, 0, o_.segment_bytes));
    CDP_RETURN_IF_ERROR(w->Sync());
  }
  CDP_ASSIGN_OR_RETURN(auto tx, sqlite::Transaction::Begin(*db_));
  {
    CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare(
        "INSERT INTO volume(id, format_version, name, size, block_size, uuid, generation, applied_seq,"
        " journal_segment, journal_offset, horizon_seq, state, rollback_to, created_us)"
        " VALUES(1, ?1, ?2, ?3, ?4, ?5, ?6, 0, 1, ?7, 0, 0, 0, ?8)"));
    CDP_RETURN_IF_ERROR(st.BindAll(int64_t(kIndexFormatVersion), id.name, id.size, int64_t(id.block_size),
                                   ByteSpan(id.uuid.data(), id.uuid.size()), id.generation,
                                   uint64_t(kSegmentHeaderSize), o_.clock->WallMicros()));
    CDP_RETURN_IF_ERROR(st.Run());
  }
  {
    CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare("INSERT INTO segments VALUES(1, 0, 0, 0, 0, ?1)"));
    CDP_RETURN_IF_ERROR(st.BindAll(uint64_t(kSegmentHeaderSize)));
    CDP_RETURN_IF_ERROR(st.Run());
  }
  return tx.Commit();
}

Status Volume::LoadIndex() {
  {
    CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare(
        "SELECT format_version, name, size, block_size, uuid, generation, applied_seq, journal_segment,"
        " journal_offset, horizon_seq, state, rollback_to FROM volume WHERE id = 1"));
    CDP_ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) return Status::Corruption(o_.index_path + ": no volume row");
    if (st.ColumnInt64(0) != kIndexFormatVersion)
      return Status::Corruption(o_.index_path + ": unsupported index format " + std::to_string(st.ColumnInt64(0)));
    id_.name = st.ColumnText(1);
    id_.size = uint64_t(st.ColumnInt64(2));
    id_.block_size = uint32_t(st.ColumnInt64(3));
    Bytes uuid = st.ColumnBlob(4);
    if (uuid.size() != id_.uuid.size()) return Status::Corruption(o_.index_path + ": bad uuid");
    std::copy(uuid.begin(), uuid.end(), id_.uuid.begin());
    id_.generation = uint64_t(st.ColumnInt64(5));
    applied_.store(uint64_t(st.ColumnInt64(6)));
    committed_segment_ = uint64_t(st.ColumnInt64(7));
    committed_offset_ = uint64_t(st.ColumnInt64(8));
    horizon_ = uint64_t(st.ColumnInt64(9));
    int64_t state = st.ColumnInt64(10);
    if (state < 0 || state > 2) return Status::Corruption(o_.index_path + ": bad state");
    state_ = VolumeState(state);
    rollback_to_ = uint64_t(st.ColumnInt64(11));
  }
  std::lock_guard<std::mutex> lk(meta_mu_);
  segments_.clear();
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
      segments_[s.segment] = s;
    }
  }
  if (!segments_.count(committed_segment_))
    return Status::Corruption(o_.index_path + ": committed journal segment is not in the index");
  points_.clear();
  {
    CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare("SELECT id, seq, time_us, kind, name FROM points ORDER BY id"));
    for (;;) {
      CDP_ASSIGN_OR_RETURN(bool row, st.Step());
      if (!row) break;
      RecoveryPoint p;
      p.id = st.ColumnInt64(0);
      p.seq = uint64_t(st.ColumnInt64(1));
      p.time_us = uint64_t(st.ColumnInt64(2));
      p.kind = st.ColumnInt64(3) == int64_t(PointKind::kTag) ? PointKind::kTag : PointKind::kCrash;
      p.name = st.ColumnText(4);
      points_.push_back(std::move(p));
    }
  }
  return Status::OK();
}

Status Volume::UndoEntries(const std::vector<UndoEntry>& entries) {
  Bytes buf;
  std::map<uint64_t, std::shared_ptr<File>> files;
  for (const UndoEntry& e : entries) {
    std::shared_ptr<File> f;
    auto it = files.find(e.segment);
    if (it != files.end()) {
      f = it->second;
    } else {
      OpenOptions ro;
      ro.read_only = true;
      CDP_ASSIGN_OR_RETURN(auto nf, o_.env->Open(JoinPath(JournalDir(), SegmentFileName(e.segment)), ro));
      f = std::shared_ptr<File>(std::move(nf));
      files[e.segment] = f;
    }
    buf.resize(e.length);
    CDP_RETURN_IF_ERROR(ReadUndoData(*f, e.header(), e.location(), buf.data()));
    CDP_RETURN_IF_ERROR(replica_->Write(e.offset, buf));
    if (o_.metrics.disk_read_bytes) o_.metrics.disk_read_bytes->Inc(e.kind == UndoKind::kData ? e.length : 0);
    if (o_.metrics.disk_write_bytes) o_.metrics.disk_write_bytes->Inc(e.length);
  }
  if (!entries.empty()) CDP_RETURN_IF_ERROR(replica_->Sync());
  return Status::OK();
}

Status Volume::RecoverUncommitted(bool undo_records) {
  writer_.reset();
  Env* env = o_.env;
  const std::string jdir = JournalDir();
  CDP_ASSIGN_OR_RETURN(auto names, env->ListDir(jdir));
  std::vector<uint64_t> on_disk;
  for (const auto& n : names) {
    uint64_t seg;
    if (ParseSegmentName(n, &seg)) on_disk.push_back(seg);
  }
  std::vector<UndoEntry> undo;
  const uint64_t applied = applied_.load();
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
                                log::Where{id_.name, "", applied}, undo.size());
  }
  CDP_RETURN_IF_ERROR(UndoEntries(undo));

  // The replica is back at the committed image; cut the journal to match.
  bool dir_dirty = false;
  std::map<uint64_t, SegmentInfo> known;
  {
    std::lock_guard<std::mutex> lk(meta_mu_);
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
    auto lk = LockIndexExclusive();
    undo_.RemoveAbove(applied);
    for (auto it = seg_files_.begin(); it != seg_files_.end();) {
      it = it->first >= committed_segment_ ? seg_files_.erase(it) : std::next(it);
    }
    seg_files_[committed_segment_] = writer_->shared_file();
  }
  return Status::OK();
}

Status Volume::RebuildUndoIndex() {
  std::map<uint64_t, SegmentInfo> segs;
  {
    std::lock_guard<std::mutex> lk(meta_mu_);
    segs = segments_;
  }
  UndoIndex idx;
  std::map<uint64_t, std::shared_ptr<File>> files;
  for (const auto& [seg, info] : segs) {
    std::shared_ptr<File> f;
    if (seg == committed_segment_) {
      f = writer_->shared_file();
    } else {
      OpenOptions ro;
      ro.read_only = true;
      CDP_ASSIGN_OR_RETURN(auto nf, o_.env->Open(JoinPath(JournalDir(), SegmentFileName(seg)), ro));
      f = std::shared_ptr<File>(std::move(nf));
    }
    uint64_t limit = seg == committed_segment_ ? committed_offset_ : info.bytes;
    CDP_ASSIGN_OR_RETURN(auto scan, ScanSegment(*f, seg, 0, false, limit,
                                                [&](const UndoHeader& h, const UndoLocation& loc) {
                                                  idx.Add(UndoEntry{h.seq, h.offset, h.length, h.kind, loc.segment,
                                                                    loc.file_offset, h.data_crc, h.time_us});
                                                  return Status::OK();
                                                }));
    if (scan.valid_end < limit) {
      return Status::Corruption(f->path() + ": committed journal records are damaged at " +
                                std::to_string(scan.valid_end));
    }
    files[seg] = f;
  }
  auto lk = LockIndexExclusive();
  undo_ = std::move(idx);
  seg_files_ = std::move(files);
  return Status::OK();
}

std::unique_lock<std::shared_mutex> Volume::LockIndexExclusive() const {
  std::unique_lock<std::mutex> gate(turnstile_);
  return std::unique_lock<std::shared_mutex>(index_mu_);
}

std::shared_lock<std::shared_mutex> Volume::LockIndexShared() const {
  { std::lock_guard<std::mutex> gate(turnstile_); }
  return std::shared_lock<std::shared_mutex>(index_mu_);
}

std::shared_ptr<File> Volume::SegmentFile(uint64_t segment) const {
  auto it = seg_files_.find(segment);
  return it == seg_files_.end() ? nullptr : it->second;
}

Status Volume::ZeroReplica(uint64_t offset, uint64_t len) {
  Status s = replica_->PunchHole(offset, len);
  if (s.ok()) return s;
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

VolumeState Volume::state() const {
  std::lock_guard<std::mutex> lk(meta_mu_);
  return state_;
}

Result<ApplyOutcome> Volume::CheckOpen(const VolumeIdentity& id) {
  std::lock_guard<std::mutex> lk(apply_mu_);
  if (broken_) return Status::IOError(id_.name + ": volume needs to be reopened after an I/O failure");
  if (id.uuid != id_.uuid) return Nack(proto::NackReason::kWrongGeneration, "volume uuid differs");
  if (id.size != id_.size)
    return Nack(proto::NackReason::kWrongGeneration,
                "volume size differs: " + std::to_string(id.size) + " != " + std::to_string(id_.size));
  if (id.block_size != id_.block_size) return Nack(proto::NackReason::kWrongGeneration, "block size differs");
  if (id.generation < id_.generation)
    return Nack(proto::NackReason::kWrongGeneration,
                "stale generation " + std::to_string(id.generation) + " < " + std::to_string(id_.generation));
  if (id.generation == id_.generation && state_ != VolumeState::kReplicating)
    return Nack(proto::NackReason::kWrongGeneration,
                std::string("volume is ") + StateName(state_) + "; re-protect with a higher generation");
  if (id.generation > id_.generation) CDP_RETURN_IF_ERROR(ResetForNewGeneration(id));
  ApplyOutcome o;
  o.durable_seq = applied_.load();
  return o;
}

Status Volume::ResetForNewGeneration(const VolumeIdentity& id) {
  {
    std::lock_guard<std::mutex> lk(meta_mu_);
    if (!pins_.empty()) return Status::Busy(id_.name + ": exports are open; cannot re-protect");
  }
  const uint64_t new_seg = writer_->segment() + 1;
  writer_.reset();
  CDP_ASSIGN_OR_RETURN(auto w, SegmentWriter::Open(o_.env, JournalDir(), new_seg, true, 1, 0, o_.segment_bytes));
  CDP_RETURN_IF_ERROR(w->Sync());
  {
    CDP_ASSIGN_OR_RETURN(auto tx, sqlite::Transaction::Begin(*db_));
    CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare(
        "UPDATE volume SET generation = ?1, applied_seq = 0, journal_segment = ?2, journal_offset = ?3,"
        " horizon_seq = 0, state = 0, rollback_to = 0 WHERE id = 1"));
    CDP_RETURN_IF_ERROR(st.BindAll(id.generation, new_seg, uint64_t(kSegmentHeaderSize)));
    CDP_RETURN_IF_ERROR(st.Run());
    CDP_RETURN_IF_ERROR(db_->Exec("DELETE FROM segments; DELETE FROM points;"));
    CDP_ASSIGN_OR_RETURN(auto ins, db_->Prepare("INSERT INTO segments VALUES(?1, 0, 0, 0, 0, ?2)"));
    CDP_RETURN_IF_ERROR(ins.BindAll(new_seg, uint64_t(kSegmentHeaderSize)));
    CDP_RETURN_IF_ERROR(ins.Run());
    CDP_RETURN_IF_ERROR(tx.Commit());
  }
  std::vector<uint64_t> old;
  {
    auto lk = LockIndexExclusive();
    undo_ = UndoIndex();
    for (auto& [seg, f] : seg_files_) old.push_back(seg);
    seg_files_.clear();
    seg_files_[new_seg] = w->shared_file();
    horizon_ = 0;
  }
  {
    std::lock_guard<std::mutex> lk(meta_mu_);
    segments_.clear();
    SegmentInfo si;
    si.segment = new_seg;
    si.bytes = kSegmentHeaderSize;
    segments_[new_seg] = si;
    points_.clear();
    state_ = VolumeState::kReplicating;
  }
  id_.generation = id.generation;
  rollback_to_ = 0;
  applied_.store(0);
  committed_segment_ = new_seg;
  committed_offset_ = kSegmentHeaderSize;
  writer_ = std::move(w);
  writer_->on_new_segment = [this](uint64_t seg, std::shared_ptr<File> f) {
    auto lk = LockIndexExclusive();
    seg_files_[seg] = std::move(f);
  };
  for (uint64_t seg : old) CDP_RETURN_IF_ERROR(o_.env->Remove(JoinPath(JournalDir(), SegmentFileName(seg))));
  CDP_RETURN_IF_ERROR(o_.env->SyncDir(JournalDir()));
  log::Get("mt.volume")->info("{} re-protected with generation {}", log::Where{id_.name, "", 0}, id.generation);
  UpdateGauges();
  return Status::OK();
}

Result<ApplyOutcome> Volume::ApplyBatch(const std::vector<proto::Record>& recs) {
  std::lock_guard<std::mutex> lk(apply_mu_);
  if (broken_) return Status::IOError(id_.name + ": volume needs to be reopened after an I/O failure");
  if (state_ != VolumeState::kReplicating)
    return Nack(proto::NackReason::kWrongGeneration,
                std::string("volume is ") + StateName(state_) + "; re-protect with a higher generation");
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
  for (size_t i = first; i < recs.size(); ++i) {
    const proto::Record& r = recs[i];
    const std::string at = "record seq " + std::to_string(r.seq) + ": ";
    switch (r.kind) {
      case proto::RecordKind::kData:
        if (r.length == 0) return Nack(proto::NackReason::kBadRecord, at + "zero length");
        if (r.length > proto::kMaxRecordLength) return Nack(proto::NackReason::kBadRecord, at + "absurd length");
        if (r.data.size() != r.length) return Nack(proto::NackReason::kBadRecord, at + "data size != length");
        [[fallthrough]];
      case proto::RecordKind::kZero:
      case proto::RecordKind::kTrim:
        if (r.length == 0) return Nack(proto::NackReason::kBadRecord, at + "zero length");
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
        if (!proto::ValidName(std::string_view(reinterpret_cast<const char*>(r.data.data()), r.data.size())))
          return Nack(proto::NackReason::kBadRecord, at + "bad tag name");
        break;
      default:
        return Nack(proto::NackReason::kBadRecord, at + "unknown kind");
    }
  }
  Status s = ApplyLocked(recs, first, &out);
  if (!s.ok()) {
    log::Get("mt.volume")->error("{} apply failed: {}; undoing the partial batch", log::Where{id_.name, "", applied + 1},
                                 s.ToString());
    Status r = RecoverUncommitted();
    if (!r.ok()) {
      broken_ = true;
      log::Get("mt.volume")->error("{} undo after failed apply failed: {}", log::Where{id_.name, "", applied},
                                   r.ToString());
    }
    return s;
  }
  out.applied = recs.size() - first;
  return out;
}

Status Volume::ApplyLocked(const std::vector<proto::Record>& recs, size_t first, ApplyOutcome* out) {
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

  // 1. Undo records: the bytes each write overwrites, in order.
  for (size_t i = first; i < recs.size(); ++i) {
    const proto::Record& r = recs[i];
    if (!IsWrite(r.kind)) continue;
    change_bytes += r.length;
    for (uint64_t done = 0; done < r.length;) {
      uint32_t n = uint32_t(std::min<uint64_t>(kMaxUndoChunk, r.length - done));
      uint64_t off = r.offset + done;
      old.resize(n);
      CDP_RETURN_IF_ERROR(replica_->Read(off, n, old.data()));
      read_bytes += n;
      overlay.Patch(off, n, old.data());
      UndoKind kind = AllZero(old) ? UndoKind::kZeroes : UndoKind::kData;
      size_t at = jbuf.size();
      EncodeUndoRecord(kind, r.seq, off, n, wall, kind == UndoKind::kData ? ByteSpan(old) : ByteSpan(), &jbuf);
      pend.push_back(Pending{UndoEntry{r.seq, off, n, kind, 0, 0, DecodeFixed32(jbuf.data() + at), wall}, at});
      if (jbuf.size() >= kJournalFlushBytes) CDP_RETURN_IF_ERROR(flush_buf());
      done += n;
    }
    overlay.Insert(r.offset, r.length, r.kind == proto::RecordKind::kData ? r.data.data() : nullptr);
  }
  CDP_RETURN_IF_ERROR(flush_buf());
  // 2. Journal durable (sync point 1).
  CDP_RETURN_IF_ERROR(writer_->Sync());
  // 3. Exports see the undo records before the replica changes.
  if (!added.empty()) {
    auto lk = LockIndexExclusive();
    for (const UndoEntry& e : added) undo_.Add(e);
  }
  // 4. The replica (sync point 2).
  bool replica_dirty = false;
  for (size_t i = first; i < recs.size(); ++i) {
    const proto::Record& r = recs[i];
    if (r.kind == proto::RecordKind::kData) {
      CDP_RETURN_IF_ERROR(replica_->Write(r.offset, r.data));
      write_bytes += r.length;
      replica_dirty = true;
    } else if (r.kind == proto::RecordKind::kZero || r.kind == proto::RecordKind::kTrim) {
      CDP_RETURN_IF_ERROR(ZeroReplica(r.offset, r.length));
      replica_dirty = true;
    }
  }
  if (replica_dirty) CDP_RETURN_IF_ERROR(replica_->Sync());

  // 5. Recovery points of this batch.
  std::vector<RecoveryPoint> new_points;
  uint64_t last_crash = 0;
  {
    std::lock_guard<std::mutex> lk(meta_mu_);
    for (auto it = points_.rbegin(); it != points_.rend(); ++it) {
      if (it->kind == PointKind::kCrash) {
        last_crash = it->time_us;
        break;
      }
    }
  }
  for (size_t i = first; i < recs.size(); ++i) {
    const proto::Record& r = recs[i];
    if (r.kind == proto::RecordKind::kFlush) {
      if (last_crash == 0 || wall >= last_crash + o_.point_interval_us) {
        new_points.push_back(RecoveryPoint{0, r.seq, wall, PointKind::kCrash, ""});
        last_crash = wall;
      }
    } else if (r.kind == proto::RecordKind::kTag) {
      new_points.push_back(RecoveryPoint{0, r.seq, wall, PointKind::kTag,
                                         std::string(reinterpret_cast<const char*>(r.data.data()), r.data.size())});
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
  {
    CDP_ASSIGN_OR_RETURN(auto tx, sqlite::Transaction::Begin(*db_));
    CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare(
        "UPDATE volume SET applied_seq = ?1, journal_segment = ?2, journal_offset = ?3 WHERE id = 1"));
    CDP_RETURN_IF_ERROR(st.BindAll(last_seq, new_seg, new_off));
    CDP_RETURN_IF_ERROR(st.Run());
    if (!touched.empty()) {
      CDP_ASSIGN_OR_RETURN(auto up, db_->Prepare("INSERT OR REPLACE INTO segments VALUES(?1, ?2, ?3, ?4, ?5, ?6)"));
      for (const auto& [seg, si] : touched) {
        CDP_RETURN_IF_ERROR(up.Reset());
        CDP_RETURN_IF_ERROR(up.BindAll(seg, si.min_seq, si.max_seq, si.first_time_us, si.last_time_us, si.bytes));
        CDP_RETURN_IF_ERROR(up.Run());
      }
    }
    if (!new_points.empty()) {
      CDP_ASSIGN_OR_RETURN(auto ins, db_->Prepare("INSERT INTO points(seq, time_us, kind, name) VALUES(?1, ?2, ?3, ?4)"));
      for (RecoveryPoint& p : new_points) {
        CDP_RETURN_IF_ERROR(ins.Reset());
        CDP_RETURN_IF_ERROR(ins.BindAll(p.seq, p.time_us, int64_t(p.kind), p.name));
        CDP_RETURN_IF_ERROR(ins.Run());
        p.id = db_->LastInsertRowId();
      }
    }
    CDP_RETURN_IF_ERROR(tx.Commit());
  }
  // 8. Publish.
  {
    std::lock_guard<std::mutex> lk(meta_mu_);
    for (const auto& [seg, si] : touched) segments_[seg] = si;
    for (auto& p : new_points) points_.push_back(std::move(p));
  }
  committed_segment_ = new_seg;
  committed_offset_ = new_off;
  applied_.store(last_seq);
  out->durable_seq = last_seq;
  const VolumeMetrics& m = o_.metrics;
  if (m.bytes_applied) m.bytes_applied->Inc(change_bytes);
  if (m.records_applied) m.records_applied->Inc(recs.size() - first);
  if (m.disk_read_bytes) m.disk_read_bytes->Inc(read_bytes);
  if (m.disk_write_bytes) m.disk_write_bytes->Inc(write_bytes);
  if (m.apply_lag_seconds && recs.back().timestamp_us) {
    uint64_t now = o_.clock->WallMicros(), ts = recs.back().timestamp_us;
    m.apply_lag_seconds->Set(now > ts ? double(now - ts) / 1e6 : 0.0);
  }
  UpdateGauges();
  return Status::OK();
}

Status Volume::ReadAt(uint64_t point_seq, uint64_t offset, uint64_t len, uint8_t* buf) const {
  if (offset > id_.size || len > id_.size - offset) return Status::OutOfRange(id_.name + ": read past the end");
  std::shared_lock<std::shared_mutex> lk = LockIndexShared();
  if (point_seq < horizon_)
    return Status::OutOfRange(id_.name + ": point " + std::to_string(point_seq) + " is below the retention horizon");
  for (const ReadPiece& p : undo_.Lookup(point_seq, offset, len)) {
    uint8_t* dst = buf + (p.offset - offset);
    if (p.from_undo) {
      std::shared_ptr<File> f = SegmentFile(p.entry.segment);
      if (!f) return Status::Corruption(id_.name + ": journal segment of an indexed record is gone");
      if (p.offset == p.entry.offset && p.length == p.entry.length) {
        // A whole record: read it with its CRC check.
        CDP_RETURN_IF_ERROR(ReadUndoData(*f, p.entry.header(), p.entry.location(), dst));
      } else {
        CDP_RETURN_IF_ERROR(ReadUndoSlice(*f, p.entry.header(), p.entry.location(),
                                          uint32_t(p.offset - p.entry.offset), p.length, dst));
      }
    } else {
      CDP_RETURN_IF_ERROR(replica_->Read(p.offset, p.length, dst));
    }
  }
  return Status::OK();
}

Result<std::unique_ptr<PointPin>> Volume::Pin(uint64_t point_seq) {
  std::shared_lock<std::shared_mutex> lk(index_mu_);
  if (point_seq < horizon_ || point_seq > applied_.load())
    return Status::OutOfRange(id_.name + ": sequence " + std::to_string(point_seq) + " is not reachable");
  std::lock_guard<std::mutex> mk(meta_mu_);
  pins_.insert(point_seq);
  return std::make_unique<PointPin>(this, point_seq);
}

void Volume::Unpin(uint64_t seq) {
  std::lock_guard<std::mutex> lk(meta_mu_);
  auto it = pins_.find(seq);
  if (it != pins_.end()) pins_.erase(it);
}

Status Volume::Rollback(uint64_t point_seq) {
  std::lock_guard<std::mutex> lk(apply_mu_);
  if (broken_) return Status::IOError(id_.name + ": volume needs to be reopened after an I/O failure");
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

Status Volume::FinishRollback() {
  const uint64_t p = rollback_to_;
  std::vector<UndoEntry> entries;
  {
    std::shared_lock<std::shared_mutex> lk(index_mu_);
    entries = undo_.EntriesAbove(p);
  }
  log::Get("mt.volume")->warn("{} rolling back {} undo records to sequence {}", log::Where{id_.name, "", p},
                              entries.size(), p);
  CDP_RETURN_IF_ERROR(UndoEntries(entries));
  // The journal ends where the first record past the point begins.
  uint64_t cut_seg = committed_segment_, cut_off = committed_offset_;
  for (const UndoEntry& e : entries) {
    if (e.segment < cut_seg || (e.segment == cut_seg && e.file_offset < cut_off)) {
      cut_seg = e.segment;
      cut_off = e.file_offset;
    }
  }
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

Result<RetentionResult> Volume::ApplyRetention() {
  std::lock_guard<std::mutex> lk(apply_mu_);
  RetentionResult res;
  res.horizon_seq = horizon_;
  const RetentionPolicy& pol = o_.retention;
  if (broken_) return Status::IOError(id_.name + ": volume needs to be reopened after an I/O failure");
  if (pol.max_age_us == 0 && pol.max_bytes == 0) return res;
  const uint64_t wall = o_.clock->WallMicros();
  const uint64_t cur = writer_->segment();
  std::map<uint64_t, SegmentInfo> segs;
  std::vector<RecoveryPoint> points;
  std::multiset<uint64_t> pins;
  {
    std::lock_guard<std::mutex> mk(meta_mu_);
    segs = segments_;
    points = points_;
    pins = pins_;
  }
  uint64_t promised_min = std::numeric_limits<uint64_t>::max();
  for (const RecoveryPoint& p : points) {
    bool time_ok = pol.max_age_us == 0 || p.time_us + pol.max_age_us >= wall;
    uint64_t need = 0;
    for (const auto& [seg, si] : segs) {
      if (seg == cur || si.max_seq > p.seq) need += si.bytes;
    }
    bool bytes_ok = pol.max_bytes == 0 || need <= pol.max_bytes;
    if (time_ok && bytes_ok) promised_min = std::min(promised_min, p.seq);
  }
  for (uint64_t pin : pins) promised_min = std::min(promised_min, pin);
  uint64_t last_dropped = 0, new_horizon = horizon_;
  for (const auto& [seg, si] : segs) {
    if (seg == cur || si.max_seq > promised_min) break;
    res.dropped_segments.push_back(seg);
    last_dropped = seg;
    new_horizon = std::max(new_horizon, si.max_seq);
  }
  if (res.dropped_segments.empty()) return res;
  for (const RecoveryPoint& p : points) {
    if (p.seq < new_horizon) res.dropped_points.push_back(p.id);
  }
  {
    CDP_ASSIGN_OR_RETURN(auto tx, sqlite::Transaction::Begin(*db_));
    CDP_ASSIGN_OR_RETURN(auto d1, db_->Prepare("DELETE FROM segments WHERE segment <= ?1"));
    CDP_RETURN_IF_ERROR(d1.BindAll(last_dropped));
    CDP_RETURN_IF_ERROR(d1.Run());
    CDP_ASSIGN_OR_RETURN(auto d2, db_->Prepare("DELETE FROM points WHERE seq < ?1"));
    CDP_RETURN_IF_ERROR(d2.BindAll(new_horizon));
    CDP_RETURN_IF_ERROR(d2.Run());
    CDP_ASSIGN_OR_RETURN(auto up, db_->Prepare("UPDATE volume SET horizon_seq = ?1 WHERE id = 1"));
    CDP_RETURN_IF_ERROR(up.BindAll(new_horizon));
    CDP_RETURN_IF_ERROR(up.Run());
    CDP_RETURN_IF_ERROR(tx.Commit());
  }
  {
    auto ik = LockIndexExclusive();
    undo_.RemoveSegmentsUpTo(last_dropped);
    for (uint64_t seg : res.dropped_segments) seg_files_.erase(seg);
    horizon_ = new_horizon;
  }
  {
    std::lock_guard<std::mutex> mk(meta_mu_);
    for (uint64_t seg : res.dropped_segments) segments_.erase(seg);
    points_.erase(std::remove_if(points_.begin(), points_.end(),
                                 [&](const RecoveryPoint& x) { return x.seq < new_horizon; }),
                  points_.end());
  }
  for (uint64_t seg : res.dropped_segments) {
    CDP_RETURN_IF_ERROR(o_.env->Remove(JoinPath(JournalDir(), SegmentFileName(seg))));
  }
  CDP_RETURN_IF_ERROR(o_.env->SyncDir(JournalDir()));
  res.horizon_seq = new_horizon;
  log::Get("mt.volume")->info("{} retention dropped {} segments and {} points; horizon {}",
                              log::Where{id_.name, "", applied_.load()}, res.dropped_segments.size(),
                              res.dropped_points.size(), new_horizon);
  UpdateGauges();
  return res;
}

void Volume::SetRetention(const RetentionPolicy& policy) {
  std::lock_guard<std::mutex> lk(apply_mu_);
  o_.retention = policy;
}

Result<std::vector<proto::Hash128>> Volume::RegionHashes(uint32_t region_size, uint64_t first, uint32_t count) {
  if (!PowerOfTwo(region_size) || region_size < 512) return Status::InvalidArgument("bad region size");
  if (count == 0 || count > proto::kMaxHashes) return Status::InvalidArgument("bad region count");
  if (first >= (id_.size + region_size - 1) / region_size)
    return Status::OutOfRange(id_.name + ": region past the end of the volume");
  // A consistent image without stopping apply: read through the current point.
  std::unique_ptr<PointPin> pin;
  {
    std::lock_guard<std::mutex> lk(apply_mu_);
    CDP_ASSIGN_OR_RETURN(pin, Pin(applied_.load()));
  }
  std::vector<proto::Hash128> out;
  Bytes buf(std::min<uint64_t>(region_size, 1u << 20));
  for (uint64_t r = first; r < first + count; ++r) {
    uint64_t start = r * region_size;
    if (start >= id_.size) break;
    uint64_t end = std::min<uint64_t>(start + region_size, id_.size);
    Xxh3_128Stream h;
    for (uint64_t off = start; off < end;) {
      uint64_t n = std::min<uint64_t>(buf.size(), end - off);
      CDP_RETURN_IF_ERROR(ReadAt(pin->seq(), off, n, buf.data()));
      h.Update(buf.data(), n);
      off += n;
    }
    out.push_back(h.Digest());
  }
  return out;
}

std::vector<RecoveryPoint> Volume::ListPoints() const {
  std::lock_guard<std::mutex> lk(meta_mu_);
  return points_;
}

std::optional<RecoveryPoint> Volume::FindPoint(int64_t id) const {
  std::lock_guard<std::mutex> lk(meta_mu_);
  for (const auto& p : points_) {
    if (p.id == id) return p;
  }
  return std::nullopt;
}

std::vector<SegmentInfo> Volume::Segments() const {
  std::lock_guard<std::mutex> lk(meta_mu_);
  std::vector<SegmentInfo> v;
  for (const auto& [seg, si] : segments_) v.push_back(si);
  return v;
}

VolumeStatus Volume::GetStatus() const {
  VolumeStatus s;
  s.identity = id_;
  s.applied_seq = applied_.load();
  {
    std::shared_lock<std::shared_mutex> ik(index_mu_);
    s.horizon_seq = horizon_;
    s.undo_records = undo_.size();
  }
  std::lock_guard<std::mutex> lk(meta_mu_);
  s.state = state_;
  for (const auto& [seg, si] : segments_) s.journal_bytes += si.bytes;
  s.journal_segments = segments_.size();
  s.points = points_.size();
  s.active_exports = pins_.size();
  s.rollback_to = state_ == VolumeState::kFailedOver ? rollback_to_ : 0;
  return s;
}

void Volume::UpdateGauges() {
  const VolumeMetrics& m = o_.metrics;
  uint64_t jbytes = 0;
  size_t npoints = 0;
  uint64_t oldest = 0;
  {
    std::lock_guard<std::mutex> lk(meta_mu_);
    for (const auto& [seg, si] : segments_) jbytes += si.bytes;
    npoints = points_.size();
    if (!points_.empty()) oldest = points_.front().time_us;
  }
  if (m.journal_bytes) m.journal_bytes->Set(int64_t(jbytes));
  if (m.points) m.points->Set(int64_t(npoints));
  if (m.applied_seq) m.applied_seq->Set(int64_t(applied_.load()));
  if (m.retention_span_seconds) {
    uint64_t now = o_.clock->WallMicros();
    m.retention_span_seconds->Set(oldest && now > oldest ? double(now - oldest) / 1e6 : 0.0);
  }
}

}  // namespace cdp::mt

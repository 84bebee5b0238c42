// SPDX-License-Identifier: Apache-2.0
#include "process-server/spool.h"

#include <algorithm>
#include <chrono>

#include "common/base/coding.h"

namespace cdp::ps {
namespace {

// A group never grows past this many bytes of records (plus one batch).
constexpr uint64_t kMaxGroupBytes = 64u << 20;

// The record's payload after the segment log's frame: seq, offset, length,
// kind, 3 reserved bytes, timestamp, data.
constexpr size_t kHeadSize = kRecordHeaderSize - seglog::kFrameSize;
constexpr uint32_t kMaxPayload = uint32_t(kHeadSize) + kMaxSpoolRecordData;

std::string SegmentName(uint64_t first_seq) { return seglog::FileName(first_seq, kSpoolSegmentSuffix); }

bool ValidShape(proto::RecordKind kind, uint32_t length, size_t data_len) {
  switch (kind) {
    case proto::RecordKind::kData:
      return data_len == length && length > 0 && length <= kMaxSpoolRecordData;
    case proto::RecordKind::kTag:
      return data_len >= 1 && data_len <= kMaxNameLength;
    case proto::RecordKind::kZero:
    case proto::RecordKind::kTrim:
    case proto::RecordKind::kFlush:
      return data_len == 0;
    case proto::RecordKind::kSealed:
      return length > 0 && length % proto::kSealUnit == 0 && data_len == length + proto::SealMacBytes(length) &&
             data_len <= kMaxSpoolRecordData;
    case proto::RecordKind::kSealedZero:
      return length > 0 && length % proto::kSealUnit == 0 && data_len == proto::SealMacBytes(length);
    case proto::RecordKind::kAnomaly:
      return length == 0 && data_len >= 8 && data_len <= 8 + proto::kMaxAnomalyText;
  }
  return false;
}

// Decodes a payload's head (and, when `data` is set, its data) into *r; false
// when a field is out of range.
bool DecodeHead(ByteSpan head, size_t data_len, proto::Record* r) {
  const uint8_t* p = head.data();
  uint8_t kind = p[20];
  if (kind < uint8_t(proto::RecordKind::kData) || kind > uint8_t(proto::RecordKind::kAnomaly)) return false;
  r->seq = DecodeFixed64(p);
  r->offset = DecodeFixed64(p + 8);
  r->length = DecodeFixed32(p + 16);
  r->kind = proto::RecordKind(kind);
  r->timestamp_us = DecodeFixed64(p + 24);
  return ValidShape(r->kind, r->length, data_len);
}

// Decodes and checks the record at the start of `in`, all of which must be it.
bool DecodeSpoolRecord(ByteSpan in, proto::Record* r) {
  ByteSpan payload;
  size_t size = 0;
  if (seglog::DecodeRecord(in, kMaxPayload, &payload, &size) != seglog::Decode::kOk || size != in.size() ||
      payload.size() < kHeadSize || !DecodeHead(payload.first(kHeadSize), payload.size() - kHeadSize, r))
    return false;
  r->data.assign(payload.begin() + kHeadSize, payload.end());
  return true;
}

}  // namespace

void EncodeSpoolRecord(const proto::Record& r, Bytes* out) {
  uint8_t head[kHeadSize];
  EncodeFixed64(head, r.seq);
  EncodeFixed64(head + 8, r.offset);
  EncodeFixed32(head + 16, r.length);
  head[20] = uint8_t(r.kind);
  head[21] = head[22] = head[23] = 0;
  EncodeFixed64(head + 24, r.timestamp_us);
  seglog::AppendRecord(ByteSpan(head, kHeadSize), ByteSpan(r.data), out);
}

struct Spool::Writer {
  std::vector<proto::Record> records;
  size_t first = 0;       // index of the first non-duplicate record
  bool accepted = false;  // to be written by the leader
  bool done = false;
  AppendResult result;
};

Spool::Spool(const SpoolOptions& options) : opt_(options) {}

Spool::~Spool() { Close(); }

Result<std::unique_ptr<Spool>> Spool::Open(const SpoolOptions& options, SpoolRecovery* recovery) {
  if (options.env == nullptr || options.clock == nullptr || options.dir.empty())
    return Status::InvalidArgument("spool: env, clock and dir are required");
  if (options.segment_bytes < 4096)
    return Status::InvalidArgument("spool: segment_bytes below 4096");
  std::unique_ptr<Spool> s(new Spool(options));
  SpoolRecovery local;
  CDP_RETURN_IF_ERROR(s->Recover(recovery ? recovery : &local));
  return s;
}

void Spool::Report(const Status& s) {
  if (opt_.on_corruption) opt_.on_corruption(s);
}

Status Spool::Recover(SpoolRecovery* rec) {
  Env* env = opt_.env;
  CDP_RETURN_IF_ERROR(env->CreateDirs(opt_.dir).WithContext("spool " + opt_.dir));
  CDP_ASSIGN_OR_RETURN(std::vector<std::string> names, env->ListDir(opt_.dir));
  std::vector<std::pair<uint64_t, std::string>> segs;
  for (const auto& n : names) {
    uint64_t first = 0;
    if (seglog::ParseFileName(n, kSpoolSegmentSuffix, &first)) segs.emplace_back(first, n);
  }
  std::sort(segs.begin(), segs.end());

  bool dir_changed = false;
  bool stop = false;  // corruption found: drop everything after it
  uint64_t prev_last = 0;
  for (size_t i = 0; i < segs.size(); ++i) {
    std::string path = JoinPath(opt_.dir, segs[i].second);
    bool last = (i + 1 == segs.size());
    if (stop) {
      CDP_RETURN_IF_ERROR(env->Remove(path));
      rec->dropped_segments++;
      dir_changed = true;
      continue;
    }
    OpenOptions oo;
    CDP_ASSIGN_OR_RETURN(std::unique_ptr<File> file, env->Open(path, oo));
    CDP_ASSIGN_OR_RETURN(uint64_t size, file->Size());
    if (size > kMaxGroupBytes * 4 + opt_.segment_bytes)
      return Status::Corruption("spool segment too large: " + path);
    Bytes hb(std::min<uint64_t>(size, kSegmentHeaderSize));
    if (!hb.empty()) CDP_RETURN_IF_ERROR(file->Read(0, hb.size(), hb.data()));
    auto header = seglog::DecodeHeader(hb, kSpoolKind);
    uint64_t first_seq = header.ok() ? header->first_seq : 0;
    if (!header.ok() || first_seq != segs[i].first || header->number != first_seq || first_seq <= prev_last ||
        first_seq == 0) {
      if (last && !header.ok()) {
        // Created but its header never became durable: a torn roll.
        file.reset();
        CDP_RETURN_IF_ERROR(env->Remove(path));
        rec->dropped_segments++;
        rec->truncated_bytes += size;
        dir_changed = true;
        continue;
      }
      Status c = Status::Corruption("spool segment header bad: " + path);
      c.MarkDataLoss();
      Report(c);
      rec->corrupt_records++;
      file.reset();
      CDP_RETURN_IF_ERROR(env->Remove(path));
      rec->dropped_segments++;
      dir_changed = true;
      stop = true;
      continue;
    }
    if (!segments_.empty() && first_seq > prev_last + 1) {
      // A floor jump (SetFloor): everything before it is already at the MT.
      for (auto& [k, old] : segments_) {
        old.log.reset();
        CDP_RETURN_IF_ERROR(env->Remove(old.path));
        rec->dropped_segments++;
        rec->segments--;
      }
      segments_.clear();
      index_.clear();
      backlog_bytes_ = 0;
      disk_bytes_ = 0;
      dir_changed = true;
    }
    Segment seg;
    seg.first_seq = first_seq;
    seg.path = path;
    uint64_t expected = first_seq;
    seglog::ScanOptions so;
    so.max_payload = kMaxPayload;
    so.head_size = kHeadSize;
    so.valid = [](const seglog::RecordView& v) {
      proto::Record r;
      return DecodeHead(v.head, v.payload_len - kHeadSize, &r);
    };
    CDP_ASSIGN_OR_RETURN(seglog::ScanResult scan,
                         seglog::Scan(*file, kSpoolKind, so, [&](const seglog::RecordView& v) -> Result<bool> {
                           proto::Record r;
                           (void)DecodeHead(v.head, v.payload_len - kHeadSize, &r);
                           if (r.seq != expected) return false;
                           uint32_t rsize = uint32_t(seglog::kFrameSize + v.payload_len);
                           bytes_indexed_ += rsize;
                           index_.push_back(IndexEntry{r.seq, first_seq, v.offset, rsize, r.timestamp_us,
                                                       bytes_indexed_});
                           backlog_bytes_ += rsize;
                           rec->records++;
                           seg.last_seq = r.seq;
                           expected++;
                           return true;
                         }));
    uint64_t pos = scan.valid_end;
    if (scan.torn_tail) {
      // A bad record followed by a good one is damage to synced data, not a
      // torn tail (which only ever loses the end).
      if (last && scan.corrupt) {
        Status c = Status::Corruption("spool record bad in " + path + " at byte " + std::to_string(pos) +
                                      " (seq " + std::to_string(expected) + "), later records dropped");
        c.MarkDataLoss();
        Report(c);
        rec->corrupt_records++;
      }
      if (!last) {
        Status c = Status::Corruption("spool record bad in synced segment " + path + " at byte " +
                                      std::to_string(pos) + " (seq " + std::to_string(expected) + ")");
        c.MarkDataLoss();
        Report(c);
        rec->corrupt_records++;
        stop = true;
      }
      rec->truncated_bytes += size - pos;
      size = pos;
    }
    CDP_ASSIGN_OR_RETURN(seg.log, seglog::Writer::Reopen(std::move(file), size));
    seg.size = size;
    disk_bytes_ += size;
    prev_last = seg.last_seq ? seg.last_seq : first_seq - 1;
    segments_[first_seq] = std::move(seg);
    rec->segments++;
  }
  if (dir_changed) CDP_RETURN_IF_ERROR(env->SyncDir(opt_.dir));
  if (!segments_.empty()) {
    const Segment& a = segments_.rbegin()->second;
    durable_seq_ = a.last_seq ? a.last_seq : a.first_seq - 1;
  }
  released_seq_ = index_.empty() ? durable_seq_ : index_.front().seq - 1;
  return Status::OK();
}

Status Spool::CreateSegment(uint64_t first_seq, Segment* out) {
  std::string path = JoinPath(opt_.dir, SegmentName(first_seq));
  CDP_ASSIGN_OR_RETURN(std::unique_ptr<seglog::Writer> w,
                       seglog::Writer::Create(opt_.env, path, seglog::Header{kSpoolKind, first_seq, first_seq},
                                              false));
  CDP_RETURN_IF_ERROR(w->Sync());
  CDP_RETURN_IF_ERROR(opt_.env->SyncDir(opt_.dir));
  out->first_seq = first_seq;
  out->last_seq = 0;
  out->size = w->end();
  out->path = path;
  out->log = std::move(w);
  return Status::OK();
}

bool Spool::BusyLocked(uint64_t extra) {
  if (opt_.quota_bytes == 0) return false;
  if (busy_ && double(backlog_bytes_) > double(opt_.quota_bytes) * opt_.resume_fraction) return true;
  busy_ = backlog_bytes_ + extra > opt_.quota_bytes;
  return busy_;
}

uint64_t Spool::NextExpectedLocked() const { return durable_seq_ + 1; }

AppendResult Spool::Append(std::vector<proto::Record> records) {
  Writer w;
  w.records = std::move(records);
  std::unique_lock<std::mutex> l(mu_);
  if (closed_) {
    w.result.status = Status::Aborted("spool closed");
    return w.result;
  }
  writers_.push_back(&w);
  cv_.wait(l, [&] { return w.done || writers_.front() == &w; });
  if (w.done) return std::move(w.result);

  // Leader: decide every queued writer's fate under the lock.
  std::vector<Writer*> group;
  uint64_t expected = NextExpectedLocked();
  uint64_t group_first = expected;
  uint64_t group_bytes = 0;
  for (Writer* x : writers_) {
    if (!group.empty() && group_bytes >= kMaxGroupBytes) break;
    group.push_back(x);
    x->result.expected_seq = expected;
    if (closed_) {
      x->result.status = Status::Aborted("spool closed");
      continue;
    }
    size_t i = 0;
    while (i < x->records.size() && x->records[i].seq < expected) ++i;
    x->first = i;
    uint64_t bytes = 0;
    Status bad;
    for (size_t j = i; j < x->records.size(); ++j) {
      const proto::Record& r = x->records[j];
      if (r.seq != expected + (j - i)) {
        bad = Status::OutOfRange("spool: gap, expected seq " + std::to_string(expected + (j - i)) +
                                 " got " + std::to_string(r.seq));
        break;
      }
      if (!ValidShape(r.kind, r.length, r.data.size())) {
        bad = Status::InvalidArgument("spool: bad record shape at seq " + std::to_string(r.seq));
        break;
      }
      bytes += kRecordHeaderSize + r.data.size();
    }
    if (!bad.ok()) {
      x->result.status = bad;
      continue;
    }
    if (i == x->records.size()) {  // all duplicates (or empty)
      x->result.status = Status::OK();
      continue;
    }
    if (BusyLocked(group_bytes + bytes)) {
      x->result.status = Status::Busy("spool over quota (" + std::to_string(backlog_bytes_) + " of " +
                                      std::to_string(opt_.quota_bytes) + " bytes)");
      continue;
    }
    x->accepted = true;
    group_bytes += bytes;
    expected += x->records.size() - i;
  }
  uint64_t group_last = expected - 1;

  // Where the group goes: the active segment unless it is full, missing, or
  // the floor jumped past its end.
  Segment active;
  bool have_active = !segments_.empty();
  if (have_active) active = segments_.rbegin()->second;
  l.unlock();

  Status s;
  bool poison = false;
  bool rolled = false;
  Segment fresh;
  std::vector<IndexEntry> entries;
  Bytes buf;
  uint64_t recent_pos = 0;
  uint64_t old_size = active.size;
  if (group_last >= group_first) {
    uint64_t active_next = have_active ? (active.last_seq ? active.last_seq : active.first_seq - 1) + 1 : 0;
    if (!have_active || active.size >= opt_.segment_bytes || active_next != group_first) {
      s = CreateSegment(group_first, &fresh);
      rolled = s.ok();
    }
    Segment& target = rolled ? fresh : active;
    if (s.ok()) {
      buf.reserve(group_bytes);
      uint64_t pos = target.size;
      for (Writer* x : group) {
        if (!x->accepted) continue;
        for (size_t j = x->first; j < x->records.size(); ++j) {
          proto::Record& r = x->records[j];
          if (r.kind == proto::RecordKind::kData && AllZero(r.data)) {
            r.kind = proto::RecordKind::kZero;
            r.data.clear();
            r.data.shrink_to_fit();
          }
          size_t before = buf.size();
          EncodeSpoolRecord(r, &buf);
          entries.push_back(IndexEntry{r.seq, target.first_seq, pos + before,
                                       uint32_t(buf.size() - before), r.timestamp_us, 0});
        }
      }
      s = target.log->Append(buf).status();
      recent_pos = pos;
      if (s.ok()) s = target.log->Sync();
      if (s.ok()) {
        target.size += buf.size();
        target.last_seq = group_last;
      } else if (!rolled) {
        // Cut the unsynced partial group so later groups never follow garbage.
        Status t = target.log->Truncate(old_size);
        if (!t.ok()) poison = true;  // cannot trust the tail any more
      }
    }
  }

  l.lock();
  if (group_last >= group_first && s.ok()) {
    Segment& target = rolled ? fresh : active;
    if (rolled && have_active && active.last_seq == 0 && segments_.count(active.first_seq)) {
      // An empty active segment superseded by a floor jump.
      Status r = opt_.env->Remove(active.path);
      if (r.ok()) {
        disk_bytes_ -= std::min(disk_bytes_, segments_[active.first_seq].size);
        segments_.erase(active.first_seq);
      }
    }
    disk_bytes_ += rolled ? target.size : target.size - old_size;
    segments_[target.first_seq] = target;
    for (IndexEntry& e : entries) {
      if (e.seq <= released_seq_) continue;
      bytes_indexed_ += e.size;
      e.end_bytes = bytes_indexed_;
      index_.push_back(e);
      backlog_bytes_ += e.size;
    }
    durable_seq_ = std::max(durable_seq_, group_last);
    syncs_++;
    if (!buf.empty() && buf.size() <= opt_.recent_bytes) {
      recent_bytes_ += buf.size();
      recent_.push_back(
          Recent{target.first_seq, recent_pos, group_last, std::make_shared<const Bytes>(std::move(buf))});
      while (recent_bytes_ > opt_.recent_bytes) {
        recent_bytes_ -= recent_.front().bytes->size();
        recent_.pop_front();
      }
    }
  }
  if (poison) closed_ = true;
  if (rolled && !s.ok()) {
    // The new segment was created but its write failed: drop it.
    (void)opt_.env->Remove(fresh.path);
  }
  for (Writer* x : group) {
    if (x->accepted) {
      x->result.status = s;
      if (s.ok()) {
        x->result.appended = x->records.size() - x->first;
        batches_++;
      }
    }
    x->result.durable_seq = durable_seq_;
    x->done = true;
    writers_.pop_front();
  }
  cv_.notify_all();
  durable_cv_.notify_all();
  return std::move(w.result);
}

Result<std::vector<proto::Record>> Spool::Read(uint64_t from_seq, uint64_t max_bytes) {
  struct Piece {
    std::shared_ptr<File> file;
    IndexEntry e;
    std::shared_ptr<const Bytes> recent;  // holds the record at `at`, when kept
    size_t at = 0;
  };
  std::vector<Piece> pieces;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (index_.empty() || from_seq > index_.back().seq) return std::vector<proto::Record>{};
    if (from_seq < index_.front().seq)
      return Status::NotFound("spool: seq " + std::to_string(from_seq) + " already released (first " +
                              std::to_string(index_.front().seq) + ")");
    size_t pos = size_t(from_seq - index_.front().seq);
    uint64_t bytes = 0;
    auto r = recent_.begin();
    for (size_t i = pos; i < index_.size() && (pieces.empty() || bytes < max_bytes); ++i) {
      const IndexEntry& e = index_[i];
      auto it = segments_.find(e.segment_first);
      if (it == segments_.end()) return Status::NotFound("spool: segment of seq " + std::to_string(e.seq));
      Piece p{it->second.log->file(), e, nullptr, 0};
      while (r != recent_.end() && r->last_seq < e.seq) ++r;
      if (r != recent_.end() && r->segment_first == e.segment_first && r->offset <= e.offset &&
          e.offset + e.size <= r->offset + r->bytes->size()) {
        p.recent = r->bytes;
        p.at = size_t(e.offset - r->offset);
      }
      pieces.push_back(std::move(p));
      bytes += e.size;
    }
  }
  uint64_t from_file = 0;
  std::vector<proto::Record> out;
  out.reserve(pieces.size());
  size_t i = 0;
  Bytes buf;
  while (i < pieces.size()) {
    // A record kept in memory is decoded there; otherwise one read covers the
    // run of adjacent records in the same file that are not.
    size_t j = i + 1;
    ByteSpan src;
    uint64_t start = pieces[i].e.offset;
    if (pieces[i].recent) {
      src = ByteSpan(*pieces[i].recent).subspan(pieces[i].at, pieces[i].e.size);
    } else {
      while (j < pieces.size() && !pieces[j].recent && pieces[j].file == pieces[i].file &&
             pieces[j].e.offset == pieces[j - 1].e.offset + pieces[j - 1].e.size)
        ++j;
      uint64_t len = pieces[j - 1].e.offset + pieces[j - 1].e.size - start;
      buf.resize(len);
      CDP_RETURN_IF_ERROR(pieces[i].file->Read(start, len, buf.data()));
      src = buf;
      from_file += len;
    }
    for (size_t k = i; k < j; ++k) {
      proto::Record r;
      if (!DecodeSpoolRecord(src.subspan(pieces[k].e.offset - start, pieces[k].e.size), &r) ||
          r.seq != pieces[k].e.seq) {
        Status c = Status::Corruption("spool: record seq " + std::to_string(pieces[k].e.seq) +
                                      " failed its check in " + pieces[k].file->path());
        c.MarkDataLoss();
        Report(c);
        if (!out.empty()) break;  // the good prefix; the next call reports again
        return c;
      }
      out.push_back(std::move(r));
    }
    if (out.size() < j) break;
    i = j;
  }
  std::lock_guard<std::mutex> l(mu_);
  for (size_t k = 0; k < out.size(); ++k) read_bytes_ += pieces[k].e.size;
  read_file_bytes_ += from_file;
  return out;
}

Status Spool::Release(uint64_t seq) {
  std::vector<std::string> doomed;
  {
    std::lock_guard<std::mutex> l(mu_);
    // Closed: its directory may have been retired and a new spool made at
    // its path (same segment names): deleting by path would hit that one.
    if (closed_) return Status::Aborted("spool closed: nothing released");
    if (seq > durable_seq_) seq = durable_seq_;
    if (seq <= released_seq_) return Status::OK();
    released_seq_ = seq;
    while (!recent_.empty() && recent_.front().last_seq <= seq) {
      recent_bytes_ -= recent_.front().bytes->size();
      recent_.pop_front();
    }
    while (!index_.empty() && index_.front().seq <= seq) {
      backlog_bytes_ -= std::min<uint64_t>(backlog_bytes_, index_.front().size);
      index_.pop_front();
    }
    while (segments_.size() > 1) {
      auto it = segments_.begin();
      const Segment& sg = it->second;
      uint64_t end = sg.last_seq ? sg.last_seq : sg.first_seq - 1;
      if (end > seq) break;
      doomed.push_back(sg.path);
      disk_bytes_ -= std::min(disk_bytes_, sg.size);
      segments_.erase(it);
    }
    if (busy_ && double(backlog_bytes_) <= double(opt_.quota_bytes) * opt_.resume_fraction) busy_ = false;
  }
  Status first;
  for (const auto& p : doomed) {
    Status s = opt_.env->Remove(p);
    if (!s.ok() && first.ok()) first = s;
  }
  if (!doomed.empty()) {
    Status s = opt_.env->SyncDir(opt_.dir);
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

void Spool::SetFloor(uint64_t seq) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (closed_ || seq <= durable_seq_) return;
    durable_seq_ = seq;
  }
  (void)Release(seq);
  durable_cv_.notify_all();
}

uint64_t Spool::WaitDurable(uint64_t after_seq, int timeout_ms) {
  std::unique_lock<std::mutex> l(mu_);
  durable_cv_.wait_for(l, std::chrono::milliseconds(timeout_ms),
                       [&] { return durable_seq_ > after_seq || closed_; });
  return durable_seq_;
}

void Spool::Close() {
  {
    std::lock_guard<std::mutex> l(mu_);
    closed_ = true;
  }
  cv_.notify_all();
  durable_cv_.notify_all();
}

uint64_t Spool::durable_seq() const {
  std::lock_guard<std::mutex> l(mu_);
  return durable_seq_;
}

SpoolStats Spool::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  SpoolStats s;
  s.first_seq = index_.empty() ? 0 : index_.front().seq;
  s.durable_seq = durable_seq_;
  s.released_seq = released_seq_;
  s.backlog_bytes = backlog_bytes_;
  s.backlog_records = index_.size();
  s.oldest_timestamp_us = index_.empty() ? 0 : index_.front().timestamp_us;
  s.disk_bytes = disk_bytes_;
  s.segments = segments_.size();
  s.syncs = syncs_;
  s.read_bytes = read_bytes_;
  s.read_file_bytes = read_file_bytes_;
  s.appended_batches = batches_;
  s.queued_writers = writers_.size();
  s.busy = busy_;
  return s;
}

SpoolBacklog Spool::BacklogAbove(uint64_t seq) const {
  std::lock_guard<std::mutex> l(mu_);
  SpoolBacklog b;
  if (index_.empty() || seq >= index_.back().seq) return b;
  const size_t pos = seq < index_.front().seq ? 0 : size_t(seq + 1 - index_.front().seq);
  const IndexEntry& first = index_[pos];
  b.records = index_.size() - pos;
  b.bytes = index_.back().end_bytes - (first.end_bytes - first.size);
  b.oldest_timestamp_us = first.timestamp_us;
  return b;
}

}  // namespace cdp::ps

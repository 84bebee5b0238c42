#include "master-target/journal.h"

#include <cstring>


namespace cdp::mt {

std::string SegmentFileName(uint64_t segment) { return seglog::FileName(segment, kSegmentSuffix); }

bool ParseSegmentName(const std::string& name, uint64_t* segment) {
  return seglog::ParseFileName(name, kSegmentSuffix, segment);
}

Bytes EncodeSegmentHeader(const SegmentHeader& h) {
  return seglog::EncodeHeader(seglog::Header{kJournalKind, h.segment, h.first_seq});
}

Result<SegmentHeader> DecodeSegmentHeader(ByteSpan bytes) {
  auto h = seglog::DecodeHeader(bytes, kJournalKind);
  if (!h.ok()) return h.status().WithContext("journal");
  return SegmentHeader{h->number, h->first_seq};
}

void EncodeUndoRecord(UndoKind kind, uint64_t seq, uint64_t offset, uint32_t length, uint64_t time_us,
                      ByteSpan old_data, Bytes* out) {
  uint8_t head[kUndoHeadSize];
  head[0] = uint8_t(kind);
  head[1] = 0;
  EncodeFixed16(head + 2, 0);
  EncodeFixed32(head + 4, length);
  EncodeFixed64(head + 8, seq);
  EncodeFixed64(head + 16, offset);
  EncodeFixed64(head + 24, time_us);
  seglog::AppendRecord(ByteSpan(head, kUndoHeadSize), kind == UndoKind::kData ? old_data : ByteSpan(), out);
}

namespace {

// Decodes a record's frame and head (kRecordHeaderSize bytes at `p`); false if
// a field is out of range.
bool ParseRecordHeader(const uint8_t* p, UndoHeader* h) {
  h->data_crc = DecodeFixed32(p);
  uint32_t payload_len = DecodeFixed32(p + 4);
  const uint8_t* q = p + seglog::kFrameSize;
  if (payload_len < kUndoHeadSize) return false;
  uint32_t data_len = payload_len - uint32_t(kUndoHeadSize);
  uint8_t kind = q[0];
  h->length = DecodeFixed32(q + 4);
  h->seq = DecodeFixed64(q + 8);
  h->offset = DecodeFixed64(q + 16);
  h->time_us = DecodeFixed64(q + 24);
  if (h->length == 0 || h->length > kMaxUndoChunk) return false;
  if (h->offset + h->length < h->offset) return false;
  if (kind == uint8_t(UndoKind::kData)) {
    h->kind = UndoKind::kData;
    return data_len == h->length;
  }
  if (kind == uint8_t(UndoKind::kZeroes)) {
    h->kind = UndoKind::kZeroes;
    return data_len == 0;
  }
  return false;
}

// The frame and head of a scanned record, contiguous as on disk.
void FrameOf(const seglog::RecordView& v, uint8_t* out) {
  EncodeFixed32(out, v.crc);
  EncodeFixed32(out + 4, v.payload_len);
  std::memcpy(out + seglog::kFrameSize, v.head.data(), kUndoHeadSize);
}

}  // namespace

Result<ScanResult> ScanSegment(const File& file, uint64_t segment, uint64_t start, bool verify_data,
                               uint64_t limit, const ScanCallback& cb) {
  seglog::ScanOptions o;
  o.start = start;
  o.limit = limit;
  o.max_payload = uint32_t(kUndoHeadSize) + kMaxUndoChunk;
  o.head_size = kUndoHeadSize;
  o.verify = verify_data;
  o.number = segment;
  o.valid = [](const seglog::RecordView& v) {
    uint8_t rh[kRecordHeaderSize];
    FrameOf(v, rh);
    UndoHeader h;
    return ParseRecordHeader(rh, &h);
  };
  auto s = seglog::Scan(file, kJournalKind, o, [&](const seglog::RecordView& v) -> Result<bool> {
    if (!cb) return true;
    uint8_t rh[kRecordHeaderSize];
    FrameOf(v, rh);
    UndoHeader h;
    ParseRecordHeader(rh, &h);
    CDP_RETURN_IF_ERROR(cb(h, UndoLocation{segment, v.offset}));
    return true;
  });
  if (!s.ok()) return s.status();
  ScanResult r;
  r.header = SegmentHeader{s->header.number, s->header.first_seq};
  r.valid_end = s->valid_end;
  r.file_size = s->file_size;
  r.torn_tail = s->torn_tail;
  return r;
}

Status ReadUndoData(const File& file, const UndoHeader& h, const UndoLocation& loc, uint8_t* buf) {
  uint8_t rh[kRecordHeaderSize];
  CDP_RETURN_IF_ERROR(file.Read(loc.file_offset, kRecordHeaderSize, rh));
  UndoHeader got;
  if (!ParseRecordHeader(rh, &got) || got.seq != h.seq || got.offset != h.offset || got.length != h.length) {
    return Status::Corruption(file.path() + ": undo record header changed at " + std::to_string(loc.file_offset));
  }
  ByteSpan data;
  if (got.kind == UndoKind::kZeroes) {
    std::memset(buf, 0, h.length);
  } else {
    CDP_RETURN_IF_ERROR(file.Read(loc.file_offset + kRecordHeaderSize, h.length, buf));
    data = ByteSpan(buf, h.length);
  }
  if (!seglog::CheckRecord(ByteSpan(rh, kRecordHeaderSize), data)) {
    return Status::Corruption(file.path() + ": undo record CRC mismatch at " + std::to_string(loc.file_offset));
  }
  return Status::OK();
}

Status ReadUndoSlice(const File& file, const UndoHeader& h, const UndoLocation& loc, uint32_t skip, uint32_t n,
                     uint8_t* buf) {
  if (uint64_t(skip) + n > h.length) return Status::OutOfRange("undo slice outside its record");
  if (h.kind == UndoKind::kZeroes) {
    std::memset(buf, 0, n);
    return Status::OK();
  }
  return file.Read(loc.file_offset + kRecordHeaderSize + skip, n, buf);
}

Result<std::unique_ptr<SegmentWriter>> SegmentWriter::Open(Env* env, std::string dir, uint64_t segment, bool create,
                                                           uint64_t first_seq, uint64_t end,
                                                           uint64_t segment_bytes) {
  std::unique_ptr<SegmentWriter> w(new SegmentWriter(env, std::move(dir), segment_bytes));
  if (create) {
    CDP_RETURN_IF_ERROR(w->StartSegment(segment, first_seq));
  } else {
    CDP_ASSIGN_OR_RETURN(std::unique_ptr<File> f, env->Open(JoinPath(w->dir_, SegmentFileName(segment)), {}));
    CDP_ASSIGN_OR_RETURN(w->log_, seglog::Writer::Reopen(std::move(f), end));
    w->segment_ = segment;
  }
  return w;
}

Status SegmentWriter::StartSegment(uint64_t segment, uint64_t first_seq) {
  CDP_ASSIGN_OR_RETURN(log_, seglog::Writer::Create(env_, JoinPath(dir_, SegmentFileName(segment)),
                                                    seglog::Header{kJournalKind, segment, first_seq}, true));
  segment_ = segment;
  unsynced_.push_back(log_->file());
  dir_dirty_ = true;
  if (on_new_segment) on_new_segment(segment, log_->file());
  return Status::OK();
}

Result<UndoLocation> SegmentWriter::Append(ByteSpan records, uint64_t next_seq) {
  if (log_->end() >= segment_bytes_) CDP_RETURN_IF_ERROR(StartSegment(segment_ + 1, next_seq));
  CDP_ASSIGN_OR_RETURN(uint64_t at, log_->Append(records));
  if (unsynced_.empty() || unsynced_.back() != log_->file()) unsynced_.push_back(log_->file());
  return UndoLocation{segment_, at};
}

Status SegmentWriter::Sync() {
  for (auto& f : unsynced_) CDP_RETURN_IF_ERROR(f->Sync());
  unsynced_.clear();
  if (dir_dirty_) {
    CDP_RETURN_IF_ERROR(env_->SyncDir(dir_));
    dir_dirty_ = false;
  }
  return Status::OK();
}

}  // namespace cdp::mt

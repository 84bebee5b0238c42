// SPDX-License-Identifier: Apache-2.0
#include "master-target/journal.h"

#include <cstring>

#include "common/wire/codec.h"

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
                      ByteSpan stored, Bytes* out) {
  uint8_t head[kUndoHeadSize];
  head[0] = uint8_t(kind);
  head[1] = 0;
  EncodeFixed16(head + 2, 0);
  EncodeFixed32(head + 4, length);
  EncodeFixed64(head + 8, seq);
  EncodeFixed64(head + 16, offset);
  EncodeFixed64(head + 24, time_us);
  seglog::AppendRecord(ByteSpan(head, kUndoHeadSize), kind == UndoKind::kZeroes ? ByteSpan() : stored, out);
}

namespace {

// zstd codecs of this thread (contexts are reused, never shared): one that
// compresses at the level last asked, one that decompresses.
Codec& ThreadCompressor(int level) {
  thread_local int codec_level = -1;
  thread_local std::unique_ptr<Codec> codec;
  if (!codec || codec_level != level) {
    codec = NewCodec(proto::Codec::kZstd, level);
    codec_level = level;
  }
  return *codec;
}

Codec& ThreadDecompressor() {
  thread_local std::unique_ptr<Codec> codec = NewCodec(proto::Codec::kZstd);
  return *codec;
}

}  // namespace

UndoKind EncodeOldData(uint64_t seq, uint64_t offset, uint64_t time_us, ByteSpan old, int zstd_level, Bytes* out) {
  const uint32_t n = uint32_t(old.size());
  if (AllZero(old)) {
    EncodeUndoRecord(UndoKind::kZeroes, seq, offset, n, time_us, ByteSpan(), out);
    return UndoKind::kZeroes;
  }
  if (zstd_level > 0) {
    thread_local Bytes frame;
    frame.clear();
    if (ThreadCompressor(zstd_level).Compress(old, &frame).ok() && !frame.empty() && frame.size() <= n - n / 8) {
      EncodeUndoRecord(UndoKind::kZstd, seq, offset, n, time_us, frame, out);
      return UndoKind::kZstd;
    }
  }
  EncodeUndoRecord(UndoKind::kData, seq, offset, n, time_us, old, out);
  return UndoKind::kData;
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
  h->data_len = data_len;
  if (kind == uint8_t(UndoKind::kZstd)) {
    h->kind = UndoKind::kZstd;
    return data_len > 0 && data_len < h->length;
  }
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
  // A small plain record: header and data in one read (a copy of the data
  // costs less than a second system call).
  constexpr uint32_t kOneReadMaxBytes = 64u << 10;
  if (h.kind == UndoKind::kData && h.length <= kOneReadMaxBytes) {
    thread_local Bytes whole;
    whole.resize(kRecordHeaderSize + h.length);
    CDP_RETURN_IF_ERROR(file.Read(loc.file_offset, whole.size(), whole.data()));
    UndoHeader got;
    if (!ParseRecordHeader(whole.data(), &got) || got.seq != h.seq || got.offset != h.offset ||
        got.length != h.length) {
      return Status::Corruption(file.path() + ": undo record header changed at " + std::to_string(loc.file_offset));
    }
    if (got.kind == UndoKind::kData) {
      if (!seglog::CheckRecord(ByteSpan(whole.data(), kRecordHeaderSize),
                               ByteSpan(whole.data() + kRecordHeaderSize, h.length))) {
        return Status::Corruption(file.path() + ": undo record CRC mismatch at " + std::to_string(loc.file_offset));
      }
      std::memcpy(buf, whole.data() + kRecordHeaderSize, h.length);
      return Status::OK();
    }
    // Another kind on disk than in the index: read it as the header says, below.
  }
  uint8_t rh[kRecordHeaderSize];
  CDP_RETURN_IF_ERROR(file.Read(loc.file_offset, kRecordHeaderSize, rh));
  UndoHeader got;
  if (!ParseRecordHeader(rh, &got) || got.seq != h.seq || got.offset != h.offset || got.length != h.length) {
    return Status::Corruption(file.path() + ": undo record header changed at " + std::to_string(loc.file_offset));
  }
  ByteSpan data;
  thread_local Bytes frame;
  if (got.kind == UndoKind::kZeroes) {
    std::memset(buf, 0, h.length);
  } else if (got.kind == UndoKind::kZstd) {
    frame.resize(got.data_len);
    CDP_RETURN_IF_ERROR(file.Read(loc.file_offset + kRecordHeaderSize, got.data_len, frame.data()));
    data = ByteSpan(frame.data(), frame.size());
  } else {
    CDP_RETURN_IF_ERROR(file.Read(loc.file_offset + kRecordHeaderSize, h.length, buf));
    data = ByteSpan(buf, h.length);
  }
  if (!seglog::CheckRecord(ByteSpan(rh, kRecordHeaderSize), data)) {
    return Status::Corruption(file.path() + ": undo record CRC mismatch at " + std::to_string(loc.file_offset));
  }
  if (got.kind == UndoKind::kZstd) {
    thread_local Bytes plain;
    plain.clear();
    Status s = ThreadDecompressor().Decompress(data, h.length, &plain);
    if (!s.ok() || plain.size() != h.length) {
      return Status::Corruption(file.path() + ": undo record at " + std::to_string(loc.file_offset) +
                                " does not decompress to its " + std::to_string(h.length) + " bytes");
    }
    std::memcpy(buf, plain.data(), h.length);
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
  if (h.kind == UndoKind::kZstd) {
    thread_local Bytes whole;
    whole.resize(h.length);
    CDP_RETURN_IF_ERROR(ReadUndoData(file, h, loc, whole.data()));
    std::memcpy(buf, whole.data() + skip, n);
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

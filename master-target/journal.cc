#include "master-target/journal.h"

#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "common/crc32c.h"

namespace cdp::mt {

std::string SegmentFileName(uint64_t segment) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016" PRIx64 ".jnl", segment);
  return buf;
}

bool ParseSegmentName(const std::string& name, uint64_t* segment) {
  if (name.size() != 20 || name.compare(16, 4, ".jnl") != 0) return false;
  uint64_t v = 0;
  for (size_t i = 0; i < 16; ++i) {
    char c = name[i];
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else return false;
    v = (v << 4) | uint64_t(d);
  }
  *segment = v;
  return true;
}

Bytes EncodeSegmentHeader(const SegmentHeader& h) {
  Bytes b;
  b.reserve(kSegmentHeaderSize);
  PutFixed32(b, kSegmentMagic);
  PutFixed16(b, kJournalVersion);
  PutFixed16(b, 0);
  PutFixed64(b, h.segment);
  PutFixed64(b, h.first_seq);
  PutFixed32(b, 0);
  PutFixed32(b, crc32c::Value(b.data(), b.size()));
  return b;
}

Result<SegmentHeader> DecodeSegmentHeader(ByteSpan bytes) {
  if (bytes.size() < kSegmentHeaderSize) return Status::Corruption("journal segment header truncated");
  const uint8_t* p = bytes.data();
  if (DecodeFixed32(p) != kSegmentMagic) return Status::Corruption("journal segment: bad magic");
  if (DecodeFixed16(p + 4) != kJournalVersion)
    return Status::Corruption("journal segment: unsupported version " + std::to_string(DecodeFixed16(p + 4)));
  if (DecodeFixed32(p + 28) != crc32c::Value(p, 28)) return Status::Corruption("journal segment header: bad CRC");
  SegmentHeader h;
  h.segment = DecodeFixed64(p + 8);
  h.first_seq = DecodeFixed64(p + 16);
  return h;
}

void EncodeUndoRecord(UndoKind kind, uint64_t seq, uint64_t offset, uint32_t length, uint64_t time_us,
                      ByteSpan old_data, Bytes* out) {
  size_t start = out->size();
  uint32_t data_len = kind == UndoKind::kData ? uint32_t(old_data.size()) : 0;
  out->resize(start + kRecordHeaderSize);
  uint8_t* p = out->data() + start;
  p[4] = uint8_t(kind);
  p[5] = 0;
  EncodeFixed16(p + 6, 0);
  EncodeFixed64(p + 8, seq);
  EncodeFixed64(p + 16, offset);
  EncodeFixed32(p + 24, length);
  EncodeFixed32(p + 28, data_len);
  EncodeFixed64(p + 32, time_us);
  uint32_t crc = crc32c::Value(p + 4, kRecordHeaderSize - 4);
  if (data_len) {
    crc = crc32c::Extend(crc, old_data.data(), data_len);
    out->insert(out->end(), old_data.begin(), old_data.begin() + data_len);
  }
  EncodeFixed32(out->data() + start, crc);
}

bool AllZero(ByteSpan data) {
  const uint8_t* p = data.data();
  size_t n = data.size();
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    if (v) return false;
    p += 8;
    n -= 8;
  }
  while (n--) {
    if (*p++) return false;
  }
  return true;
}

namespace {

// Decodes a record header; false if a field is out of range.
bool ParseRecordHeader(const uint8_t* p, UndoHeader* h, uint32_t* data_len) {
  h->data_crc = DecodeFixed32(p);
  uint8_t kind = p[4];
  h->seq = DecodeFixed64(p + 8);
  h->offset = DecodeFixed64(p + 16);
  h->length = DecodeFixed32(p + 24);
  *data_len = DecodeFixed32(p + 28);
  h->time_us = DecodeFixed64(p + 32);
  if (h->length == 0 || h->length > kMaxUndoChunk) return false;
  if (h->offset + h->length < h->offset) return false;
  if (kind == uint8_t(UndoKind::kData)) {
    h->kind = UndoKind::kData;
    return *data_len == h->length;
  }
  if (kind == uint8_t(UndoKind::kZeroes)) {
    h->kind = UndoKind::kZeroes;
    return *data_len == 0;
  }
  return false;
}

}  // namespace

Result<ScanResult> ScanSegment(const File& file, uint64_t segment, uint64_t start, bool verify_data,
                               uint64_t limit, const ScanCallback& cb) {
  ScanResult r;
  CDP_ASSIGN_OR_RETURN(r.file_size, file.Size());
  uint8_t hb[kSegmentHeaderSize];
  if (r.file_size < kSegmentHeaderSize) {
    return Status::Corruption(file.path() + ": journal segment shorter than its header");
  }
  CDP_RETURN_IF_ERROR(file.Read(0, kSegmentHeaderSize, hb));
  auto sh = DecodeSegmentHeader(ByteSpan(hb, kSegmentHeaderSize));
  if (!sh.ok()) return sh.status().WithContext(file.path());
  if (sh->segment != segment) return Status::Corruption(file.path() + ": segment number mismatch");
  r.header = *sh;
  uint64_t pos = start < kSegmentHeaderSize ? kSegmentHeaderSize : start;
  Bytes data;
  while (pos < r.file_size && pos < limit) {
    if (r.file_size - pos < kRecordHeaderSize) {
      r.torn_tail = true;
      break;
    }
    uint8_t rh[kRecordHeaderSize];
    CDP_RETURN_IF_ERROR(file.Read(pos, kRecordHeaderSize, rh));
    UndoHeader h;
    uint32_t data_len = 0;
    if (!ParseRecordHeader(rh, &h, &data_len) || r.file_size - pos - kRecordHeaderSize < data_len) {
      r.torn_tail = true;
      break;
    }
    if (verify_data) {
      uint32_t crc = crc32c::Value(rh + 4, kRecordHeaderSize - 4);
      if (data_len) {
        data.resize(data_len);
        CDP_RETURN_IF_ERROR(file.Read(pos + kRecordHeaderSize, data_len, data.data()));
        crc = crc32c::Extend(crc, data.data(), data_len);
      }
      if (crc != h.data_crc) {
        r.torn_tail = true;
        break;
      }
    }
    if (cb) CDP_RETURN_IF_ERROR(cb(h, UndoLocation{segment, pos}));
    pos += kRecordHeaderSize + data_len;
  }
  r.valid_end = pos;
  return r;
}

Status ReadUndoData(const File& file, const UndoHeader& h, const UndoLocation& loc, uint8_t* buf) {
  uint8_t rh[kRecordHeaderSize];
  CDP_RETURN_IF_ERROR(file.Read(loc.file_offset, kRecordHeaderSize, rh));
  UndoHeader got;
  uint32_t data_len = 0;
  if (!ParseRecordHeader(rh, &got, &data_len) || got.seq != h.seq || got.offset != h.offset ||
      got.length != h.length) {
    return Status::Corruption(file.path() + ": undo record header changed at " + std::to_string(loc.file_offset));
  }
  uint32_t crc = crc32c::Value(rh + 4, kRecordHeaderSize - 4);
  if (got.kind == UndoKind::kZeroes) {
    std::memset(buf, 0, h.length);
  } else {
    CDP_RETURN_IF_ERROR(file.Read(loc.file_offset + kRecordHeaderSize, h.length, buf));
    crc = crc32c::Extend(crc, buf, h.length);
  }
  if (crc != got.data_crc) {
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
    OpenOptions o;
    auto f = env->Open(JoinPath(w->dir_, SegmentFileName(segment)), o);
    if (!f.ok()) return f.status();
    std::shared_ptr<File> file = std::move(*f);
    CDP_ASSIGN_OR_RETURN(uint64_t size, file->Size());
    if (size != end) {
      CDP_RETURN_IF_ERROR(file->Truncate(end));
      CDP_RETURN_IF_ERROR(file->Sync());
    }
    w->segment_ = segment;
    w->end_ = end;
    w->file_ = std::move(file);
  }
  return w;
}

Status SegmentWriter::StartSegment(uint64_t segment, uint64_t first_seq) {
  OpenOptions o;
  o.create = true;
  o.exclusive = true;
  auto f = env_->Open(JoinPath(dir_, SegmentFileName(segment)), o);
  if (!f.ok()) return f.status();
  std::shared_ptr<File> file = std::move(*f);
  Bytes h = EncodeSegmentHeader(SegmentHeader{segment, first_seq});
  CDP_RETURN_IF_ERROR(file->Append(h));
  segment_ = segment;
  end_ = h.size();
  file_ = file;
  unsynced_.push_back(file);
  dir_dirty_ = true;
  if (on_new_segment) on_new_segment(segment, file);
  return Status::OK();
}

Result<UndoLocation> SegmentWriter::Append(ByteSpan records, uint64_t next_seq) {
  if (end_ >= segment_bytes_) CDP_RETURN_IF_ERROR(StartSegment(segment_ + 1, next_seq));
  UndoLocation loc{segment_, end_};
  CDP_RETURN_IF_ERROR(file_->Append(records));
  end_ += records.size();
  if (unsynced_.empty() || unsynced_.back() != file_) unsynced_.push_back(file_);
  return loc;
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

// SPDX-License-Identifier: Apache-2.0
#include "common/store/segment_log.h"

#include <cinttypes>
#include <cstdio>

#include "common/base/crc32c.h"

namespace cdp::seglog {

std::string FileName(uint64_t number, std::string_view suffix) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, number);
  return std::string(buf) + std::string(suffix);
}

bool ParseFileName(std::string_view name, std::string_view suffix, uint64_t* number) {
  if (name.size() != 16 + suffix.size() || name.substr(16) != suffix) return false;
  uint64_t v = 0;
  for (size_t i = 0; i < 16; ++i) {
    char c = name[i];
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else return false;
    v = (v << 4) | uint64_t(d);
  }
  *number = v;
  return true;
}

Bytes EncodeHeader(const Header& h) {
  Bytes b;
  b.reserve(kHeaderSize);
  PutFixed32(b, kMagic);
  PutFixed16(b, kVersion);
  PutFixed16(b, h.kind);
  PutFixed64(b, h.number);
  PutFixed64(b, h.first_seq);
  PutFixed32(b, 0);
  PutFixed32(b, crc32c::Value(b.data(), b.size()));
  return b;
}

Result<Header> DecodeHeader(ByteSpan bytes, uint16_t kind) {
  if (bytes.size() < kHeaderSize) return Status::Corruption("segment header truncated");
  const uint8_t* p = bytes.data();
  if (DecodeFixed32(p) != kMagic) return Status::Corruption("segment header: bad magic");
  if (DecodeFixed16(p + 4) != kVersion)
    return Status::Corruption("segment header: unsupported version " + std::to_string(DecodeFixed16(p + 4)));
  if (DecodeFixed32(p + 28) != crc32c::Value(p, 28)) return Status::Corruption("segment header: bad CRC");
  Header h;
  h.kind = DecodeFixed16(p + 6);
  if (h.kind != kind) return Status::Corruption("segment header: kind " + std::to_string(h.kind));
  h.number = DecodeFixed64(p + 8);
  h.first_seq = DecodeFixed64(p + 16);
  return h;
}

void AppendRecord(ByteSpan head, ByteSpan data, Bytes* out) {
  size_t start = out->size();
  PutFixed32(*out, 0);
  PutFixed32(*out, uint32_t(head.size() + data.size()));
  PutBytes(*out, head);
  PutBytes(*out, data);
  EncodeFixed32(out->data() + start, crc32c::Value(out->data() + start + 4, out->size() - start - 4));
}

bool CheckRecord(ByteSpan frame, ByteSpan rest) {
  uint32_t crc = crc32c::Value(frame.data() + 4, frame.size() - 4);
  crc = crc32c::Extend(crc, rest.data(), rest.size());
  return crc == DecodeFixed32(frame.data());
}

Decode DecodeRecord(ByteSpan in, uint32_t max_payload, ByteSpan* payload, size_t* size) {
  if (in.size() < kFrameSize) return Decode::kTruncated;
  uint32_t len = DecodeFixed32(in.data() + 4);
  if (len > max_payload) return Decode::kBad;
  if (in.size() - kFrameSize < len) return Decode::kTruncated;
  if (!CheckRecord(in.first(kFrameSize + len), {})) return Decode::kBad;
  *payload = in.subspan(kFrameSize, len);
  *size = kFrameSize + len;
  return Decode::kOk;
}

Result<std::unique_ptr<Writer>> Writer::Create(Env* env, const std::string& path, const Header& h,
                                               bool exclusive) {
  OpenOptions o;
  o.create = true;
  o.exclusive = exclusive;
  o.truncate = !exclusive;
  CDP_ASSIGN_OR_RETURN(std::unique_ptr<File> f, env->Open(path, o));
  Bytes hdr = EncodeHeader(h);
  CDP_RETURN_IF_ERROR(f->Append(hdr));
  return std::unique_ptr<Writer>(new Writer(std::move(f), hdr.size()));
}

Result<std::unique_ptr<Writer>> Writer::Reopen(std::shared_ptr<File> f, uint64_t end) {
  CDP_ASSIGN_OR_RETURN(uint64_t size, f->Size());
  if (size != end) {
    CDP_RETURN_IF_ERROR(f->Truncate(end));
    CDP_RETURN_IF_ERROR(f->Sync());
  }
  return std::unique_ptr<Writer>(new Writer(std::move(f), end));
}

Result<uint64_t> Writer::Append(ByteSpan records) {
  uint64_t at = end_;
  CDP_RETURN_IF_ERROR(file_->Append(records));
  end_ += records.size();
  return at;
}

Status Writer::Truncate(uint64_t end) {
  CDP_RETURN_IF_ERROR(file_->Truncate(end));
  end_ = end;
  return Status::OK();
}

namespace {

enum class Probe { kGood, kBad, kShort };

// Reads the record at `pos` (its frame and head; with `verify` its payload too)
// into `head`/`payload` and checks it. *next is set once the frame is readable.
Result<Probe> ReadRecord(const File& file, uint64_t size, uint64_t pos, const ScanOptions& o, Bytes* buf,
                         RecordView* v, uint64_t* next) {
  size_t fixed = kFrameSize + o.head_size;
  if (size - pos < kFrameSize) return Probe::kShort;
  size_t first = size_t(std::min<uint64_t>(fixed, size - pos));
  buf->resize(first);
  CDP_RETURN_IF_ERROR(file.Read(pos, first, buf->data()));
  v->offset = pos;
  v->crc = DecodeFixed32(buf->data());
  v->payload_len = DecodeFixed32(buf->data() + 4);
  *next = pos + kFrameSize + v->payload_len;
  if (v->payload_len > o.max_payload || v->payload_len < o.head_size) return Probe::kBad;
  if (size - pos - kFrameSize < v->payload_len) return Probe::kShort;
  if (o.verify) {
    buf->resize(kFrameSize + v->payload_len);
    if (v->payload_len > o.head_size)
      CDP_RETURN_IF_ERROR(file.Read(pos + fixed, v->payload_len - o.head_size, buf->data() + fixed));
    if (!CheckRecord(*buf, {})) return Probe::kBad;
    v->payload = ByteSpan(*buf).subspan(kFrameSize);
  } else {
    v->payload = {};
  }
  v->head = ByteSpan(*buf).subspan(kFrameSize, o.head_size);
  if (o.valid && !o.valid(*v)) return Probe::kBad;
  return Probe::kGood;
}

}  // namespace

Result<ScanResult> Scan(const File& file, uint16_t kind, const ScanOptions& o, const RecordFn& fn) {
  ScanResult r;
  CDP_ASSIGN_OR_RETURN(r.file_size, file.Size());
  if (r.file_size < kHeaderSize) return Status::Corruption(file.path() + ": segment shorter than its header");
  uint8_t hb[kHeaderSize];
  CDP_RETURN_IF_ERROR(file.Read(0, kHeaderSize, hb));
  auto h = DecodeHeader(ByteSpan(hb, kHeaderSize), kind);
  if (!h.ok()) return h.status().WithContext(file.path());
  if (o.number && h->number != *o.number) return Status::Corruption(file.path() + ": segment number mismatch");
  r.header = *h;
  uint64_t pos = o.start < kHeaderSize ? kHeaderSize : o.start;
  Bytes buf;
  while (pos < r.file_size && pos < o.limit) {
    RecordView v;
    uint64_t next = 0;
    CDP_ASSIGN_OR_RETURN(Probe p, ReadRecord(file, r.file_size, pos, o, &buf, &v, &next));
    if (p == Probe::kGood) {
      bool accept = true;
      if (fn) {
        CDP_ASSIGN_OR_RETURN(accept, fn(v));
      }
      if (accept) {
        r.records++;
        pos = next;
        continue;
      }
    }
    r.torn_tail = true;
    if (next > pos && next < r.file_size) {
      RecordView v2;
      uint64_t next2 = 0;
      CDP_ASSIGN_OR_RETURN(Probe p2, ReadRecord(file, r.file_size, next, o, &buf, &v2, &next2));
      r.corrupt = p2 == Probe::kGood;
    }
    break;
  }
  r.valid_end = pos;
  return r;
}

}  // namespace cdp::seglog

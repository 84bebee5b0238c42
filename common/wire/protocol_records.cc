// SPDX-License-Identifier: Apache-2.0
// Records, write batches, failback extents and digests, and the bounded
// helpers every message uses (common/wire/protocol_codec.h); the public record
// helpers of common/wire/protocol.h.
#include <algorithm>
#include <bit>
#include <limits>
#include <string>
#include <type_traits>

#include "common/base/crc32c.h"
#include "common/wire/codec.h"
#include "common/wire/protocol_codec.h"

namespace cdp::proto {
namespace codec {

// ---- encoding helpers ----

Status PutName(Bytes& b, const std::string& s, const char* field) {
  if (!ValidName(s)) return Invalid(std::string("invalid ") + field + " name");
  PutFixed16(b, uint16_t(s.size()));
  PutBytes(b, s);
  return Status::OK();
}

Status PutText(Bytes& b, const std::string& s, const char* field) {
  if (s.size() > kMaxTextLength) return Invalid(std::string(field) + " longer than kMaxTextLength");
  PutFixed16(b, uint16_t(s.size()));
  PutBytes(b, s);
  return Status::OK();
}


// ---- decoding helpers: every Get checks bounds and caps ----

bool GetString(ByteReader& r, size_t cap, std::string* out) {
  uint16_t n = 0;
  if (!r.GetFixed16(&n) || n > cap) return false;
  ByteSpan s;
  if (!r.GetSpan(n, &s)) return false;
  out->assign(reinterpret_cast<const char*>(s.data()), s.size());
  return true;
}

bool GetName(ByteReader& r, std::string* out) {
  return GetString(r, kMaxNameLength, out) && ValidName(*out);
}


// ---- records ----

// A pull answer's blocks: data or zeros, sealed (with their MACs) on a sealed volume.
bool IsPullKind(RecordKind k) {
  return k == RecordKind::kData || k == RecordKind::kZero || k == RecordKind::kSealed || k == RecordKind::kSealedZero;
}

bool KnownKind(uint8_t k) { return k >= uint8_t(RecordKind::kData) && k <= uint8_t(RecordKind::kAnomaly); }

// Checks one record's fields (shared by encoder and parser). `expected_seq` is
// 0 for the first record of a batch (any sequence >= 1), else the required one.
Status CheckRecord(uint64_t seq, uint64_t offset, uint32_t length, RecordKind kind,
                   ByteSpan data, uint64_t expected_seq) {
  if (seq == 0) return Status::InvalidArgument("record sequence 0");
  if (expected_seq != 0 && seq != expected_seq) {
    return Status::InvalidArgument("record sequence " + std::to_string(seq) + " where " +
                                   std::to_string(expected_seq) + " was due");
  }
  if (offset > std::numeric_limits<uint64_t>::max() - length) {
    return Status::InvalidArgument("record offset + length overflows");
  }
  switch (kind) {
    case RecordKind::kData:
      if (length == 0 || length > kMaxRecordLength) return Status::InvalidArgument("data record length out of range");
      if (data.size() != length) return Status::InvalidArgument("data record size differs from its length");
      return Status::OK();
    case RecordKind::kZero:
    case RecordKind::kTrim:
      if (length == 0) return Status::InvalidArgument("zero/trim record of length 0");
      if (!data.empty()) return Status::InvalidArgument("zero/trim record carries data");
      return Status::OK();
    case RecordKind::kSealed:
    case RecordKind::kSealedZero: {
      if (length == 0 || length > kMaxRecordLength) return Status::InvalidArgument("sealed record length out of range");
      if (offset % kSealUnit != 0 || length % kSealUnit != 0)
        return Status::InvalidArgument("sealed record not on whole 4 KiB blocks");
      const uint64_t want = SealMacBytes(length) + (kind == RecordKind::kSealed ? length : 0);
      if (data.size() != want) return Status::InvalidArgument("sealed record size differs from its blocks and MACs");
      return Status::OK();
    }
    case RecordKind::kFlush:
      if (offset != 0 || length != 0) return Status::InvalidArgument("flush record with a range");
      if (!data.empty()) return Status::InvalidArgument("flush record carries data");
      return Status::OK();
    case RecordKind::kTag:
      if (offset != 0 || length != 0) return Status::InvalidArgument("tag record with a range");
      if (!ValidName(std::string_view(reinterpret_cast<const char*>(data.data()), data.size()))) {
        return Status::InvalidArgument("tag record with an invalid name");
      }
      return Status::OK();
    case RecordKind::kAnomaly: {
      if (offset != 0 || length != 0) return Status::InvalidArgument("anomaly record with a range");
      uint64_t back = 0;
      std::string message;
      if (!DecodeAnomaly(data, &back, &message)) return Status::InvalidArgument("bad anomaly record");
      if (back > seq) return Status::InvalidArgument("anomaly record points before the volume's first record");
      return Status::OK();
    }
  }
  return Status::InvalidArgument("unknown record kind");
}

// Appends the payload of `wb` to `out`. With `pieces`, the data of records of
// kInPlaceData bytes or more is not copied: *pieces receives the payload as
// spans of `out` (from its size on entry) and of those records' data, unless
// the batch is compressed (then one span of `out`).
Status EncodeBatch(const WriteBatch& wb, Bytes& out, std::vector<ByteSpan>* pieces) {
  if (wb.records.empty()) return Invalid("empty write batch");
  if (wb.records.size() > kMaxRecords) return Invalid("more than kMaxRecords records");
  if (uint8_t(wb.codec) > uint8_t(Codec::kZstd)) return Invalid("unknown codec");
  auto in_place = [&](const Record& rec) { return pieces != nullptr && rec.bytes().size() >= kInPlaceData; };
  uint64_t raw_size = 0, own_size = 0;
  for (const Record& rec : wb.records) {
    raw_size += kRecordHeaderSize + rec.bytes().size();
    own_size += kRecordHeaderSize + (in_place(rec) ? 0 : rec.bytes().size());
  }
  if (raw_size > kMaxBatchRaw) return Invalid("record block larger than kMaxBatchRaw");

  // The record block is written in place, after the batch header; it is
  // replaced by its compressed form only when that is smaller. Reserved
  // whole: the pieces point into `out`.
  const size_t start = out.size();
  out.reserve(start + kBatchHeaderSize + size_t(own_size));
  if (pieces != nullptr) pieces->clear();
  size_t run = start;  // the part of `out` not yet a piece
  auto cut = [&] {
    if (out.size() > run) pieces->emplace_back(out.data() + run, out.size() - run);
    run = out.size();
  };
  PutFixed32(out, wb.volume_id);
  PutU8(out, uint8_t(Codec::kNone));  // set below
  PutFixed32(out, uint32_t(raw_size));
  PutFixed32(out, uint32_t(wb.records.size()));
  const size_t block_at = out.size();
  uint64_t expected = 0;
  for (const Record& rec : wb.records) {
    Status s = CheckRecord(rec.seq, rec.offset, rec.length, rec.kind, rec.bytes(), expected);
    if (!s.ok()) return Invalid(s.message());
    expected = rec.seq + 1;
    if (expected == 0) return Invalid("record sequence overflows");
    PutFixed64(out, rec.seq);
    PutFixed64(out, rec.offset);
    PutFixed32(out, rec.length);
    PutU8(out, uint8_t(rec.kind));
    PutFixed64(out, rec.timestamp_us);
    const ByteSpan data = rec.bytes();
    PutFixed32(out, uint32_t(data.size()));
    if (in_place(rec)) {
      cut();
      pieces->emplace_back(data);
    } else {
      PutBytes(out, data);
    }
  }
  if (pieces != nullptr) cut();

  Codec codec = wb.codec;
  if (codec != Codec::kNone) {
    std::unique_ptr<cdp::Codec> c = NewCodec(codec, wb.level);
    if (!c) return Invalid("codec unavailable");
    // Incompressible data travels raw: the receiver then skips a useless pass,
    // and a sample spares the sender one (common/wire/codec.h).
    std::vector<ByteSpan> block{ByteSpan(out).subspan(block_at)};
    if (pieces != nullptr) {
      block = *pieces;
      block.front() = block.front().subspan(kBatchHeaderSize);
    }
    Bytes flat, compressed;
    if (SampleCompresses(*c, block)) {
      if (block.size() > 1) {
        flat.reserve(size_t(raw_size));
        for (ByteSpan b : block) PutBytes(flat, b);
      }
      CDP_RETURN_IF_ERROR(c->Compress(block.size() > 1 ? ByteSpan(flat) : block.front(), &compressed));
    }
    if (!compressed.empty() && compressed.size() < raw_size) {
      out.resize(block_at);
      PutBytes(out, compressed);
      if (pieces != nullptr) pieces->assign(1, ByteSpan(out).subspan(start));
    } else {
      codec = Codec::kNone;
    }
  }
  out[start + 4] = uint8_t(codec);
  uint64_t size = out.size() - start;
  if (pieces != nullptr) {
    size = 0;
    for (ByteSpan b : *pieces) size += b.size();
  }
  if (size > kMaxPayload) return Invalid("write batch larger than kMaxPayload");
  return Status::OK();
}

Result<Message> ParseBatch(ByteReader& r) {
  WriteBatch wb;
  uint8_t codec = 0;
  uint32_t raw_size = 0, count = 0;
  if (!r.GetFixed32(&wb.volume_id) || !r.GetU8(&codec) || !r.GetFixed32(&raw_size) ||
      !r.GetFixed32(&count)) {
    return Bad("truncated write batch header");
  }
  if (codec > uint8_t(Codec::kZstd)) return Bad("unknown codec " + std::to_string(codec));
  wb.codec = Codec(codec);
  if (raw_size > kMaxBatchRaw) return Bad("record block larger than kMaxBatchRaw");
  if (count == 0 || count > kMaxRecords) return Bad("record count out of range");
  if (uint64_t(count) * kRecordHeaderSize > raw_size) return Bad("record count exceeds the record block");

  ByteSpan body;
  r.GetSpan(r.remaining(), &body);
  Bytes decompressed;
  ByteSpan block;
  if (wb.codec == Codec::kNone) {
    if (body.size() != raw_size) return Bad("record block size differs from raw_size");
    block = body;
  } else {
    std::unique_ptr<cdp::Codec> c = NewCodec(wb.codec);
    if (!c) return Bad("codec unavailable");
    Status s = c->Decompress(body, raw_size, &decompressed);
    if (!s.ok()) return Bad("record block does not decompress: " + s.message());
    if (decompressed.size() != raw_size) return Bad("record block decompressed to the wrong size");
    block = decompressed;
  }

  ByteReader br(block);
  wb.records.reserve(count);  // count * kRecordHeaderSize <= raw_size <= kMaxBatchRaw
  uint64_t expected = 0;
  for (uint32_t i = 0; i < count; ++i) {
    Record rec;
    uint8_t kind = 0;
    uint32_t data_len = 0;
    if (!br.GetFixed64(&rec.seq) || !br.GetFixed64(&rec.offset) || !br.GetFixed32(&rec.length) ||
        !br.GetU8(&kind) || !br.GetFixed64(&rec.timestamp_us) || !br.GetFixed32(&data_len)) {
      return Bad("truncated record header");
    }
    if (!KnownKind(kind)) return Bad("unknown record kind " + std::to_string(kind));
    rec.kind = RecordKind(kind);
    ByteSpan data;
    if (!br.GetSpan(data_len, &data)) return Bad("record data runs past the record block");
    Status s = CheckRecord(rec.seq, rec.offset, rec.length, rec.kind, data, expected);
    if (!s.ok()) return Bad(s.message());
    expected = rec.seq + 1;
    if (expected == 0) return Bad("record sequence overflows");
    rec.data.assign(data.begin(), data.end());
    wb.records.push_back(std::move(rec));
  }
  if (!br.empty()) return Bad("trailing bytes after the last record");
  return Message(std::move(wb));
}

// ---- failback pieces ----

bool KnownFailbackStatus(uint8_t s) { return s <= uint8_t(FailbackStatus::kFailed); }

void PutExtents(Bytes& b, std::span<const BlockExtent> extents) {
  PutFixed32(b, uint32_t(extents.size()));
  for (const BlockExtent& e : extents) {
    PutFixed64(b, e.first_block);
    PutFixed32(b, e.count);
  }
}

// Reads a count and that many extents (sorted, disjoint, non-empty);
// checks the count against the bytes left before allocating.
bool GetExtents(ByteReader& r, uint32_t max, std::vector<BlockExtent>* out) {
  uint32_t n = 0;
  if (!r.GetFixed32(&n) || n > max || uint64_t(n) * 12 > r.remaining()) return false;
  out->resize(n);
  for (BlockExtent& e : *out) {
    if (!r.GetFixed64(&e.first_block) || !r.GetFixed32(&e.count)) return false;
  }
  return ExtentBlocks(*out).has_value();
}

void PutDigest(Bytes& b, const Hash128& h) {
  // A zero digest is one flag byte; any other is flag 0 and 16 bytes.
  if (h == Hash128{}) {
    b.push_back(1);
    return;
  }
  b.push_back(0);
  PutFixed64(b, h.low);
  PutFixed64(b, h.high);
}

bool GetDigest(ByteReader& r, Hash128* h) {
  uint8_t flag = 0;
  if (!r.GetU8(&flag) || flag > 1) return false;
  if (flag == 1) {
    *h = Hash128{};
    return true;
  }
  return r.GetFixed64(&h->low) && r.GetFixed64(&h->high) && !(*h == Hash128{});
}


}  // namespace codec

using namespace codec;

std::vector<BlockExtent> MergeExtents(std::vector<BlockExtent> v) {
  std::sort(v.begin(), v.end(), [](const BlockExtent& a, const BlockExtent& b) {
    return a.first_block < b.first_block;
  });
  std::vector<BlockExtent> out;
  for (const BlockExtent& e : v) {
    if (e.count == 0) continue;
    const uint64_t end = e.first_block + e.count;
    if (!out.empty() && e.first_block <= out.back().first_block + out.back().count) {
      BlockExtent& b = out.back();
      const uint64_t new_end = std::max(b.first_block + b.count, end);
      if (new_end - b.first_block <= UINT32_MAX) {
        b.count = uint32_t(new_end - b.first_block);
        continue;
      }
      // Too long for one extent: start the next where this one ends.
      const uint64_t b_end = b.first_block + b.count;
      out.push_back(BlockExtent{b_end, uint32_t(new_end - b_end)});
      continue;
    }
    out.push_back(e);
  }
  return out;
}

std::optional<uint64_t> ExtentBlocks(std::span<const BlockExtent> extents) {
  uint64_t total = 0, end = 0;
  for (size_t i = 0; i < extents.size(); ++i) {
    const BlockExtent& e = extents[i];
    if (e.count == 0 || e.first_block > std::numeric_limits<uint64_t>::max() - e.count) return std::nullopt;
    if (i > 0 && e.first_block < end) return std::nullopt;
    end = e.first_block + e.count;
    total += e.count;  // <= 2^32 * extents.size(): no overflow for any vector that fits in memory
  }
  return total;
}

Bytes EncodeAnomaly(uint64_t back, std::string_view message) {
  message = message.substr(0, kMaxAnomalyText);
  Bytes out(8 + message.size());
  EncodeFixed64(out.data(), back);
  std::copy(message.begin(), message.end(), out.begin() + 8);
  return out;
}

bool DecodeAnomaly(ByteSpan data, uint64_t* back, std::string* message) {
  if (data.size() < 8 || data.size() > 8 + kMaxAnomalyText) return false;
  *back = DecodeFixed64(data.data());
  if (*back == 0) return false;
  message->assign(reinterpret_cast<const char*>(data.data()) + 8, data.size() - 8);
  return true;
}

bool IsWriteKind(RecordKind k) {
  return k == RecordKind::kData || k == RecordKind::kZero || k == RecordKind::kTrim || k == RecordKind::kSealed ||
         k == RecordKind::kSealedZero;
}

bool IsZeroKind(RecordKind k) {
  return k == RecordKind::kZero || k == RecordKind::kTrim || k == RecordKind::kSealedZero;
}

uint64_t BatchWork(std::span<const Record> records) {
  uint64_t work = 0;
  for (const Record& r : records) {
    if (!IsWriteKind(r.kind)) continue;
    work += r.length;
    if (r.kind == RecordKind::kSealed || r.kind == RecordKind::kSealedZero) work += SealMacBytes(r.length);
  }
  return work;
}

void CutToWorkCap(std::vector<Record>* records) {
  uint64_t work = 0;
  for (size_t i = 0; i < records->size(); ++i) {
    work += BatchWork(std::span<const Record>(&(*records)[i], 1));
    if (i > 0 && work > kMaxBatchWork) {
      records->resize(i);
      return;
    }
  }
}

}  // namespace cdp::proto

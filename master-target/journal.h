// SPDX-License-Identifier: Apache-2.0
// The undo journal of one replica volume: a segment log (common/store/segment_log.h)
// holding, for every byte range a captured write overwrote, the bytes it held
// before (an "undo record"). Byte format: docs/formats/journal.md, on top of
// docs/formats/segment-log.md.
//
// A segment file is `<journal dir>/<segment number as 16 hex digits>.jnl`:
//
//   segment header (32 bytes, kind kJournalKind) | record | record | ...
//   record = 8-byte frame (crc, payload_len) | 32-byte undo head | old data
//
// Every record carries a CRC32C over its payload length and payload; a reader
// stops at the first record that is incomplete or whose CRC does not match (a
// torn tail after a power cut) and reports where the valid part ends, so the
// owner can truncate there.
//
// Undo records never hold more than kMaxUndoChunk bytes of old data; a longer
// write is journalled as several records with the same sequence. A range whose
// old bytes were all zero is stored without data (kind kZeroes), so a write to
// a never-written (sparse) area costs only a header in the journal; old bytes
// that zstd shrinks are stored compressed (kind kZstd), the others as they
// are (kind kData).
//
// Thread safety: the pure functions are thread-safe. A SegmentWriter is used by
// one thread at a time (the volume's apply thread); reads of a segment file
// through ReadRecordData may run concurrently with appends to it (they touch
// only bytes already appended).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/base/coding.h"
#include "common/base/result.h"
#include "common/base/status.h"
#include "common/env/env.h"
#include "common/store/segment_log.h"

namespace cdp::mt {

// The segment-log kind of journal segments; the version is the segment log's.
inline constexpr uint16_t kJournalKind = 2;
inline constexpr uint32_t kSegmentMagic = seglog::kMagic;
inline constexpr uint16_t kJournalVersion = seglog::kVersion;
inline constexpr char kSegmentSuffix[] = ".jnl";
inline constexpr size_t kSegmentHeaderSize = seglog::kHeaderSize;
inline constexpr size_t kUndoHeadSize = 32;  // kind, length, seq, offset, time_us
inline constexpr size_t kRecordHeaderSize = seglog::kFrameSize + kUndoHeadSize;
inline constexpr uint32_t kMaxUndoChunk = 1u << 20;  // old-data bytes per record, at most

enum class UndoKind : uint8_t {
  kData = 1,    // `data_len == length` bytes of old data follow
  kZeroes = 2,  // the old bytes were all zero; no data follows (data_len == 0)
  kZstd = 3,    // a zstd frame follows (0 < data_len < length) that decompresses
                // to exactly `length` bytes of old data
};

// One undo record, as decoded (without its data).
struct UndoHeader {
  UndoKind kind = UndoKind::kData;
  uint64_t seq = 0;        // the sequence of the write that overwrote the range
  uint64_t offset = 0;     // byte offset in the volume
  uint32_t length = 0;     // bytes of the volume covered (1..kMaxUndoChunk)
  uint64_t time_us = 0;    // wall-clock micros when the write was applied
  uint32_t data_crc = 0;   // the record's CRC (header + data)
  uint32_t data_len = 0;   // bytes stored after the head (see UndoKind); 0 when not read from disk
};

// Where a record lives: segment number and the file offset of its header.
struct UndoLocation {
  uint64_t segment = 0;
  uint64_t file_offset = 0;
};

struct SegmentHeader {
  uint64_t segment = 0;
  uint64_t first_seq = 0;  // the first sequence this segment was opened for
};

// "<16 hex digits>.jnl"; ParseSegmentName accepts exactly that form.
std::string SegmentFileName(uint64_t segment);
bool ParseSegmentName(const std::string& name, uint64_t* segment);

// Encodes the 32-byte segment header.
Bytes EncodeSegmentHeader(const SegmentHeader& h);
// Decodes it; kCorruption for a bad magic, version or CRC.
Result<SegmentHeader> DecodeSegmentHeader(ByteSpan bytes);

// Appends one encoded record to `out`. `stored` is empty for kZeroes, exactly
// `length` bytes for kData, the zstd frame for kZstd. The record's CRC is
// computed here.
void EncodeUndoRecord(UndoKind kind, uint64_t seq, uint64_t offset, uint32_t length,
                      uint64_t time_us, ByteSpan stored, Bytes* out);

// Appends the record of old bytes `old` (one chunk, 1..kMaxUndoChunk bytes):
// kZeroes when all zero; else, with `zstd_level` > 0, kZstd when the frame
// saves at least an eighth; else kData. Returns the kind written.
UndoKind EncodeOldData(uint64_t seq, uint64_t offset, uint64_t time_us, ByteSpan old, int zstd_level, Bytes* out);

// True if every byte of `data` is zero (common/base/coding.h).
using cdp::AllZero;

// Callback of ScanSegment for each valid record: its header and location.
// Returning a non-ok Status stops the scan and is returned by ScanSegment.
using ScanCallback = std::function<Status(const UndoHeader&, const UndoLocation&)>;

struct ScanResult {
  SegmentHeader header;
  uint64_t valid_end = 0;    // file offset just past the last valid record
  uint64_t file_size = 0;
  bool torn_tail = false;    // bytes after valid_end are incomplete or corrupt
};

// Reads a segment (its header first, then the records from file offset
// `start`, which must be a record boundary; 0 = the first record), calling `cb`
// for each valid record whose header lies before `limit` (UINT64_MAX: all). With `verify_data` the record
// data is read and its CRC checked (a mismatch ends the scan as a torn tail);
// without it only header fields are checked (lengths in range), which is what
// start-up does for records already committed. kCorruption if the segment
// header itself is bad.
Result<ScanResult> ScanSegment(const File& file, uint64_t segment, uint64_t start, bool verify_data,
                               uint64_t limit, const ScanCallback& cb);

// Reads the old data of the record at `loc` (whose header is `h`) into `buf`
// (h.length bytes; zeros for kZeroes; decompressed for kZstd) and checks the
// CRC. kCorruption when it does not match, or a frame does not decompress to
// exactly h.length bytes.
Status ReadUndoData(const File& file, const UndoHeader& h, const UndoLocation& loc, uint8_t* buf);

// Reads the old data of the record at `loc`, a sub-range [skip, skip+n) of it,
// without checking the CRC of the whole record (used for point-in-time reads of
// a small part of a large record; the whole record was checked when scanned or
// written). kZeroes records yield zeros; a kZstd record is read whole, checked
// and decompressed (ReadUndoData), then the slice copied.
Status ReadUndoSlice(const File& file, const UndoHeader& h, const UndoLocation& loc,
                     uint32_t skip, uint32_t n, uint8_t* buf);

// Appends to the current segment of a journal directory, opening new segments
// when the current one passes `segment_bytes`. Durability is explicit: Sync()
// syncs every segment written since the last Sync() and the directory if a
// segment was created.
class SegmentWriter {
 public:
  // Opens `segment` in `dir` for appending. If `create`, the file is created
  // (it must not exist) with a header naming `first_seq`; otherwise it is
  // opened and truncated to `end` (the committed or valid end).
  static Result<std::unique_ptr<SegmentWriter>> Open(Env* env, std::string dir, uint64_t segment,
                                                     bool create, uint64_t first_seq, uint64_t end,
                                                     uint64_t segment_bytes);

  // Appends encoded records (whole records only). If the current segment
  // already holds >= segment_bytes, a new segment is started first with
  // `next_seq` as its first sequence. Returns the location of the first byte
  // appended (so the caller can compute each record's location).
  Result<UndoLocation> Append(ByteSpan records, uint64_t next_seq);
  // Makes everything appended durable (file syncs, and the directory sync for
  // new segments).
  Status Sync();

  uint64_t segment() const { return segment_; }
  uint64_t end() const { return log_->end(); }  // append position in the current segment
  // The open file of the current segment (for reads of fresh records).
  File* current_file() const { return log_->file().get(); }
  // A shared handle of the current segment's file for readers.
  std::shared_ptr<File> shared_file() const { return log_->file(); }

  // Called when a new segment was started: (segment number, its file).
  std::function<void(uint64_t, std::shared_ptr<File>)> on_new_segment;

 private:
  SegmentWriter(Env* env, std::string dir, uint64_t segment_bytes)
      : env_(env), dir_(std::move(dir)), segment_bytes_(segment_bytes) {}
  Status StartSegment(uint64_t segment, uint64_t first_seq);

  Env* env_;
  std::string dir_;
  uint64_t segment_bytes_;
  uint64_t segment_ = 0;
  std::unique_ptr<seglog::Writer> log_;
  std::vector<std::shared_ptr<File>> unsynced_;  // files appended since the last Sync
  bool dir_dirty_ = false;
};

}  // namespace cdp::mt

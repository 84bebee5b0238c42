// SPDX-License-Identifier: Apache-2.0
// Segment log: the on-disk mechanism shared by the process server's spool and
// the master target's undo journal (leveldb's log::Writer / log::Reader idea).
// Byte layout and version note: docs/formats/segment-log.md.
//
// A log is a directory of segment files "<16 lower-case hex digits><suffix>"
// (the number is chosen by the user: a segment counter, or the first sequence).
// Each segment is a 32-byte header (magic, version, the user's kind, number,
// first_seq, CRC) followed by records:
//
//   record = crc u32 | payload_len u32 | payload (payload_len bytes)
//   crc    = CRC32C of payload_len and the payload (common/base/crc32c.h)
//
// What a payload holds is the user's business (its own fixed "head" followed by
// data). The log knows nothing of sequences, kinds or retention.
//
// Durability follows common/env/env.h: appended bytes are durable after Sync(); a
// created segment's name is durable after SyncDir() of its directory (the
// Writer does neither on its own except where a method says so).
//
// Thread safety: the pure functions are thread-safe. A Writer is used by one
// thread at a time; readers may read bytes already appended through its file()
// concurrently. Scan() reads a File and keeps no state.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/base/coding.h"
#include "common/base/result.h"
#include "common/base/status.h"
#include "common/env/env.h"

namespace cdp::seglog {

inline constexpr uint32_t kMagic = 0x4C504443;  // "CDPL" little-endian
inline constexpr uint16_t kVersion = 1;
inline constexpr size_t kHeaderSize = 32;        // segment header
inline constexpr size_t kFrameSize = 8;          // crc + payload_len before each payload

// "<16 lower-case hex digits><suffix>"; ParseFileName accepts exactly that form.
std::string FileName(uint64_t number, std::string_view suffix);
bool ParseFileName(std::string_view name, std::string_view suffix, uint64_t* number);

struct Header {
  uint16_t kind = 0;       // the user's constant (spool, journal)
  uint64_t number = 0;     // the number in the file name
  uint64_t first_seq = 0;  // the user's first sequence for this segment
};
Bytes EncodeHeader(const Header& h);
// kCorruption for a short buffer, bad magic, version, CRC or another kind.
Result<Header> DecodeHeader(ByteSpan bytes, uint16_t kind);

// Appends one framed record whose payload is `head` followed by `data`.
void AppendRecord(ByteSpan head, ByteSpan data, Bytes* out);
// True when the CRC in `frame` (kFrameSize + some of the payload) matches it
// followed by `rest` (the remainder of the payload).
bool CheckRecord(ByteSpan frame, ByteSpan rest);

enum class Decode { kOk, kTruncated, kBad };
// Decodes the record at the start of `in` (a buffer already in memory): kOk when
// complete, payload_len <= max_payload and the CRC matches; *payload views the
// payload inside `in`, *size is the whole record's size.
Decode DecodeRecord(ByteSpan in, uint32_t max_payload, ByteSpan* payload, size_t* size);

// Appends to one segment file. Owns a shared handle of it.
class Writer {
 public:
  // Creates `path` with a header for `h` (with `exclusive` the file must not
  // exist, else it is truncated). Nothing is synced.
  static Result<std::unique_ptr<Writer>> Create(Env* env, const std::string& path, const Header& h,
                                                bool exclusive);
  // Appends to an existing segment, already open as `file`, at `end`
  // (truncating and syncing the file when it is longer).
  static Result<std::unique_ptr<Writer>> Reopen(std::shared_ptr<File> file, uint64_t end);

  // Appends whole encoded records; returns the file offset of the first byte.
  // On failure the file may hold part of them: Truncate(old end) or discard.
  Result<uint64_t> Append(ByteSpan records);
  Status Sync() { return file_->Sync(); }
  // Cuts the file back to `end` (a record boundary at or after the header).
  Status Truncate(uint64_t end);

  uint64_t end() const { return end_; }
  const std::shared_ptr<File>& file() const { return file_; }

 private:
  Writer(std::shared_ptr<File> f, uint64_t end) : file_(std::move(f)), end_(end) {}
  std::shared_ptr<File> file_;
  uint64_t end_;
};

// A record as the scanner found it.
struct RecordView {
  uint64_t offset = 0;       // file offset of the record (its crc field)
  uint32_t crc = 0;
  uint32_t payload_len = 0;
  ByteSpan head;             // the first ScanOptions::head_size payload bytes
  ByteSpan payload;          // the whole payload when verifying, else empty
};

struct ScanOptions {
  uint64_t start = 0;                  // a record boundary; 0 = the first record
  uint64_t limit = UINT64_MAX;         // no record at or past this offset is read
  uint32_t max_payload = 0;            // a longer payload_len is a bad record
  size_t head_size = 0;                // payloads are at least this long
  bool verify = true;                  // read the whole payload and check the CRC
  std::optional<uint64_t> number;      // when set, the header must name it
  // A check of a record's own fields (no state): false makes it a bad record.
  std::function<bool(const RecordView&)> valid;
};

struct ScanResult {
  Header header;
  uint64_t file_size = 0;
  uint64_t valid_end = 0;   // just past the last accepted record
  uint64_t records = 0;     // accepted records
  bool torn_tail = false;   // bytes after valid_end (before limit) were not accepted
  // The first bad record is followed by a good one: damage to bytes that were
  // synced, not a torn tail (which only ever loses the end).
  bool corrupt = false;
};

// Called for every valid record in order. true accepts it; false rejects it
// (the scan ends there as at a bad record: say, a sequence out of order); an
// error ends the scan and is returned by Scan.
using RecordFn = std::function<Result<bool>(const RecordView&)>;

// Reads a segment: its header (kCorruption when bad, short or of another
// kind or number), then records from options.start. Never returns records past
// the first bad one.
Result<ScanResult> Scan(const File& file, uint16_t kind, const ScanOptions& options, const RecordFn& fn);

}  // namespace cdp::seglog

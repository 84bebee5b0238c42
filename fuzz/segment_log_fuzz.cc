// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the segment log reader (common/store/segment_log.h), the
// mechanism under the spool and the undo journal.
//
// Input: byte 0 picks the scan options (verify or not, head size, payload cap,
// whether the header must name the segment number, a start offset); the rest
// is a segment file's contents, put in an in-memory Env (common/env/env.h) and
// read with Scan as a recovering owner does. The same bytes also go through
// DecodeRecord as an in-memory buffer.
//
// Properties: Scan never reads out of range; records it accepts lie inside
// valid_end <= file_size in order, with payloads that DecodeRecord accepts at
// the same offsets when verified; after Writer::Reopen at valid_end and one
// appended record, a rescan finds exactly one more record and no torn tail.
#include <cstddef>
#include <cstdint>

#include "common/env/env.h"
#include "common/store/segment_log.h"
#include "fuzz/fuzz_util.h"

namespace {

using namespace cdp;
using cdp::fuzz::Check;

constexpr uint16_t kKind = 7;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t sel = data[0];
  ByteSpan contents(data + 1, size - 1);

  // As an in-memory buffer of records.
  {
    ByteSpan rest = contents;
    while (!rest.empty()) {
      ByteSpan payload;
      size_t used = 0;
      if (seglog::DecodeRecord(rest, 1u << 16, &payload, &used) != seglog::Decode::kOk) break;
      Check(used == seglog::kFrameSize + payload.size() && used <= rest.size());
      rest = rest.subspan(used);
    }
  }

  std::unique_ptr<Env> env = NewMemEnv();
  const std::string path = "/log/" + seglog::FileName(1, ".seg");
  Check(env->CreateDirs("/log").ok());
  {
    OpenOptions o;
    o.create = true;
    auto f = env->Open(path, o);
    Check(f.ok() && (*f)->Append(contents).ok());
  }
  OpenOptions rw;
  auto opened = env->Open(path, rw);
  Check(opened.ok());
  std::shared_ptr<File> file(std::move(*opened));

  seglog::ScanOptions so;
  so.verify = (sel & 1) != 0;
  so.head_size = (sel & 2) ? 32 : 0;
  so.max_payload = (sel & 4) ? (1u << 20) : 256;
  if (sel & 8) so.number = 1;
  so.start = (sel & 16) ? seglog::kHeaderSize + (sel >> 5) : 0;
  if (sel & 32) so.valid = [](const seglog::RecordView& v) { return v.head.empty() || v.head[0] != 0xff; };

  uint64_t seen = 0;
  uint64_t last_end = 0;
  Bytes whole(contents.begin(), contents.end());
  auto scan = seglog::Scan(*file, kKind, so, [&](const seglog::RecordView& v) -> Result<bool> {
    Check(v.offset >= last_end && v.offset + seglog::kFrameSize + v.payload_len <= whole.size());
    Check(v.payload_len >= so.head_size && v.payload_len <= so.max_payload && v.head.size() == so.head_size);
    if (so.verify) {
      ByteSpan payload;
      size_t used = 0;
      Check(seglog::DecodeRecord(ByteSpan(whole).subspan(v.offset), so.max_payload, &payload, &used) ==
            seglog::Decode::kOk);
      Check(payload.size() == v.payload_len && v.payload.size() == v.payload_len);
    }
    last_end = v.offset + seglog::kFrameSize + v.payload_len;
    ++seen;
    return true;
  });
  if (!scan.ok()) return 0;
  Check(scan->records == seen);
  Check(scan->file_size == whole.size() && scan->valid_end >= seglog::kHeaderSize);
  if (so.start > scan->file_size) return 0;  // nothing to read from there
  Check(scan->valid_end <= scan->file_size);
  Check(scan->torn_tail == (scan->valid_end < scan->file_size));

  // Recover: cut the tail and append, as the spool and journal owners do.
  if (so.start > seglog::kHeaderSize) return 0;  // start may not be a record boundary
  auto w = seglog::Writer::Reopen(file, scan->valid_end);
  Check(w.ok());
  Bytes rec;
  Bytes head(so.head_size, 0x11);
  seglog::AppendRecord(head, ByteSpan(reinterpret_cast<const uint8_t*>("after"), 5), &rec);
  Check((*w)->Append(rec).ok());
  so.valid = nullptr;
  auto again = seglog::Scan(*file, kKind, so, nullptr);
  Check(again.ok() && again->records == scan->records + 1 && !again->torn_tail &&
        again->valid_end == scan->valid_end + rec.size());
  return 0;
}

// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the undo journal's readers (master-target/journal.h):
// what the master target reads from a replica's journal directory at start-up.
//
// Input: up to four segment files separated by fuzz::kFileSeparator, put in an
// in-memory Env (common/env/env.h) under the names of the segment numbers in their
// headers. Then, as ReplicaVolume's recovery does: list the directory, parse
// the names, scan each segment with and without data verification (the second
// up to a limit, as the committed offset bounds it), read every record's old
// data and a slice of it, and reopen the last segment for appending at its
// valid end and append one record.
//
// Properties: no crash or out-of-range read; records come in file order inside
// valid_end <= file_size; a record the verifying scan accepted reads back with
// a matching CRC, except a zstd record whose frame does not decompress to its
// length, which every read reports as corruption; after the append a rescan
// finds one more record, untorn.
#include <cstddef>
#include <cstdint>
#include <limits>

#include "common/env/env.h"
#include "fuzz/fuzz_util.h"
#include "master-target/journal.h"

namespace {

using namespace cdp;
using namespace cdp::mt;
using cdp::fuzz::Check;

constexpr char kDir[] = "/replica/journal";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t sel = data[0];
  std::unique_ptr<Env> env = NewMemEnv();
  Check(env->CreateDirs(kDir).ok());
  std::vector<ByteSpan> files = fuzz::SplitFiles(ByteSpan(data + 1, size - 1), 4);
  for (size_t i = 0; i < files.size(); ++i) {
    uint64_t number = files[i].size() >= 16 ? DecodeFixed64(files[i].data() + 8) : i + 1;
    OpenOptions o;
    o.create = true;
    o.truncate = true;
    auto f = env->Open(JoinPath(kDir, SegmentFileName(number)), o);
    Check(f.ok() && (*f)->Append(files[i]).ok());
  }

  auto names = env->ListDir(kDir);
  Check(names.ok());
  uint64_t last_seg = 0;
  uint64_t last_end = 0;
  uint64_t last_records = 0;
  bool have_last = false;
  Bytes buf;
  for (const std::string& n : *names) {
    uint64_t seg = 0;
    if (!ParseSegmentName(n, &seg)) continue;
    OpenOptions ro;
    ro.read_only = true;
    auto f = env->Open(JoinPath(kDir, n), ro);
    Check(f.ok());
    const File& file = **f;

    std::vector<std::pair<UndoHeader, UndoLocation>> recs;
    uint64_t prev_end = 0;
    auto scan = ScanSegment(file, seg, 0, true, std::numeric_limits<uint64_t>::max(),
                            [&](const UndoHeader& h, const UndoLocation& loc) {
                              Check(loc.segment == seg && loc.file_offset >= prev_end);
                              prev_end = loc.file_offset + kRecordHeaderSize +
                                         (h.kind == UndoKind::kData ? h.length : 0);
                              recs.emplace_back(h, loc);
                              return Status::OK();
                            });
    if (!scan.ok()) continue;  // a bad header: recovery skips or refuses the segment
    Check(scan->header.segment == seg);
    Check(scan->valid_end <= scan->file_size && prev_end <= scan->valid_end);
    for (const auto& [h, loc] : recs) {
      Check(h.length >= 1 && h.length <= kMaxUndoChunk);
      buf.resize(h.length);
      // The scan checks CRCs, not what a zstd frame decompresses to: a zstd
      // record whose CRC holds but whose frame is not one of exactly its
      // length (a writer's bug, or a file made to look right) is reported as
      // corruption when read, by the whole read and by every slice alike.
      const Status whole = ReadUndoData(file, h, loc, buf.data());
      Check(whole.ok() || (h.kind == UndoKind::kZstd && whole.IsCorruption()));
      const uint32_t skip = sel % h.length;
      const uint32_t n2 = std::min<uint32_t>(h.length - skip, 1 + sel);
      const Status slice = ReadUndoSlice(file, h, loc, skip, n2, buf.data());
      Check(slice.ok() == whole.ok() && (slice.ok() || slice.IsCorruption()));
      Check(!ReadUndoSlice(file, h, loc, h.length, 1, buf.data()).ok());
    }

    // Start-up's index rebuild: headers only, up to the committed offset.
    const uint64_t limit = (sel & 1) ? scan->valid_end : kSegmentHeaderSize + uint64_t(sel) * 8;
    uint64_t unverified = 0;
    auto quick = ScanSegment(file, seg, 0, false, limit, [&](const UndoHeader& h, const UndoLocation& loc) {
      Check(loc.file_offset < limit);
      ++unverified;
      return Status::OK();
    });
    Check(quick.ok());
    if (limit == scan->valid_end) Check(unverified >= recs.size());

    have_last = true;
    last_seg = seg;
    last_end = scan->valid_end;
    last_records = recs.size();
  }

  // Reopen the newest segment at its valid end and append, as after recovery.
  if (!have_last) return 0;
  auto w = SegmentWriter::Open(env.get(), kDir, last_seg, false, 0, last_end, 1u << 20);
  Check(w.ok());
  Bytes rec;
  const Bytes old(16, 0x42);
  EncodeUndoRecord(UndoKind::kData, 99, 4096, 16, 1, old, &rec);
  auto at = (*w)->Append(rec, 100);
  Check(at.ok() && (*w)->Sync().ok());
  auto f = env->Open(JoinPath(kDir, SegmentFileName(last_seg)), {});
  Check(f.ok());
  uint64_t count = 0;
  auto again = ScanSegment(**f, last_seg, 0, true, std::numeric_limits<uint64_t>::max(),
                           [&](const UndoHeader&, const UndoLocation&) {
                             ++count;
                             return Status::OK();
                           });
  Check(again.ok() && !again->torn_tail && count == last_records + 1);
  return 0;
}

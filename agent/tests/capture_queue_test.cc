// SPDX-License-Identifier: Apache-2.0
#include "agent/capture_queue.h"

#include <catch2/catch.hpp>

using cdp::agent::CaptureMode;
using cdp::agent::CaptureQueue;
using cdp::agent::QueuedRecord;
using cdp::proto::RecordKind;

namespace {
cdp::Bytes Pattern(size_t n, uint8_t seed) {
  cdp::Bytes b(n);
  for (size_t i = 0; i < n; ++i) b[i] = uint8_t(seed + i * 7);
  return b;
}
}  // namespace

TEST_CASE("data mode keeps data with contiguous sequences", "[queue]") {
  cdp::ManualClock clock;
  CaptureQueue q({"v", 4u << 20, &clock});
  auto a = Pattern(4096, 1), b = Pattern(512, 2);
  {
    auto lk = q.Lock();
    REQUIRE(q.AppendLocked(RecordKind::kData, 0, 4096, a) == 1);
    REQUIRE(q.AppendLocked(RecordKind::kZero, 8192, 65536, {}) == 2);
    REQUIRE(q.AppendFlushLocked(true) == 3);
    REQUIRE(q.AppendLocked(RecordKind::kData, 100, 512, b) == 4);
    REQUIRE(q.AppendTagLocked("t1") == 5);
  }
  std::vector<QueuedRecord> out;
  REQUIRE(q.Peek(2, 1 << 20, 100, &out));
  REQUIRE(out.size() == 4);
  REQUIRE(out[0].seq == 2);
  REQUIRE(out[0].kind == RecordKind::kZero);
  REQUIRE(out[1].kind == RecordKind::kFlush);
  REQUIRE(out[2].has_data);
  REQUIRE(*out[2].data == b);
  REQUIRE(std::string(out[3].data->begin(), out[3].data->end()) == "t1");
  REQUIRE(out[3].length == 0);
  REQUIRE(q.Ack(3) == 3);
  REQUIRE(q.Stats().records == 2);
  REQUIRE(q.Stats().memory_bytes == 2 * CaptureQueue::kEntryOverhead + 512 + 2);
  REQUIRE(!q.Peek(6, 1 << 20, 100, &out));
}

TEST_CASE("modes degrade within the budget and return to data once drained", "[queue]") {
  cdp::ManualClock clock;
  const uint64_t budget = 1u << 20;
  CaptureQueue q({"v", budget, &clock});
  auto data = Pattern(64 * 1024, 3);
  uint64_t last_seq = 0;
  int meta = 0, bitmap = 0;
  for (int i = 0; i < 20000; ++i) {
    auto lk = q.Lock();
    uint64_t s = q.AppendLocked(RecordKind::kData, uint64_t(i) * 4096, uint32_t(data.size()), data);
    if (s != 0) {
      REQUIRE(s == last_seq + 1);
      last_seq = s;
    }
    if (q.ModeLocked() == CaptureMode::kMetadata) ++meta;
    if (q.ModeLocked() == CaptureMode::kBitmap) ++bitmap;
  }
  auto st = q.Stats();
  REQUIRE(meta > 0);
  REQUIRE(bitmap > 0);
  REQUIRE(st.peak_memory_bytes <= budget);
  REQUIRE(st.to_metadata == 1);
  REQUIRE(st.to_bitmap == 1);
  REQUIRE(st.bitmap_mode_ops == uint64_t(20000) - last_seq);
  {
    auto lk = q.Lock();
    REQUIRE(q.AppendFlushLocked(true) == 0);
  }
  REQUIRE(q.Stats().flushes_suppressed == 1);
  // Records taken in metadata mode carry no data.
  std::vector<QueuedRecord> out;
  REQUIRE(q.Peek(last_seq, 1 << 20, 10, &out));
  REQUIRE(!out[0].has_data);
  REQUIRE(out[0].length == data.size());
  q.Ack(last_seq - 1);
  REQUIRE(q.mode() == CaptureMode::kBitmap);
  q.Ack(last_seq);
  REQUIRE(q.mode() == CaptureMode::kData);
  REQUIRE(q.Stats().to_data == 1);
  REQUIRE(q.Stats().memory_bytes == 0);
}

TEST_CASE("resume inside the window acks, outside it renumbers", "[queue]") {
  cdp::ManualClock clock;
  CaptureQueue q({"v", 4u << 20, &clock});
  auto d = Pattern(100, 4);
  for (int i = 0; i < 5; ++i) {
    auto lk = q.Lock();
    (void)q.AppendLocked(RecordKind::kData, 0, 100, d);
  }
  REQUIRE(q.Resume(2));
  REQUIRE(q.Stats().records == 3);
  REQUIRE(!q.Resume(41));  // the server's numbering wins
  std::vector<QueuedRecord> out;
  REQUIRE(q.Peek(0, 1 << 20, 100, &out));
  REQUIRE(out.front().seq == 42);
  REQUIRE(out.back().seq == 44);
  REQUIRE(q.next_seq() == 45);
  REQUIRE(q.acked_seq() == 41);
}

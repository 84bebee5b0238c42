// SPDX-License-Identifier: Apache-2.0
#include "process-server/spool.h"
#include "process-server/spooled_volume.h"

#include <catch2/catch.hpp>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "common/env/env_wrapper.h"
#include "common/env/fault_env.h"
#include "common/tests/gated_env.h"

using cdp::Bytes;
using cdp::ByteSpan;
using cdp::proto::Record;
using cdp::proto::RecordKind;

namespace {

Record DataRecord(uint64_t seq, uint32_t len, uint8_t fill) {
  Record r;
  r.seq = seq;
  r.offset = seq * 4096;
  r.length = len;
  r.kind = RecordKind::kData;
  r.timestamp_us = 1000 + seq;
  r.data.resize(len);
  for (uint32_t i = 0; i < len; ++i) r.data[i] = uint8_t(fill + i * 7 + seq);
  return r;
}

std::vector<Record> Batch(uint64_t first, size_t n, uint32_t len = 512) {
  std::vector<Record> v;
  for (size_t i = 0; i < n; ++i) v.push_back(DataRecord(first + i, len, uint8_t(first)));
  return v;
}

bool SameRecord(const Record& a, const Record& b) {
  return a.seq == b.seq && a.offset == b.offset && a.length == b.length && a.kind == b.kind &&
         a.timestamp_us == b.timestamp_us && a.data == b.data;
}

cdp::ps::SpoolOptions Opts(cdp::Env* env, cdp::Clock* clock) {
  cdp::ps::SpoolOptions o;
  o.env = env;
  o.clock = clock;
  o.dir = "/spool/t1/vol1";
  o.segment_bytes = 8192;
  return o;
}

std::vector<Record> ReadAll(cdp::ps::Spool& s, uint64_t from = 1) {
  std::vector<Record> all;
  for (;;) {
    auto r = s.Read(from, 1 << 20);
    REQUIRE(r.ok());
    if (r->empty()) break;
    from = r->back().seq + 1;
    for (auto& x : *r) all.push_back(std::move(x));
  }
  return all;
}

// The last segment file of the test spool.
std::string LastSegment(cdp::Env* env) {
  auto names = env->ListDir("/spool/t1/vol1");
  REQUIRE(names.ok());
  REQUIRE(!names->empty());
  return "/spool/t1/vol1/" + names->back();
}

}  // namespace

TEST_CASE("spool appends, reads back byte-equal, skips duplicates, nacks gaps", "[spool]") {
  auto env = cdp::NewMemEnv();
  cdp::ManualClock clock;
  auto sp = cdp::ps::Spool::Open(Opts(env.get(), &clock));
  REQUIRE(sp.ok());
  auto& s = **sp;

  auto b1 = Batch(1, 5);
  auto r1 = s.Append(b1);
  REQUIRE(r1.status.ok());
  CHECK(r1.durable_seq == 5);
  CHECK(r1.appended == 5);

  // 3..7: 3,4,5 are duplicates, 6,7 new.
  auto b2 = Batch(3, 5);
  auto r2 = s.Append(b2);
  REQUIRE(r2.status.ok());
  CHECK(r2.durable_seq == 7);
  CHECK(r2.appended == 2);

  auto r3 = s.Append(Batch(10, 2));
  CHECK(r3.status.code() == cdp::Code::kOutOfRange);
  CHECK(r3.expected_seq == 8);
  CHECK(s.durable_seq() == 7);

  auto all = ReadAll(s);
  REQUIRE(all.size() == 7);
  for (size_t i = 0; i < 5; ++i) CHECK(SameRecord(all[i], b1[i]));
  CHECK(SameRecord(all[5], b2[3]));
  CHECK(SameRecord(all[6], b2[4]));
}

TEST_CASE("spool stores all-zero data as a zero record and keeps tags", "[spool]") {
  auto env = cdp::NewMemEnv();
  cdp::ManualClock clock;
  auto sp = cdp::ps::Spool::Open(Opts(env.get(), &clock));
  REQUIRE(sp.ok());
  std::vector<Record> b;
  Record z = DataRecord(1, 4096, 0);
  std::fill(z.data.begin(), z.data.end(), 0);
  b.push_back(z);
  Record t;
  t.seq = 2;
  t.kind = RecordKind::kTag;
  t.data = {'n', 'i', 'g', 'h', 't'};
  b.push_back(t);
  Record f;
  f.seq = 3;
  f.kind = RecordKind::kFlush;
  b.push_back(f);
  REQUIRE((*sp)->Append(b).status.ok());
  auto all = ReadAll(**sp);
  REQUIRE(all.size() == 3);
  CHECK(all[0].kind == RecordKind::kZero);
  CHECK(all[0].length == 4096);
  CHECK(all[0].offset == z.offset);
  CHECK(all[0].data.empty());
  CHECK(SameRecord(all[1], t));
  CHECK(SameRecord(all[2], f));
}

TEST_CASE("spool keeps sealed records byte for byte, all-zero blocks included, across a reopen", "[spool][sealed]") {
  auto env = cdp::NewMemEnv();
  cdp::ManualClock clock;
  std::vector<Record> b;
  Record s;
  s.seq = 1;
  s.offset = 8192;
  s.length = 8192;
  s.kind = RecordKind::kSealed;
  s.data.assign(8192 + 32, 0);  // a sealed zero block stays zero: never turned into a zero record
  s.data[8192] = 0x11;
  b.push_back(s);
  Record z;
  z.seq = 2;
  z.offset = 0;
  z.length = 4096;
  z.kind = RecordKind::kSealedZero;
  z.data.assign(16, 0x22);
  b.push_back(z);
  {
    auto sp = cdp::ps::Spool::Open(Opts(env.get(), &clock));
    REQUIRE(sp.ok());
    REQUIRE((*sp)->Append(b).status.ok());
  }
  auto sp = cdp::ps::Spool::Open(Opts(env.get(), &clock));
  REQUIRE(sp.ok());
  auto all = ReadAll(**sp);
  REQUIRE(all.size() == 2);
  CHECK(SameRecord(all[0], s));
  CHECK(SameRecord(all[1], z));
}

TEST_CASE("spool recovers every record across segments after reopen", "[spool]") {
  auto env = cdp::NewMemEnv();
  cdp::ManualClock clock;
  std::vector<Record> sent;
  {
    auto sp = cdp::ps::Spool::Open(Opts(env.get(), &clock));
    REQUIRE(sp.ok());
    for (uint64_t seq = 1; seq <= 60; seq += 4) {
      auto b = Batch(seq, 4, 1000);
      for (auto& r : b) sent.push_back(r);
      REQUIRE((*sp)->Append(b).status.ok());
    }
    CHECK((*sp)->stats().segments > 3);
  }
  cdp::ps::SpoolRecovery rec;
  auto sp = cdp::ps::Spool::Open(Opts(env.get(), &clock), &rec);
  REQUIRE(sp.ok());
  CHECK(rec.records == 60);
  CHECK(rec.truncated_bytes == 0);
  CHECK(rec.corrupt_records == 0);
  CHECK((*sp)->durable_seq() == 60);
  auto all = ReadAll(**sp);
  REQUIRE(all.size() == sent.size());
  for (size_t i = 0; i < all.size(); ++i) CHECK(SameRecord(all[i], sent[i]));
  // And it continues where it stopped.
  REQUIRE((*sp)->Append(Batch(61, 1)).status.ok());
  CHECK((*sp)->durable_seq() == 61);
}

TEST_CASE("spool truncates a torn tail and keeps everything before it", "[spool]") {
  auto env = cdp::NewMemEnv();
  cdp::ManualClock clock;
  {
    auto sp = cdp::ps::Spool::Open(Opts(env.get(), &clock));
    REQUIRE(sp.ok());
    REQUIRE((*sp)->Append(Batch(1, 3)).status.ok());
  }
  // Half of a fourth record, as a crash mid-append leaves it.
  Record r4 = DataRecord(4, 512, 4);
  Bytes enc;
  cdp::ps::EncodeSpoolRecord(r4, &enc);
  std::string seg = LastSegment(env.get());
  uint64_t good_size = *env->FileSize(seg);
  {
    auto f = env->Open(seg, {});
    REQUIRE(f.ok());
    REQUIRE((*f)->Append(ByteSpan(enc).first(enc.size() / 2)).ok());
  }
  cdp::ps::SpoolRecovery rec;
  auto sp = cdp::ps::Spool::Open(Opts(env.get(), &clock), &rec);
  REQUIRE(sp.ok());
  CHECK(rec.records == 3);
  CHECK(rec.truncated_bytes == enc.size() / 2);
  CHECK(rec.corrupt_records == 0);
  CHECK(*env->FileSize(seg) == good_size);
  CHECK((*sp)->durable_seq() == 3);
  REQUIRE((*sp)->Append({r4}).status.ok());
  auto all = ReadAll(**sp);
  REQUIRE(all.size() == 4);
  CHECK(SameRecord(all[3], r4));
}

TEST_CASE("spool keeps its latest group commits in memory and Read takes them from there", "[spool]") {
  auto env = cdp::NewMemEnv();
  cdp::ManualClock clock;
  auto opts = Opts(env.get(), &clock);
  opts.recent_bytes = 64 * 1024;
  auto sp = cdp::ps::Spool::Open(opts);
  REQUIRE(sp.ok());
  std::vector<Record> written;
  for (uint64_t g = 0; g < 10; ++g) {
    auto b = Batch(1 + 4 * g, 4, 4096);
    written.insert(written.end(), b.begin(), b.end());
    REQUIRE((*sp)->Append(b).status.ok());
  }
  // A group is 4 records of kRecordHeaderSize + 4096 bytes: the last 3 fit in 64 KiB.
  constexpr uint64_t kGroup = 4 * (cdp::ps::kRecordHeaderSize + 4096);
  auto r = (*sp)->Read(1, 1 << 20);
  REQUIRE(r.ok());
  REQUIRE(r->size() == 40);
  for (size_t i = 0; i < 40; ++i) CHECK(SameRecord((*r)[i], written[i]));
  CHECK((*sp)->stats().read_bytes == 10 * kGroup);
  CHECK((*sp)->stats().read_file_bytes == 7 * kGroup);
  // Released groups are dropped; the rest still reads from memory.
  REQUIRE((*sp)->Release(36).ok());
  r = (*sp)->Read(37, 1 << 20);
  REQUIRE(r.ok());
  REQUIRE(r->size() == 4);
  for (size_t i = 0; i < 4; ++i) CHECK(SameRecord((*r)[i], written[36 + i]));
  CHECK((*sp)->stats().read_file_bytes == 7 * kGroup);
  // A group larger than recent_bytes is not kept.
  REQUIRE((*sp)->Append(Batch(41, 20, 4096)).status.ok());
  r = (*sp)->Read(41, 1 << 20);
  REQUIRE(r.ok());
  REQUIRE(r->size() == 20);
  CHECK((*sp)->stats().read_file_bytes == 7 * kGroup + 20 * (cdp::ps::kRecordHeaderSize + 4096));
}

TEST_CASE("spool detects a flipped byte and never returns that record", "[spool]") {
  auto env = cdp::NewMemEnv();
  cdp::ManualClock clock;
  std::vector<cdp::Status> reported;
  auto opts = Opts(env.get(), &clock);
  opts.segment_bytes = 1 << 20;
  opts.on_corruption = [&](const cdp::Status& s) { reported.push_back(s); };
  const bool keep = GENERATE(true, false);
  opts.recent_bytes = keep ? cdp::ps::kRecentBytes : 0;
  auto sp = cdp::ps::Spool::Open(opts);
  REQUIRE(sp.ok());
  REQUIRE((*sp)->Append(Batch(1, 4)).status.ok());
  std::string seg = LastSegment(env.get());
  // Flip one data byte of record 2 (segment header + record 1 (40+512) + header 40 + 100).
  uint64_t at = cdp::ps::kSegmentHeaderSize + (40 + 512) + 40 + 100;
  {
    auto f = env->Open(seg, {});
    REQUIRE(f.ok());
    uint8_t b = 0;
    REQUIRE((*f)->Read(at, 1, &b).ok());
    b ^= 0x20;
    REQUIRE((*f)->Write(at, ByteSpan(&b, 1)).ok());
  }
  SECTION("while running: Read stops before it and reports (or, the group kept in memory, returns it as written)") {
    if (keep) {
      auto r = (*sp)->Read(1, 1 << 20);
      REQUIRE(r.ok());
      REQUIRE(r->size() == 4);
      CHECK(SameRecord((*r)[1], Batch(1, 4)[1]));
      CHECK((*sp)->stats().read_file_bytes == 0);
      CHECK((*sp)->stats().read_bytes == 4 * (cdp::ps::kRecordHeaderSize + 512));
      CHECK(reported.empty());
      return;
    }
    auto r = (*sp)->Read(1, 1 << 20);
    REQUIRE(r.ok());
    REQUIRE(r->size() == 1);
    CHECK(r->front().seq == 1);
    auto r2 = (*sp)->Read(2, 1 << 20);
    CHECK(r2.status().code() == cdp::Code::kCorruption);
    CHECK(r2.status().data_loss());
    CHECK(reported.size() == 2);
  }
  SECTION("on reopen: reported as corruption, the good prefix stays") {
    sp->reset();
    cdp::ps::SpoolRecovery rec;
    auto sp2 = cdp::ps::Spool::Open(opts, &rec);
    REQUIRE(sp2.ok());
    CHECK(rec.corrupt_records == 1);
    CHECK(rec.records == 1);
    REQUIRE(reported.size() == 1);
    CHECK(reported[0].data_loss());
    auto all = ReadAll(**sp2);
    REQUIRE(all.size() == 1);
    CHECK(all[0].seq == 1);
  }
}

TEST_CASE("spool crash before the sync never leaves an acknowledged batch behind, after it never loses one",
          "[spool][fault]") {
  cdp::ManualClock clock;
  uint64_t runs = 0;
  for (uint64_t n = 0;; ++n) {
    auto mem = cdp::NewMemEnv();
    cdp::FaultEnv fault(mem.get());
    fault.SetCrashAfterSyncs(n);
    std::vector<Record> acked;
    std::vector<Record> attempted;
    {
      auto sp = cdp::ps::Spool::Open(Opts(&fault, &clock));
      if (sp.ok()) {
        for (uint64_t seq = 1; seq <= 40; seq += 5) {
          auto b = Batch(seq, 5, 700);
          auto copy = b;
          auto r = (*sp)->Append(std::move(b));
          for (auto& x : copy) attempted.push_back(x);
          if (!r.status.ok()) break;
          for (auto& x : copy) acked.push_back(x);
        }
      }
    }
    bool finished = !fault.crashed();
    REQUIRE(fault.DropUnsyncedData().ok());
    fault.ClearErrors();
    cdp::ps::SpoolRecovery rec;
    auto sp = cdp::ps::Spool::Open(Opts(&fault, &clock), &rec);
    REQUIRE(sp.ok());
    CHECK(rec.corrupt_records == 0);
    auto all = ReadAll(**sp);
    // Every acknowledged record is there, byte for byte; anything more is a
    // prefix of what was attempted (never garbage).
    REQUIRE(all.size() >= acked.size());
    REQUIRE(all.size() <= attempted.size());
    for (size_t i = 0; i < all.size(); ++i) REQUIRE(SameRecord(all[i], attempted[i]));
    // The recovered spool accepts the next batch.
    auto next = (*sp)->Append(Batch(all.size() + 1, 1));
    CHECK(next.status.ok());
    ++runs;
    if (finished) {
      CHECK(acked.size() == 40);
      break;
    }
    REQUIRE(n < 500);
  }
  CHECK(runs > 10);
}

TEST_CASE("spool leaves no garbage after a failed write and keeps accepting", "[spool][fault]") {
  auto mem = cdp::NewMemEnv();
  cdp::FaultEnv fault(mem.get());
  cdp::ManualClock clock;
  auto opts = Opts(&fault, &clock);
  opts.segment_bytes = 1 << 20;
  auto sp = cdp::ps::Spool::Open(opts);
  REQUIRE(sp.ok());
  REQUIRE((*sp)->Append(Batch(1, 2)).status.ok());
  fault.InjectError(cdp::FaultEnv::Op::kSync, EIO);
  auto r = (*sp)->Append(Batch(3, 2));
  CHECK(r.status.code() == cdp::Code::kIOError);
  CHECK((*sp)->durable_seq() == 2);
  fault.ClearErrors();
  auto r2 = (*sp)->Append(Batch(3, 2));
  REQUIRE(r2.status.ok());
  sp->reset();
  cdp::ps::SpoolRecovery rec;
  auto sp2 = cdp::ps::Spool::Open(opts, &rec);
  REQUIRE(sp2.ok());
  CHECK(rec.truncated_bytes == 0);
  CHECK(ReadAll(**sp2).size() == 4);
}


TEST_CASE("spool group commit: one sync covers every batch waiting for it", "[spool]") {
  auto mem = cdp::NewMemEnv();
  cdp::testing::GatedEnv env(mem.get());
  cdp::ManualClock clock;
  auto opts = Opts(&env, &clock);
  opts.segment_bytes = 1 << 20;
  auto sp = cdp::ps::Spool::Open(opts);
  REQUIRE(sp.ok());
  auto& s = **sp;
  REQUIRE(s.Append(Batch(1, 1)).status.ok());  // creates the segment
  uint64_t syncs0 = s.stats().syncs;

  env.Close();
  std::thread leader([&] { CHECK(s.Append(Batch(2, 1)).status.ok()); });
  REQUIRE(env.WaitUntilSyncBlocked(std::chrono::seconds(10)));
  // Four more batches queue behind the leader's sync.
  std::vector<std::thread> followers;
  std::atomic<int> ok{0};
  for (int i = 0; i < 4; ++i) {
    followers.emplace_back([&, i] {
      // Each thread sends its own seq; order is whatever the queue makes it,
      // so send the whole contiguous tail and let duplicates be skipped.
      auto r = s.Append(Batch(3, uint64_t(4)));
      if (r.status.ok() && r.durable_seq >= 6) ok++;
      (void)i;
    });
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (s.stats().queued_writers < 5 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
  REQUIRE(s.stats().queued_writers == 5);
  env.Open();
  leader.join();
  for (auto& t : followers) t.join();
  CHECK(ok == 4);
  CHECK(s.durable_seq() == 6);
  // The leader's sync, then one sync for all four followers.
  CHECK(s.stats().syncs - syncs0 == 2);
}

TEST_CASE("spool quota: busy past the quota, accepting again once drained", "[spool][quota]") {
  auto env = cdp::NewMemEnv();
  cdp::ManualClock clock;
  auto opts = Opts(env.get(), &clock);
  opts.quota_bytes = 10 * (cdp::ps::kRecordHeaderSize + 1000);  // ten records
  opts.resume_fraction = 0.5;
  auto sp = cdp::ps::Spool::Open(opts);
  REQUIRE(sp.ok());
  auto& s = **sp;
  uint64_t seq = 1;
  for (; seq <= 10; ++seq) REQUIRE(s.Append(Batch(seq, 1, 1000)).status.ok());
  auto r = s.Append(Batch(seq, 1, 1000));
  CHECK(r.status.code() == cdp::Code::kBusy);
  CHECK(r.status.retryable());
  CHECK(s.stats().busy);
  CHECK(s.durable_seq() == 10);
  // Draining to 70%: still above the resume mark (50%), still busy.
  REQUIRE(s.Release(3).ok());
  CHECK(s.Append(Batch(seq, 1, 1000)).status.code() == cdp::Code::kBusy);
  // Down to 40%: accepting again.
  REQUIRE(s.Release(6).ok());
  CHECK(!s.stats().busy);
  auto r2 = s.Append(Batch(seq, 1, 1000));
  REQUIRE(r2.status.ok());
  CHECK(r2.durable_seq == 11);
  // Nothing acknowledged was dropped: 7..11 readable.
  auto all = ReadAll(s, 7);
  REQUIRE(all.size() == 5);
  CHECK(all.front().seq == 7);
  CHECK(all.back().seq == 11);
  CHECK(s.stats().backlog_records == 5);
}

TEST_CASE("spool release deletes only fully acknowledged segments", "[spool]") {
  auto env = cdp::NewMemEnv();
  cdp::ManualClock clock;
  auto sp = cdp::ps::Spool::Open(Opts(env.get(), &clock));
  REQUIRE(sp.ok());
  auto& s = **sp;
  for (uint64_t seq = 1; seq <= 40; seq += 4) REQUIRE(s.Append(Batch(seq, 4, 1000)).status.ok());
  uint64_t segs = s.stats().segments;
  REQUIRE(segs >= 4);
  REQUIRE(s.Release(20).ok());
  CHECK(s.stats().segments < segs);
  CHECK(s.stats().first_seq == 21);
  // Records 21..40 are still all there (in files) after a reopen.
  sp->reset();
  auto sp2 = cdp::ps::Spool::Open(Opts(env.get(), &clock));
  REQUIRE(sp2.ok());
  auto all = ReadAll(**sp2, (*sp2)->stats().first_seq);
  CHECK(all.front().seq <= 21);
  CHECK(all.back().seq == 40);
  // Releasing everything keeps the active segment, so the resume point survives.
  REQUIRE((*sp2)->Release(40).ok());
  sp2->reset();
  auto sp3 = cdp::ps::Spool::Open(Opts(env.get(), &clock));
  REQUIRE(sp3.ok());
  CHECK((*sp3)->durable_seq() == 40);
}

TEST_CASE("spool floor: the master target is ahead, the spool continues after it", "[spool]") {
  auto env = cdp::NewMemEnv();
  cdp::ManualClock clock;
  {
    auto sp = cdp::ps::Spool::Open(Opts(env.get(), &clock));
    REQUIRE(sp.ok());
    REQUIRE((*sp)->Append(Batch(1, 3)).status.ok());
    (*sp)->SetFloor(100);
    CHECK((*sp)->durable_seq() == 100);
    CHECK((*sp)->stats().backlog_records == 0);
    auto dup = (*sp)->Append(Batch(50, 2));
    CHECK(dup.status.ok());
    CHECK(dup.appended == 0);
    auto r = (*sp)->Append(Batch(101, 2));
    REQUIRE(r.status.ok());
    CHECK(r.durable_seq == 102);
  }
  auto sp = cdp::ps::Spool::Open(Opts(env.get(), &clock));
  REQUIRE(sp.ok());
  CHECK((*sp)->durable_seq() == 102);
  auto all = ReadAll(**sp, (*sp)->stats().first_seq);
  REQUIRE(all.size() >= 2);
  CHECK(all[all.size() - 2].seq == 101);
}

TEST_CASE("a sealed volume's spool keeps its sealing in volume.meta and ships uncompressed", "[spool][sealed]") {
  auto env = cdp::NewMemEnv();
  cdp::ManualClock clock;
  cdp::proto::VolumeOpen open;
  open.name = "vol1";
  open.size = 1 << 20;
  open.sealed = true;
  {
    auto v = cdp::ps::SpooledVolume::Open(Opts(env.get(), &clock), "t1", &open, cdp::proto::Codec::kZstd, 1);
    REQUIRE(v.ok());
    CHECK((*v)->codec() == cdp::proto::Codec::kNone);
    CHECK((*v)->open_message().sealed);
  }
  // Reopened from volume.meta at start-up.
  auto again = cdp::ps::SpooledVolume::Open(Opts(env.get(), &clock), "t1", nullptr, cdp::proto::Codec::kZstd, 1);
  REQUIRE(again.ok());
  CHECK((*again)->open_message().sealed);
  CHECK((*again)->codec() == cdp::proto::Codec::kNone);
  // A plain volume keeps the configured codec, and its meta file has no flags byte.
  open.name = "vol2";
  open.sealed = false;
  auto plain_opts = Opts(env.get(), &clock);
  plain_opts.dir = "/spool/t1/vol2";
  auto plain = cdp::ps::SpooledVolume::Open(plain_opts, "t1", &open, cdp::proto::Codec::kZstd, 1);
  REQUIRE(plain.ok());
  CHECK((*plain)->codec() == cdp::proto::Codec::kZstd);
  auto meta = cdp::ReadWholeFile(env.get(), "/spool/t1/vol2/volume.meta");
  REQUIRE(meta.ok());
  CHECK(meta->size() == cdp::ps::EncodeVolumeMeta(open).size());
  auto sealed_meta = cdp::ReadWholeFile(env.get(), "/spool/t1/vol1/volume.meta");
  REQUIRE(sealed_meta.ok());
  CHECK(sealed_meta->size() == meta->size() + 1);
}

// SPDX-License-Identifier: Apache-2.0
// Copies at the process server (process-server/spooled_volume.h): one spool,
// one cursor per master target; the spool releases only what every copy
// acknowledged, the cursors persist, the quota follows the slowest copy, and
// the config keys (`mt` repeated, `copies`, `volume_copies`).
#include <catch2/catch.hpp>

#include "common/base/clock.h"
#include "common/env/env.h"
#include "common/env/fault_env.h"
#include "process-server/ps_config.h"
#include "process-server/spool.h"
#include "process-server/spooled_volume.h"

using cdp::proto::Record;
using cdp::proto::RecordKind;

namespace {

constexpr const char* kDir = "/spool/acme/vol1";
const std::vector<std::string> kTwo = {"mt-a.example:7500", "mt-b.example:7500"};

Record DataRecord(uint64_t seq, uint32_t len = 1000) {
  Record r;
  r.seq = seq;
  r.offset = seq * 4096;
  r.length = len;
  r.kind = RecordKind::kData;
  r.timestamp_us = 1'000'000 * seq;
  r.data.assign(len, uint8_t(seq | 1));
  return r;
}

std::vector<Record> Batch(uint64_t first, size_t n) {
  std::vector<Record> v;
  for (size_t i = 0; i < n; ++i) v.push_back(DataRecord(first + i));
  return v;
}

cdp::proto::VolumeOpen Vol() {
  cdp::proto::VolumeOpen o;
  o.name = "vol1";
  o.size = 64 << 20;
  o.block_size = 4096;
  o.uuid[0] = 7;
  o.generation = 1;
  return o;
}

cdp::ps::SpoolOptions Opts(cdp::Env* env, cdp::Clock* clock, uint64_t quota = 0) {
  cdp::ps::SpoolOptions o;
  o.env = env;
  o.clock = clock;
  o.dir = kDir;
  o.segment_bytes = 4096;  // a few records per segment: releases delete files
  o.quota_bytes = quota;
  return o;
}

std::unique_ptr<cdp::ps::SpooledVolume> OpenVolume(cdp::Env* env, cdp::Clock* clock,
                                                   const std::vector<std::string>& copies, uint64_t quota = 0,
                                                   bool create = true) {
  cdp::proto::VolumeOpen vol = Vol();
  auto v = cdp::ps::SpooledVolume::Open(Opts(env, clock, quota), "acme", create ? &vol : nullptr,
                                        cdp::proto::Codec::kNone, 0, copies, 1000);
  INFO(v.status().ToString());
  REQUIRE(v.ok());
  return std::move(*v);
}

size_t SegmentFiles(cdp::Env* env) {
  auto names = env->ListDir(kDir);
  REQUIRE(names.ok());
  size_t n = 0;
  for (const auto& f : *names)
    if (f.size() > 4 && f.substr(f.size() - 4) == ".spl") ++n;
  return n;
}

uint64_t Acked(const cdp::ps::SpooledVolume& v, size_t copy) { return v.CopyStates().at(copy).acked; }

// Appends records first..first+n-1 in groups of 3 (a segment rolls between
// groups only: several segment files).
void Fill(cdp::ps::SpooledVolume& v, uint64_t first, size_t n) {
  for (size_t i = 0; i < n; i += 3) {
    cdp::ps::AppendResult r = v.spool().Append(Batch(first + i, std::min<size_t>(3, n - i)));
    INFO(r.status.ToString());
    REQUIRE(r.status.ok());
  }
}

}  // namespace

TEST_CASE("copies: the spool releases only what every copy acknowledged, at the lowest cursor", "[copies]") {
  auto env = cdp::NewMemEnv();
  cdp::ManualClock clock;
  auto v = OpenVolume(env.get(), &clock, kTwo);
  REQUIRE(v->copies() == 2);
  Fill(*v, 1, 40);
  const size_t segments = SegmentFiles(env.get());
  REQUIRE(segments > 4);

  // Copy A has everything, copy B nothing: nothing leaves the spool.
  v->SetCopyAcked(0, 40);
  CHECK(v->spool().stats().released_seq == 0);
  CHECK(v->spool().stats().backlog_records == 40);
  CHECK(SegmentFiles(env.get()) == segments);
  CHECK(v->counters().mt_acked.load() == 40);  // the primary's cursor
  CHECK(v->ReleasableSeq() == 0);

  // B reaches 25: released up to 25, not beyond.
  v->SetCopyAcked(1, 25);
  CHECK(v->spool().stats().released_seq == 25);
  CHECK(v->spool().stats().backlog_records == 15);
  CHECK(SegmentFiles(env.get()) < segments);
  auto rest = v->spool().Read(26, 1 << 20);
  REQUIRE(rest.ok());
  REQUIRE(rest->front().seq == 26);

  // Cursors only move up through acks; a lower one changes nothing.
  v->SetCopyAcked(1, 20);
  CHECK(Acked(*v, 1) == 25);

  // Each copy's own lag: A none, B 15 records from seq 26 on.
  cdp::ps::SpoolBacklog a = v->spool().BacklogAbove(Acked(*v, 0));
  cdp::ps::SpoolBacklog b = v->spool().BacklogAbove(Acked(*v, 1));
  CHECK(a.records == 0);
  CHECK(a.bytes == 0);
  CHECK(a.oldest_timestamp_us == 0);
  CHECK(b.records == 15);
  CHECK(b.bytes == 15 * (cdp::ps::kRecordHeaderSize + 1000));
  CHECK(b.oldest_timestamp_us == 26'000'000);
  CHECK(b.bytes == v->spool().stats().backlog_bytes);

  v->SetCopyAcked(1, 40);
  CHECK(v->spool().stats().released_seq == 40);
  CHECK(v->spool().stats().backlog_records == 0);
}

TEST_CASE("copies: a copy whose MT stands below what was released is lost and no longer holds the spool", "[copies]") {
  auto env = cdp::NewMemEnv();
  cdp::ManualClock clock;
  auto v = OpenVolume(env.get(), &clock, kTwo);
  Fill(*v, 1, 20);
  REQUIRE(v->SetCopyOpened(0, 0));
  REQUIRE(v->SetCopyOpened(1, 0));
  v->SetCopyAcked(0, 20);
  v->SetCopyAcked(1, 12);
  REQUIRE(v->spool().stats().released_seq == 12);

  // B's MT comes back having lost its replica (durable 3 < 12): the spool
  // cannot serve it.
  CHECK_FALSE(v->SetCopyOpened(1, 3));
  CHECK(v->CopyStates().at(1).lost);
  CHECK(Acked(*v, 1) == 3);
  // It no longer holds the spool: A's cursor alone releases.
  CHECK(v->ReleasableSeq() == 20);
  CHECK(v->spool().stats().released_seq == 20);
  REQUIRE(v->spool().Append(Batch(21, 5)).status.ok());
  v->SetCopyAcked(0, 25);
  CHECK(v->spool().stats().released_seq == 25);

  // An open at or above the released sequence is servable again.
  CHECK(v->SetCopyOpened(1, 25));
  CHECK_FALSE(v->CopyStates().at(1).lost);
}

TEST_CASE("copies: a copy the spool's floor jumped past (spool lost, the other MT ahead) does not hold the spool",
          "[copies]") {
  auto env = cdp::NewMemEnv();
  cdp::ManualClock clock;
  auto v = OpenVolume(env.get(), &clock, kTwo);
  // The spool is empty (lost); B's MT answers first at 800, then A's at
  // 1000: the floor moves to each (as the link does), past B's cursor.
  v->spool().SetFloor(800);
  REQUIRE(v->SetCopyOpened(1, 800));
  v->spool().SetFloor(1000);
  REQUIRE(v->SetCopyOpened(0, 1000));
  REQUIRE(v->spool().stats().released_seq == 1000);
  Fill(*v, 1001, 10);
  v->SetCopyAcked(0, 1010);
  CHECK(v->ReleasableSeq() == 1010);
  CHECK(v->spool().stats().released_seq == 1010);
  CHECK(v->spool().stats().backlog_records == 0);
}

TEST_CASE("copies: each copy's cursor persists in copies.meta and reloads by MT name", "[copies]") {
  auto env = cdp::NewMemEnv();
  cdp::ManualClock clock;
  {
    auto v = OpenVolume(env.get(), &clock, kTwo);
    Fill(*v, 1, 30);
    v->SetCopyAcked(0, 30);
    v->SetCopyAcked(1, 10);
    // Not yet due (cursor_sync_ms = 1000 of the manual clock): nothing written.
    CHECK_FALSE(env->Exists(std::string(kDir) + "/copies.meta"));
    clock.Advance(1'000'000);
    v->SetCopyAcked(1, 17);  // due: written by this ack
    auto data = cdp::ReadWholeFile(env.get(), std::string(kDir) + "/copies.meta");
    REQUIRE(data.ok());
    auto cur = cdp::ps::DecodeCopiesMeta(*data);
    REQUIRE(cur.ok());
    REQUIRE(cur->size() == 2);
    CHECK((*cur)[0] == std::make_pair(kTwo[0], uint64_t(30)));
    CHECK((*cur)[1] == std::make_pair(kTwo[1], uint64_t(17)));
    // Later moves reach the file at Close (daemon stop, retire).
    v->SetCopyAcked(1, 21);
    v->Close();
  }
  {
    // Reopened from volume.meta (a daemon restart), the MTs listed the other
    // way round: each cursor follows its MT's name.
    auto v = OpenVolume(env.get(), &clock, {kTwo[1], kTwo[0]}, 0, /*create=*/false);
    CHECK(v->CopyStates().at(0).mt == kTwo[1]);
    CHECK(Acked(*v, 0) == 21);
    CHECK(Acked(*v, 1) == 30);
    CHECK(v->counters().mt_acked.load() == 21);
    // The spool kept every record above the lower cursor.
    auto r = v->spool().Read(22, 1 << 20);
    REQUIRE(r.ok());
    REQUIRE(!r->empty());
    CHECK(r->front().seq <= 22);
    v->Close();
  }
  {
    // A copy that never acknowledged anything (a new MT) starts at the
    // spool's released sequence, a lower bound of every copy.
    auto v = OpenVolume(env.get(), &clock, {kTwo[0], kTwo[1], "mt-c.example:7500"}, 0, false);
    CHECK(Acked(*v, 2) == v->spool().stats().released_seq);
    CHECK(Acked(*v, 0) == 30);
  }
  // A damaged copies.meta is refused, never guessed.
  {
    auto f = cdp::ReadWholeFile(env.get(), std::string(kDir) + "/copies.meta");
    REQUIRE(f.ok());
    cdp::Bytes bad = *f;
    bad[12] ^= 1;
    REQUIRE(cdp::WriteFileAtomic(env.get(), std::string(kDir) + "/copies.meta", bad).ok());
    cdp::proto::VolumeOpen vol = Vol();
    auto v = cdp::ps::SpooledVolume::Open(Opts(env.get(), &clock), "acme", &vol, cdp::proto::Codec::kNone, 0, kTwo);
    CHECK(v.status().code() == cdp::Code::kCorruption);
  }
}

TEST_CASE("copies: a persisted cursor below the released sequence reloads at the released sequence", "[copies]") {
  auto env = cdp::NewMemEnv();
  cdp::ManualClock clock;
  {
    auto v = OpenVolume(env.get(), &clock, kTwo);
    Fill(*v, 1, 40);
    v->SetCopyAcked(0, 2);
    v->SetCopyAcked(1, 2);
    REQUIRE(v->PersistCursors().ok());  // both at 2 on disk
    v->SetCopyAcked(0, 40);
    v->SetCopyAcked(1, 30);  // released to 30, not persisted (kill -9 now)
    REQUIRE(v->spool().stats().released_seq == 30);
  }
  auto v = OpenVolume(env.get(), &clock, kTwo, 0, false);
  const uint64_t released = v->spool().stats().released_seq;
  CHECK(released > 2);
  CHECK(released <= 30);
  CHECK(Acked(*v, 0) == released);
  CHECK(Acked(*v, 1) == released);
}

// Issue 38 F2: with one copy nothing was persisted but the segments
// deleted, so a restart counted the active segment's shipped records as
// backlog until the MT answered (never, while it fenced the volume).
TEST_CASE("copies: one copy persists its cursor too, and a restart releases what the MT acknowledged before it "
          "answers again",
          "[copies]") {
  auto env = cdp::NewMemEnv();
  cdp::ManualClock clock;
  {
    auto v = OpenVolume(env.get(), &clock, {});
    Fill(*v, 1, 10);  // within the active segment and the ones before it
    v->SetCopyAcked(0, 10);
    CHECK(v->spool().stats().backlog_records == 0);
    // The last move was not due (cursor_sync_ms of the manual clock): the
    // flusher writes it a period later. No Close: a kill -9 after that.
    CHECK(v->PersistCursorsIfMoved().ok());
    REQUIRE(env->Exists(std::string(kDir) + "/copies.meta"));
    Fill(*v, 11, 5);  // spooled, never acknowledged
  }
  auto v = OpenVolume(env.get(), &clock, {}, 0, /*create=*/false);
  CHECK(Acked(*v, 0) == 10);
  CHECK(v->counters().mt_acked.load() == 10);
  const cdp::ps::SpoolStats st = v->spool().stats();
  CHECK(st.released_seq == 10);
  CHECK(st.backlog_records == 5);
  auto r = v->spool().Read(11, 1 << 20);
  REQUIRE(r.ok());
  REQUIRE(r->size() == 5);
  CHECK(r->front().seq == 11);
}

TEST_CASE("copies: the quota counts what the slowest copy has not acknowledged", "[copies]") {
  auto env = cdp::NewMemEnv();
  cdp::ManualClock clock;
  const uint64_t rec = cdp::ps::kRecordHeaderSize + 1000;
  auto v = OpenVolume(env.get(), &clock, kTwo, /*quota=*/10 * rec);
  REQUIRE(v->spool().Append(Batch(1, 10)).status.ok());
  // The fast copy has everything; the slow one nothing: still full.
  v->SetCopyAcked(0, 10);
  cdp::ps::AppendResult r = v->spool().Append(Batch(11, 1));
  CHECK(r.status.code() == cdp::Code::kBusy);
  CHECK(v->spool().stats().busy);
  // The slow copy catches up to 5: below the resume mark (90%), accepted.
  v->SetCopyAcked(1, 5);
  r = v->spool().Append(Batch(11, 1));
  CHECK(r.status.ok());
  CHECK(v->spool().stats().backlog_records == 6);
  // The other way round: B has everything, A lags at 10 and holds the spool.
  REQUIRE(v->spool().Append(Batch(12, 4)).status.ok());
  v->SetCopyAcked(1, 15);
  REQUIRE(v->spool().Append(Batch(16, 5)).status.ok());
  v->SetCopyAcked(1, 20);
  CHECK(v->spool().stats().backlog_records == 10);  // 11..20, A's lag
  r = v->spool().Append(Batch(21, 1));
  CHECK(r.status.code() == cdp::Code::kBusy);
  v->SetCopyAcked(0, 20);
  CHECK(v->spool().Append(Batch(21, 1)).status.ok());
}

TEST_CASE("copies config: repeated mt keys, copies and volume_copies", "[copies][config]") {
  auto load = [](std::string text, std::vector<const char*> flags = {}) {
    std::vector<const char*> argv{"cdp-process-server"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    text = "tls = off\ntenant = acme:s3cret-acme-0123456789\n" + text;
    auto loaded =
        cdp::LoadConfigText(int(argv.size()), argv.data(), cdp::ps::ProcessServerConfigDescription(), text, "ps.conf");
    if (!loaded.ok()) return cdp::Result<cdp::ps::ProcessServerOptions>(loaded.status());
    return cdp::ps::OptionsFromConfig(loaded->vars);
  };
  // One mt, as always: no more copies.
  auto one = load("mt = a.example:7500\n");
  REQUIRE(one.ok());
  CHECK(one->mt.ToString() == "a.example:7500");
  CHECK(one->more_mts.empty());
  CHECK(one->copies == 0);
  // The default when no mt is given.
  auto def = load("");
  REQUIRE(def.ok());
  CHECK(def->mt.ToString() == "127.0.0.1:7500");
  CHECK(def->more_mts.empty());

  auto two = load("mt = a.example:7500\nmt = b.example:7501\ncopies = 2\nvolume_copies = acme/scratch=1\n");
  INFO(two.status().ToString());
  REQUIRE(two.ok());
  CHECK(two->mt.ToString() == "a.example:7500");
  REQUIRE(two->more_mts.size() == 1);
  CHECK(two->more_mts[0].ToString() == "b.example:7501");
  CHECK(two->copies == 2);
  CHECK(two->volume_copies.at("acme/scratch") == 1);

  // Flags replace the file's list.
  auto flags = load("mt = a.example:7500\nmt = b.example:7501\n", {"--mt", "c.example:7502"});
  REQUIRE(flags.ok());
  CHECK(flags->mt.ToString() == "c.example:7502");
  CHECK(flags->more_mts.empty());

  CHECK(load("mt = a.example:7500\ncopies = 2\n").status().code() == cdp::Code::kInvalidArgument);
  CHECK(load("mt = a.example:7500\nmt = a.example:7500\n").status().code() == cdp::Code::kInvalidArgument);
  CHECK(load("mt = a.example:7500\nvolume_copies = acme/v=2\n").status().code() == cdp::Code::kInvalidArgument);
  CHECK(load("mt = a.example:7500\nvolume_copies = acme/v=0\n").status().code() == cdp::Code::kInvalidArgument);
  CHECK(load("mt = a.example:7500\nvolume_copies = v=1\n").status().code() == cdp::Code::kInvalidArgument);
  CHECK(load("mt = a.example\n").status().code() == cdp::Code::kInvalidArgument);
}

bool Beyond(const cdp::ps::SpooledVolume& v, size_t copy) { return v.CopyStates().at(copy).beyond; }

// The copies `list`'s file in kDir names.
std::vector<std::string> Listed(cdp::Env* env, const cdp::ps::CopyList& list) {
  auto data = cdp::ReadWholeFile(env, std::string(kDir) + "/" + list.file);
  REQUIRE(data.ok());
  auto names = cdp::ps::DecodeCopyList(list, *data);
  REQUIRE(names.ok());
  return *names;
}

TEST_CASE("copies: a copy refused as beyond the spool stays refused after a restart, by MT name, until cleared",
          "[copies][history]") {
  // Regression: the refusal lived in memory only, so a restart of the PS
  // resumed the copy after the MT's position and skipped the records the
  // spool had numbered since it lost its own (process_server_test.cc).
  auto env = cdp::NewMemEnv();
  cdp::ManualClock clock;
  const std::string path = std::string(kDir) + "/" + cdp::ps::kBeyondList.file;
  {
    auto v = OpenVolume(env.get(), &clock, kTwo);
    CHECK_FALSE(env->Exists(path));
    REQUIRE(v->SetBeyond(1).ok());
    CHECK(Listed(env.get(), cdp::ps::kBeyondList) == std::vector<std::string>{kTwo[1]});
  }
  {
    // Reopened with the MTs the other way round: the refusal follows the name.
    auto v = OpenVolume(env.get(), &clock, {kTwo[1], kTwo[0]}, 0, /*create=*/false);
    CHECK(Beyond(*v, 0));
    CHECK_FALSE(Beyond(*v, 1));
    REQUIRE(v->ClearBeyond().ok());
    CHECK_FALSE(Beyond(*v, 0));
    CHECK_FALSE(env->Exists(path));
  }
  {
    auto v = OpenVolume(env.get(), &clock, kTwo, 0, false);
    CHECK_FALSE(Beyond(*v, 0));
    CHECK_FALSE(Beyond(*v, 1));
    REQUIRE(v->SetBeyond(0).ok());  // for the sections below
  }
  SECTION("a damaged file refuses every copy, never guesses the refusal away") {
    cdp::Bytes bad = cdp::ReadWholeFile(env.get(), path).value();
    bad[9] ^= 1;
    REQUIRE(cdp::WriteFileAtomic(env.get(), path, bad).ok());
    auto v = OpenVolume(env.get(), &clock, kTwo, 0, false);
    CHECK(Beyond(*v, 0));
    CHECK(Beyond(*v, 1));
  }
  SECTION("a single copy's refusal is kept too") {
    auto one = cdp::NewMemEnv();
    {
      auto v = OpenVolume(one.get(), &clock, {});
      REQUIRE(v->SetBeyond(0).ok());
    }
    auto v = OpenVolume(one.get(), &clock, {}, 0, false);
    CHECK(Beyond(*v, 0));
    CHECK(Listed(one.get(), cdp::ps::kBeyondList) == std::vector<std::string>{""});  // one copy's name
  }
}

TEST_CASE("copies: a refusal reported kept survives a power cut at any point, a clearing reported done too",
          "[copies][history][fault]") {
  cdp::ManualClock clock;
  uint64_t runs = 0;
  for (uint64_t n = 0;; ++n) {
    auto mem = cdp::NewMemEnv();
    {
      auto v = OpenVolume(mem.get(), &clock, kTwo);  // created before the faults start
      v->Close();
    }
    cdp::FaultEnv fault(mem.get());
    fault.SetCrashAfterSyncs(n);
    bool set = false, cleared = false, set_again = false;
    {
      cdp::proto::VolumeOpen vol = Vol();
      auto v = cdp::ps::SpooledVolume::Open(Opts(&fault, &clock), "acme", &vol, cdp::proto::Codec::kNone, 0, kTwo);
      if (v.ok()) {
        set = (*v)->SetBeyond(0).ok();
        if (set) cleared = (*v)->ClearBeyond().ok();
        if (cleared) set_again = (*v)->SetBeyond(1).ok();
      }
    }
    const bool finished = !fault.crashed();
    REQUIRE(fault.DropUnsyncedData().ok());
    fault.ClearErrors();
    auto v = OpenVolume(&fault, &clock, kTwo, 0, false);
    // What each call reported done is what the restart finds; a call cut
    // short may have taken effect or not.
    if (set_again) CHECK(Beyond(*v, 1));
    if (cleared) {
      CHECK_FALSE(Beyond(*v, 0));
    } else if (set) {
      CHECK(Beyond(*v, 0));
    }
    ++runs;
    if (finished) {
      CHECK(set_again);
      break;
    }
    REQUIRE(n < 100);
  }
  CHECK(runs > 3);
}

TEST_CASE("copies: a new spool names every copy unanchored until its MT answers, across restarts",
          "[copies][history]") {
  auto env = cdp::NewMemEnv();
  cdp::ManualClock clock;
  const std::string path = std::string(kDir) + "/" + cdp::ps::kAnchorList.file;
  {
    auto v = OpenVolume(env.get(), &clock, kTwo);
    CHECK(v->unanchored(0));
    CHECK(v->unanchored(1));
    CHECK(Listed(env.get(), cdp::ps::kAnchorList) == kTwo);
    REQUIRE(v->SetAnchored(0).ok());
  }
  {
    // The agent's open of the existing spool (a restart) creates nothing new.
    auto v = OpenVolume(env.get(), &clock, kTwo);
    CHECK_FALSE(v->unanchored(0));
    CHECK(v->unanchored(1));
    REQUIRE(v->SetAnchored(1).ok());
    CHECK_FALSE(env->Exists(path));
  }
  auto v = OpenVolume(env.get(), &clock, kTwo, 0, false);
  CHECK_FALSE(v->unanchored(0));
  CHECK_FALSE(v->unanchored(1));
}

TEST_CASE("copies: a copy stays unanchored when anchor.meta cannot be rewritten, and a power cut never finds it "
          "unanchored once it was reported anchored",
          "[copies][history][fault]") {
  cdp::ManualClock clock;
  {
    auto mem = cdp::NewMemEnv();
    cdp::FaultEnv fault(mem.get());
    auto v = OpenVolume(&fault, &clock, kTwo);
    fault.InjectError(cdp::FaultEnv::Op::kRename, ENOSPC);
    CHECK(v->SetAnchored(0).code() == cdp::Code::kNoSpace);
    CHECK(v->unanchored(0));
    fault.ClearErrors();
    REQUIRE(v->SetAnchored(0).ok());
    CHECK_FALSE(v->unanchored(0));
  }
  uint64_t runs = 0;
  for (uint64_t n = 0;; ++n) {
    auto mem = cdp::NewMemEnv();
    cdp::FaultEnv fault(mem.get());
    fault.SetCrashAfterSyncs(n);
    bool created = false, anchored = false;
    {
      cdp::proto::VolumeOpen vol = Vol();
      auto v = cdp::ps::SpooledVolume::Open(Opts(&fault, &clock), "acme", &vol, cdp::proto::Codec::kNone, 0, kTwo);
      created = v.ok();
      if (created) anchored = (*v)->SetAnchored(1).ok();
    }
    const bool finished = !fault.crashed();
    REQUIRE(fault.DropUnsyncedData().ok());
    fault.ClearErrors();
    if (fault.Exists(std::string(kDir) + "/volume.meta")) {
      // A spool that exists after the cut was created with anchor.meta.
      auto v = OpenVolume(&fault, &clock, kTwo, 0, false);
      CHECK(v->unanchored(0));
      CHECK(v->unanchored(1) == !anchored);
    } else {
      CHECK_FALSE(created);
    }
    ++runs;
    if (finished) {
      CHECK(anchored);
      break;
    }
    REQUIRE(n < 100);
  }
  CHECK(runs > 3);
}

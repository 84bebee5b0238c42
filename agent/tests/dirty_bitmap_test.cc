// SPDX-License-Identifier: Apache-2.0
#include "agent/dirty_bitmap.h"

#include <catch2/catch.hpp>
#include <cerrno>

#include "common/base/coding.h"
#include "common/base/crc32c.h"
#include "common/env/fault_env.h"

using cdp::agent::DirtyBitmap;

namespace {

constexpr uint64_t kMiB = 1u << 20;

DirtyBitmap::Options Opts(cdp::Env* env, uint64_t size = 16 * kMiB) {
  DirtyBitmap::Options o;
  o.env = env;
  o.path = "/bm/vol.bitmap";
  o.volume_size = size;
  o.region_size = kMiB;
  return o;
}

// Marks every region done and clean, so that a test starts from a clean bitmap.
void CleanAll(DirtyBitmap& bm) {
  for (uint64_t r = 0; r < bm.region_count(); ++r) bm.ResyncDone(r, 0);
  REQUIRE(bm.Checkpoint().ok());
  REQUIRE(bm.DirtyCount() == 0);
}

std::vector<uint64_t> ResyncRegions(DirtyBitmap& bm) {
  std::vector<uint64_t> out;
  uint64_t from = 0;
  while (auto r = bm.NextResync(from)) {
    out.push_back(*r);
    from = *r + 1;
  }
  return out;
}

}  // namespace

TEST_CASE("a new bitmap asks for a full initial sync", "[bitmap]") {
  auto env = cdp::NewMemEnv();
  REQUIRE(env->CreateDirs("/bm").ok());
  auto bm = DirtyBitmap::Open(Opts(env.get(), 10 * kMiB + 1));
  REQUIRE(bm.ok());
  REQUIRE((*bm)->region_count() == 11);
  REQUIRE((*bm)->ResyncCount() == 11);
  REQUIRE((*bm)->ResyncState(10) == DirtyBitmap::Resync::kCompare);
  CleanAll(**bm);
  bm->reset();
  auto again = DirtyBitmap::Open(Opts(env.get(), 10 * kMiB + 1));
  REQUIRE(again.ok());
  REQUIRE((*again)->ResyncCount() == 0);
  REQUIRE((*again)->DirtyCount() == 0);
}

TEST_CASE("marking an already marked region costs no I/O", "[bitmap]") {
  auto env = cdp::NewMemEnv();
  REQUIRE(env->CreateDirs("/bm").ok());
  auto bm = std::move(*DirtyBitmap::Open(Opts(env.get())));
  CleanAll(*bm);
  uint64_t p0 = bm->persist_count();
  REQUIRE(bm->MarkAndPin(3 * kMiB + 10, 4096).ok());
  REQUIRE(bm->persist_count() == p0 + 1);
  bm->Assign(3 * kMiB + 10, 4096, 1);
  for (int i = 0; i < 100; ++i) {
    REQUIRE(bm->MarkAndPin(3 * kMiB + 4096 * i, 4096).ok());
    bm->Assign(3 * kMiB + 4096 * i, 4096, 2 + i);
  }
  REQUIRE(bm->persist_count() == p0 + 1);
  // A write spanning regions 3 and 4 marks only region 4.
  REQUIRE(bm->MarkAndPin(4 * kMiB - 512, 1024).ok());
  bm->Assign(4 * kMiB - 512, 1024, 200);
  REQUIRE(bm->persist_count() == p0 + 2);
  REQUIRE(bm->DirtyCount() == 2);
}

TEST_CASE("a region is cleared only when acknowledged and cold", "[bitmap]") {
  auto env = cdp::NewMemEnv();
  REQUIRE(env->CreateDirs("/bm").ok());
  auto bm = std::move(*DirtyBitmap::Open(Opts(env.get())));
  CleanAll(*bm);
  REQUIRE(bm->MarkAndPin(0, 4096).ok());
  bm->Assign(0, 4096, 5);
  REQUIRE(bm->MarkAndPin(2 * kMiB, 4096).ok());
  bm->Assign(2 * kMiB, 4096, 6);
  bm->SetAcked(5);
  // Region 0 is acknowledged but was hot during this interval.
  REQUIRE(*bm->Checkpoint() == 0);
  // Cold now: region 0 clears; region 2 still has seq 6 unacknowledged.
  REQUIRE(*bm->Checkpoint() == 1);
  REQUIRE(bm->DirtyCount() == 1);
  // A pinned region (write in progress) is never cleared.
  REQUIRE(bm->MarkAndPin(2 * kMiB, 4096).ok());
  bm->SetAcked(6);
  REQUIRE(*bm->Checkpoint() == 0);
  REQUIRE(*bm->Checkpoint() == 0);
  bm->Assign(2 * kMiB, 4096, 7);
  bm->SetAcked(7);
  REQUIRE(*bm->Checkpoint() == 0);  // hot from the MarkAndPin above
  REQUIRE(*bm->Checkpoint() == 1);
  REQUIRE(bm->DirtyCount() == 0);
}

TEST_CASE("after a power cut exactly the unacknowledged regions are dirty", "[bitmap][fault]") {
  auto mem = cdp::NewMemEnv();
  cdp::FaultEnv fault(mem.get());
  REQUIRE(fault.CreateDirs("/bm").ok());
  {
    auto bm = std::move(*DirtyBitmap::Open(Opts(&fault)));
    CleanAll(*bm);
    REQUIRE(*bm->Checkpoint() == 0);
    uint64_t seq = 0;
    for (uint64_t r : {1, 4, 5, 9, 15}) {
      REQUIRE(bm->MarkAndPin(r * kMiB + 100, 8192).ok());
      bm->Assign(r * kMiB + 100, 8192, ++seq);
    }
    bm->SetAcked(2);  // regions 1 and 4 acknowledged
    REQUIRE(bm->Checkpoint().ok());
    REQUIRE(bm->Checkpoint().ok());
    // A write whose mark was synced but which never got a sequence (crash mid-write).
    REQUIRE(bm->MarkAndPin(12 * kMiB, 4096).ok());
  }
  REQUIRE(fault.DropUnsyncedData().ok());
  auto bm = DirtyBitmap::Open(Opts(&fault));
  REQUIRE(bm.ok());
  REQUIRE(ResyncRegions(**bm) == std::vector<uint64_t>{5, 9, 12, 15});
}

TEST_CASE("a torn slot falls back to the previous image, two bad slots are corruption", "[bitmap][fault]") {
  auto env = cdp::NewMemEnv();
  REQUIRE(env->CreateDirs("/bm").ok());
  {
    auto bm = std::move(*DirtyBitmap::Open(Opts(env.get())));
    CleanAll(*bm);  // counter 2 in slot 0: clean
    REQUIRE(bm->MarkAndPin(7 * kMiB, 1).ok());  // counter 3 in slot 1: region 7 dirty
    bm->Assign(7 * kMiB, 1, 1);
  }
  {
    auto f = std::move(*env->Open("/bm/vol.bitmap", cdp::OpenOptions{}));
    auto size = *f->Size();
    uint8_t b = 0;
    REQUIRE(f->Read(size / 2 + 60, 1, &b).ok());
    b ^= 0x10;
    REQUIRE(f->Write(size / 2 + 60, cdp::ByteSpan(&b, 1)).ok());  // flip a bit in slot 1
  }
  {
    auto bm = DirtyBitmap::Open(Opts(env.get()));
    REQUIRE(bm.ok());
    REQUIRE((*bm)->ResyncCount() == 0);  // slot 0's image
  }
  {
    auto f = std::move(*env->Open("/bm/vol.bitmap", cdp::OpenOptions{}));
    uint8_t b = 0;
    REQUIRE(f->Read(0, 1, &b).ok());
    b ^= 1;
    REQUIRE(f->Write(0, cdp::ByteSpan(&b, 1)).ok());
  }
  auto bad = DirtyBitmap::Open(Opts(env.get()));
  REQUIRE(!bad.ok());
  REQUIRE(bad.status().code() == cdp::Code::kCorruption);
  auto other = DirtyBitmap::Open(Opts(env.get(), 32 * kMiB));
  REQUIRE(!other.ok());
}

TEST_CASE("a failed mark is reported and releases its pins", "[bitmap][fault]") {
  auto mem = cdp::NewMemEnv();
  cdp::FaultEnv fault(mem.get());
  REQUIRE(fault.CreateDirs("/bm").ok());
  auto bm = std::move(*DirtyBitmap::Open(Opts(&fault)));
  CleanAll(*bm);
  fault.InjectError(cdp::FaultEnv::Op::kSync, EIO);
  cdp::Status s = bm->MarkAndPin(0, 4096);
  REQUIRE(s.code() == cdp::Code::kIOError);
  REQUIRE(bm->DirtyCount() == 0);
  fault.ClearErrors();
  REQUIRE(bm->MarkAndPin(0, 4096).ok());
  REQUIRE(bm->DirtyCount() == 1);
  REQUIRE(bm->MarkAndPin(16 * kMiB, 1).code() == cdp::Code::kOutOfRange);
}

TEST_CASE("every image carries the acknowledged sequence, KnownAcked tells it, and a resume below it after a "
          "restart is history lost",
          "[bitmap][history]") {
  auto env = cdp::NewMemEnv();
  REQUIRE(env->CreateDirs("/bm").ok());
  {
    auto bm = std::move(*DirtyBitmap::Open(Opts(env.get())));
    REQUIRE(!bm->Resumed(0));  // a new bitmap: nothing acknowledged before
    CleanAll(*bm);
    REQUIRE(bm->MarkAndPin(3 * kMiB, 4096).ok());
    bm->Assign(3 * kMiB, 4096, 40);
    bm->SetAcked(40);
    CHECK(bm->KnownAcked() == 40);  // what the next VolumeOpen tells the server
    REQUIRE(*bm->Checkpoint() == 0);  // hot
    REQUIRE(*bm->Checkpoint() == 1);  // region 3 cleared in an image that says 40
    REQUIRE(!bm->Resumed(10));        // a later contact of this process: the queue's window decides
  }
  {
    auto bm = std::move(*DirtyBitmap::Open(Opts(env.get())));
    REQUIRE(bm->ResyncCount() == 0);
    CHECK(bm->KnownAcked() == 40);  // across the restart, before the server speaks
    // Images written before the server speaks keep 40: a crash now must not forget it.
    REQUIRE(bm->MarkAndPin(5 * kMiB, 4096).ok());
    bm->Assign(5 * kMiB, 4096, 1);
  }
  {
    auto bm = std::move(*DirtyBitmap::Open(Opts(env.get())));
    REQUIRE(bm->Resumed(39));   // the server lost record 40, acknowledged earlier
    REQUIRE(!bm->Resumed(39));  // once per process
    bm->MarkAllCompare();
    bm->Renumber(0, 39);
    CHECK(bm->KnownAcked() == 39);  // the server's numbering from now on
    REQUIRE(bm->Checkpoint().ok());
  }
  {
    // The compare is on disk with the server's new numbering: no second alarm.
    auto bm = std::move(*DirtyBitmap::Open(Opts(env.get())));
    REQUIRE(bm->ResyncCount() == 16);
    REQUIRE(!bm->Resumed(39));
  }
  {
    auto bm = std::move(*DirtyBitmap::Open(Opts(env.get())));
    REQUIRE(!bm->Resumed(50));  // at or above: nothing lost
    bm->ForgetAll();            // a new generation numbers from 0 again
    CHECK(bm->KnownAcked() == 0);
    REQUIRE(bm->Checkpoint().ok());
  }
  auto bm = std::move(*DirtyBitmap::Open(Opts(env.get())));
  REQUIRE(!bm->Resumed(0));
}

namespace {

// A version 1 image (56-byte header, no acknowledged sequence), as the
// agents before version 2 wrote it.
cdp::Bytes V1Image(uint64_t counter, uint64_t cursor, const std::vector<uint64_t>& dirty) {
  cdp::Bytes buf;
  cdp::PutFixed64(buf, 0x31504d4244504443ull);
  cdp::PutFixed32(buf, 1);
  cdp::PutFixed32(buf, uint32_t(kMiB));
  cdp::PutFixed64(buf, 16 * kMiB);
  cdp::PutFixed64(buf, 16);
  cdp::PutFixed64(buf, counter);
  cdp::PutFixed64(buf, cursor);
  cdp::PutFixed32(buf, 2);
  cdp::PutFixed32(buf, 0);
  uint8_t bits[2] = {0, 0};
  for (uint64_t r : dirty) bits[r / 8] |= uint8_t(1u << (r % 8));
  cdp::PutBytes(buf, cdp::ByteSpan(bits, 2));
  cdp::PutFixed32(buf, cdp::crc32c::Value(buf.data(), buf.size()));
  return buf;
}

}  // namespace

TEST_CASE("a version 1 bitmap is read, rewritten as version 2 whole, and keeps its regions and cursor",
          "[bitmap][fault]") {
  auto mem = cdp::NewMemEnv();
  REQUIRE(mem->CreateDirs("/bm").ok());
  {
    cdp::Bytes file(2 * 4096, 0);
    cdp::Bytes older = V1Image(2, 0, {});
    cdp::Bytes newer = V1Image(3, 7, {2, 5});
    std::copy(older.begin(), older.end(), file.begin());
    std::copy(newer.begin(), newer.end(), file.begin() + 4096);
    REQUIRE(cdp::WriteFileAtomic(mem.get(), "/bm/vol.bitmap", cdp::ByteSpan(file.data(), file.size())).ok());
  }
  cdp::FaultEnv fault(mem.get());
  {
    auto bm = DirtyBitmap::Open(Opts(&fault));
    INFO(bm.status().ToString());
    REQUIRE(bm.ok());
    CHECK(ResyncRegions(**bm) == std::vector<uint64_t>{2, 5});
    CHECK((*bm)->cursor() == 7);
    CHECK(!(*bm)->Resumed(0));
  }
  // The rewrite is durable (a power cut right after the open keeps it) and of version 2.
  REQUIRE(fault.DropUnsyncedData().ok());
  {
    auto f = std::move(*fault.Open("/bm/vol.bitmap", cdp::OpenOptions{}));
    uint8_t hdr[12];
    REQUIRE(f->Read(0, 12, hdr).ok());  // counter 4: slot 0
    CHECK(cdp::DecodeFixed32(hdr + 8) == 2);
  }
  auto bm = DirtyBitmap::Open(Opts(&fault));
  REQUIRE(bm.ok());
  CHECK(ResyncRegions(**bm) == std::vector<uint64_t>{2, 5});
  CHECK((*bm)->cursor() == 7);
}

TEST_CASE("a power cut at every sync point of the version 1 rewrite leaves a readable bitmap", "[bitmap][fault]") {
  for (uint64_t n = 0;; ++n) {
    INFO("crash after sync " << n);
    auto mem = cdp::NewMemEnv();
    REQUIRE(mem->CreateDirs("/bm").ok());
    {
      cdp::Bytes file(2 * 4096, 0);
      cdp::Bytes image = V1Image(1, 3, {0, 9, 15});
      std::copy(image.begin(), image.end(), file.begin() + 4096);
      REQUIRE(cdp::WriteFileAtomic(mem.get(), "/bm/vol.bitmap", cdp::ByteSpan(file.data(), file.size())).ok());
    }
    cdp::FaultEnv fault(mem.get());
    fault.SetCrashAfterSyncs(n);
    (void)DirtyBitmap::Open(Opts(&fault));
    const bool finished = !fault.crashed();
    REQUIRE(fault.DropUnsyncedData().ok());
    auto bm = DirtyBitmap::Open(Opts(&fault));
    INFO(bm.status().ToString());
    REQUIRE(bm.ok());
    CHECK(ResyncRegions(**bm) == std::vector<uint64_t>{0, 9, 15});
    CHECK((*bm)->cursor() == 3);
    if (finished) break;
  }
}

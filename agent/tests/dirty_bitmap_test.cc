#include "agent/dirty_bitmap.h"

#include <catch2/catch.hpp>
#include <cerrno>

#include "common/fault_env.h"

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

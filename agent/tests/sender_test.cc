// SPDX-License-Identifier: Apache-2.0
// The capture tap + sender against a test peer (agent/tests/test_peer.h):
// mode transitions under a slow peer, resync by hash comparison, resync after
// a crash with a dirty bitmap.
#include "agent/sender.h"

#include <catch2/catch.hpp>
#include <atomic>
#include <chrono>
#include <random>
#include <set>
#include <thread>

#include "agent/resync.h"
#include "agent/tests/test_peer.h"
#include "common/crypto/seal.h"
#include "common/env/env_wrapper.h"
#include "common/env/fault_env.h"
#include "common/tests/test_util.h"
#include "common/wire/block_digest.h"

using namespace std::chrono_literals;
using cdp::agent::CaptureDevice;
using cdp::agent::CaptureMode;
using cdp::agent::Sender;
using cdp::agent::SenderOptions;
using cdp::agent::testing::TestPeer;

namespace {

using cdp::testing::WaitUntil;

constexpr uint64_t kMiB = 1u << 20;

void MakeBacking(cdp::Env* env, const std::string& path, const cdp::Bytes& content) {
  REQUIRE(env->CreateDirs(cdp::DirName(path)).ok());
  cdp::OpenOptions oo;
  oo.create = true;
  oo.truncate = true;
  auto f = std::move(*env->Open(path, oo));
  REQUIRE(f->Write(0, content).ok());
  REQUIRE(f->Sync().ok());
  REQUIRE(env->SyncDir(cdp::DirName(path)).ok());
}

cdp::Bytes ReadAll(cdp::Env* env, const std::string& path) {
  auto r = cdp::ReadWholeFile(env, path);
  REQUIRE(r.ok());
  return *r;
}

std::shared_ptr<CaptureDevice> OpenDevice(cdp::Env* env, uint64_t budget = 64 * kMiB, const std::string& dir = "/d",
                                          std::shared_ptr<const cdp::seal::BlockSealer> sealer = nullptr) {
  CaptureDevice::Options o;
  o.sealer = std::move(sealer);
  o.volume = "vol";
  o.env = env;
  o.clock = cdp::SystemClock::Get();
  o.backing_path = dir + "/vol.img";
  o.bitmap_path = dir + "/vol.bitmap";
  o.budget = budget;
  auto d = CaptureDevice::Open(o);
  REQUIRE(d.ok());
  return *d;
}

SenderOptions Opts(const TestPeer& peer) {
  SenderOptions so;
  so.link.peer.port = peer.port();
  so.link.tenant = "t1";
  so.link.secret = "s3cret";
  so.link.client_id = "test-agent";
  so.link.frame_bytes = 256 * 1024;
  so.link.backoff_min_ms = 10;
  so.link.backoff_max_ms = 200;
  so.link.busy_hold_ms = 10;
  so.checkpoint_interval_ms = 20;
  so.link.connect_timeout_ms = 2000;
  return so;
}

// Everything captured reached the peer and was acknowledged; no resync left.
bool Drained(CaptureDevice& dev, TestPeer& peer) {
  auto st = dev.queue().Stats();
  return st.records == 0 && st.mode == CaptureMode::kData && dev.bitmap().ResyncCount() == 0 &&
         peer.durable() == st.next_seq - 1;
}

cdp::Bytes Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  cdp::Bytes b(n);
  for (auto& x : b) x = uint8_t(rng());
  return b;
}

}  // namespace

TEST_CASE("a slow peer degrades the modes within budget, after drain the replica equals the source",
          "[sender][modes]") {
  auto env = cdp::NewMemEnv();
  const uint64_t size = 32 * kMiB, budget = 2 * kMiB;
  MakeBacking(env.get(), "/d/vol.img", cdp::Bytes(size, 0));
  TestPeer peer("t1", "s3cret", size);
  auto dev = OpenDevice(env.get(), budget);
  Sender sender(dev.get(), Opts(peer));
  sender.Start();
  // Initial sync: every region compared, all equal (both zero).
  REQUIRE(WaitUntil([&] { return Drained(*dev, peer); }));
  REQUIRE(sender.Stats().resync.regions_equal == 32);
  REQUIRE(sender.Stats().resync.shipped_blocks == 0);
  REQUIRE(sender.Stats().resync.read_bytes == size);  // each region read once (MemEnv knows no holes)

  peer.Pause();
  std::mt19937 rng(7);
  auto data = Random(64 * 1024, 1);
  uint64_t peak = 0;
  for (int i = 0; i < 8000; ++i) {
    uint64_t len = 512 * (1 + rng() % 128);
    uint64_t off = (rng() % ((size - len) / 512)) * 512;
    data[0] = uint8_t(i);
    REQUIRE(dev->Write(off, cdp::ByteSpan(data.data(), len), false).ok());
    if (i % 100 == 99) {
      REQUIRE(dev->Flush().ok());
    }
    if (i % 200 == 50) REQUIRE(dev->WriteZeroes(off, 8192, false, true).ok());
    peak = std::max(peak, dev->queue().Stats().memory_bytes);
  }
  auto st = dev->queue().Stats();
  INFO("records " << st.records << " mem " << st.memory_bytes << " acked " << st.acked_seq << " next " << st.next_seq
       << " peer durable " << peer.durable() << " batches " << sender.Stats().batches_sent);
  REQUIRE(st.peak_memory_bytes <= budget);
  REQUIRE(peak <= budget);
  REQUIRE(st.to_metadata == 1);
  REQUIRE(st.to_bitmap == 1);
  REQUIRE(st.flushes_suppressed > 0);
  REQUIRE(dev->bitmap().ResyncCount() > 0);

  peer.Resume();
  REQUIRE(WaitUntil([&] { return Drained(*dev, peer); }));
  REQUIRE(dev->queue().Stats().to_data >= 1);
  REQUIRE(sender.Stats().resync.shipped_blocks > 0);
  REQUIRE(sender.Stats().reread_bytes > 0);
  REQUIRE(peer.Image() == ReadAll(env.get(), "/d/vol.img"));
  // Back in data mode: a flush is a recovery point again.
  uint64_t flushes = peer.count(cdp::proto::RecordKind::kFlush);
  REQUIRE(dev->Write(0, cdp::ByteSpan(data.data(), 4096), true).ok());
  REQUIRE(dev->Flush().ok());
  REQUIRE(WaitUntil([&] { return Drained(*dev, peer); }));
  REQUIRE(peer.count(cdp::proto::RecordKind::kFlush) == flushes + 1);
  sender.Stop();
}

TEST_CASE("resync ships only the blocks that differ", "[sender][resync]") {
  auto env = cdp::NewMemEnv();
  const uint64_t size = 16 * kMiB;
  cdp::Bytes src = Random(size, 3);
  MakeBacking(env.get(), "/d/vol.img", src);
  cdp::Bytes replica = src;
  for (uint64_t r : {3, 7, 11, 15}) replica[r * kMiB + 12345] ^= 0x5a;
  TestPeer peer("t1", "s3cret", size);
  peer.SetImage(replica);
  auto dev = OpenDevice(env.get());
  REQUIRE(dev->bitmap().ResyncCount() == 16);
  Sender sender(dev.get(), Opts(peer));
  sender.Start();
  REQUIRE(WaitUntil([&] { return Drained(*dev, peer); }));
  auto ss = sender.Stats();
  REQUIRE(ss.resync.regions_compared == 16);
  REQUIRE(ss.resync.regions_equal == 12);
  REQUIRE(ss.resync.shipped_blocks == 4);  // one 4 KiB block in each differing region
  REQUIRE(ss.resync.shipped_bytes == 4 * 4096);
  // The regions; the 64 KiB units of the four differing ones (4 regions apart:
  // one request); the 16 leaves of each differing 64 KiB unit (far apart: one
  // request each).
  REQUIRE(ss.resync.hash_requests == 1 + 1 + 4);
  REQUIRE(peer.count(cdp::proto::RecordKind::kData) == 4);
  REQUIRE(peer.Image() == src);
  sender.Stop();
  // The bitmap is clean on disk: a restart resyncs nothing. (The stopped
  // sender no longer touches the device.)
  dev.reset();
  auto again = OpenDevice(env.get());
  REQUIRE(again->bitmap().ResyncCount() == 0);
}

TEST_CASE("after a crash exactly the dirty regions are resynced", "[sender][resync][fault]") {
  auto mem = cdp::NewMemEnv();
  cdp::FaultEnv fault(mem.get());
  const uint64_t size = 16 * kMiB;
  MakeBacking(&fault, "/d/vol.img", cdp::Bytes(size, 0));
  TestPeer peer("t1", "s3cret", size);
  {
    auto dev = OpenDevice(&fault);
    Sender sender(dev.get(), Opts(peer));
    sender.Start();
    // Initial sync done and the clean bitmap persisted.
    REQUIRE(WaitUntil([&] { return Drained(*dev, peer) && dev->bitmap().DirtyCount() == 0; }));
    sender.Stop();
    // Writes the process server never sees, made durable by FLUSH, then the power goes.
    auto data = Random(8192, 9);
    for (uint64_t r : {2, 5, 9}) REQUIRE(dev->Write(r * kMiB + 4096, data, false).ok());
    REQUIRE(dev->Write(5 * kMiB + 65536, data, false).ok());  // a second write into region 5
    REQUIRE(dev->Flush().ok());
    fault.CrashNow();
  }
  REQUIRE(fault.DropUnsyncedData().ok());
  auto dev = OpenDevice(&fault);
  REQUIRE(dev->bitmap().ResyncCount() == 3);
  Sender sender(dev.get(), Opts(peer));
  sender.Start();
  REQUIRE(WaitUntil([&] { return Drained(*dev, peer); }));
  auto ss = sender.Stats();
  REQUIRE(ss.resync.regions_compared == 3);
  // The peer reads zeros there: exactly the written blocks are shipped,
  // without descending (2 in regions 2 and 9, 4 in region 5).
  REQUIRE(ss.resync.shipped_blocks == 8);
  REQUIRE(ss.resync.shipped_records == 4);
  REQUIRE(ss.resync.hash_requests == 3);  // one per run of flagged regions: 2, 5 and 9
  REQUIRE(peer.Image() == ReadAll(&fault, "/d/vol.img"));
  sender.Stop();
}

TEST_CASE("an unanswerable hash request pauses the resync, not the session, and the pause is no longer reported "
          "once answered",
          "[sender][resync]") {
  auto env = cdp::NewMemEnv();
  const uint64_t size = 4 * kMiB;
  cdp::Bytes src = Random(size, 11);
  MakeBacking(env.get(), "/d/vol.img", src);
  TestPeer peer("t1", "s3cret", size);
  peer.RefuseHashes(2);
  auto dev = OpenDevice(env.get());
  SenderOptions so = Opts(peer);
  so.resync.retry_min_ms = 20;
  Sender sender(dev.get(), so);
  sender.Start();
  // Writes flow while the resync waits for the master target.
  cdp::Bytes data(4096, 0x77);
  REQUIRE(dev->Write(8192, data, false).ok());
  REQUIRE(WaitUntil([&] { return Drained(*dev, peer); }));
  // Two refused, then the regions; region 0 holds the captured write at the
  // peer, so it descends into its first 64 KiB unit (whose leaf 2 is equal).
  REQUIRE(peer.hash_requests() == 2 + 1 + 1 + 1);
  REQUIRE(sender.Stats().link.connects == 1);
  REQUIRE(sender.Stats().resync.shipped_blocks == 1023);
  REQUIRE(sender.Stats().resync.shipped_records == 3 + 3);
  REQUIRE(sender.Stats().resync.hash_failed == 2);
  // The pause was reported while it lasted; answered again, nothing is
  // reported (cdpctl status would show a stale error as current).
  CHECK(sender.Stats().resync.last_error.empty());
  CHECK(sender.Stats().link.last_error.empty());
  std::copy(data.begin(), data.end(), src.begin() + 8192);
  REQUIRE(peer.Image() == src);
  sender.Stop();
}

TEST_CASE("resync of k scattered 4 KiB changes ships exactly k blocks", "[sender][resync]") {
  const uint64_t size = 64 * kMiB, blocks = size / 4096;
  const cdp::Bytes src = Random(size, 21);
  for (uint64_t k : {1, 7, 64, 500}) {
    DYNAMIC_SECTION("k = " << k) {
      auto env = cdp::NewMemEnv();
      MakeBacking(env.get(), "/d/vol.img", src);
      // The replica differs from the source in exactly k distinct blocks.
      cdp::Bytes replica = src;
      std::mt19937_64 rng(k);
      std::set<uint64_t> changed;
      while (changed.size() < k) changed.insert(rng() % blocks);
      for (uint64_t b : changed) replica[b * 4096 + rng() % 4096] ^= 0xa5;
      TestPeer peer("t1", "s3cret", size);
      peer.SetImage(replica);
      auto dev = OpenDevice(env.get());
      Sender sender(dev.get(), Opts(peer));
      sender.Start();
      REQUIRE(WaitUntil([&] { return Drained(*dev, peer); }));
      auto ss = sender.Stats();
      REQUIRE(ss.resync.shipped_blocks == k);
      REQUIRE(ss.resync.shipped_bytes == k * 4096);
      REQUIRE(ss.resync.regions_compared == 64);
      REQUIRE(ss.bytes_sent == k * 4096);
      REQUIRE(peer.Image() == src);
      sender.Stop();
    }
  }
}

TEST_CASE("initial sync of an empty sparse volume reads no data", "[sender][resync]") {
  cdp::testing::ScratchDir tmp;
  cdp::Env* env = cdp::DefaultEnv();
  const uint64_t size = 256 * kMiB;
  {
    cdp::OpenOptions oo;
    oo.create = true;
    auto f = env->Open(tmp.path() + "/vol.img", oo);
    REQUIRE(f.ok());
    REQUIRE((*f)->Truncate(size).ok());  // a hole from end to end
  }
  TestPeer peer("t1", "s3cret", size);
  auto dev = OpenDevice(env, 64 * kMiB, tmp.path());
  REQUIRE(dev->bitmap().ResyncCount() == 256);
  Sender sender(dev.get(), Opts(peer));
  sender.Start();
  REQUIRE(WaitUntil([&] { return Drained(*dev, peer); }));
  auto ss = sender.Stats();
  REQUIRE(ss.resync.read_bytes == 0);
  REQUIRE(ss.resync.skipped_bytes == size);
  REQUIRE(ss.resync.regions_equal == 256);
  REQUIRE(ss.resync.shipped_blocks == 0);
  REQUIRE(ss.resync.hash_requests == 4);  // 64 regions per request
  sender.Stop();
}

// The unsafe case of a resync by hashes: a record acknowledged by the process
// server but still in its spool would change the replica away from content
// the source has meanwhile returned to (by a write the stream never saw), so
// an early compare would match and the spooled record would land afterwards.
// The compare asks the replica for at least the resume point: it waits.
TEST_CASE("regression: records still in the spool are never hidden by an equal compare", "[sender][resync]") {
  auto env = cdp::NewMemEnv();
  const uint64_t size = 4 * kMiB;
  MakeBacking(env.get(), "/d/vol.img", cdp::Bytes(size, 0));
  TestPeer peer("t1", "s3cret", size);
  auto dev = OpenDevice(env.get());
  {
    Sender sender(dev.get(), Opts(peer));
    sender.Start();
    REQUIRE(WaitUntil([&] { return Drained(*dev, peer); }));
    // A write acknowledged by the peer but held in its "spool".
    peer.HoldApply(true);
    REQUIRE(dev->Write(1 * kMiB, cdp::Bytes(4096, 0x11), false).ok());
    REQUIRE(WaitUntil([&] { return Drained(*dev, peer); }));
    sender.Stop();
  }
  // The agent restarts (what it knew of its sequences is gone), the source
  // returns to zeros behind the stream's back, and everything is compared
  // again (as after lost history).
  dev.reset();
  {
    cdp::OpenOptions oo;
    auto f = env->Open("/d/vol.img", oo);
    REQUIRE(f.ok());
    REQUIRE((*f)->Write(1 * kMiB, cdp::Bytes(4096, 0)).ok());
  }
  dev = OpenDevice(env.get());
  dev->bitmap().MarkAllCompare();
  Sender sender(dev.get(), Opts(peer));
  sender.Start();
  // The replica has not applied the resume point: asked again and again, never equal.
  REQUIRE(WaitUntil([&] { return peer.behind_answers() >= 3; }));
  REQUIRE(dev->bitmap().ResyncCount() == 4);
  peer.HoldApply(false);
  REQUIRE(WaitUntil([&] { return Drained(*dev, peer); }));
  // We read zeros in region 1 and the replica does not: one kZero record.
  REQUIRE(sender.Stats().resync.shipped_records == 1);
  REQUIRE(sender.Stats().resync.shipped_blocks == 256);
  REQUIRE(peer.Image() == cdp::Bytes(size, 0));
  sender.Stop();
}

TEST_CASE("the resync keeps at most its fill target queued: live writes keep their room", "[sender][resync]") {
  auto env = cdp::NewMemEnv();
  const uint64_t size = 32 * kMiB, budget = 16 * kMiB, fill = 2 * kMiB;
  const cdp::Bytes src = Random(size, 31);
  MakeBacking(env.get(), "/d/vol.img", src);
  TestPeer peer("t1", "s3cret", size);  // reads zeros: all 32 MiB differ
  auto dev = OpenDevice(env.get(), budget);
  SenderOptions so = Opts(peer);
  so.resync.fill_target = fill;
  Sender sender(dev.get(), so);
  sender.Start();
  REQUIRE(WaitUntil([&] { return sender.Stats().resync.shipped_bytes > 0; }));
  // The process server stops taking anything: the resync stops at its fill target.
  peer.Pause();
  REQUIRE(WaitUntil([&] { return sender.Stats().resync.inflight_bytes >= fill - kMiB; }));
  // Live writes still find room in data mode.
  cdp::Bytes data = Random(64 * 1024, 32);
  cdp::Bytes expect = src;
  for (uint64_t i = 0; i < 128; ++i) {  // 8 MiB
    const uint64_t off = (i * 37 % 512) * 65536;
    REQUIRE(dev->Write(off, data, false).ok());
    std::copy(data.begin(), data.end(), expect.begin() + long(off));
    REQUIRE(sender.Stats().resync.inflight_bytes <= fill);
  }
  REQUIRE(dev->queue().Stats().to_metadata == 0);
  REQUIRE(dev->queue().Stats().mode == CaptureMode::kData);
  peer.Resume();
  REQUIRE(WaitUntil([&] { return Drained(*dev, peer); }));
  REQUIRE(dev->queue().Stats().to_metadata == 0);
  REQUIRE(peer.Image() == expect);
  sender.Stop();
}

// A device over `size` random bytes (`seed`) whose every region is flagged
// for a compare.
std::shared_ptr<CaptureDevice> FlaggedDevice(cdp::Env* env, uint64_t size, uint32_t seed) {
  MakeBacking(env, "/d/vol.img", Random(size, seed));
  auto dev = OpenDevice(env);
  auto lk = dev->queue().Lock();
  dev->bitmap().MarkAllCompare();
  return dev;
}

// A HashFn for a replica of `size` bytes that reads zeros everywhere,
// answering at once.
cdp::agent::Resync::HashFn ZeroReplica(uint64_t size) {
  return [size](const cdp::proto::HashRequest& req, cdp::agent::Resync::HashCallback done) {
    cdp::proto::HashResponse r;
    r.region_size = req.region_size;
    r.first_region = req.first_region;
    const uint64_t units = (size + req.region_size - 1) / req.region_size;
    r.hashes.assign(std::min<uint64_t>(req.count, units - req.first_region), cdp::kZeroDigest);
    r.seq = req.min_seq;
    done(r);
  };
}

TEST_CASE("an acknowledgement kicks the resync only while its records are in flight: the kick ends its wait, once",
          "[sender][resync]") {
  auto env = cdp::NewMemEnv();
  auto dev = FlaggedDevice(env.get(), 4 * kMiB, 41);
  cdp::agent::ResyncOptions ro;
  ro.fill_target = kMiB;
  // The replica reads zeros everywhere, answered at once: every block differs.
  cdp::agent::Resync resync(dev.get(), ro, ZeroReplica(4 * kMiB));
  // Nothing in flight: an acknowledgement has nothing to release (no wake-ups
  // for volumes with no resync).
  REQUIRE_FALSE(resync.Kick());
  // Nobody acknowledges: the resync stops at its fill target.
  REQUIRE(WaitUntil([&] {
    auto did = resync.Step();
    REQUIRE(did.ok());
    return !*did && resync.Stats().inflight_bytes > 0;
  }));
  REQUIRE(resync.Stats().inflight_bytes <= ro.fill_target);
  using Clock = std::chrono::steady_clock;
  // Kicked before it waits, and kicked while it waits (whichever comes first).
  for (int round = 0; round < 2; ++round) {
    const auto t0 = Clock::now();
    bool kicked = false;
    std::thread kicker([&] { kicked = resync.Kick(); });
    if (round == 0) kicker.join();
    resync.Wait(60s);
    if (round == 1) kicker.join();
    REQUIRE(kicked);
    REQUIRE(Clock::now() - t0 < 30s);
  }
  // The kick was used up: the next wait lasts its whole time.
  const auto t0 = Clock::now();
  resync.Wait(50ms);
  REQUIRE(Clock::now() - t0 >= 50ms);
}

TEST_CASE("the resync window grows to what was acknowledged in the plan-ahead, within fill target and max",
          "[sender][resync]") {
  auto env = cdp::NewMemEnv();
  auto dev = FlaggedDevice(env.get(), 64 * kMiB, 43);
  cdp::ManualClock clock(1'000'000);
  cdp::agent::ResyncOptions ro;
  ro.fill_target = kMiB;
  ro.fill_max = 8 * kMiB;
  ro.plan_ahead_ms = 100;
  ro.clock = &clock;
  // The replica reads zeros everywhere, answered at once: every block differs.
  cdp::agent::Resync resync(dev.get(), ro, ZeroReplica(64 * kMiB));
  // Steps until the resync holds back (nothing more until an acknowledgement).
  auto settle = [&] {
    for (int i = 0; i < 10'000; ++i) {
      auto did = resync.Step();
      REQUIRE(did.ok());
      if (!*did) return;
    }
    FAIL("the resync never settled");
  };
  auto ack_all = [&] { dev->queue().Ack(dev->queue().next_seq() - 1); };
  settle();
  REQUIRE(resync.Stats().fill_window_bytes == kMiB);
  REQUIRE(resync.Stats().inflight_bytes > 0);
  REQUIRE(resync.Stats().inflight_bytes <= kMiB);
  // The process server acknowledges a whole window every 10 ms, 100 MiB/s:
  // 10 MiB in the plan-ahead, so the window grows to its max.
  for (int round = 0; round < 3; ++round) {
    ack_all();
    clock.Advance(10'000);
    settle();
  }
  CHECK(resync.Stats().fill_window_bytes == 8 * kMiB);
  CHECK(resync.Stats().inflight_bytes > 7 * kMiB);
  CHECK(resync.Stats().inflight_bytes <= 8 * kMiB);
  // 8 MiB acknowledged in 50 ms: 16 MiB in the plan-ahead, still the max.
  ack_all();
  clock.Advance(50'000);
  settle();
  CHECK(resync.Stats().fill_window_bytes == 8 * kMiB);
  // 8 MiB in 200 ms: 4 MiB in the plan-ahead.
  ack_all();
  clock.Advance(200'000);
  settle();
  CHECK(resync.Stats().fill_window_bytes == 4 * kMiB);
  CHECK(resync.Stats().inflight_bytes <= 4 * kMiB);
  // Nothing acknowledged for a quarter of the plan-ahead: back to the fill target.
  clock.Advance(25'000);
  settle();
  CHECK(resync.Stats().fill_window_bytes == kMiB);
  const uint64_t held = resync.Stats().inflight_bytes;
  ack_all();
  settle();  // no time passed: no measurement, the window stays
  CHECK(resync.Stats().fill_window_bytes == kMiB);
  CHECK(resync.Stats().inflight_bytes <= kMiB);
  CHECK(held > kMiB);
}

namespace {

// Counts the bytes read from files whose path ends in "vol.img".
class CountingEnv final : public cdp::EnvWrapper {
 public:
  explicit CountingEnv(cdp::Env* base) : EnvWrapper(base) {}
  cdp::Result<std::unique_ptr<cdp::File>> Open(const std::string& path, const cdp::OpenOptions& opts) override {
    CDP_ASSIGN_OR_RETURN(std::unique_ptr<cdp::File> f, EnvWrapper::Open(path, opts));
    if (!path.ends_with("vol.img")) return f;
    return std::unique_ptr<cdp::File>(new Counting(std::move(f), &read_));
  }
  uint64_t read() const { return read_.load(); }

 private:
  class Counting final : public cdp::FileWrapper {
   public:
    Counting(std::unique_ptr<cdp::File> f, std::atomic<uint64_t>* read) : FileWrapper(std::move(f)), read_(read) {}
    cdp::Status Read(uint64_t offset, size_t n, uint8_t* buf) const override {
      *read_ += n;
      return FileWrapper::Read(offset, n, buf);
    }
    cdp::Result<size_t> ReadUpTo(uint64_t offset, size_t n, uint8_t* buf) const override {
      auto got = FileWrapper::ReadUpTo(offset, n, buf);
      if (got.ok()) *read_ += *got;
      return got;
    }

   private:
    std::atomic<uint64_t>* read_;
  };
  std::atomic<uint64_t> read_{0};
};

}  // namespace

TEST_CASE("initial sync to a replica of zeros reads each block once and ships exactly the non-zero blocks",
          "[sender][resync]") {
  auto mem = cdp::NewMemEnv();
  CountingEnv env(mem.get());
  const uint64_t size = 16 * kMiB;
  cdp::Bytes src = Random(size, 51);
  std::fill(src.begin() + long(2 * kMiB), src.begin() + long(3 * kMiB), 0);  // region 2: zeros
  for (uint64_t block : {3, 4, 100}) {                                        // region 5: three zero blocks
    std::fill_n(src.begin() + long(5 * kMiB + block * 4096), 4096, 0);
  }
  MakeBacking(mem.get(), "/d/vol.img", src);
  TestPeer peer("t1", "s3cret", size);  // reads zeros everywhere
  auto dev = OpenDevice(&env);
  const uint64_t read_before = env.read();
  Sender sender(dev.get(), Opts(peer));
  sender.Start();
  REQUIRE(WaitUntil([&] { return Drained(*dev, peer); }));
  sender.Stop();
  const bool same = peer.Image() == src;
  CHECK(same);
  auto ss = sender.Stats();
  // Once, not once for digests and again to ship (MemEnv knows no holes).
  CHECK(env.read() - read_before == size);
  CHECK(ss.resync.read_bytes == size);
  CHECK(ss.resync.shipped_blocks == 4096 - 256 - 3);
  // A record per region, but three in region 5 (blocks 0-2, 5-99, 101-255).
  CHECK(ss.resync.shipped_records == 14 + 3);
  CHECK(peer.count(cdp::proto::RecordKind::kData) == 14 + 3);
  CHECK(peer.count(cdp::proto::RecordKind::kZero) == 0);
  CHECK(ss.resync.regions_compared == 16);
  CHECK(ss.resync.regions_equal == 1);
  CHECK(ss.resync.regions_differ == 15);
}

TEST_CASE("the resync reads digests once answers come while the replica reads zeros, else ahead of them",
          "[sender][resync]") {
  auto env = cdp::NewMemEnv();
  auto dev = FlaggedDevice(env.get(), 16 * kMiB, 61);
  // Region digests as a replica equal to the source holds them.
  auto leaves = dev->LeafDigests(0, 16 * kMiB, nullptr);
  REQUIRE(leaves.ok());
  auto region_digest = [&](uint64_t region) {
    return cdp::UnitDigest(std::span<const cdp::proto::Hash128>(*leaves).subspan(region * 256, 256));
  };
  // Answers are held until the test gives them.
  std::vector<std::pair<cdp::proto::HashRequest, cdp::agent::Resync::HashCallback>> held;
  cdp::ManualClock clock;
  cdp::agent::ResyncOptions ro;
  ro.batch_regions = 1;
  ro.max_requests = 2;
  ro.clock = &clock;
  ro.max_rate = 1;  // and the clock stands still: nothing is shipped
  cdp::agent::Resync resync(dev.get(), ro,
                            [&](const cdp::proto::HashRequest& req, cdp::agent::Resync::HashCallback done) {
                              held.emplace_back(req, std::move(done));
                            });
  auto answer = [&](bool zeros) {
    REQUIRE_FALSE(held.empty());
    auto [req, done] = std::move(held.front());
    held.erase(held.begin());
    cdp::proto::HashResponse r;
    r.region_size = req.region_size;
    r.first_region = req.first_region;
    r.hashes.push_back(zeros ? cdp::kZeroDigest : region_digest(req.first_region));
    r.seq = req.min_seq;
    done(r);
    REQUIRE(resync.Step().ok());
  };
  REQUIRE(resync.Step().ok());
  REQUIRE(held.size() == 2);
  // Nothing known of the replica yet: no digests read ahead.
  CHECK(resync.Stats().read_bytes == 0);
  // Region 0 reads as zeros: no digests, it will be read as it is shipped;
  // the next request (region 2) goes out without reading ahead.
  answer(true);
  CHECK(resync.Stats().read_bytes == 0);
  CHECK(held.size() == 2);
  // Region 1 holds data (equal to ours): its digests are read now, and ahead
  // of their answers those of region 2 and of the next request (region 3);
  // none of region 0, which waits to be shipped.
  answer(false);
  CHECK(resync.Stats().regions_equal == 1);
  REQUIRE(held.size() == 2);
  CHECK(resync.Stats().read_bytes == 3 * kMiB);
  // Region 2's answer: its digests were read already; region 4's are read ahead.
  answer(false);
  CHECK(resync.Stats().read_bytes == 4 * kMiB);
  CHECK(resync.Stats().regions_equal == 2);
  CHECK(resync.Stats().shipped_bytes == 0);
}

TEST_CASE("an encrypted volume ships only sealed blocks: the peer holds the sealed source, every block opens, and "
          "partial writes travel as whole blocks",
          "[sender][sealed]") {
  auto env = cdp::NewMemEnv();
  const uint64_t size = 4 * kMiB;
  cdp::Bytes src = Random(size, 5);
  std::fill(src.begin() + long(2 * kMiB), src.end(), 0);  // the second half reads as zeros
  MakeBacking(env.get(), "/d/vol.img", src);
  cdp::seal::TenantKey key;
  key.bytes.fill(7);
  auto sealer = *cdp::seal::BlockSealer::Create(*cdp::seal::DeriveVolumeKeys(key, "vol"));
  TestPeer peer("t1", "s3cret", size);
  auto dev = OpenDevice(env.get(), 64 * kMiB, "/d", sealer);
  Sender sender(dev.get(), Opts(peer));
  sender.Start();
  REQUIRE(WaitUntil([&] { return Drained(*dev, peer); }));
  // Partial writes and zeroes: captured as whole blocks.
  cdp::Bytes bytes = Random(1000, 9);
  REQUIRE(dev->Write(3 * 4096 + 100, bytes, false).ok());
  REQUIRE(dev->WriteZeroes(10 * 4096 + 512, 3 * 4096, false, true).ok());
  REQUIRE(dev->Trim(3 * kMiB, 8192, false).ok());
  REQUIRE(dev->Flush().ok());
  REQUIRE(WaitUntil([&] { return Drained(*dev, peer); }));
  sender.Stop();
  cdp::Bytes source = ReadAll(env.get(), "/d/vol.img");
  cdp::Bytes sealed = source;
  REQUIRE(sealer->Seal(0, sealed, nullptr).ok());
  CHECK(peer.Image() == sealed);
  CHECK(peer.count(cdp::proto::RecordKind::kData) == 0);
  CHECK(peer.count(cdp::proto::RecordKind::kZero) == 0);
  CHECK(peer.count(cdp::proto::RecordKind::kTrim) == 0);
  CHECK(peer.count(cdp::proto::RecordKind::kSealed) > 0);
  CHECK(peer.count(cdp::proto::RecordKind::kSealedZero) == 2);  // the zeroed whole blocks, the trim
  // The blocks written after the initial sync open with the volume's keys to the source.
  cdp::Bytes macs = peer.Macs();
  REQUIRE(macs.size() == cdp::seal::MacBytes(size));
  for (uint64_t first : {uint64_t{3}, uint64_t{10}, uint64_t{11}, uint64_t{12}, uint64_t{13}}) {
    INFO("block " << first);
    cdp::Bytes b(sealed.begin() + long(first * 4096), sealed.begin() + long(first * 4096 + 4096));
    REQUIRE(sealer->Open(first * 4096, b, macs.data() + first * 16).ok());
    CHECK(std::equal(b.begin(), b.end(), source.begin() + long(first * 4096)));
  }
  // And no data block of the source travelled in the clear.
  const cdp::Bytes image = peer.Image();
  for (uint64_t b = 0; b < 2 * kMiB / 4096; ++b) {
    if (cdp::IsAllZero(source.data() + b * 4096, 4096)) continue;  // blocks 11 and 12 were zeroed
    CHECK(!std::equal(image.begin() + long(b * 4096), image.begin() + long(b * 4096 + 4096),
                      source.begin() + long(b * 4096)));
  }
}

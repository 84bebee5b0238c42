// SPDX-License-Identifier: Apache-2.0
// CaptureDevice::DigestAtQuietPoint (online verify): a range is hashed in a
// window with no write into it, and the digests it returns are the image at
// the sequence it names; what cannot be compared now is busy, never a digest.
#include "agent/capture_device.h"

#include <catch2/catch.hpp>
#include <functional>
#include <map>
#include <random>

#include "common/env/env_wrapper.h"
#include "common/wire/block_digest.h"

using cdp::agent::CaptureDevice;
using cdp::agent::DirtyBitmap;

namespace {

constexpr uint64_t kMiB = 1u << 20;
constexpr uint64_t kSize = 4 * kMiB;
const std::string kBacking = "/vol/backing.img";

// An Env over MemEnv that calls `on_read` before every read of the backing
// file: a test writes through the device there, i.e. inside a verify window.
// With `fail_writes`, a write of the backing file writes its first half and
// fails (EIO after a partial write).
class ReadHookEnv : public cdp::EnvWrapper {
 public:
  explicit ReadHookEnv(cdp::Env* base) : EnvWrapper(base) {}
  std::function<void()> on_read;
  bool fail_writes = false;

  class HookFile : public cdp::FileWrapper {
   public:
    HookFile(ReadHookEnv* env, std::unique_ptr<cdp::File> f) : FileWrapper(std::move(f)), env_(env) {}
    cdp::Status Read(uint64_t o, size_t n, uint8_t* b) const override {
      env_->Hook(path());
      return FileWrapper::Read(o, n, b);
    }
    cdp::Status Write(uint64_t o, cdp::ByteSpan d) override {
      if (!env_->fail_writes || path() != kBacking) return FileWrapper::Write(o, d);
      CDP_RETURN_IF_ERROR(FileWrapper::Write(o, d.subspan(0, d.size() / 2)));
      return cdp::Status::IOError("injected: write failed half way");
    }

   private:
    ReadHookEnv* env_;
  };

  cdp::Result<std::unique_ptr<cdp::File>> Open(const std::string& p, const cdp::OpenOptions& o) override {
    CDP_ASSIGN_OR_RETURN(auto f, EnvWrapper::Open(p, o));
    return std::unique_ptr<cdp::File>(new HookFile(this, std::move(f)));
  }

 private:
  void Hook(const std::string& path) {
    if (path != kBacking || !on_read || in_hook_) return;
    in_hook_ = true;  // the hook may read the backing file itself (Fixture::DigestNow)
    on_read();
    in_hook_ = false;
  }
  bool in_hook_ = false;
};

struct Fixture {
  std::unique_ptr<cdp::Env> mem = cdp::NewMemEnv();
  ReadHookEnv env{mem.get()};
  cdp::ManualClock clock;
  std::shared_ptr<CaptureDevice> dev;

  explicit Fixture(std::optional<cdp::agent::AnomalyOptions> anomaly = std::nullopt) {
    REQUIRE(env.CreateDirs("/vol").ok());
    cdp::OpenOptions oo;
    oo.create = true;
    auto f = env.Open(kBacking, oo);
    REQUIRE(f.ok());
    REQUIRE((*f)->Truncate(kSize).ok());
    CaptureDevice::Options o;
    o.volume = "vol";
    o.env = &env;
    o.clock = &clock;
    o.backing_path = kBacking;
    o.bitmap_path = "/vol/bitmap";
    o.budget = 16 * kMiB;
    o.region_size = 1u << 20;
    o.anomaly = anomaly;
    auto d = CaptureDevice::Open(o);
    REQUIRE(d.ok());
    dev = *d;
    // The process server told the resume point (numbers are no longer
    // provisional) and the initial sync found every region equal.
    dev->queue().Resume(0);
    for (uint64_t r = 0; r < dev->bitmap().region_count(); ++r) dev->bitmap().ResyncDone(r, 0);
  }

  uint64_t Write(uint64_t off, size_t len, uint8_t fill) {
    cdp::Bytes b(len, fill);
    REQUIRE(dev->Write(off, cdp::ByteSpan(b.data(), b.size()), false).ok());
    return dev->queue().Stats().next_seq - 1;
  }
  cdp::proto::Hash128 DigestNow(uint64_t off, size_t len) {
    cdp::Bytes b(len);
    REQUIRE(dev->ReadBacking(off, len, b.data()).ok());
    return cdp::DigestOf(b.data(), b.size());
  }
};

}  // namespace

TEST_CASE("verify: a quiet region is hashed in one window at the last sequence", "[agent][verify]") {
  Fixture f;
  f.Write(0, 8192, 0x11);
  const uint64_t s = f.Write(kMiB + 4096, 4096, 0x22);
  auto d = f.dev->DigestAtQuietPoint(kMiB, kMiB, 1u << 20, 20, nullptr);
  REQUIRE(d.ok());
  CHECK_FALSE(d->busy);
  CHECK(d->tries == 1);
  CHECK(d->seq == s);
  REQUIRE(d->digests.size() == 1);
  CHECK(d->digests[0] == f.DigestNow(kMiB, kMiB));
  // 4 KiB units of the same window: one sequence for all of them.
  auto leaves = f.dev->DigestAtQuietPoint(kMiB, kMiB, cdp::kLeafSize, 20, nullptr);
  REQUIRE(leaves.ok());
  REQUIRE(leaves->digests.size() == 256);
  CHECK(leaves->digests[0] == cdp::kZeroDigest);
  CHECK(leaves->digests[1] == f.DigestNow(kMiB + 4096, 4096));
  CHECK(cdp::UnitDigest(leaves->digests) == d->digests[0]);
}

TEST_CASE("verify: a region written during its window is hashed again, at the later sequence", "[agent][verify]") {
  Fixture f;
  const uint64_t s1 = f.Write(2 * kMiB, 4096, 0x33);
  // The image of region 2 at every sequence, as the test writes it.
  std::map<uint64_t, cdp::proto::Hash128> image;
  image[s1] = f.DigestNow(2 * kMiB, kMiB);
  int writes = 0;
  f.env.on_read = [&] {
    if (writes >= 2) return;  // the first two windows are disturbed
    ++writes;
    uint64_t s = f.Write(2 * kMiB + 8192 * writes, 4096, uint8_t(0x40 + writes));
    image[s] = f.DigestNow(2 * kMiB, kMiB);
  };
  auto d = f.dev->DigestAtQuietPoint(2 * kMiB, kMiB, 1u << 20, 20, nullptr);
  f.env.on_read = nullptr;
  REQUIRE(d.ok());
  CHECK_FALSE(d->busy);
  CHECK(d->tries == 3);
  CHECK(d->seq == s1 + 2);
  REQUIRE(image.count(d->seq) == 1);
  CHECK(d->digests.at(0) == image[d->seq]);
  CHECK(d->digests.at(0) != image[s1]);

  // A write into another region during the window does not disturb it: the
  // answer is the image at the sequence before that write.
  const uint64_t before = f.dev->queue().Stats().next_seq - 1;
  bool once = false;
  f.env.on_read = [&] {
    if (once) return;
    once = true;
    f.Write(0, 4096, 0x77);
  };
  auto other = f.dev->DigestAtQuietPoint(2 * kMiB, kMiB, 1u << 20, 20, nullptr);
  f.env.on_read = nullptr;
  REQUIRE(other.ok());
  CHECK(other->tries == 1);
  CHECK(other->seq == before);
  CHECK(other->digests.at(0) == image[s1 + 2]);
}

TEST_CASE("verify: a region written in every window is busy, never a digest", "[agent][verify]") {
  Fixture f;
  f.Write(3 * kMiB, 4096, 0x54);  // data to read (a hole may be skipped unread)
  f.env.on_read = [&] { f.Write(3 * kMiB, 4096, 0x55); };
  auto d = f.dev->DigestAtQuietPoint(3 * kMiB, kMiB, 1u << 20, 5, nullptr);
  f.env.on_read = nullptr;
  REQUIRE(d.ok());
  CHECK(d->busy);
  CHECK(d->tries == 5);
  CHECK(d->digests.empty());
  CHECK(d->why.find("written") != std::string::npos);
}

TEST_CASE("verify: a region flagged for resync, or unsent metadata, is busy", "[agent][verify]") {
  Fixture f;
  SECTION("flagged for a resync (a write not captured: bitmap mode)") {
    REQUIRE(f.dev->bitmap().MarkAndPin(kMiB, 4096).ok());
    f.dev->bitmap().AssignResync(kMiB, 4096);
    auto d = f.dev->DigestAtQuietPoint(kMiB, kMiB, 1u << 20, 20, nullptr);
    REQUIRE(d.ok());
    CHECK(d->busy);
    CHECK(d->why.find("resync") != std::string::npos);
    // Its neighbour is still comparable.
    auto n = f.dev->DigestAtQuietPoint(0, kMiB, 1u << 20, 20, nullptr);
    REQUIRE(n.ok());
    CHECK_FALSE(n->busy);
  }
  SECTION("flagged during the window: the epoch moved") {
    f.Write(kMiB, 4096, 0x66);
    bool once = false;
    f.env.on_read = [&] {
      if (once) return;
      once = true;
      f.dev->bitmap().MarkAllCompare();
    };
    auto d = f.dev->DigestAtQuietPoint(kMiB, kMiB, 1u << 20, 20, nullptr);
    f.env.on_read = nullptr;
    REQUIRE(d.ok());
    CHECK(d->busy);
    CHECK(d->tries == 2);  // the second window saw the flag
  }
  SECTION("provisional sequence numbers (before the first resume)") {
    Fixture g;
    auto fresh =
        CaptureDevice::Open({"vol2", &g.env, &g.clock, kBacking, "/vol/bitmap2", 16 * kMiB, 1u << 20, 4096, nullptr, {}});
    REQUIRE(fresh.ok());
    for (uint64_t r = 0; r < (*fresh)->bitmap().region_count(); ++r) (*fresh)->bitmap().ResyncDone(r, 0);
    auto d = (*fresh)->DigestAtQuietPoint(0, kMiB, 1u << 20, 20, nullptr);
    REQUIRE(d.ok());
    CHECK(d->busy);
    CHECK(d->why.find("provisional") != std::string::npos);
  }
}

TEST_CASE("verify: bad ranges are refused", "[agent][verify]") {
  Fixture f;
  CHECK(f.dev->DigestAtQuietPoint(4096, kMiB, 1u << 20, 1, nullptr).status().code() == cdp::Code::kInvalidArgument);
  CHECK(f.dev->DigestAtQuietPoint(0, kMiB, 3000, 1, nullptr).status().code() == cdp::Code::kInvalidArgument);
  CHECK(f.dev->DigestAtQuietPoint(kSize, kMiB, 1u << 20, 1, nullptr).status().code() == cdp::Code::kOutOfRange);
}

TEST_CASE("a write that fails half way flags its region for resync, so what landed is shipped", "[agent][capture]") {
  Fixture f;
  const uint64_t before = f.dev->queue().Stats().next_seq;
  REQUIRE(f.dev->bitmap().ResyncCount() == 0);
  const uint32_t epoch = f.dev->bitmap().ResyncEpoch(1);
  f.env.fail_writes = true;
  cdp::Bytes b(8192, 0x5a);
  auto s = f.dev->Write(kMiB + 4096, cdp::ByteSpan(b.data(), b.size()), false);
  REQUIRE(s.code() == cdp::Code::kIOError);
  f.env.fail_writes = false;
  // Nothing was captured, but half of it is on the source now.
  CHECK(f.dev->queue().Stats().next_seq == before);
  cdp::Bytes now(4096);
  REQUIRE(f.dev->ReadBacking(kMiB + 4096, 4096, now.data()).ok());
  CHECK(now == cdp::Bytes(4096, 0x5a));
  // So the region is compared with the replica again; the others are not.
  CHECK(f.dev->bitmap().ResyncCount() == 1);
  CHECK(f.dev->bitmap().ResyncEpoch(1) == epoch + 1);
  CHECK(f.dev->bitmap().ResyncEpoch(0) == 0);
  // A zero-range write that fails does the same.
  f.env.fail_writes = true;
  REQUIRE(!f.dev->WriteZeroes(3 * kMiB, 8192, false, false).ok());
  f.env.fail_writes = false;
  CHECK(f.dev->bitmap().ResyncCount() == 2);
}

TEST_CASE("capture: a jump to incompressible writes queues an anomaly record naming the last write before it",
          "[agent][capture][anomaly]") {
  cdp::agent::AnomalyOptions ao;
  ao.learning_windows = 5;
  ao.run_windows = 2;
  ao.sample_every = 4;
  Fixture f(ao);
  std::mt19937_64 rng(7);
  uint64_t clean = 0;
  // Ten 1 s windows of 128 KiB of text-like data each, then 1 MiB of random
  // data per window.
  for (int w = 0; w < 10; ++w) {
    for (int i = 0; i < 2; ++i) clean = f.Write(uint64_t(w * 2 + i) * 65536, 65536, uint8_t('a' + w));
    f.clock.Advance(1'000'000);
  }
  uint64_t anomaly_seq = 0;
  for (int w = 0; w < 4 && anomaly_seq == 0; ++w) {
    for (int i = 0; i < 16; ++i) {
      cdp::Bytes b(65536);
      for (auto& x : b) x = uint8_t(rng());
      REQUIRE(f.dev->Write(uint64_t(i) * 65536, cdp::ByteSpan(b.data(), b.size()), false).ok());
    }
    f.clock.Advance(1'000'000);
    std::vector<cdp::agent::QueuedRecord> recs;
    REQUIRE(f.dev->queue().Peek(1, 1ull << 30, 100000, &recs));
    for (const auto& r : recs) {
      if (r.kind != cdp::proto::RecordKind::kAnomaly) continue;
      uint64_t back = 0;
      std::string msg;
      REQUIRE(cdp::proto::DecodeAnomaly(*r.data, &back, &msg));
      CHECK(r.seq - back == clean);
      CHECK(msg.find("incompressible") != std::string::npos);
      anomaly_seq = r.seq;
    }
  }
  REQUIRE(anomaly_seq != 0);
  CHECK(f.dev->queue().Stats().anomalies == 1);
}

// Issue 41 (a leaner agent): the NBD server hands a WRITE's payload over
// (BlockDevice::WriteShared) and the capture queue keeps that buffer as the
// record's data: no copy between the tap and the queue. A plain Write() of a
// span the caller owns is copied.
TEST_CASE("capture: a handed-over write is queued as the very buffer, a span is copied", "[agent][capture]") {
  Fixture f;
  auto buf = std::make_shared<const cdp::Bytes>(8192, uint8_t(0x5a));
  REQUIRE(f.dev->WriteShared(4096, buf, false).ok());
  const uint64_t s1 = f.dev->queue().Stats().next_seq - 1;
  const uint64_t s2 = f.Write(kMiB, 4096, 0x33);
  std::vector<cdp::agent::QueuedRecord> recs;
  REQUIRE(f.dev->queue().Peek(s1, 1 << 20, 16, &recs));
  REQUIRE(recs.size() == 2);
  CHECK(recs[0].seq == s1);
  CHECK(recs[0].has_data);
  CHECK(recs[0].data.get() == buf.get());
  CHECK(recs[1].seq == s2);
  REQUIRE(recs[1].data);
  CHECK(*recs[1].data == cdp::Bytes(4096, 0x33));
  cdp::Bytes back(8192);
  REQUIRE(f.dev->ReadBacking(4096, 8192, back.data()).ok());
  CHECK(back == *buf);
}

// Regression (ASan, bench:agent_bench smoke under make asan): the write that
// reaches the memory budget switches the queue to metadata and the queue
// drops the handed-over buffer; the detector then read the write's bytes
// from that freed buffer. The device now holds the buffer until it returns.
// (The old code fails this test under ASan: heap-use-after-free in
// AnomalyDetector::Incompressible.)
TEST_CASE("capture: the handed-over write that reaches the budget is still read by the detector after the queue drops it",
          "[agent][capture][anomaly]") {
  cdp::agent::AnomalyOptions ao;
  ao.sample_every = 1;  // every block read by the detector
  Fixture f(ao);
  int n = 0;
  while (f.dev->queue().mode() == cdp::agent::CaptureMode::kData) {
    REQUIRE(n < 64);
    // The device holds the only reference.
    REQUIRE(f.dev->WriteShared(uint64_t(n % 4) * kMiB, std::make_shared<const cdp::Bytes>(kMiB, uint8_t(n)), false)
                .ok());
    ++n;
  }
  CHECK(n > 1);
  CHECK(f.dev->anomaly_counters().blocks_sampled == uint64_t(n) * (kMiB / 4096));
  CHECK(f.dev->anomaly_counters().blocks_incompressible == 0);
}

// SPDX-License-Identifier: Apache-2.0
// Recovery points carry the time the protected host wrote them (issue 38 F4):
// two copies fed the same stream at different moments, in different
// batches, list the same points with the same ids and times; retention and
// the history lock count from the apply time; VOLUME@TIME picks the newest
// point written at or before TIME. A stream without flushes gets a point
// every interval too (issue #43), each the volume as of its sequence.
#include <catch2/catch.hpp>

#include "common/base/clock.h"
#include "common/env/env.h"
#include "master-target/replica_volume.h"
#include "master-target/tests/mt_test_util.h"

using namespace cdp;
using namespace cdp::mt;
using namespace cdp::mt::testing;

namespace {

constexpr uint64_t kSize = 256 * 1024;
constexpr uint64_t kSecond = 1'000'000;
constexpr uint64_t kHostStart = 1'700'000'000 * kSecond;  // the agent's clock

VolumeIdentity Ident() {
  VolumeIdentity id;
  id.name = "timed";
  id.size = kSize;
  id.block_size = 4096;
  id.uuid[0] = 0x38;
  id.generation = 1;
  return id;
}

VolumeOptions Opts(Env* env, const Clock* clock, const std::string& dir, const std::string& index) {
  VolumeOptions o;
  o.env = env;
  o.clock = clock;
  o.dir = dir;
  o.index_path = index;
  o.segment_bytes = 64 * 1024;
  o.point_interval_us = 5 * kSecond;
  // This stream flushes every second: its points are at the flushes, as
  // their times below are (points at writes: the last test).
  o.points_require_flush = true;
  return o;
}

// The stream the agent captured: every second a 4 KiB write and a flush,
// a tag every 7 s, stamped with the host's clock.
std::vector<proto::Record> Stream(int seconds) {
  std::vector<proto::Record> s;
  uint64_t seq = 0;
  for (int i = 0; i < seconds; ++i) {
    const uint64_t t = kHostStart + uint64_t(i) * kSecond;
    proto::Record d = DataRecord(++seq, uint64_t(i % 64) * 4096, Bytes(4096, uint8_t(i + 1)));
    d.timestamp_us = t;
    s.push_back(d);
    proto::Record f = FlushRecord(++seq);
    f.timestamp_us = t + 1;
    s.push_back(f);
    if (i % 7 == 6) {
      proto::Record g = TagRecord(++seq, "t" + std::to_string(i));
      g.timestamp_us = t + 2;
      s.push_back(g);
    }
  }
  return s;
}

void Feed(ReplicaVolume& v, const std::vector<proto::Record>& s, size_t batch) {
  for (size_t i = 0; i < s.size(); i += batch) {
    std::vector<proto::Record> b(s.begin() + i, s.begin() + std::min(s.size(), i + batch));
    auto o = v.ApplyBatch(b);
    REQUIRE(o.ok());
    REQUIRE(o->ack);
  }
}

}  // namespace

TEST_CASE("points: two copies fed one stream at different times list the same points, ids and host times",
          "[points]") {
  TempDir tmp;
  auto env = NewMemEnv();
  const std::vector<proto::Record> s = Stream(60);
  // Copy A applies as the host writes; copy B an hour later, all at once
  // after an outage, in other batches.
  ManualClock clock_a, clock_b;
  clock_a.Set(kHostStart + 50'000);
  clock_b.Set(kHostStart + 3600 * kSecond);
  const VolumeIdentity id = Ident();
  auto a = ReplicaVolume::Open(Opts(env.get(), &clock_a, "/a", tmp.path() + "/a.db"), &id);
  auto b = ReplicaVolume::Open(Opts(env.get(), &clock_b, "/b", tmp.path() + "/b.db"), &id);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  for (size_t i = 0; i < s.size(); i += 2) {  // A: one second's records per batch
    clock_a.Advance(kSecond / 2);
    Feed(**a, std::vector<proto::Record>(s.begin() + i, s.begin() + std::min(s.size(), i + 2)), 2);
  }
  Feed(**b, s, 37);
  const auto pa = (*a)->points().List(), pb = (*b)->points().List();
  // Crash points every 5 s of the host's clock (12 in 60 s) and 8 tags.
  size_t crash = 0, tags = 0;
  for (const auto& p : pa) (p.kind == PointKind::kCrash ? crash : tags)++;
  CHECK(crash == 12);
  CHECK(tags == 8);
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    INFO("point " << i);
    CHECK(pa[i].id == pb[i].id);
    CHECK(pa[i].seq == pb[i].seq);
    CHECK(pa[i].time_us == pb[i].time_us);
    CHECK(pa[i].name == pb[i].name);
    // The host's time is the record's; the apply time is each MT's own.
    CHECK(pa[i].time_us == s[pa[i].seq - 1].timestamp_us);
    CHECK(pb[i].applied_us == clock_b.WallMicros());
    CHECK(pa[i].applied_us <= clock_a.WallMicros());
    CHECK(pb[i].applied_us > pa[i].applied_us + 3000 * kSecond);
  }
  // Reopened: the apply time is persisted beside the host's.
  (*b).reset();
  auto b2 = ReplicaVolume::Open(Opts(env.get(), &clock_b, "/b", tmp.path() + "/b.db"), nullptr);
  REQUIRE(b2.ok());
  const auto pb2 = (*b2)->points().List();
  REQUIRE(pb2.size() == pb.size());
  for (size_t i = 0; i < pb.size(); ++i) {
    CHECK(pb2[i].time_us == pb[i].time_us);
    CHECK(pb2[i].applied_us == pb[i].applied_us);
  }
  // VOLUME@TIME: the newest point written at or before it, at both copies.
  const uint64_t t20 = kHostStart + 20 * kSecond + 1;  // the flush of second 20
  auto at_a = PointAtTime(pa, t20), at_b = PointAtTime(pb, t20);
  REQUIRE(at_a);
  REQUIRE(at_b);
  CHECK(at_a->id == at_b->id);
  CHECK(at_a->time_us == t20);
  CHECK(at_a->kind == PointKind::kCrash);
  auto between = PointAtTime(pa, kHostStart + 22 * kSecond);  // the tag t20 at 20 s + 2 us is newer
  REQUIRE(between);
  CHECK(between->name == "t20");
  CHECK_FALSE(PointAtTime(pa, kHostStart));  // before the first point
}

TEST_CASE("points: a host clock stepped back still makes points, and retention counts from the apply time",
          "[points]") {
  TempDir tmp;
  auto env = NewMemEnv();
  ManualClock clock;
  clock.Set(kHostStart);
  VolumeOptions o = Opts(env.get(), &clock, "/v", tmp.path() + "/v.db");
  o.retention.max_age_us = 3600 * kSecond;
  o.retention.lock_us = 0;
  o.segment_bytes = 4096;  // a segment per batch: retention can drop whole ones
  const VolumeIdentity id = Ident();
  auto v = ReplicaVolume::Open(o, &id);
  REQUIRE(v.ok());
  std::vector<proto::Record> s;
  uint64_t seq = 0;
  // A host whose clock says 1970 (or a hostile one): its points are listed
  // with its times, and retention does not take them as ancient.
  for (int i = 0; i < 4; ++i) {
    // Random data over the same block: each batch journals 4 KiB that no
    // compressor shrinks, so segments fill and roll.
    proto::Record d = DataRecord(++seq, 0, RandomBytes(4096, uint64_t(i) + 1));
    d.timestamp_us = 1'000 + uint64_t(i) * 10 * kSecond;
    proto::Record f = FlushRecord(++seq);
    f.timestamp_us = d.timestamp_us + 1;
    REQUIRE((*v)->ApplyBatch({d, f}).ok());
  }
  // The clock steps back to before the last point: a point all the same.
  proto::Record d = DataRecord(++seq, 0, RandomBytes(4096, 99));
  d.timestamp_us = 500;
  proto::Record f = FlushRecord(++seq);
  f.timestamp_us = 501;
  REQUIRE((*v)->ApplyBatch({d, f}).ok());
  auto pts = (*v)->points().List();
  REQUIRE(pts.size() == 5);
  CHECK(pts.back().time_us == 501);
  REQUIRE((*v)->ApplyRetention().ok());
  CHECK((*v)->points().List().size() == 5);
  clock.Advance(3601 * kSecond);  // an hour of the MT's clock: now they age out
  REQUIRE((*v)->ApplyRetention().ok());
  CHECK((*v)->points().List().size() < 5);
}

namespace {
uint64_t Utc(const char* t) {
  auto r = ParseUtcTime(t);
  INFO(t << ": " << r.status().ToString());
  REQUIRE(r.ok());
  return *r;
}
}  // namespace

TEST_CASE("points: UTC times as an operator writes them", "[points]") {
  CHECK(Utc("1970-01-01T00:00:00Z") == 0);
  CHECK(Utc("2026-11-21T23:31:41Z") == 1795303901ull * kSecond);
  CHECK(Utc("2026-11-21 23:31:41") == 1795303901ull * kSecond);
  CHECK(Utc("2026-11-21T23:31") == 1795303860ull * kSecond);
  CHECK(Utc("2024-02-29T12:00:00.25Z") == 1709208000ull * kSecond + 250'000);
  for (const char* bad : {"", "yesterday", "2026-13-01T00:00", "2026-11-21T24:00", "2026-11-21T23:31:41.1234567",
                          "2026-11-21T23:31:41+01:00", "1969-12-31T23:59:59Z", "2026-11-21"}) {
    INFO(bad);
    auto r = ParseUtcTime(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == Code::kInvalidArgument);
  }
}

// Issue #43: an application that never flushes. Writes every 250 ms of the
// host's clock, 4 KiB each at a block of its own (the block of write i holds
// i's bytes), no flush in 60 s.
TEST_CASE("points: a stream without flushes gets a point every interval, the same at every copy, each the volume "
          "as of its sequence",
          "[points]") {
  TempDir tmp;
  auto env = NewMemEnv();
  std::vector<proto::Record> s;
  constexpr int kWrites = 240;
  constexpr uint64_t kBlocks = kSize / 4096;
  for (int i = 0; i < kWrites; ++i) {
    proto::Record d = DataRecord(uint64_t(i) + 1, (uint64_t(i) * 7 % kBlocks) * 4096, RandomBytes(4096, uint64_t(i)));
    d.timestamp_us = kHostStart + uint64_t(i) * kSecond / 4;
    s.push_back(d);
  }
  ManualClock clock;
  clock.Set(kHostStart + 3600 * kSecond);
  const VolumeIdentity id = Ident();
  VolumeOptions oa = Opts(env.get(), &clock, "/a", tmp.path() + "/a.db");
  VolumeOptions ob = Opts(env.get(), &clock, "/b", tmp.path() + "/b.db");
  VolumeOptions oc = Opts(env.get(), &clock, "/c", tmp.path() + "/c.db");
  oa.points_require_flush = ob.points_require_flush = false;
  auto a = ReplicaVolume::Open(oa, &id);
  auto b = ReplicaVolume::Open(ob, &id);
  auto c = ReplicaVolume::Open(oc, &id);  // configured to require flushes
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(c.ok());
  Feed(**a, s, 3);
  Feed(**b, s, 50);
  Feed(**c, s, 50);
  const auto pa = (*a)->points().List(), pb = (*b)->points().List();
  // At the first write, then at the first write of every 5 s of the host's
  // clock: writes 0, 20, 40, ... 220.
  REQUIRE(pa.size() == 12);
  REQUIRE(pb.size() == pa.size());
  for (size_t k = 0; k < pa.size(); ++k) {
    INFO("point " << k);
    CHECK(pa[k].kind == PointKind::kCrash);
    CHECK(pa[k].seq == 20 * k + 1);
    CHECK(pa[k].time_us == kHostStart + 5 * kSecond * k);
    CHECK(pb[k].seq == pa[k].seq);
    CHECK(pb[k].time_us == pa[k].time_us);
    // The image at the point: every write up to its sequence, none after.
    Bytes want(kSize, 0), got(kSize);
    for (uint64_t i = 0; i < pa[k].seq; ++i) {
      const Bytes& d = s[i].data;
      std::copy(d.begin(), d.end(), want.begin() + std::ptrdiff_t(s[i].offset));
    }
    REQUIRE((*a)->ReadAt(pa[k].seq, 0, kSize, got.data()).ok());
    CHECK(got == want);
  }
  CHECK((*c)->points().List().empty());
}

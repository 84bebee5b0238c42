// SPDX-License-Identifier: Apache-2.0
// ReplicaVolume on the Ceph backend (storage/ceph_env.h, the index through
// sqlite's EnvVfs), against the real single-node cluster of
// scripts/ceph-micro.sh ([ceph][e2e]): randomized apply with every point
// equal to the reference image, a second master target taking the volume
// over from the pool alone, rollback, and a power cut at sync points.
#include <catch2/catch.hpp>
#include <random>

#include "common/base/clock.h"
#include "common/env/fault_env.h"
#include "common/store/sqlite_vfs.h"
#include "master-target/replica_volume.h"
#include "master-target/tests/mt_test_util.h"
#include "storage/ceph_env.h"
#include "storage/tests/ceph_cluster.h"

using namespace cdp;
using namespace cdp::mt;
using namespace cdp::mt::testing;

namespace {

constexpr uint64_t kVolSize = 256 * 1024;

VolumeIdentity Ident() {
  VolumeIdentity id;
  id.name = "vol1";
  id.size = kVolSize;
  id.block_size = 4096;
  id.uuid[0] = 0x5e;
  id.generation = 1;
  return id;
}

// One master target's view of the pool: its own Ceph client, Env and VFS.
struct Site {
  std::unique_ptr<storage::CephEnv> env;
  std::unique_ptr<sqlite::EnvVfs> vfs;
};

Site Connect(const storage::testing::CephTestCluster& c, const std::string& prefix, bool take_over) {
  storage::RadosOptions o;
  o.conf_path = c.conf;
  o.client_id = c.client_id;
  storage::CephEnvOptions eo;
  eo.prefix = prefix;
  eo.take_over = take_over;
  auto env = storage::CephEnv::Connect(o, c.pool, eo);
  INFO(env.status().ToString());
  REQUIRE(env.ok());
  Site s;
  s.env = std::move(*env);
  s.vfs = std::make_unique<sqlite::EnvVfs>(s.env.get());
  return s;
}

VolumeOptions Opts(Env* env, const sqlite::EnvVfs& vfs, const Clock* clock) {
  VolumeOptions o;
  o.env = env;
  o.clock = clock;
  o.dir = "tenants/t1/volumes/vol1";
  o.index_path = o.dir + "/index.db";
  o.index_vfs = vfs.name();
  o.segment_bytes = 64 * 1024;
  o.point_interval_us = 0;
  return o;
}

Bytes ReadImage(ReplicaVolume& v, uint64_t point) {
  Bytes b(v.size());
  Status s = v.ReadAt(point, 0, b.size(), b.data());
  INFO(s.ToString());
  REQUIRE(s.ok());
  return b;
}

Bytes ReplicaFile(Env* env) {
  auto f = env->Open("tenants/t1/volumes/vol1/replica.img", OpenOptions{.read_only = true});
  REQUIRE(f.ok());
  Bytes b(kVolSize);
  REQUIRE((*f)->Read(0, kVolSize, b.data()).ok());
  return b;
}

}  // namespace

TEST_CASE("ceph backend: randomized apply, every point equals the reference, a second MT takes over, rollback",
          "[ceph][e2e][volume]") {
  CDP_CEPH_CLUSTER_OR_SKIP(cluster);
  storage::testing::ScopedImages images(*cluster, "mtv");
  const std::string& prefix = images.prefix();
  ManualClock clock;
  StreamGen gen(kVolSize, 11);
  auto batches = gen.Batches(30, 10);
  const VolumeIdentity id = Ident();

  Site first = Connect(*cluster, prefix, false);
  auto v = ReplicaVolume::Open(Opts(first.env.get(), *first.vfs, &clock), &id);
  INFO(v.status().ToString());
  REQUIRE(v.ok());
  for (const auto& b : batches) {
    clock.Advance(1000);
    auto out = (*v)->ApplyBatch(b);
    REQUIRE(out.ok());
    REQUIRE(out->ack);
  }
  REQUIRE((*v)->journal().Segments().size() > 1);
  const auto points = (*v)->points().List();
  REQUIRE(points.size() == gen.points().size());
  for (const auto& p : points) REQUIRE(ReadImage(**v, p.seq) == gen.ImageAt(p.seq));
  REQUIRE(ReplicaFile(first.env.get()) == gen.image());

  // Another master target cannot open the volume for writing while this one holds it.
  Site second = Connect(*cluster, prefix, false);
  auto refused = ReplicaVolume::Open(Opts(second.env.get(), *second.vfs, &clock), nullptr);
  INFO(refused.status().ToString());
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == Code::kBusy);
  // kBusy is what the master target shows as `locked` in /status (issue 38 F7).

  // The first one stops answering with everything still open (as a killed
  // process's handles would stay until its watch times out); a takeover
  // finds everything in the pool and fences the first one.
  Site third = Connect(*cluster, prefix, true);
  auto w = ReplicaVolume::Open(Opts(third.env.get(), *third.vfs, &clock), nullptr);
  INFO(w.status().ToString());
  REQUIRE(w.ok());
  REQUIRE((*w)->applied_seq() == gen.last_seq());
  REQUIRE((*w)->points().List().size() == points.size());
  for (const auto& p : points) REQUIRE(ReadImage(**w, p.seq) == gen.ImageAt(p.seq));

  // Replication goes on at the new MT, then a rollback to a middle point.
  auto more = gen.Batches(5, 6);
  for (const auto& b : more) {
    auto out = (*w)->ApplyBatch(b);
    REQUIRE(out.ok());
    REQUIRE(out->ack);
  }
  REQUIRE(ReadImage(**w, gen.last_seq()) == gen.image());
  const auto& mid = points[points.size() / 2];
  REQUIRE((*w)->Rollback(mid.seq).ok());
  REQUIRE((*w)->GetStatus().rollback_to == mid.seq);
  REQUIRE(ReplicaFile(third.env.get()) == gen.ImageAt(mid.seq));
  // The rollback kept what it rewound: the later points still read as they were.
  for (const auto& p : points) REQUIRE(ReadImage(**w, p.seq) == gen.ImageAt(p.seq));

  // The fenced first MT can apply nothing more.
  std::vector<proto::Record> late{DataRecord(gen.last_seq() + 1, 0, Bytes(4096, 7))};
  auto out = (*v)->ApplyBatch(late);
  CHECK((!out.ok() || !out->ack));
  v->reset();
  REQUIRE(ReplicaFile(third.env.get()) == gen.ImageAt(mid.seq));
}

TEST_CASE("ceph backend: a power cut at sync points of apply loses no acknowledged batch", "[ceph][e2e][crash]") {
  CDP_CEPH_CLUSTER_OR_SKIP(cluster);
  StreamGen gen(kVolSize, 23);
  auto batches = gen.Batches(8, 5);
  const VolumeIdentity id = Ident();
  // Every third sync point (each run costs round trips to the cluster), until a run finishes.
  for (uint64_t n = 0;; n += 3) {
    CAPTURE(n);
    storage::testing::ScopedImages images(*cluster, "mtc");
    const std::string& prefix = images.prefix();
    Site site = Connect(*cluster, prefix, false);
    FaultEnv fault(site.env.get());
    sqlite::EnvVfs vfs(&fault);  // the index crashes with the rest
    ManualClock clock;
    fault.SetCrashAfterSyncs(n);
    uint64_t acked = 0;
    {
      auto v = ReplicaVolume::Open(Opts(&fault, vfs, &clock), &id);
      if (v.ok()) {
        for (const auto& b : batches) {
          auto o = (*v)->ApplyBatch(b);
          if (!o.ok() || !o->ack) break;
          acked = o->durable_seq;
        }
      }
    }
    const bool finished = !fault.crashed();
    REQUIRE(fault.DropUnsyncedData().ok());
    fault.ClearErrors();
    auto v = ReplicaVolume::Open(Opts(&fault, vfs, &clock), &id);
    INFO(v.status().ToString());
    REQUIRE(v.ok());
    const uint64_t durable = (*v)->applied_seq();
    REQUIRE(durable >= acked);
    REQUIRE(ReplicaFile(&fault) == gen.ImageAt(durable));
    for (const auto& b : batches) {
      if (b.back().seq <= durable) continue;
      auto o = (*v)->ApplyBatch(b);
      REQUIRE(o.ok());
      REQUIRE(o->ack);
    }
    REQUIRE(ReplicaFile(&fault) == gen.image());
    for (const auto& p : (*v)->points().List()) REQUIRE(ReadImage(**v, p.seq) == gen.ImageAt(p.seq));
    if (finished) break;
  }
}

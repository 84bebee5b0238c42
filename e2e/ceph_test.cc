// SPDX-License-Identifier: Apache-2.0
// End to end on the Ceph backend (storage = ceph at the master target): the
// real daemons over TLS, the replica, journal and index of the volume in RBD
// images of the run's single-node test cluster (scripts/ceph-micro.sh).
//   - random writes through qemu-io and nbdcopy: the RBD replica equals the
//     source byte for byte; a tag exports equal to its copy; a rollback;
//   - takeover: kill -9 of the MT while the process server streams; a
//     second MT start pointed at the same pool (ceph.take_over) serves the
//     volume; the PS resumes against it; replica == source, and the points
//     taken before export as they were.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "e2e/harness.h"
#include "storage/tests/ceph_cluster.h"

namespace {

using cdp::e2e::Cluster;
using cdp::e2e::ClusterOptions;
using cdp::e2e::RandomWrites;
using cdp::e2e::Sha256File;
using cdp::e2e::Which;
using cdp::storage::testing::CephTestCluster;

std::string CephConfig(const CephTestCluster& ceph, const std::string& prefix) {
  return "storage = ceph\nceph.conf = " + ceph.conf + "\nceph.user = " + ceph.client_id + "\nceph.pool = " + ceph.pool +
         "\nceph.prefix = " + prefix + "\n";
}

// A cluster whose master target keeps its volumes in the test pool, under a
// prefix of the test's own.
std::unique_ptr<Cluster> StartOnCeph(const CephTestCluster& ceph, const std::string& prefix) {
  ClusterOptions o;
  o.mt_extra_config = CephConfig(ceph, prefix);
  auto c = std::make_unique<Cluster>(o);
  bool started = c->Start();
  INFO(c->why());
  REQUIRE(started);
  return c;
}

// The replica image's first `size` bytes, exported by the rbd CLI into `dest`.
bool ExportReplica(const CephTestCluster& ceph, const std::string& prefix, const ClusterOptions& o,
                   const std::string& dest) {
  const std::string image = ceph.pool + "/" + prefix + "~tenants~" + o.tenant + "~volumes~" + o.volume + "~replica.img";
  std::filesystem::remove(dest);
  auto r = cdp::testing::RunCommand(
      {"rbd", "--conf", ceph.conf, "--name", "client." + ceph.admin_id, "export", "--no-progress", image, dest},
      120000);
  INFO(r.output);
  if (r.exit_code != 0) return false;
  std::filesystem::resize_file(dest, o.volume_size);  // the image may be larger than its file
  return true;
}

void RequireClients() {
  for (const char* p : {"qemu-io", "nbdcopy", "sha256sum", "rbd"}) {
    INFO("missing program " << p << " (scripts/install-deps.sh installs it)");
    REQUIRE(cdp::testing::HaveProgram(p));
  }
}

}  // namespace

TEST_CASE("ceph backend: writes reach the RBD replica byte for byte, a tag exports and rolls back", "[e2e][ceph]") {
  CDP_CEPH_CLUSTER_OR_SKIP(ceph);
  RequireClients();
  cdp::storage::testing::ScopedImages images(*ceph, "e2e");
  auto cluster = StartOnCeph(*ceph, images.prefix());
  Cluster& c = *cluster;
  const ClusterOptions& o = c.options();
  const std::string& prefix = images.prefix();
  std::string w = RandomWrites(c.nbd_uri(), o.volume_size, 7, 3, 40, 4 << 20, c.dir());
  INFO(w);
  REQUIRE(w.empty());
  const std::string copy = c.Path("tag.img");
  REQUIRE(cdp::e2e::CopyFile(c.source_path(), copy));
  auto t = c.Cdpctl({"tag", "before"});
  INFO(t.output);
  REQUIRE(t.exit_code == 0);
  w = RandomWrites(c.nbd_uri(), o.volume_size, 8, 2, 40, 1 << 20, c.dir());
  REQUIRE(w.empty());
  bool drained = c.WaitDrained();
  INFO(c.why() << c.Logs());
  REQUIRE(drained);

  auto status = c.StatusOf(Which::kMasterTarget);
  REQUIRE(status.has_value());
  CHECK(status->at("storage").as_string() == "ceph");
  // Nothing of the volume is in the MT's local directory: it is all in the pool.
  REQUIRE_FALSE(std::filesystem::exists(c.Path("mt/tenants/" + o.tenant + "/volumes/" + o.volume)));
  const std::string replica = c.Path("replica-from-rbd.img");
  REQUIRE(ExportReplica(*ceph, prefix, o, replica));
  REQUIRE(Sha256File(replica) == Sha256File(c.source_path()));
  REQUIRE(Sha256File(copy) != Sha256File(c.source_path()));

  int64_t id = c.TagPointId("before");
  REQUIRE(id >= 0);
  const std::string out = c.Path("export.img");
  bool copied = c.CopyExport(std::to_string(id), out);
  INFO(c.why());
  REQUIRE(copied);
  REQUIRE(Sha256File(out) == Sha256File(copy));

  auto rb = c.Cdpctl({"rollback", o.volume, "--to", std::to_string(id)});
  INFO(rb.output);
  REQUIRE(rb.exit_code == 0);
  REQUIRE(ExportReplica(*ceph, prefix, o, replica));
  REQUIRE(Sha256File(replica) == Sha256File(copy));
}

TEST_CASE("ceph backend: kill -9 of the MT, a second MT takes the volume over from the pool, the PS resumes",
          "[e2e][ceph][crash]") {
  CDP_CEPH_CLUSTER_OR_SKIP(ceph);
  RequireClients();
  cdp::storage::testing::ScopedImages images(*ceph, "tko");
  auto cluster = StartOnCeph(*ceph, images.prefix());
  Cluster& c = *cluster;
  const ClusterOptions& o = c.options();
  const std::string& prefix = images.prefix();
  std::string w = RandomWrites(c.nbd_uri(), o.volume_size, 21, 2, 40, 2 << 20, c.dir());
  REQUIRE(w.empty());
  const std::string copy = c.Path("tag.img");
  REQUIRE(cdp::e2e::CopyFile(c.source_path(), copy));
  auto t = c.Cdpctl({"tag", "kept"});
  REQUIRE(t.exit_code == 0);
  REQUIRE(c.WaitDrained());
  const int64_t id = c.TagPointId("kept");
  REQUIRE(id >= 0);

  // More writes; MT 1 dies while the process server is still shipping them.
  w = RandomWrites(c.nbd_uri(), o.volume_size, 22, 3, 60, 4 << 20, c.dir());
  REQUIRE(w.empty());
  REQUIRE(c.Kill9(Which::kMasterTarget));

  // MT 2: the same pool and prefix, taking over the locks MT 1 held (its
  // Ceph client is blocklisted); the same address, so the PS reconnects.
  {
    // Before any [section] of the file.
    const std::string path = c.Path("etc/master-target.conf");
    std::ifstream in(path);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream conf(path, std::ios::trunc);
    conf << "ceph.take_over = true\n" << text;
    REQUIRE(conf.good());
  }
  bool restarted = c.Restart(Which::kMasterTarget);
  INFO(c.why() << c.Logs(6000));
  REQUIRE(restarted);
  w = RandomWrites(c.nbd_uri(), o.volume_size, 23, 1, 30, 0, c.dir());
  REQUIRE(w.empty());
  bool drained = c.WaitDrained(std::chrono::seconds(180));
  INFO(c.why() << c.Logs());
  REQUIRE(drained);
  const std::string replica = c.Path("replica-from-rbd.img");
  REQUIRE(ExportReplica(*ceph, prefix, o, replica));
  REQUIRE(Sha256File(replica) == Sha256File(c.source_path()));
  // The point taken at MT 1 exports from MT 2 as it was.
  const std::string out = c.Path("export.img");
  bool copied = c.CopyExport(std::to_string(id), out);
  INFO(c.why());
  REQUIRE(copied);
  REQUIRE(Sha256File(out) == Sha256File(copy));
}

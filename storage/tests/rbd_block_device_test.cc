// SPDX-License-Identifier: Apache-2.0
// RbdBlockDevice: an RBD image behind the BlockDevice interface, called
// directly and exported by the NbdServer to a real client (qemu-io).
#include "storage/rbd_block_device.h"

#include <catch2/catch.hpp>
#include <fstream>
#include <random>
#include <thread>

#include "common/nbd_server.h"
#include "common/tests/test_util.h"
#include "storage/tests/ceph_cluster.h"

namespace cdp::storage {
namespace {

using testing::UniqueName;

constexpr uint64_t kMiB = 1 << 20;

Bytes Pattern(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  Bytes b(n);
  for (auto& x : b) x = uint8_t(rng());
  return b;
}

struct DeviceFixture {
  explicit DeviceFixture(const testing::CephTestCluster& c, uint64_t size) : name(UniqueName("dev")) {
    RadosOptions o;
    o.conf_path = c.conf;
    o.client_id = c.client_id;
    auto cluster = RadosCluster::Connect(o);
    INFO(cluster.status().ToString());
    REQUIRE(cluster.ok());
    auto p = (*cluster)->OpenPool(c.pool);
    REQUIRE(p.ok());
    pool = *p;
    REQUIRE(pool->CreateImage(name, size, {.order = 20}).ok());
    auto img = RbdImage::Open(pool, name);
    REQUIRE(img.ok());
    image = std::move(*img);
    auto d = RbdBlockDevice::Create(image, {});
    INFO(d.status().ToString());
    REQUIRE(d.ok());
    dev = *d;
  }
  ~DeviceFixture() {
    dev.reset();
    image.reset();
    (void)pool->RemoveImage(name);
  }
  std::string name;
  std::shared_ptr<RadosPool> pool;
  std::shared_ptr<RbdImage> image;
  std::shared_ptr<RbdBlockDevice> dev;
};

TEST_CASE("rbd block device reads, writes, zeroes and flushes through BlockDevice", "[ceph][e2e][rbd]") {
  CDP_CEPH_CLUSTER_OR_SKIP(cluster);
  DeviceFixture fx(*cluster, 6 * kMiB);
  BlockDevice& dev = *fx.dev;
  CHECK(dev.size() == 6 * kMiB);
  CHECK(!dev.read_only());
  const auto f = dev.features();
  CHECK((f.flush && f.fua && f.trim && f.write_zeroes && f.multi_conn));
  CHECK(dev.preferred_block_size() == 4096);

  const Bytes a = Pattern(2 * kMiB, 5);
  REQUIRE(dev.Write(kMiB - 4096, a, /*fua=*/true).ok());
  Bytes b(a.size());
  REQUIRE(dev.Read(kMiB - 4096, uint32_t(b.size()), b.data()).ok());
  CHECK(b == a);
  REQUIRE(dev.Trim(kMiB, 4096, false).ok());
  REQUIRE(dev.WriteZeroes(2 * kMiB, 8192, true, /*may_trim=*/false).ok());
  REQUIRE(dev.Flush().ok());
  Bytes expect = a;
  std::fill(expect.begin() + 4096, expect.begin() + 4096 + 4096, 0);
  std::fill(expect.begin() + kMiB + 4096, expect.begin() + kMiB + 4096 + 8192, 0);
  REQUIRE(dev.Read(kMiB - 4096, uint32_t(b.size()), b.data()).ok());
  CHECK(b == expect);

  // Read-only: by option, and from a read-only image.
  auto ro = RbdBlockDevice::Create(fx.image, {.read_only = true});
  REQUIRE(ro.ok());
  CHECK((*ro)->read_only());
  CHECK((*ro)->Write(0, a, false).code() == Code::kPermissionDenied);
  CHECK(RbdBlockDevice::Create(fx.image, {.preferred_block_size = 1000}).status().code() == Code::kInvalidArgument);
}

TEST_CASE("an rbd image exported by the NbdServer is written and read by qemu-io", "[ceph][e2e][rbd][nbd]") {
  CDP_CEPH_CLUSTER_OR_SKIP(cluster);
  INFO("qemu-io is not installed (Debian: qemu-utils)");
  REQUIRE(cdp::testing::HaveProgram("qemu-io"));
  DeviceFixture fx(*cluster, 16 * kMiB);
  NbdServerOptions o;
  o.tcp_port = 0;
  NbdServer server(o);
  REQUIRE(server.AddExport("rbd", fx.dev, "an RBD image").ok());
  REQUIRE(server.Start().ok());
  const std::string url = "nbd://127.0.0.1:" + std::to_string(server.port()) + "/rbd";

  struct W {
    uint64_t off;
    uint64_t len;
    int pat;
  };
  const std::vector<W> ws = {
      {0, 65536, 0xab}, {kMiB - 512, 4096, 0x11}, {(9 << 20) + 512, 1 << 20, 0x22}, {16 * kMiB - 4096, 4096, 0x33}};
  std::vector<std::string> cmd = {"qemu-io", "-f", "raw", url};
  for (const auto& w : ws) {
    cmd.push_back("-c");
    cmd.push_back("write -P " + std::to_string(w.pat) + " " + std::to_string(w.off) + " " + std::to_string(w.len));
  }
  cmd.insert(cmd.end(), {"-c", "flush", "-c", "write -z 4096 4096"});
  for (const auto& w : ws) {
    cmd.push_back("-c");
    cmd.push_back("read -P " + std::to_string(w.off == 0 ? 0 : w.pat) + " " +
                  std::to_string(w.off == 0 ? 4096 : w.off) + " " + std::to_string(w.off == 0 ? 4096 : w.len));
  }
  auto r = cdp::testing::RunCommand(cmd, 120000);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("failed") == std::string::npos);
  server.Stop();

  // The image itself holds what the client wrote.
  for (const auto& w : ws) {
    Bytes b(w.len);
    REQUIRE(fx.image->Read(w.off, b).ok());
    Bytes expect(w.len, uint8_t(w.pat));
    if (w.off == 0) std::fill(expect.begin() + 4096, expect.begin() + 8192, 0);
    CHECK(b == expect);
  }
}

TEST_CASE("nbdcopy copies an image into and out of an rbd export over several connections", "[ceph][e2e][rbd][nbd]") {
  CDP_CEPH_CLUSTER_OR_SKIP(cluster);
  INFO("nbdcopy is not installed (Debian: libnbd-bin)");
  REQUIRE(cdp::testing::HaveProgram("nbdcopy"));
  constexpr uint64_t kSize = 24 * kMiB;
  DeviceFixture fx(*cluster, kSize);
  NbdServerOptions o;
  o.tcp_port = 0;
  o.worker_threads = 4;
  NbdServer server(o);
  REQUIRE(server.AddExport("rbd", fx.dev).ok());
  REQUIRE(server.Start().ok());
  const std::string url = "nbd://127.0.0.1:" + std::to_string(server.port()) + "/rbd";

  cdp::testing::ScratchDir dir;
  const std::string in = dir.Join("in.img"), out = dir.Join("out.img");
  Bytes data = Pattern(kSize, 77);
  std::fill(data.begin() + 3 * kMiB, data.begin() + 5 * kMiB, 0);  // a zero run
  {
    std::ofstream f(in, std::ios::binary);
    f.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size()));
  }
  auto r = cdp::testing::RunCommand({"nbdcopy", in, url}, 120000);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  r = cdp::testing::RunCommand({"nbdcopy", url, out}, 120000);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  // nbdcopy opened several connections: the device advertises CAN_MULTI_CONN.
  CHECK(server.ExportStats("rbd")->connections_total >= 2);
  server.Stop();

  std::ifstream f(out, std::ios::binary);
  Bytes back((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  CHECK(back.size() == kSize);
  CHECK(back == data);
  Bytes direct(kSize);
  REQUIRE(fx.image->Read(0, direct).ok());
  CHECK(direct == data);
}

TEST_CASE("one rbd image handle serves writers on several threads at once", "[ceph][e2e][rbd]") {
  CDP_CEPH_CLUSTER_OR_SKIP(cluster);
  constexpr int kThreads = 4, kWrites = 32;
  constexpr uint64_t kSlice = 2 * kMiB;
  DeviceFixture fx(*cluster, kThreads * kSlice);
  std::vector<Status> results(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Thread t owns [t*kSlice, (t+1)*kSlice) and fills it 64 KiB at a time.
      for (int i = 0; i < kWrites && results[t].ok(); ++i) {
        results[t] = fx.image->Write(t * kSlice + uint64_t(i) * 65536, Pattern(65536, uint32_t(t * 1000 + i)));
      }
      if (results[t].ok()) results[t] = fx.image->Flush();
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    INFO("thread " << t << ": " << results[t].ToString());
    CHECK(results[t].ok());
  }
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kWrites; ++i) {
      Bytes b(65536);
      REQUIRE(fx.image->Read(t * kSlice + uint64_t(i) * 65536, b).ok());
      CHECK(b == Pattern(65536, uint32_t(t * 1000 + i)));
    }
  }
}

}  // namespace
}  // namespace cdp::storage

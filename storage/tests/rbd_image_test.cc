// SPDX-License-Identifier: Apache-2.0
// RadosCluster, RadosPool and RbdImage against the real single-node cluster
// of scripts/ceph-micro.sh ([ceph][e2e]), plus the error mapping alone.
#include "storage/rbd_image.h"

#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <fstream>
#include <random>
#include <thread>
#include <vector>

#include "common/tests/test_util.h"
#include "storage/tests/ceph_cluster.h"

namespace cdp::storage {
namespace {

using testing::CephTestCluster;
using testing::UniqueName;

constexpr uint64_t kMiB = 1 << 20;

Bytes Pattern(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  Bytes b(n);
  for (auto& x : b) x = uint8_t(rng());
  return b;
}

std::shared_ptr<RadosCluster> ConnectAs(const CephTestCluster& c, const std::string& id) {
  RadosOptions o;
  o.conf_path = c.conf;
  o.client_id = id;
  auto cluster = RadosCluster::Connect(o);
  INFO(cluster.status().ToString());
  REQUIRE(cluster.ok());
  return *cluster;
}

std::shared_ptr<RadosPool> OpenTestPool(const CephTestCluster& c) {
  auto pool = ConnectAs(c, c.client_id)->OpenPool(c.pool);
  INFO(pool.status().ToString());
  REQUIRE(pool.ok());
  return *pool;
}

// Creates an image and removes it at the end of the test.
struct TempImage {
  TempImage(std::shared_ptr<RadosPool> p, uint64_t size, RbdImageOptions options = {})
      : pool(std::move(p)), name(UniqueName("img")) {
    auto s = pool->CreateImage(name, size, options);
    INFO(s.ToString());
    REQUIRE(s.ok());
  }
  ~TempImage() { (void)pool->RemoveImage(name); }
  std::unique_ptr<RbdImage> Open() {
    auto img = RbdImage::Open(pool, name);
    INFO(img.status().ToString());
    REQUIRE(img.ok());
    return std::move(*img);
  }
  std::shared_ptr<RadosPool> pool;
  std::string name;
};

Bytes ReadBack(RbdImage& img, uint64_t offset, size_t len) {
  Bytes b(len, 0xee);
  auto s = img.Read(offset, b);
  INFO(s.ToString());
  REQUIRE(s.ok());
  return b;
}

struct Extent {
  uint64_t offset;
  size_t len;
};

// Aligned and unaligned, inside one RADOS object and across object borders
// (the images below use 1 MiB objects), at the very start and the very end.
const std::vector<Extent> kScattered = {
    {0, 4096},
    {4096 * 3 + 17, 1000},
    {kMiB - 512, 1024},              // across the first object border
    {5 * kMiB + 123, 3 * kMiB + 7},  // spans several objects
    {13 * kMiB, 64 * 1024},
    {31 * kMiB - 4096, 4096},  // the last 4 KiB of a 31 MiB image
};

TEST_CASE("ceph error codes map to Status codes", "[storage][rbd]") {
  CHECK(FromCephError(0, "x").ok());
  CHECK(FromCephError(5, "x").ok());
  CHECK(FromCephError(-ENOENT, "open").code() == Code::kNotFound);
  CHECK(FromCephError(-EEXIST, "create").code() == Code::kAlreadyExists);
  CHECK(FromCephError(-ETIMEDOUT, "connect").code() == Code::kUnavailable);
  CHECK(FromCephError(-ETIMEDOUT, "connect").retryable());
  CHECK(FromCephError(-ENOTCONN, "connect").code() == Code::kUnavailable);
  CHECK(FromCephError(-EACCES, "auth").code() == Code::kPermissionDenied);
  CHECK(FromCephError(-EPERM, "auth").code() == Code::kPermissionDenied);
  CHECK(FromCephError(-EROFS, "write").code() == Code::kPermissionDenied);
  CHECK(FromCephError(-ENOSPC, "write").code() == Code::kNoSpace);
  CHECK(FromCephError(-EDQUOT, "write").code() == Code::kNoSpace);
  CHECK(FromCephError(-EBUSY, "remove").code() == Code::kBusy);
  CHECK(FromCephError(-EINVAL, "x").code() == Code::kInvalidArgument);
  CHECK(FromCephError(-EIO, "read").code() == Code::kIOError);
  CHECK(FromCephError(-ENOENT, "rbd: open image rbd/a").message() ==
        "rbd: open image rbd/a: No such file or directory");
}

// Regression test for the crash in librados' io_context_pool thread: librados
// (Boost 1.74) bound to this binary's Boost.Asio 1.81 template statics, which
// a binary exports when a shared library defines them too. storage/CMakeLists.txt
// links every user of cdp_storage with --exclude-libs,ALL.
TEST_CASE("a binary linking cdp_storage exports no Boost.Asio symbol for librados to bind to", "[storage][rbd]") {
  // Not "/proc/self/exe" on nm's command line: that would be nm itself.
  char self[4096] = {};
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  REQUIRE(n > 0);
  auto r = cdp::testing::RunCommand({"nm", "-D", "--defined-only", std::string(self, size_t(n))}, 30000);
  INFO(r.output.substr(0, 2000));
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("_ZN5boost4asio") == std::string::npos);
  CHECK(r.output.find("_ZGVN5boost4asio") == std::string::npos);
}

TEST_CASE("rbd image write patterns at scattered offsets and read them back byte-equal", "[ceph][e2e][rbd]") {
  CDP_CEPH_CLUSTER_OR_SKIP(cluster);
  TempImage t(OpenTestPool(*cluster), 31 * kMiB, RbdImageOptions{.order = 20});
  auto img = t.Open();
  auto size = img->Size();
  REQUIRE(size.ok());
  CHECK(*size == 31 * kMiB);
  CHECK(img->name() == t.name);

  // A fresh image reads as zeros.
  CHECK(ReadBack(*img, 7 * kMiB, 8192) == Bytes(8192, 0));
  uint32_t seed = 1;
  for (const auto& e : kScattered) REQUIRE(img->Write(e.offset, Pattern(e.len, seed++)).ok());
  REQUIRE(img->Flush().ok());
  seed = 1;
  for (const auto& e : kScattered) {
    INFO("extent at " << e.offset << " +" << e.len);
    CHECK(ReadBack(*img, e.offset, e.len) == Pattern(e.len, seed++));
  }
  // Around the writes nothing changed.
  CHECK(ReadBack(*img, 4096, 4096 * 2) == Bytes(4096 * 2, 0));
  CHECK(ReadBack(*img, 20 * kMiB, 4096) == Bytes(4096, 0));
  // A whole-image read agrees with the extents.
  Bytes all = ReadBack(*img, 0, 31 * kMiB);
  seed = 1;
  for (const auto& e : kScattered) {
    CHECK(Bytes(all.begin() + e.offset, all.begin() + e.offset + e.len) == Pattern(e.len, seed++));
  }

  // Outside the image: kOutOfRange, and nothing is written.
  CHECK(img->Write(31 * kMiB - 100, Pattern(200, 9)).code() == Code::kOutOfRange);
  Bytes b(200);
  CHECK(img->Read(31 * kMiB - 100, b).code() == Code::kOutOfRange);
  CHECK(img->Read(40 * kMiB, b).code() == Code::kOutOfRange);
}

TEST_CASE("rbd image discard and write-zeroes read back zeros at any alignment", "[ceph][e2e][rbd]") {
  CDP_CEPH_CLUSTER_OR_SKIP(cluster);
  TempImage t(OpenTestPool(*cluster), 8 * kMiB, RbdImageOptions{.order = 20});
  auto img = t.Open();
  const Bytes full = Pattern(8 * kMiB, 42);
  REQUIRE(img->Write(0, full).ok());
  REQUIRE(img->Flush().ok());

  Bytes expect = full;
  auto zero = [&](uint64_t off, uint64_t len) { std::fill(expect.begin() + off, expect.begin() + off + len, 0); };
  // Inside one object, unaligned: below librbd's discard granularity.
  REQUIRE(img->Discard(1000, 3000).ok());
  zero(1000, 3000);
  // Whole objects plus ragged edges.
  REQUIRE(img->Discard(kMiB + 4096 + 5, 3 * kMiB).ok());
  zero(kMiB + 4096 + 5, 3 * kMiB);
  // Kept allocated (NO_HOLE).
  REQUIRE(img->WriteZeroes(6 * kMiB + 1, 65536).ok());
  zero(6 * kMiB + 1, 65536);
  REQUIRE(img->Flush().ok());
  CHECK(ReadBack(*img, 0, 8 * kMiB) == expect);
  CHECK(img->Discard(8 * kMiB - 10, 20).code() == Code::kOutOfRange);
}

TEST_CASE("rbd image resize grows with zeros and shrinking drops the tail", "[ceph][e2e][rbd]") {
  CDP_CEPH_CLUSTER_OR_SKIP(cluster);
  TempImage t(OpenTestPool(*cluster), 4 * kMiB, RbdImageOptions{.order = 20});
  auto img = t.Open();
  const Bytes head = Pattern(4 * kMiB, 7);
  REQUIRE(img->Write(0, head).ok());

  REQUIRE(img->Resize(10 * kMiB).ok());
  CHECK(*img->Size() == 10 * kMiB);
  CHECK(ReadBack(*img, 0, 4 * kMiB) == head);
  CHECK(ReadBack(*img, 4 * kMiB, 6 * kMiB) == Bytes(6 * kMiB, 0));
  REQUIRE(img->Write(9 * kMiB, Pattern(4096, 8)).ok());  // now inside

  REQUIRE(img->Resize(2 * kMiB + 4096).ok());
  CHECK(*img->Size() == 2 * kMiB + 4096);
  Bytes b(4096);
  CHECK(img->Read(9 * kMiB, b).code() == Code::kOutOfRange);
  CHECK(ReadBack(*img, 0, 2 * kMiB + 4096) == Bytes(head.begin(), head.begin() + 2 * kMiB + 4096));

  // Growing again: the dropped tail is gone, zeros there.
  REQUIRE(img->Resize(4 * kMiB).ok());
  CHECK(ReadBack(*img, 2 * kMiB + 4096, 2 * kMiB - 4096) == Bytes(2 * kMiB - 4096, 0));
  REQUIRE(img->Flush().ok());
}

TEST_CASE("rbd image flushed data is there after close and a new connection", "[ceph][e2e][rbd]") {
  CDP_CEPH_CLUSTER_OR_SKIP(cluster);
  const std::string name = UniqueName("reopen");
  {
    auto pool = OpenTestPool(*cluster);
    REQUIRE(pool->CreateImage(name, 16 * kMiB).ok());
    auto img = RbdImage::Open(pool, name);
    REQUIRE(img.ok());
    uint32_t seed = 100;
    for (const auto& e : kScattered) {
      if (e.offset + e.len <= 16 * kMiB) REQUIRE((*img)->Write(e.offset, Pattern(e.len, seed++)).ok());
    }
    REQUIRE((*img)->Flush().ok());
    // The image handle, the pool and the connection all go away here.
  }
  auto pool = OpenTestPool(*cluster);  // a new RadosCluster: a new cephx session
  auto names = pool->ListImages();
  REQUIRE(names.ok());
  CHECK(std::find(names->begin(), names->end(), name) != names->end());
  {
    auto img = RbdImage::Open(pool, name, {.read_only = true});
    REQUIRE(img.ok());
    CHECK((*img)->read_only());
    uint32_t seed = 100;
    for (const auto& e : kScattered) {
      if (e.offset + e.len > 16 * kMiB) continue;
      INFO("extent at " << e.offset << " +" << e.len);
      CHECK(ReadBack(**img, e.offset, e.len) == Pattern(e.len, seed++));
    }
    // A read-only handle refuses every change.
    CHECK((*img)->Write(0, Pattern(10, 1)).code() == Code::kPermissionDenied);
    CHECK((*img)->Discard(0, 10).code() == Code::kPermissionDenied);
    CHECK((*img)->Resize(kMiB).code() == Code::kPermissionDenied);
  }
  REQUIRE(pool->RemoveImage(name).ok());
  names = pool->ListImages();
  REQUIRE(names.ok());
  CHECK(std::find(names->begin(), names->end(), name) == names->end());
}

TEST_CASE("rados object put, get, replace and remove round trip", "[ceph][e2e][rados]") {
  CDP_CEPH_CLUSTER_OR_SKIP(cluster);
  auto pool = OpenTestPool(*cluster);
  const std::string obj = UniqueName("state");
  CHECK(pool->GetObject(obj).status().code() == Code::kNotFound);

  const Bytes v1 = Pattern(300, 1);
  REQUIRE(pool->PutObject(obj, v1).ok());
  auto got = pool->GetObject(obj);
  REQUIRE(got.ok());
  CHECK(*got == v1);

  // Replaced whole: a shorter value leaves nothing of the longer one.
  const Bytes v2 = Pattern(17, 2);
  REQUIRE(pool->PutObject(obj, v2).ok());
  got = pool->GetObject(obj);
  REQUIRE(got.ok());
  CHECK(*got == v2);

  // Larger than the first read guess (64 KiB), and the size cap.
  const Bytes v3 = Pattern(200 * 1024 + 3, 3);
  REQUIRE(pool->PutObject(obj, v3).ok());
  got = pool->GetObject(obj);
  REQUIRE(got.ok());
  CHECK(*got == v3);
  CHECK(pool->GetObject(obj, 1024).status().code() == Code::kOutOfRange);

  // Empty is a value too.
  REQUIRE(pool->PutObject(obj, Bytes{}).ok());
  got = pool->GetObject(obj);
  REQUIRE(got.ok());
  CHECK(got->empty());

  REQUIRE(pool->RemoveObject(obj).ok());
  CHECK(pool->GetObject(obj).status().code() == Code::kNotFound);
  CHECK(pool->RemoveObject(obj).code() == Code::kNotFound);
}

TEST_CASE("a missing image or pool is kNotFound and a taken name kAlreadyExists", "[ceph][e2e][rbd]") {
  CDP_CEPH_CLUSTER_OR_SKIP(cluster);
  auto pool = OpenTestPool(*cluster);
  const std::string name = UniqueName("missing");
  auto img = RbdImage::Open(pool, name);
  CHECK(img.status().code() == Code::kNotFound);
  CHECK(img.status().message().find(name) != std::string::npos);
  CHECK(pool->RemoveImage(name).code() == Code::kNotFound);

  auto other = pool->cluster()->OpenPool("no-such-pool");
  CHECK(other.status().code() == Code::kNotFound);

  TempImage t(pool, kMiB);
  CHECK(pool->CreateImage(t.name, kMiB).code() == Code::kAlreadyExists);
  CHECK(pool->CreateImage(UniqueName("bad-order"), kMiB, {.order = 40}).code() == Code::kInvalidArgument);
}

TEST_CASE("cephx refuses a client whose key is wrong", "[ceph][e2e][rados]") {
  CDP_CEPH_CLUSTER_OR_SKIP(cluster);
  cdp::testing::ScratchDir dir;
  const std::string keyring = dir.Join("wrong.keyring");
  auto r = cdp::testing::RunCommand(
      {"ceph-authtool", "--create-keyring", keyring, "--gen-key", "-n", "client." + cluster->client_id}, 30000);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  RadosOptions o;
  o.conf_path = cluster->conf;
  o.client_id = cluster->client_id;
  o.keyring = keyring;
  o.timeout = std::chrono::seconds(5);
  auto c = RadosCluster::Connect(o);
  INFO(c.status().ToString());
  CHECK(c.status().code() == Code::kPermissionDenied);
  // The right key (the cluster's keyring) gets in.
  o.keyring.clear();
  auto ok = RadosCluster::Connect(o);
  INFO(ok.status().ToString());
  CHECK(ok.ok());
}

TEST_CASE("an unreachable cluster fails with kUnavailable within the deadline", "[ceph][e2e][rados]") {
  CDP_CEPH_CLUSTER_OR_SKIP(cluster);
  // The test cluster's keyring and auth, but a monitor address where nobody listens.
  cdp::testing::ScratchDir dir;
  const uint16_t port = cdp::testing::FreePort();
  REQUIRE(port != 0);
  const std::string conf = dir.Join("ceph.conf");
  {
    std::ofstream f(conf);
    f << "[global]\nmon host = [v2:127.0.0.1:" << port << "]\nkeyring = " << cluster->keyring
      << "\nauth client required = cephx\nlog file = " << dir.Join("client.log") << "\n";
  }
  RadosOptions o;
  o.conf_path = conf;
  o.client_id = cluster->client_id;
  o.timeout = std::chrono::seconds(3);
  const auto start = std::chrono::steady_clock::now();
  auto c = RadosCluster::Connect(o);
  const auto took = std::chrono::steady_clock::now() - start;
  INFO(c.status().ToString());
  CHECK(c.status().code() == Code::kUnavailable);
  CHECK(c.status().retryable());
  CHECK(took < std::chrono::seconds(10));

  // A conf that does not exist. (Not a conf without "mon host": librados would
  // then ask DNS for SRV records, which leaves this machine.)
  o.conf_path = dir.Join("no-such.conf");
  auto missing = RadosCluster::Connect(o);
  INFO(missing.status().ToString());
  CHECK(missing.status().code() == Code::kNotFound);
}

// One handle, several writer threads (CephEnv shares an image's handle
// between the MT's apply and its readers). Moved here with RbdBlockDevice's
// deletion: it had no user outside its tests.
TEST_CASE("one rbd image handle serves writers on several threads at once", "[ceph][e2e][rbd]") {
  CDP_CEPH_CLUSTER_OR_SKIP(cluster);
  constexpr int kThreads = 4, kWrites = 32;
  constexpr uint64_t kSlice = 2 * kMiB;
  TempImage t(OpenTestPool(*cluster), kThreads * kSlice, RbdImageOptions{.order = 20});
  std::shared_ptr<RbdImage> image = t.Open();
  std::vector<Status> results(kThreads);
  std::vector<std::thread> threads;
  for (int w = 0; w < kThreads; ++w) {
    threads.emplace_back([&, w] {
      // Thread w owns [w*kSlice, (w+1)*kSlice) and fills it 64 KiB at a time.
      for (int i = 0; i < kWrites && results[w].ok(); ++i) {
        results[w] = image->Write(w * kSlice + uint64_t(i) * 65536, Pattern(65536, uint32_t(w * 1000 + i)));
      }
      if (results[w].ok()) results[w] = image->Flush();
    });
  }
  for (auto& th : threads) th.join();
  for (int w = 0; w < kThreads; ++w) {
    INFO("thread " << w << ": " << results[w].ToString());
    CHECK(results[w].ok());
  }
  for (int w = 0; w < kThreads; ++w) {
    for (int i = 0; i < kWrites; ++i) {
      CHECK(ReadBack(*image, w * kSlice + uint64_t(i) * 65536, 65536) == Pattern(65536, uint32_t(w * 1000 + i)));
    }
  }
}

}  // namespace
}  // namespace cdp::storage

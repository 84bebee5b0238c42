// SPDX-License-Identifier: Apache-2.0
// End-to-end failback and re-protect (issue 14): real daemons over TLS,
// cdpctl, real NBD clients, ext4 through nbdfuse + loop.
//   - test 1: ext4 protected; a tag; more files written at the original site
//     and never shipped (the process server is down); failover to the tag; the
//     promoted export mounted and written at the provider; cdpctl failback.
//     The original volume then equals the promoted image byte for byte and
//     passes e2fsck; the blocks pulled are exactly the blocks that differed;
//     the original site's overwritten blocks are in the branch, whose export
//     reads as the original volume did before the failback.
//   - test 2: cdpctl reprotect; new writes replicate (the replica equals the
//     source); the points from before the failover are listed and export
//     correctly.
//   - test 3: kill -9 of the agent, the process server and the master
//     target, each at a different phase of failback; re-running cdpctl
//     failback ends in the same state.
// Tests 4 (fencing) and 5 (undo) are in failover_test.cc.
#include <catch2/catch.hpp>

#include <boost/json.hpp>
#include <fstream>
#include <random>

#include "common/http/http_client.h"
#include "e2e/fs_util.h"
#include "e2e/harness.h"

namespace {

using cdp::e2e::Attach;
using cdp::e2e::Attachments;
using cdp::e2e::Cluster;
using cdp::e2e::ClusterOptions;
using cdp::e2e::MakeTree;
using cdp::e2e::MissingFsPrerequisite;
using cdp::e2e::RandomWrites;
using cdp::e2e::ReadAll;
using cdp::e2e::Sha256File;
using cdp::e2e::WaitFor;
using cdp::e2e::Which;
using cdp::e2e::WriteTree;
using cdp::testing::CommandResult;
using cdp::testing::RunCommand;
namespace json = boost::json;
using namespace std::chrono_literals;

constexpr uint64_t kBlock = 4096;

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// 4 KiB blocks that differ between two images of one size.
uint64_t DifferingBlocks(const std::string& a, const std::string& b) {
  const std::string x = Slurp(a), y = Slurp(b);
  REQUIRE(x.size() == y.size());
  uint64_t n = 0;
  for (size_t off = 0; off < x.size(); off += kBlock) {
    if (x.compare(off, kBlock, y, off, kBlock) != 0) ++n;
  }
  return n;
}

// The sum of `key` over the passes of a `cdpctl --json failback` answer.
uint64_t SumPasses(const json::value& report, const char* key) {
  uint64_t n = 0;
  for (const auto& p : report.at("passes").as_array()) n += json::value_to<uint64_t>(p.at(key));
  return n;
}

std::string VolumeState(Cluster& c) {
  auto s = c.StatusOf(Which::kMasterTarget);
  if (!s) return "";
  for (const auto& v : s->at("volumes").as_array()) {
    if (v.at("volume").as_string() == c.options().volume) return std::string(v.at("state").as_string());
  }
  return "";
}

// The provider's side of ext4: the promoted export through nbdkit's nbd
// plugin (TLS with the tenant's certificate), read-write.
std::vector<std::string> PromotedSource(Cluster& c) {
  return {"--command",
          "nbdkit",
          "-s",
          "--exit-with-parent",
          "nbd",
          "hostname=127.0.0.1",
          "port=" + std::to_string(c.mt_nbd_port()),
          "export=acme/" + c.options().volume + "@failover",
          "tls=require",
          "tls-certificates=" + c.nbd_client_dir()};
}

// Mounts `dev` at `dir`, writes `files`, unmounts (pushing no undo: the
// caller's Attachments cover the device).
void WriteFiles(const std::string& dev, const std::string& dir, const std::vector<cdp::e2e::TreeFile>& files) {
  RunCommand({"mkdir", "-p", dir});
  CommandResult m = RunCommand({"mount", dev, dir}, 30000);
  INFO(m.output);
  REQUIRE(m.exit_code == 0);
  std::string why;
  const bool ok = WriteTree(dir, files, &why);
  CommandResult u = RunCommand({"umount", dir}, 60000);
  INFO(why << u.output);
  REQUIRE(ok);
  REQUIRE(u.exit_code == 0);
}

std::vector<cdp::e2e::TreeFile> Prefixed(std::vector<cdp::e2e::TreeFile> files, const std::string& prefix) {
  for (auto& f : files) f.path = prefix + "/" + f.path;
  return files;
}

}  // namespace

TEST_CASE("failback of ext4: the original volume ends equal to the promoted one, only differing blocks travel, "
          "the original site's own writes are in the branch, reprotect resumes with the old points exportable",
          "[e2e][failback]") {
  std::string missing = MissingFsPrerequisite();
  if (!missing.empty()) {
    WARN("skipped: " << missing);
    return;
  }
  ClusterOptions co;
  co.volume_size = 64ull << 20;
  Cluster c(co);
  INFO(c.why());
  REQUIRE(c.Start());
  const std::string vol = co.volume;
  std::string why;

  // Protected ext4 with a tree of files, and a tag.
  {
    Attachments at;
    std::string dev = Attach({c.nbd_uri()}, c.Path("fuse-a"), false, co.volume_size, c.Path("fuse-a.log"), &at, &why);
    INFO(why);
    REQUIRE(!dev.empty());
    CommandResult mk = RunCommand({"mkfs.ext4", "-q", "-F", "-E", "nodiscard", dev}, 120000);
    INFO(mk.output);
    REQUIRE(mk.exit_code == 0);
    WriteFiles(dev, c.Path("fs-a"), MakeTree(1));
  }
  REQUIRE(c.Cdpctl({"tag", "before"}).exit_code == 0);
  REQUIRE(c.WaitDrained());
  const std::string at_tag = c.Path("at-tag.img");
  REQUIRE(cdp::e2e::CopyFile(c.source_path(), at_tag));

  // The original site writes more, never shipped: the process server is down.
  REQUIRE(c.Kill9(Which::kProcessServer));
  {
    Attachments at;
    std::string dev = Attach({c.nbd_uri()}, c.Path("fuse-b"), false, co.volume_size, c.Path("fuse-b.log"), &at, &why);
    INFO(why);
    REQUIRE(!dev.empty());
    WriteFiles(dev, c.Path("fs-b"), Prefixed(MakeTree(2), "site"));
  }
  const std::string diverged = c.Path("diverged.img");
  REQUIRE(cdp::e2e::CopyFile(c.source_path(), diverged));
  REQUIRE(Sha256File(diverged) != Sha256File(at_tag));

  // Failover to the tag; the provider mounts the promoted export and writes.
  auto f = c.Cdpctl({"failover", vol, "--to", "before"});
  INFO(f.output);
  REQUIRE(f.exit_code == 0);
  {
    Attachments at;
    std::string dev = Attach(PromotedSource(c), c.Path("fuse-p"), false, co.volume_size, c.Path("fuse-p.log"), &at, &why);
    INFO(why);
    REQUIRE(!dev.empty());
    WriteFiles(dev, c.Path("fs-p"), Prefixed(MakeTree(3), "provider"));
  }
  const std::string promoted = c.Path("promoted.img");
  auto cp = RunCommand({"nbdcopy", c.mt_export_uri("acme/" + vol + "@failover"), promoted}, 120000);
  INFO(cp.output);
  REQUIRE(cp.exit_code == 0);
  const uint64_t differ = DifferingBlocks(diverged, promoted);
  REQUIRE(differ > 0);

  // Failback (the process server back first: the pull goes through it).
  REQUIRE(c.Restart(Which::kProcessServer));
  auto fb = c.CdpctlJson({"failback", vol});
  INFO(c.why() << c.Logs());
  REQUIRE(fb.has_value());
  CHECK(Sha256File(c.source_path()) == Sha256File(promoted));
  CHECK(Sha256File(c.replica_path()) == Sha256File(promoted));
  CHECK(SumPasses(*fb, "pulled_blocks") == differ);
  CHECK(SumPasses(*fb, "saved_blocks") == differ);
  CommandResult fsck = RunCommand({"e2fsck", "-n", "-f", c.source_path()}, 120000);
  INFO(fsck.output);
  CHECK(fsck.exit_code == 0);
  CHECK(VolumeState(c) == "failed-back");
  // The branch: the original volume as it was before the failback.
  const std::string branch = c.Path("branch.img");
  cp = RunCommand({"nbdcopy", "nbd+unix:///" + vol + "@branch-g1?socket=" + c.agent_nbd_socket(), branch}, 120000);
  INFO(cp.output);
  REQUIRE(cp.exit_code == 0);
  CHECK(Sha256File(branch) == Sha256File(diverged));
  auto br = c.Cdpctl({"branches"});
  INFO(br.output);
  CHECK(br.output.find(vol + "  generation 1  " + std::to_string(differ) + " blocks") == 0);
  // Re-running it is a no-op that says so.
  auto again = c.Cdpctl({"failback", vol});
  INFO(again.output);
  CHECK(again.exit_code == 0);
  CHECK(again.output.find("failed back") != std::string::npos);

  // Test 2: reprotect; new writes replicate without a resync.
  auto rp = c.Cdpctl({"reprotect", vol});
  INFO(rp.output);
  REQUIRE(rp.exit_code == 0);
  CHECK(rp.output.find("re-protected as generation 2") != std::string::npos);
  {
    Attachments at;
    std::string dev = Attach({c.nbd_uri()}, c.Path("fuse-c"), false, co.volume_size, c.Path("fuse-c.log"), &at, &why);
    INFO(why);
    REQUIRE(!dev.empty());
    auto home = Prefixed(MakeTree(4), "home");
    home.resize(40);  // the volume is nearly full by now
    WriteFiles(dev, c.Path("fs-c"), home);
  }
  bool drained = c.WaitDrained();
  INFO(c.why());
  REQUIRE(drained);
  CHECK(Sha256File(c.replica_path()) == Sha256File(c.source_path()));
  CHECK(VolumeState(c) == "protecting");
  CHECK(c.AgentU64("resync_remaining") == 0);
  // The point from before the failover is listed and exports correctly.
  const int64_t before = c.TagPointId("before");
  REQUIRE(before > 0);
  const std::string old = c.Path("old.img");
  REQUIRE(c.CopyExport(std::to_string(before), old));
  CHECK(Sha256File(old) == Sha256File(at_tag));
}

TEST_CASE("failback survives kill -9 of the agent, the process server and the master target at different phases",
          "[e2e][failback]") {
  ClusterOptions co;
  co.volume_size = 32ull << 20;
  Cluster c(co);
  INFO(c.why());
  REQUIRE(c.Start());
  const std::string vol = co.volume;
  std::string w = RandomWrites(c.nbd_uri(), co.volume_size, 21, 2, 40, 1 << 20, c.dir());
  INFO(w);
  REQUIRE(w.empty());
  REQUIRE(c.Cdpctl({"tag", "t"}).exit_code == 0);
  REQUIRE(c.WaitDrained());
  REQUIRE(c.Kill9(Which::kProcessServer));
  w = RandomWrites(c.nbd_uri(), co.volume_size, 22, 1, 30, 0, c.dir());
  REQUIRE(w.empty());
  const std::string diverged = c.Path("diverged.img");
  REQUIRE(cdp::e2e::CopyFile(c.source_path(), diverged));
  REQUIRE(c.Cdpctl({"failover", vol, "--to", "t"}).exit_code == 0);
  const std::string uri = c.mt_export_uri("acme/" + vol + "@failover");
  // The provider writes 200 random blocks (qemu-io speaks no nbds://: nbdcopy
  // of a sparse file holding only those blocks).
  {
    const std::string patch = c.Path("provider.patch");
    REQUIRE(cdp::e2e::MakeSparseFile(patch, co.volume_size));
    std::mt19937_64 rng(23);
    std::fstream pf(patch, std::ios::in | std::ios::out | std::ios::binary);
    for (int i = 0; i < 200; ++i) {
      std::string b(kBlock, '\0');
      for (auto& x : b) x = char(rng());
      pf.seekp(std::streamoff((rng() % (co.volume_size / kBlock)) * kBlock));
      pf.write(b.data(), std::streamsize(b.size()));
    }
    pf.close();
    auto cp = RunCommand({"nbdcopy", "--destination-is-zero", "--flush", patch, uri}, 120000);
    INFO(cp.output);
    REQUIRE(cp.exit_code == 0);
  }
  const std::string promoted = c.Path("promoted.img");
  REQUIRE(RunCommand({"nbdcopy", uri, promoted}, 120000).exit_code == 0);
  const uint64_t differ = DifferingBlocks(diverged, promoted);
  REQUIRE(c.Restart(Which::kProcessServer));

  auto post = [&](Which w, const std::string& route) {
    const uint16_t port = w == Which::kAgent ? c.agent_control() : c.mt_control();
    cdp::http::ClientOptions ho = cdp::e2e::ControlClient(c.token(w));
    auto r = cdp::http::HttpRequest("127.0.0.1", port, "POST", route, "{\"volume\":\"" + vol + "\"}", 120s, ho);
    REQUIRE(r.ok());
    INFO(route << " -> " << r->body);
    REQUIRE(r->status == 200);
    return json::parse(r->body);
  };
  // Phase 1: failing back, one live pass done at the agent; kill -9 the agent.
  post(Which::kMasterTarget, "/v1/failback/start");
  post(Which::kAgent, "/v1/failback/begin");
  auto p1 = post(Which::kAgent, "/v1/failback/pass");
  const uint64_t pulled1 = json::value_to<uint64_t>(p1.at("pulled_blocks"));
  CHECK(pulled1 == differ);
  REQUIRE(c.Kill9(Which::kAgent));
  REQUIRE(c.Restart(Which::kAgent));
  // Phase 2: quiesced at the master target; kill -9 the process server.
  post(Which::kMasterTarget, "/v1/failback/quiesce");
  REQUIRE(c.Kill9(Which::kProcessServer));
  REQUIRE(c.Restart(Which::kProcessServer));
  // Phase 3: finished at the master target, not yet ended at the agent; kill -9 the master target.
  post(Which::kAgent, "/v1/failback/pass");
  post(Which::kMasterTarget, "/v1/failback/finish");
  REQUIRE(c.Kill9(Which::kMasterTarget));
  REQUIRE(c.Restart(Which::kMasterTarget));

  auto fb = c.Cdpctl({"failback", vol});
  INFO(fb.output << c.Logs());
  REQUIRE(fb.exit_code == 0);
  CHECK(VolumeState(c) == "failed-back");
  CHECK(Sha256File(c.source_path()) == Sha256File(promoted));
  CHECK(Sha256File(c.replica_path()) == Sha256File(promoted));
  const std::string branch = c.Path("branch.img");
  auto cp = RunCommand({"nbdcopy", "nbd+unix:///" + vol + "@branch-g1?socket=" + c.agent_nbd_socket(), branch}, 120000);
  INFO(cp.output);
  REQUIRE(cp.exit_code == 0);
  CHECK(Sha256File(branch) == Sha256File(diverged));
  REQUIRE(c.Cdpctl({"reprotect", vol}).exit_code == 0);
  w = RandomWrites(c.nbd_uri(), co.volume_size, 24, 1, 20, 0, c.dir());
  REQUIRE(w.empty());
  bool drained = c.WaitDrained();
  INFO(c.why());
  REQUIRE(drained);
  CHECK(Sha256File(c.replica_path()) == Sha256File(c.source_path()));
}

// SPDX-License-Identifier: Apache-2.0
// A stalled apply is visible (issue 17): the master target's data directory
// on a small real ext4 file system (a loop device; needs root), filled up
// while replication runs. Its state says "stalled: no space" in /status and
// cdpctl status, cdp_mt_apply_stalled{cause="no_space"} is 1; once space is
// freed the resent batches apply, the state returns to "protecting" and the
// replica equals the source byte for byte.
#include <catch2/catch.hpp>

#include <sys/statvfs.h>
#include <unistd.h>

#include <boost/json.hpp>
#include <filesystem>
#include <optional>

#include "common/http/http_client.h"
#include "e2e/harness.h"

namespace {

using cdp::e2e::Cluster;
using cdp::e2e::WaitFor;
using cdp::e2e::Which;
using cdp::testing::HaveProgram;
using cdp::testing::RunCommand;
namespace json = boost::json;
using namespace std::chrono_literals;

std::string MtState(Cluster& c) {
  auto s = c.StatusOf(Which::kMasterTarget);
  if (!s) return "";
  for (const auto& v : s->at("volumes").as_array()) {
    if (v.as_object().at("volume").as_string() == c.options().volume) return std::string(v.at("state").as_string());
  }
  return "";
}

std::optional<double> StalledMetric(Cluster& c, const std::string& cause) {
  cdp::http::ClientOptions co = cdp::e2e::ControlClient(c.token(Which::kMasterTarget));
  auto r = cdp::http::HttpRequest("127.0.0.1", c.mt_control(), "GET", "/metrics", "", 10s, co);
  if (!r.ok() || r->status != 200) return std::nullopt;
  const std::string series = "cdp_mt_apply_stalled{cause=\"" + cause + "\",tenant=\"" + c.options().tenant +
                             "\",volume=\"" + c.options().volume + "\"} ";
  size_t at = r->body.find("\n" + series);
  if (at == std::string::npos) return std::nullopt;
  return std::stod(r->body.substr(at + 1 + series.size()));
}

// Unmounts (lazily: the master target may still hold files) before the
// Cluster removes its scratch directory.
struct Mount {
  std::string dir;
  bool mounted = false;
  ~Mount() {
    if (mounted) RunCommand({"umount", "-l", dir}, 30000);
  }
};

}  // namespace

TEST_CASE("apply stalled by a full disk at the master target: named, exported, and resumed with nothing lost",
          "[e2e][stall]") {
  if (::geteuid() != 0 || !HaveProgram("mkfs.ext4") || !HaveProgram("mount") || !HaveProgram("fallocate")) {
    WARN("needs root, mkfs.ext4, mount and fallocate (a loop device); the fault-injecting Env test covers the logic");
    return;
  }
  Cluster c;
  INFO(c.why());
  const std::string img = c.Path("mt.ext4"), mnt = c.Path("mt");
  std::filesystem::create_directories(mnt);
  REQUIRE(RunCommand({"truncate", "-s", "96M", img}).exit_code == 0);
  auto mk = RunCommand({"mkfs.ext4", "-q", "-F", "-m", "0", img}, 60000);
  INFO(mk.output);
  REQUIRE(mk.exit_code == 0);
  Mount m{mnt};
  auto mo = RunCommand({"mount", "-o", "loop", img, mnt}, 60000);
  INFO(mo.output);
  REQUIRE(mo.exit_code == 0);
  m.mounted = true;
  REQUIRE(c.Start());

  std::string w = cdp::e2e::RandomWrites(c.nbd_uri(), c.options().volume_size, 41, 1, 20, 1 << 20, c.dir());
  INFO(w);
  REQUIRE(w.empty());
  REQUIRE(c.WaitDrained());
  CHECK(MtState(c) == "protecting");
  CHECK(StalledMetric(c, "no_space") == 0.0);

  // Fill the file system but 1 MiB, then write more than that.
  struct statvfs fs{};
  REQUIRE(::statvfs(mnt.c_str(), &fs) == 0);
  const uint64_t avail = uint64_t(fs.f_bavail) * fs.f_frsize;
  REQUIRE(avail > (4u << 20));
  const std::string ballast = mnt + "/ballast";
  REQUIRE(RunCommand({"fallocate", "-l", std::to_string(avail - (1u << 20)), ballast}).exit_code == 0);
  w = cdp::e2e::RandomWrites(c.nbd_uri(), c.options().volume_size, 42, 2, 40, 4 << 20, c.dir());
  INFO(w);
  REQUIRE(w.empty());

  const bool stalled = WaitFor([&] { return MtState(c) == "stalled: no space"; }, 120s, 200ms);
  INFO("MT state: " << MtState(c) << "\n" << c.Logs());
  REQUIRE(stalled);
  CHECK(StalledMetric(c, "no_space") == 1.0);
  CHECK(StalledMetric(c, "io_error") == 0.0);
  auto st = c.Cdpctl({"status"});
  INFO(st.output);
  CHECK(st.output.find("stalled: no space") != std::string::npos);
  CHECK(st.output.find("APPLY STALLED (no space)") != std::string::npos);

  // Space is back: the process server's next resend applies.
  std::filesystem::remove(ballast);
  const bool resumed = WaitFor([&] { return MtState(c) == "protecting"; }, 120s, 200ms);
  INFO("MT state: " << MtState(c));
  REQUIRE(resumed);
  const bool drained = c.WaitDrained();
  INFO(c.why());
  REQUIRE(drained);
  CHECK(StalledMetric(c, "no_space") == 0.0);
  CHECK(cdp::e2e::Sha256File(c.replica_path()) == cdp::e2e::Sha256File(c.source_path()));
  c.StopAll();
}

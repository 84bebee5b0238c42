// SPDX-License-Identifier: Apache-2.0
// Many volumes (issue 15, "100 volumes"): one agent protecting kVolumes
// volumes through one process server and one master target, every link over
// TLS with the cluster's own site PKI. Each volume gets writes through the
// agent's NBD tap (qemu-io); every replica then equals its source byte for
// byte, and the daemons' threads do not grow with the number of volumes:
//
//   process server  threads(N) <= threads(1) + 3 * kPsConnections - 2
//                   (per agent connection its session thread and the
//                   receiver's inbox reader, plus a replier while answers
//                   the MT gave to the agent's hash requests are being sent:
//                   common/wire/replication_receiver.h; the agent spreads its
//                   volumes over ps_connections = kPsConnections links)
//   master target   threads(N) <= threads(1) + kPosixDirectIoThreads
//                   (one thread per process-server connection: one PS; and
//                   the Env's direct-I/O pool, once the first batch starts it)
//   agent           threads(N) <= threads(1) + 3 * (kPsConnections - 1)
//                   (per link to the PS: its connect/send thread, its reader
//                   and a resync thread for the link's volumes)
//
// Descriptors do not grow with the number of volumes either: the three
// daemons run with max_open_files = kMaxOpenFiles (common/env/file_cache_env.h),
// below what 40 volumes keep open without it (about 9 each at the MT:
// replica and its O_DIRECT handle, journal segment, digests, the index's two
// sqlite connections with their WAL; one spool segment per written volume at
// the PS; the backing file and the bitmap of each volume at the agent). So
//
//   every daemon    fds(N) <= fds(1) + kMaxOpenFiles + kCallsInFlight
//                   (+ a fixed number per agent connection at the PS and
//                   at the agent)
//
// Counts come from /proc/PID/status and /proc/PID/fd of the real daemons, at
// rest after every write is applied, and the largest seen while the writes
// drain.
#include <boost/json.hpp>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "common/env/env.h"
#include "e2e/harness.h"

namespace {

using cdp::e2e::Cluster;
using cdp::e2e::ClusterOptions;
using cdp::e2e::Sha256File;
using cdp::e2e::WaitFor;
using cdp::e2e::Which;
using cdp::testing::HaveProgram;
using cdp::testing::RunCommand;
namespace json = boost::json;

constexpr int kVolumes = 40;
constexpr int kPsConnections = 4;
constexpr uint64_t kVolumeSize = 8ull << 20;
constexpr int kAgentThreadsPerLink = 3;
// Files the MT's and the PS's caches keep open, and what calls in flight
// may hold beyond them (two per calling thread: common/env/file_cache_env.h).
constexpr int kMaxOpenFiles = 32;
constexpr int kCallsInFlight = 16;
// Per agent connection (at the PS and at the agent alike): three socket
// descriptors (the connection, the listener's or the stream's duplicate, the
// TLS stream's) and two Asio event loops (epoll, eventfd, timerfd each).
constexpr int kFdsPerConnection = 9;

struct Usage {
  int threads = 0;
  int fds = 0;
};

Usage UsageOf(pid_t pid) {
  Usage u;
  std::ifstream st("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(st, line);) {
    if (line.rfind("Threads:", 0) == 0) u.threads = std::stoi(line.substr(8));
  }
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    ++u.fds;
  return u;
}

struct Sample {
  Usage agent, ps, mt;
};

Sample SampleOf(Cluster& c) {
  return {UsageOf(c.pid(Which::kAgent)), UsageOf(c.pid(Which::kProcessServer)), UsageOf(c.pid(Which::kMasterTarget))};
}

void Max(Usage* into, const Usage& u) {
  into->threads = std::max(into->threads, u.threads);
  into->fds = std::max(into->fds, u.fds);
}

std::string Name(int i) { return i == 0 ? std::string("vol1") : "v" + std::to_string(i + 1); }

// Every volume connected with no resync left at the agent (want_applied =
// false), or also every captured record applied at the master target.
bool AllVolumes(Cluster& c, int n, bool want_applied, std::string* why) {
  auto a = c.StatusOf(Which::kAgent);
  auto m = c.StatusOf(Which::kMasterTarget);
  if (!a || !m) {
    *why = "a daemon did not answer /status";
    return false;
  }
  std::map<std::string, uint64_t> applied;
  for (const auto& v : m->at("volumes").as_array())
    applied[std::string(v.at("volume").as_string())] = json::value_to<uint64_t>(v.at("applied_seq"));
  int ok = 0;
  for (const auto& v : a->at("volumes").as_array()) {
    const std::string name(v.at("name").as_string());
    const auto it = applied.find(name);
    bool good =
        v.at("connected").as_bool() && json::value_to<uint64_t>(v.at("resync_remaining")) == 0 && it != applied.end();
    if (good && want_applied) {
      good = json::value_to<uint64_t>(v.at("queue_records")) == 0 &&
             it->second == json::value_to<uint64_t>(v.at("next_seq")) - 1;
    }
    ok += good ? 1 : 0;
  }
  *why = std::to_string(n - ok) + " of " + std::to_string(n) + " volumes not " + (want_applied ? "applied" : "synced");
  return ok == n;
}

// A cluster with n volumes: starts it, waits for every initial sync, writes
// to every volume through the tap, waits until all is applied and checks
// each replica against its source. Returns the usage at rest after that
// (`rest`) and the largest seen while the writes drained (`peak`).
void RunVolumes(int n, Sample* rest, Sample* peak) {
  cdp::testing::ScratchDir sources;
  ClusterOptions o;
  o.volume_size = kVolumeSize;
  o.agent_budget = "16MiB";
  o.agent_extra_config = "ps_connections = " + std::to_string(kPsConnections) + "\n";
  o.mt_extra_config = "max_open_files = " + std::to_string(kMaxOpenFiles) + "\n";
  o.ps_extra_config = "max_open_files = " + std::to_string(kMaxOpenFiles) + "\n";
  o.agent_extra_config += "max_open_files = " + std::to_string(kMaxOpenFiles) + "\n";
  for (int i = 1; i < n; ++i) {
    const std::string path = sources.Join(Name(i) + ".img");
    REQUIRE(cdp::e2e::MakeSparseFile(path, kVolumeSize));
    o.agent_extra_config += "volume = " + Name(i) + "=" + path + "\n";
  }
  Cluster c(o);
  INFO(n << " volumes");
  const bool started = c.Start();
  INFO(c.why());
  REQUIRE(started);
  std::string why;
  {
    INFO(c.Logs());
    REQUIRE(WaitFor([&] { return AllVolumes(c, n, false, &why); }, std::chrono::seconds(60)));
  }
  const std::string socket = c.agent_nbd_socket();
  for (int i = 0; i < n; ++i) {
    const std::string uri = "nbd+unix:///" + Name(i) + "?socket=" + socket;
    const std::string pattern = std::to_string(1 + i % 250);
    const std::string off = std::to_string((uint64_t(i) * 192 * 1024) % (kVolumeSize - (1 << 20)));
    auto r =
        RunCommand({"qemu-io", "-f", "raw", uri, "-c", "write -P " + pattern + " " + off + " 256k", "-c",
                    "write -P " + std::to_string(255 - i % 250) + " 7M 64k", "-c", "write -z 1M 64k", "-c", "flush"},
                   60000);
    INFO(Name(i) << ": " << r.output);
    REQUIRE(r.exit_code == 0);
  }
  *peak = SampleOf(c);
  const bool drained = WaitFor(
      [&] {
        const Sample s = SampleOf(c);
        Max(&peak->agent, s.agent);
        Max(&peak->ps, s.ps);
        Max(&peak->mt, s.mt);
        return AllVolumes(c, n, true, &why);
      },
      std::chrono::seconds(90));
  INFO(why << "\n" << c.Logs());
  REQUIRE(drained);
  for (int i = 0; i < n; ++i) {
    const std::string source = i == 0 ? c.source_path() : sources.Join(Name(i) + ".img");
    const std::string replica = c.Path("mt/tenants/" + o.tenant + "/volumes/" + Name(i) + "/replica.img");
    INFO(Name(i));
    REQUIRE(RunCommand({"cmp", source, replica}).exit_code == 0);
  }
  *rest = SampleOf(c);
}

}  // namespace

TEST_CASE("many volumes through one PS and one MT - replicas equal, threads and descriptors bounded", "[e2e][volumes]") {
  for (const char* p : {"qemu-io", "cmp"}) {
    INFO("missing program " << p << " (scripts/install-deps.sh installs it)");
    REQUIRE(HaveProgram(p));
  }
  Sample one_rest, one_peak, many_rest, many_peak;
  RunVolumes(1, &one_rest, &one_peak);
  RunVolumes(kVolumes, &many_rest, &many_peak);
  INFO("threads agent/PS/MT: 1 volume " << one_rest.agent.threads << "/" << one_rest.ps.threads << "/"
                                        << one_rest.mt.threads << ", " << kVolumes << " volumes at rest "
                                        << many_rest.agent.threads << "/" << many_rest.ps.threads << "/"
                                        << many_rest.mt.threads << ", peak " << many_peak.agent.threads << "/"
                                        << many_peak.ps.threads << "/" << many_peak.mt.threads);
  INFO("fds agent/PS/MT: 1 volume " << one_rest.agent.fds << "/" << one_rest.ps.fds << "/" << one_rest.mt.fds << ", "
                                    << kVolumes << " volumes at rest " << many_rest.agent.fds << "/" << many_rest.ps.fds
                                    << "/" << many_rest.mt.fds << ", peak " << many_peak.agent.fds << "/"
                                    << many_peak.ps.fds << "/" << many_peak.mt.fds);
  for (const Sample* s : {&many_rest, &many_peak}) {
    CHECK(s->ps.threads <= one_rest.ps.threads + 3 * kPsConnections - 2);
    // The MT's only thread that may come later is its Env's direct-I/O pool,
    // started by the first multi-block direct batch: a constant too.
    CHECK(s->mt.threads <= one_rest.mt.threads + cdp::kPosixDirectIoThreads);
    CHECK(s->agent.threads <= one_rest.agent.threads + kAgentThreadsPerLink * (kPsConnections - 1));
    CHECK(s->mt.fds <= one_rest.mt.fds + kMaxOpenFiles + kCallsInFlight);
    CHECK(s->ps.fds <= one_rest.ps.fds + kFdsPerConnection * (kPsConnections - 1) + kMaxOpenFiles + kCallsInFlight);
    CHECK(s->agent.fds <= one_rest.agent.fds + kFdsPerConnection * (kPsConnections - 1) + kMaxOpenFiles + kCallsInFlight);
  }
}

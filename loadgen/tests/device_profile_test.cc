// SPDX-License-Identifier: Apache-2.0
// Device profile (issue #44) against the real kernel: a loop device over a
// file of the test's, written by fio with direct I/O, profiled through
// tracefs. Root, fio and losetup are required (make test's install-deps
// installs fio; the suite runs as root).
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "loadgen/device_profile.h"
#include "loadgen/profile.h"

extern char** environ;

namespace {

using cdp::loadgen::DeviceInterval;
using cdp::loadgen::DeviceProfileOptions;
using cdp::loadgen::DeviceProfiler;

constexpr uint64_t kMiB = 1 << 20;

std::string Run(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[256];
  while (std::fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  const int rc = ::pclose(p);
  INFO(cmd << "\n" << out);
  REQUIRE(rc == 0);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

// A loop device over a sparse 256 MiB file of its own.
struct LoopDevice {
  std::string dir, path;
  LoopDevice() {
    char tmpl[] = "/tmp/cdp-profile-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    dir = tmpl;
    Run("truncate -s 256M " + dir + "/disk.img");
    path = Run("losetup --find --show " + dir + "/disk.img");
    REQUIRE(path.rfind("/dev/loop", 0) == 0);
  }
  ~LoopDevice() {
    std::system(("losetup -d " + path + " 2>/dev/null; rm -rf " + dir).c_str());
  }
};

// fio with direct I/O on `dev`: writes reach the block layer as issued.
void Fio(const std::string& dev, const std::string& args) {
  Run("fio --name=p --filename=" + dev + " --direct=1 --ioengine=psync --output=/dev/null " + args);
}

bool Within(double got, double want, double tolerance) { return got >= want * (1 - tolerance) && got <= want * (1 + tolerance); }

}  // namespace

// trace_pipe lines as this kernel prints them (with the I/O priority) and as
// older ones do (without), and the lines that are not write events.
TEST_CASE("profile: block_rq_issue lines of trace_pipe are parsed, other lines are not events", "[profile]") {
  cdp::loadgen::BlockEvent e;
  uint64_t lost = 9;
  REQUIRE(cdp::loadgen::ParseBlockEvent(
      "             fio-1234    [001] ..... 4075.123456: block_rq_issue: 7,0 WS 4096 () 2048 + 8 none,0,0 [fio]", &e, &lost));
  CHECK(lost == 0);
  CHECK(e.major == 7);
  CHECK(e.minor == 0);
  CHECK(e.write);
  CHECK(e.sector == 2048);
  CHECK(e.sectors == 8);
  REQUIRE(cdp::loadgen::ParseBlockEvent("kworker/1:1H-42 [001] d..1. 1.5: block_rq_issue: 259,3 FWFS 1048576 () 123456789 + 2048 [kworker/1:1H]", &e, &lost));
  CHECK(e.major == 259);
  CHECK(e.minor == 3);
  CHECK(e.write);  // a write with a preflush and FUA
  CHECK(e.sectors == 2048);
  REQUIRE(cdp::loadgen::ParseBlockEvent("x-1 [000] ..... 2.0: block_rq_issue: 8,0 R 4096 () 8 + 8 be,0,4 [cat]", &e, &lost));
  CHECK_FALSE(e.write);
  REQUIRE(cdp::loadgen::ParseBlockEvent("x-1 [000] ..... 2.0: block_rq_issue: 8,0 DS 1048576 () 0 + 2048 be,0,4 [fstrim]", &e, &lost));
  CHECK_FALSE(e.write);  // a discard carries no data
  REQUIRE(cdp::loadgen::ParseBlockEvent("x-1 [000] ..... 2.0: block_rq_issue: 8,0 FF 0 () 0 + 0 none,0,0 [kworker]", &e, &lost));
  CHECK_FALSE(e.write);  // a flush
  CHECK_FALSE(cdp::loadgen::ParseBlockEvent("CPU:1 [LOST 1234 EVENTS]", &e, &lost));
  CHECK(lost == 1234);
  CHECK_FALSE(cdp::loadgen::ParseBlockEvent("x-1 [000] ..... 2.0: block_rq_complete: 8,0 W () 8 + 8 [0]", &e, &lost));
  CHECK(lost == 0);
  CHECK_FALSE(cdp::loadgen::ParseBlockEvent("x-1 [000] ..... 2.0: block_rq_issue: 8,0 W", &e, &lost));
  CHECK_FALSE(cdp::loadgen::ParseBlockEvent("x-1 [000] ..... 2.0: block_rq_issue: 8,0 W 4096 () 18446744073709551616 + 8", &e, &lost));
}

// The pattern: random 4 KiB over a 64 MiB hot spot, then sequential
// 1 MiB. fio's random map writes every block of the hot spot once per pass,
// so 96 MiB of random writes over 64 MiB touch exactly 64 MiB; two passes of
// sequential writes over another 64 MiB write 128 MiB and touch 64 MiB.
TEST_CASE("profile: raw bytes and unique 4 KiB blocks of a loop device match fio's writes", "[e2e][profile]") {
  REQUIRE(std::system("command -v fio >/dev/null && command -v losetup >/dev/null") == 0);
  LoopDevice loop;
  DeviceProfileOptions o;
  o.devices = {loop.path};
  o.source = DeviceProfileOptions::Source::kTracefs;
  auto p = DeviceProfiler::Start(o);
  REQUIRE(p.ok());
  CHECK((*p)->has_unique());
  CHECK((*p)->names() == std::vector<std::string>{loop.path.substr(5)});

  // The kernel buffers the events (4 MiB per CPU) until Collect reads them.
  Fio(loop.path, "--rw=randwrite --bs=4k --size=64M --io_size=96M --randrepeat=1 --randseed=7");
  auto rnd = (*p)->Collect(std::chrono::milliseconds(300));
  REQUIRE(rnd.ok());
  REQUIRE(rnd->size() == 1);
  const DeviceInterval r = rnd->front();
  INFO("random: bytes " << r.bytes << ", unique " << r.unique_bytes << ", writes " << r.writes);
  CHECK(Within(double(r.bytes), 96.0 * kMiB, 0.02));
  CHECK(Within(double(r.unique_bytes), 64.0 * kMiB, 0.02));

  Fio(loop.path, "--rw=write --bs=1M --offset=128M --size=64M --io_size=128M");
  auto seq = (*p)->Collect(std::chrono::milliseconds(300));
  REQUIRE(seq.ok());
  const DeviceInterval s = seq->front();
  INFO("sequential: bytes " << s.bytes << ", unique " << s.unique_bytes << ", writes " << s.writes);
  CHECK(Within(double(s.bytes), 128.0 * kMiB, 0.02));
  CHECK(Within(double(s.unique_bytes), 64.0 * kMiB, 0.02));
  CHECK((*p)->lost_events() == 0);

  // Nothing written: nothing counted.
  auto idle = (*p)->Collect(std::chrono::milliseconds(100));
  REQUIRE(idle.ok());
  CHECK(idle->front().bytes == 0);
  CHECK(idle->front().unique_bytes == 0);
}

// Lost events are reported, not hidden: the profiler is stopped (SIGSTOP)
// while fio writes 8192 requests into a 4 KiB ring buffer per CPU, so the
// kernel must drop most of them. The CSV's lost_events column and its
// summary line say how many; SIGTERM ends the profile cleanly (the summary
// is written and the tracing instance removed).
TEST_CASE("profile: a ring buffer too small loses events, and the CSV says how many", "[e2e][profile]") {
  REQUIRE(std::system("command -v fio >/dev/null && command -v losetup >/dev/null") == 0);
  LoopDevice loop;
  const std::string csv = loop.dir + "/profile.csv";
  std::vector<std::string> args = {CDP_LOADGEN_BIN, "profile", "--device", loop.path, "--source", "tracefs",
                                   "--buffer-kb", "4", "--interval", "200ms", "--duration", "10m", "--out", csv};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  REQUIRE(::posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) == 0);
  auto read_csv = [&] {
    std::ifstream in(csv);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  };
  // Tracing is on once the header is written.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (read_csv().find("timestamp,") == std::string::npos) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const std::string instance = "/sys/kernel/tracing/instances/cdp-profile-" + std::to_string(pid);
  struct stat st {};
  CHECK(::stat(instance.c_str(), &st) == 0);
  REQUIRE(::kill(pid, SIGSTOP) == 0);
  Fio(loop.path, "--rw=randwrite --bs=4k --size=32M --randrepeat=1 --randseed=3");
  REQUIRE(::kill(pid, SIGCONT) == 0);
  REQUIRE(::kill(pid, SIGTERM) == 0);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(::stat(instance.c_str(), &st) != 0);  // removed

  const std::string text = read_csv();
  INFO(text);
  auto prof = cdp::loadgen::ParseProfileCsv(text);
  REQUIRE(prof.ok());
  double lost = 0, bytes = 0;
  for (const auto& s : prof->samples) lost += s.lost_events, bytes += s.bytes;
  CHECK(lost > 0);
  CHECK(bytes < 32.0 * kMiB);  // what was lost is missing from the rows, and said so
  const size_t at = text.find("# lost events: ");
  REQUIRE(at != std::string::npos);
  CHECK(std::stod(text.substr(at + 15)) == lost);
  CHECK(text.find("use a larger --buffer-kb") != std::string::npos);
  REQUIRE(prof->devices == std::vector<std::string>{loop.path.substr(5)});
}

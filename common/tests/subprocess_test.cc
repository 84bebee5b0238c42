// SPDX-License-Identifier: Apache-2.0
// The one process spawner: exit statuses, signals, exec failures named,
// output to a file or captured, deadlines that kill the whole process group,
// and no child left behind.
#include "common/env/subprocess.h"

#include <signal.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>

#include "common/tests/test_util.h"

using namespace std::chrono_literals;
using cdp::RunCommand;
using cdp::SpawnOptions;
using cdp::Subprocess;

namespace {

bool ProcessExists(pid_t pid) { return ::kill(pid, 0) == 0; }

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("subprocess: exit status, output captured, stdin is /dev/null", "[subprocess]") {
  auto r = RunCommand({"sh", "-c", "echo out; echo err >&2; cat; exit 3"}, 10s);
  REQUIRE(r.ok());
  CHECK(r->exit_code == 3);
  CHECK_FALSE(r->timed_out);
  CHECK(r->output == "out\nerr\n");
}

TEST_CASE("subprocess: a program that cannot be executed is named with the reason", "[subprocess]") {
  auto r = RunCommand({"/nonexistent/cdp-no-such-program"}, 10s);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == cdp::Code::kNotFound);
  CHECK(r.status().message() == "cannot execute /nonexistent/cdp-no-such-program: no such file");
  SpawnOptions o;
  o.argv = {"/dev/null"};
  auto s = Subprocess::Spawn(o);
  REQUIRE_FALSE(s.ok());
  CHECK(s.status().code() == cdp::Code::kPermissionDenied);
  CHECK(Subprocess::Spawn(SpawnOptions{}).status().code() == cdp::Code::kInvalidArgument);
}

TEST_CASE("subprocess: the deadline kills the command and the children it started", "[subprocess]") {
  cdp::testing::ScratchDir dir;
  const std::string pidfile = dir.Join("child.pid");
  auto r = RunCommand({"sh", "-c", "sleep 60 & echo $! > " + pidfile + "; wait"}, 300ms);
  REQUIRE(r.ok());
  CHECK(r->timed_out);
  CHECK(r->exit_code == -1);
  const pid_t child = pid_t(std::stol(ReadFile(pidfile)));
  // SIGKILL went to the whole group; init reaps the orphan.
  CHECK(cdp::testing::WaitUntil([&] { return !ProcessExists(child); }, 10s));
}

TEST_CASE("subprocess: output to a file, signals, Wait with a deadline, Stop escalates, no zombie", "[subprocess]") {
  cdp::testing::ScratchDir dir;
  SpawnOptions o;
  o.argv = {"sh", "-c", "echo started; trap '' TERM; sleep 60"};
  o.output_file = dir.Join("log");
  o.truncate_output = true;
  auto p = Subprocess::Spawn(o);
  REQUIRE(p.ok());
  const pid_t pid = p->pid();
  CHECK(p->Running());
  CHECK(p->Wait(50ms).status().code() == cdp::Code::kBusy);
  REQUIRE(cdp::testing::WaitUntil([&] { return ReadFile(o.output_file) == "started\n"; }, 10s));
  // TERM is ignored: Stop waits the grace, then kills.
  int st = p->Stop(SIGTERM, 200ms);
  CHECK(WIFSIGNALED(st));
  CHECK(WTERMSIG(st) == SIGKILL);
  CHECK_FALSE(p->Running());
  CHECK_FALSE(ProcessExists(pid));  // reaped: not even a zombie
  CHECK(p->Stop(SIGKILL, 0ms) == -1);

  SpawnOptions q;
  q.argv = {"sh", "-c", "exit 7"};
  auto e = Subprocess::Spawn(q);
  REQUIRE(e.ok());
  auto w = e->Wait(10s);
  REQUIRE(w.ok());
  CHECK(WEXITSTATUS(*w) == 7);
}

TEST_CASE("subprocess: the destructor kills and reaps, Release leaves the child alone", "[subprocess]") {
  SpawnOptions o;
  o.argv = {"sleep", "60"};
  pid_t killed = -1, released = -1;
  {
    auto p = Subprocess::Spawn(o);
    REQUIRE(p.ok());
    killed = p->pid();
  }
  CHECK_FALSE(ProcessExists(killed));
  {
    auto p = Subprocess::Spawn(o);
    REQUIRE(p.ok());
    released = p->Release();
  }
  CHECK(ProcessExists(released));
  auto again = Subprocess::Adopt(released, false);
  CHECK(again.Stop(SIGKILL, 0ms) != -1);
  CHECK_FALSE(ProcessExists(released));
}

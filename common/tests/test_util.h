// SPDX-License-Identifier: Apache-2.0
// Test helpers: run an external command with a deadline and capture its
// output; create a scratch directory; wait for a condition with a deadline. Used by tests that drive real clients
// (qemu-io, nbdinfo, nbdcopy...).
//
// Thread safety: RunCommand may be called from several threads at once.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/base/host_port.h"
#include "common/env/subprocess.h"

namespace cdp::testing {

// Polls `pred` every `poll` until it holds (true) or `timeout` passes (false,
// after one last look). A condition with a deadline, never a sleep used as
// synchronization: the timeout only bounds a failing test.
template <typename Pred>
bool WaitUntil(Pred pred, std::chrono::milliseconds timeout = std::chrono::seconds(60),
               std::chrono::milliseconds poll = std::chrono::milliseconds(2)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return pred();
    std::this_thread::sleep_for(poll);
  }
  return true;
}

using cdp::CommandResult;

// cdp::RunCommand (common/env/subprocess.h) with a timeout in ms; a program that
// cannot be started gives exit_code -1 and the reason as its output.
inline CommandResult RunCommand(const std::vector<std::string>& argv, int timeout_ms = 60000) {
  auto r = cdp::RunCommand(argv, std::chrono::milliseconds(timeout_ms));
  if (r.ok()) return *r;
  CommandResult res;
  res.output = r.status().ToString();
  return res;
}

// True when `name` is an executable found in PATH.
inline bool HaveProgram(const std::string& name) {
  return RunCommand({"sh", "-c", "command -v " + name}, 10000).exit_code == 0;
}

// A TCP port on 127.0.0.1 that was free a moment ago (bound with port 0, then
// closed); 0 on error. Daemons bind it with SO_REUSEADDR.
inline uint16_t FreePort() {
  auto p = cdp::FreeLoopbackPort();
  return p.ok() ? *p : 0;
}

// A fresh directory under $TMPDIR (or /tmp), removed with its contents by the
// destructor.
class ScratchDir {
 public:
  ScratchDir() {
    const char* t = std::getenv("TMPDIR");
    std::string tmpl = std::string(t && *t ? t : "/tmp") + "/cdp-test-XXXXXX";
    std::vector<char> b(tmpl.begin(), tmpl.end());
    b.push_back('\0');
    if (::mkdtemp(b.data()) != nullptr) path_ = b.data();
  }
  ~ScratchDir() {
    if (!path_.empty()) RunCommand({"rm", "-rf", path_}, 30000);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Join(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// One row of `nbdinfo --map URI`: an extent and its base:allocation type
// (1 hole, 2 zero, 0 data).
struct MapEntry {
  uint64_t offset = 0, length = 0;
  uint32_t type = 0;
  bool operator==(const MapEntry&) const = default;
};
// `nbdinfo --map uri` as rows; empty (and `*output` says why) when nbdinfo
// fails.
inline std::vector<MapEntry> NbdMap(const std::string& uri, std::string* output = nullptr) {
  CommandResult r = RunCommand({"nbdinfo", "--map", uri}, 30000);
  if (output != nullptr) *output = r.output;
  std::vector<MapEntry> v;
  if (r.exit_code != 0) return v;
  std::istringstream in(r.output);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream l(line);
    MapEntry e;
    if (l >> e.offset >> e.length >> e.type) v.push_back(e);
  }
  return v;
}

}  // namespace cdp::testing

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
#include <string>
#include <thread>
#include <vector>

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

struct CommandResult {
  int exit_code = -1;      // exit status; -1 when killed by a signal or not started
  bool timed_out = false;  // killed because the deadline passed
  std::string output;      // stdout and stderr, interleaved
};

// Runs argv[0] (looked up in PATH) with `argv`, stdin from /dev/null, and
// waits at most `timeout_ms`; past it the process is killed (SIGKILL).
inline CommandResult RunCommand(const std::vector<std::string>& argv, int timeout_ms = 60000) {
  CommandResult res;
  int fds[2];
  if (argv.empty() || ::pipe2(fds, O_CLOEXEC) != 0) return res;
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return res;
  }
  if (pid == 0) {
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    ::execvp(args[0], args.data());
    _exit(127);
  }
  ::close(fds[1]);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      res.timed_out = true;
      ::kill(pid, SIGKILL);
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int r = ::poll(&p, 1, int(left));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    const ssize_t n = ::read(fds[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    res.output.append(buf, size_t(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  res.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return res;
}

// True when `name` is an executable found in PATH.
inline bool HaveProgram(const std::string& name) {
  return RunCommand({"sh", "-c", "command -v " + name}, 10000).exit_code == 0;
}

// A TCP port on 127.0.0.1 that was free a moment ago (bound with port 0, then
// closed); 0 on error. Daemons bind it with SO_REUSEADDR.
inline uint16_t FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  uint16_t port = 0;
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
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

}  // namespace cdp::testing

// SPDX-License-Identifier: Apache-2.0
#include "common/env/subprocess.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

namespace cdp {
namespace {

using Clock = std::chrono::steady_clock;

// The child side of Spawn: async-signal-safe calls only. Reports an exec
// failure's errno on `err_fd` (close-on-exec: EOF there means exec worked).
[[noreturn]] void Child(const SpawnOptions& o, char* const* argv, int out_fd, int err_fd) {
  if (o.new_session) ::setsid();
  if (o.new_process_group && !o.new_session) ::setpgid(0, 0);
  if (o.die_with_parent) ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  // The parent may block signals it waits for (sigwait): the program must not
  // inherit that.
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  int in = ::open("/dev/null", O_RDONLY);
  if (in >= 0) ::dup2(in, 0);
  if (out_fd >= 0) {
    ::dup2(out_fd, 1);
    ::dup2(out_fd, 2);
  }
  ::execvp(argv[0], argv);
  int e = errno;
  ssize_t ignored = ::write(err_fd, &e, sizeof(e));
  (void)ignored;
  _exit(127);
}

Status ExecError(int e, const std::string& program) {
  if (e == ENOENT) return Status::NotFound("cannot execute " + program + ": no such file");
  if (e == EACCES) return Status::PermissionDenied("cannot execute " + program + ": permission denied");
  return Status::FromErrno(e, "cannot execute " + program);
}

Result<Subprocess> SpawnWithFd(const SpawnOptions& o, int out_fd) {
  if (o.argv.empty()) return Status::InvalidArgument("spawn: empty argv");
  std::vector<char*> argv;
  for (const auto& a : o.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  int err[2];
  if (::pipe2(err, O_CLOEXEC) != 0) return Status::FromErrno(errno, "spawn: pipe");
  const pid_t pid = ::fork();
  if (pid < 0) {
    int e = errno;
    ::close(err[0]);
    ::close(err[1]);
    return Status::FromErrno(e, "spawn: fork");
  }
  if (pid == 0) Child(o, argv.data(), out_fd, err[1]);
  ::close(err[1]);
  if (o.new_process_group && !o.new_session) ::setpgid(pid, pid);  // no race with the child's own call
  int child_errno = 0;
  ssize_t n;
  while ((n = ::read(err[0], &child_errno, sizeof(child_errno))) < 0 && errno == EINTR) {
  }
  ::close(err[0]);
  if (n == sizeof(child_errno)) {
    int st = 0;
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    return ExecError(child_errno, o.argv[0]);
  }
  return Subprocess::Adopt(pid, o.new_process_group || o.new_session);
}

}  // namespace

Subprocess Subprocess::Adopt(pid_t pid, bool group) { return Subprocess(pid, group); }

Result<Subprocess> Subprocess::Spawn(const SpawnOptions& o) {
  int fd = -1;
  if (!o.output_file.empty()) {
    fd = ::open(o.output_file.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (o.truncate_output ? O_TRUNC : O_APPEND),
                0600);
    if (fd < 0) return Status::FromErrno(errno, "spawn: open " + o.output_file);
  }
  auto r = SpawnWithFd(o, fd);
  if (fd >= 0) ::close(fd);
  return r;
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(other.pid_), group_(other.group_), status_(other.status_) {
  other.pid_ = -1;
}

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  if (this != &other) {
    Reset();
    pid_ = other.pid_;
    group_ = other.group_;
    status_ = other.status_;
    other.pid_ = -1;
  }
  return *this;
}

Subprocess::~Subprocess() { Reset(); }

void Subprocess::Reset() {
  if (pid_ > 0) Stop(SIGKILL, std::chrono::milliseconds(0));
  pid_ = -1;
}

bool Subprocess::Running() {
  if (pid_ <= 0) return false;
  int st = 0;
  pid_t r = ::waitpid(pid_, &st, WNOHANG);
  if (r == pid_ || (r < 0 && errno == ECHILD)) {
    status_ = r == pid_ ? st : -1;
    pid_ = -1;
    return false;
  }
  return true;
}

Status Subprocess::Signal(int sig) {
  if (pid_ <= 0) return Status::NotFound("no child process");
  if (group_) ::kill(-pid_, sig);
  if (::kill(pid_, sig) != 0 && errno != ESRCH) return Status::FromErrno(errno, "kill");
  return Status::OK();
}

Result<int> Subprocess::Wait(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) {
    if (status_ != -1) return status_;
    return Status::NotFound("no child process");
  }
  const auto deadline = Clock::now() + timeout;
  auto poll = std::chrono::milliseconds(1);
  while (Running()) {
    if (Clock::now() >= deadline) return Status::Busy("still running");
    // The polling period of the exit, not a synchronization: waitpid has no timeout.
    std::this_thread::sleep_for(poll);
    poll = std::min(poll * 2, std::chrono::milliseconds(20));
  }
  return status_;
}

int Subprocess::Stop(int sig, std::chrono::milliseconds grace) {
  if (pid_ <= 0) return -1;
  (void)Signal(sig);
  if (sig != SIGKILL) {
    auto r = Wait(grace);
    if (r.ok()) return *r;
    (void)Signal(SIGKILL);
  }
  int st = 0;
  while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
  }
  status_ = st;
  pid_ = -1;
  return st;
}

pid_t Subprocess::Release() {
  pid_t p = pid_;
  pid_ = -1;
  return p;
}

Result<CommandResult> RunCommand(const std::vector<std::string>& argv, std::chrono::milliseconds timeout) {
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return Status::FromErrno(errno, "run: pipe");
  SpawnOptions o;
  o.argv = argv;
  o.new_process_group = true;
  auto p = SpawnWithFd(o, out[1]);
  ::close(out[1]);
  if (!p.ok()) {
    ::close(out[0]);
    return p.status();
  }
  CommandResult res;
  const auto deadline = Clock::now() + timeout;
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      res.timed_out = true;
      break;
    }
    pollfd pfd{out[0], POLLIN, 0};
    const int r = ::poll(&pfd, 1, int(left));
    if (r <= 0) continue;  // EINTR or the deadline: checked above
    const ssize_t n = ::read(out[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    res.output.append(buf, size_t(n));
  }
  ::close(out[0]);
  if (!res.timed_out) {
    // The output is closed; the exit follows (or the deadline kills it).
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    res.timed_out = !p->Wait(std::max(left, std::chrono::milliseconds(0))).ok();
  }
  const int st = res.timed_out ? p->Stop(SIGKILL, std::chrono::milliseconds(0)) : p->status();
  res.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return res;
}

}  // namespace cdp

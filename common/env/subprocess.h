// SPDX-License-Identifier: Apache-2.0
// Subprocess: the one way OpenCDP starts another program -- the agent's
// freeze/thaw hooks, wanem's forwarder, the local cluster's daemons, and the
// tests' commands.
//
//   auto p = Subprocess::Spawn(opts);      // fork + exec; an exec failure is
//                                          // reported here, with its errno
//   p->Wait(timeout) / p->Stop(SIGTERM, grace) / destructor: SIGKILL + reap
//   RunCommand({"sha256sum", path}, 2min)  // output captured, killed at the deadline
//
// Between fork and exec the child only calls async-signal-safe functions, so
// spawning from a multi-threaded process is safe. The child gets stdin from
// /dev/null; its stdout and stderr go to `output_file` (or are inherited).
//
// Thread safety: a Subprocess is used by one thread at a time; RunCommand
// from any thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "common/base/result.h"
#include "common/base/status.h"

namespace cdp {

struct SpawnOptions {
  std::vector<std::string> argv;  // argv[0]: a path, or a name looked up in PATH
  std::string output_file;        // "" = inherit stdout/stderr; else both go to this file
  bool truncate_output = false;   // else the file is appended to
  bool new_session = false;       // setsid(): no controlling terminal, survives our exit
  bool new_process_group = false;  // a group of its own: Signal/Stop reach its children too
  bool die_with_parent = false;   // SIGKILL when the spawning thread's process dies (tests)
};

class Subprocess {
 public:
  // Starts the program. kNotFound / kPermissionDenied / kIOError with the
  // program's name when it cannot be executed.
  static Result<Subprocess> Spawn(const SpawnOptions& options);
  // Takes over a child of this process started elsewhere (`group`: it leads
  // its own process group).
  static Subprocess Adopt(pid_t pid, bool group);

  Subprocess() = default;
  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  ~Subprocess();  // SIGKILLs and reaps a child still running (unless Release()d)

  pid_t pid() const { return pid_; }
  // True while the child has not exited (reaps it if it has).
  bool Running();
  // The raw wait status once it exited (see WIFEXITED), else -1.
  int status() const { return status_; }

  // Sends `sig` (to the process group if it has its own).
  Status Signal(int sig);
  // Waits at most `timeout` for the exit: the raw wait status; kBusy if it
  // still runs; kNotFound if there is no child.
  Result<int> Wait(std::chrono::milliseconds timeout);
  // Signal(sig), waits `grace`, then SIGKILL and waits for the exit. The raw
  // wait status, or -1 if there was no child.
  int Stop(int sig, std::chrono::milliseconds grace);
  // Gives the child up: it is neither killed nor reaped by this object.
  pid_t Release();

 private:
  Subprocess(pid_t pid, bool group) : pid_(pid), group_(group) {}
  void Reset();
  pid_t pid_ = -1;
  bool group_ = false;
  int status_ = -1;
};

struct CommandResult {
  int exit_code = -1;      // exit status; -1 when killed by a signal or not started
  bool timed_out = false;  // killed (SIGKILL, with its process group) at the deadline
  std::string output;      // stdout and stderr, interleaved
};

// Runs `argv` (argv[0] looked up in PATH) with stdin from /dev/null, captures
// its output and waits at most `timeout`. An error only when it could not be
// started.
Result<CommandResult> RunCommand(const std::vector<std::string>& argv, std::chrono::milliseconds timeout);

}  // namespace cdp

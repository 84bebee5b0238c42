// Helpers for loadgen tests: run a shell command and capture its output, and
// a scratch directory removed at the end of the test.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace cdp::loadgen::testing {

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

inline CommandResult Run(const std::string& cmd) {
  CommandResult r;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  int st = ::pclose(p);
  r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/loadgen_test.XXXXXX";
    char* d = ::mkdtemp(tmpl);
    path_ = d ? d : "";
  }
  ~TempDir() {
    if (!path_.empty()) Run("rm -rf '" + path_ + "'");
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace cdp::loadgen::testing

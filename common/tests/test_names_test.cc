// SPDX-License-Identifier: Apache-2.0
// The test suite's own hygiene. CTest registers each Catch2 test by its name
// and splits a name at ';' (a CMake list separator): such a test becomes two
// entries that match nothing, and fails (or, before --warn NoTests, passed
// empty). Regression test for the names found split twice (sessions 8 and 9).
#include <catch2/catch.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

namespace fs = std::filesystem;

TEST_CASE("no TEST_CASE name in the tree holds a semicolon (CTest would split it)", "[hygiene]") {
  const fs::path root = CDP_SOURCE_DIR;
  // TEST_CASE( then one or more adjacent string literals (the name).
  const std::regex test_case(R"re(TEST_CASE\(((?:\s*"(?:[^"\\]|\\.)*")+))re");
  const std::regex literal(R"re("((?:[^"\\]|\\.)*)")re");
  size_t files = 0, names = 0;
  std::vector<std::string> bad;
  for (const char* dir : {"agent", "common", "process-server", "master-target", "loadgen", "cdpctl", "e2e", "fuzz", "storage"}) {
    if (!fs::exists(root / dir)) continue;
    for (const auto& e : fs::recursive_directory_iterator(root / dir)) {
      if (!e.is_regular_file() || e.path().extension() != ".cc") continue;
      std::ifstream in(e.path());
      std::stringstream ss;
      ss << in.rdbuf();
      const std::string text = ss.str();
      ++files;
      for (auto m = std::sregex_iterator(text.begin(), text.end(), test_case); m != std::sregex_iterator(); ++m) {
        std::string name;
        const std::string lits = (*m)[1];
        for (auto l = std::sregex_iterator(lits.begin(), lits.end(), literal); l != std::sregex_iterator(); ++l)
          name += (*l)[1];
        ++names;
        if (name.find(';') != std::string::npos) bad.push_back(e.path().string() + ": " + name);
      }
    }
  }
  INFO(files << " files, " << names << " test names");
  CHECK(names > 300);
  for (const auto& b : bad) FAIL_CHECK(b);
  CHECK(bad.empty());
}

// Regression test for CI's failure at 099e444: the TLS export-removal test's
// client (SSL_write, no MSG_NOSIGNAL) wrote to a connection the server had just
// closed, and SIGPIPE killed the whole common test binary. Every test binary
// shares common/tests/main.cc, which ignores SIGPIPE as the daemons do.
TEST_CASE("a test writing to a socket its peer closed gets EPIPE, the binary is not killed by SIGPIPE",
          "[hygiene]") {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  ::close(sv[1]);
  const char b = 'x';
  errno = 0;
  CHECK(::write(sv[0], &b, 1) == -1);  // write(), not send(MSG_NOSIGNAL): what SSL_write does
  CHECK(errno == EPIPE);
  ::close(sv[0]);
}

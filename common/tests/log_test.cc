// SPDX-License-Identifier: Apache-2.0
// The log (common/base/log.h): info lines reach the file within about a second
// without a warning to flush them (issue 38 F5: a kill -9 of the PS lost the
// info lines about a copy reconnecting).
#include "common/base/log.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>

#include "common/tests/test_util.h"

TEST_CASE("log: an info line reaches the log file within about a second, with no warning after it", "[log]") {
  cdp::testing::ScratchDir dir;
  const std::string path = dir.path() + "/daemon.log";
  cdp::log::Options o;
  o.file = path;
  o.level = "info";
  REQUIRE(cdp::log::Init(o).ok());
  cdp::log::Get("ps.link")->info("copy 1 reconnected and resumed after seq {}", 42);
  auto contents = [&] {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  REQUIRE(cdp::testing::WaitUntil(
      [&] { return contents().find("copy 1 reconnected and resumed after seq 42") != std::string::npos; },
      std::chrono::seconds(5)));  // the old code kept it buffered until a warning or exit
}

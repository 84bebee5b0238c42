// SPDX-License-Identifier: Apache-2.0
// Helpers for loadgen tests, on the project's (common/tests/test_util.h).
#pragma once

#include <string>

#include "common/tests/test_util.h"

namespace cdp::loadgen {

// Runs `cmd` with sh -c; stdout and stderr in output. At most 10 minutes.
inline cdp::testing::CommandResult RunShell(const std::string& cmd) {
  return cdp::testing::RunCommand({"sh", "-c", cmd}, 600000);
}

}  // namespace cdp::loadgen

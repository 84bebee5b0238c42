// SPDX-License-Identifier: Apache-2.0
// The version every binary reports with --version: the project version from
// CMakeLists.txt and the git revision the build was made from ("unknown" for a
// source tree without .git, "-dirty" appended for uncommitted changes).
// Thread safety: pure functions over constants.
#pragma once

#include <string>
#include <string_view>

namespace cdp {

std::string_view ProjectVersion();  // "0.1.0"
std::string_view GitRevision();     // "21c6ed0a1b2c", "21c6ed0a1b2c-dirty" or "unknown"

// "cdp-agent 0.1.0 (git 21c6ed0a1b2c)\n": what `PROGRAM --version` prints.
std::string VersionText(std::string_view program);

}  // namespace cdp

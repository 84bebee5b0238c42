// SPDX-License-Identifier: Apache-2.0
#include "common/base/version.h"

#include "cdp_version_info.h"  // generated: CDP_PROJECT_VERSION, CDP_GIT_REVISION

namespace cdp {

std::string_view ProjectVersion() { return CDP_PROJECT_VERSION; }
std::string_view GitRevision() { return CDP_GIT_REVISION; }

std::string VersionText(std::string_view program) {
  std::string s(program);
  s += " ";
  s += ProjectVersion();
  s += " (git ";
  s += GitRevision();
  s += ")\n";
  return s;
}

}  // namespace cdp

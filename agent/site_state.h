// SPDX-License-Identifier: Apache-2.0
// SiteState: what the original site remembers of a volume's failover story,
// persisted per volume in <bitmap_dir>/<volume>.site (docs/formats/site-state.md),
// replaced atomically (WriteFileAtomic) at each change:
//
//   generation  the replication generation the sender opens (1 at first;
//               +1 at each `cdpctl reprotect`)
//   phase       protecting   the tap captures writes and ships them
//               failing-back `cdpctl failback` began: the tap refuses writes
//                            (EPERM) while the provider's image is pulled in
//               failed-back  the source equals the provider's image; writes
//                            stay refused until `cdpctl reprotect`, which
//                            returns to protecting under generation + 1
//
//   protecting --BeginFailback--> failing-back --EndFailback--> failed-back
//        ^                                                           |
//        +------------------ Reprotect (generation + 1) -------------+
//
// A missing file is generation 1, protecting (a volume never failed over).
//
// Thread safety: plain functions; the agent serialises changes per volume.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/base/result.h"
#include "common/base/status.h"
#include "common/env/env.h"

namespace cdp::agent {

enum class SitePhase { kProtecting = 0, kFailingBack = 1, kFailedBack = 2 };
std::string_view SitePhaseName(SitePhase p);  // "protecting", "failing-back", "failed-back"

struct SiteState {
  uint64_t generation = 1;
  SitePhase phase = SitePhase::kProtecting;
  bool operator==(const SiteState&) const = default;
};

// The state at `path`; the default one when the file does not exist;
// kCorruption when it cannot be parsed.
Result<SiteState> LoadSiteState(Env* env, const std::string& path);
// Replaces the file atomically (temporary file, sync, rename, directory sync).
Status SaveSiteState(Env* env, const std::string& path, const SiteState& s);

}  // namespace cdp::agent

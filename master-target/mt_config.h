// SPDX-License-Identifier: Apache-2.0
// The master target's configuration: option declarations for common/daemon/config.h
// and their translation into MasterTargetOptions (docs/recovery.md and
// docs/examples/master-target.conf show the keys).
//
// Thread safety: pure functions, for start-up.
#pragma once

#include "common/base/log.h"
#include "common/base/result.h"
#include "common/daemon/config.h"
#include "master-target/master_target.h"

namespace cdp::mt {

po::options_description MasterTargetConfigDescription();

// Translates loaded values; reads `tenants_file` through `env` (one
// "NAME = SECRET" per line; blank lines and lines starting with '#' are
// skipped). Fills *log with the [log] keys when given. kInvalidArgument names
// the bad key and value. env and clock in the result are `env` and the system clock.
Result<MasterTargetOptions> MasterTargetOptionsFromConfig(const po::variables_map& vars, Env* env,
                                                          log::Options* log = nullptr);

}  // namespace cdp::mt

// SPDX-License-Identifier: Apache-2.0
// The agent's configuration: option declarations for common/daemon/config.h and their
// translation into AgentOptions (docs/agent.md lists every key).
//
// Thread safety: pure functions, for start-up.
#pragma once

#include "agent/agent.h"
#include "common/base/log.h"
#include "common/base/result.h"
#include "common/daemon/config.h"

namespace cdp::agent {

po::options_description AgentConfigDescription();

// Translates loaded values; reads `secret_file` through `env`. Fills *log with
// the [log] keys when given. kInvalidArgument names the bad key and value.
// env and clock in the result are `env` and the system clock.
Result<AgentOptions> AgentOptionsFromConfig(const po::variables_map& vars, Env* env, log::Options* log = nullptr);

}  // namespace cdp::agent

// SPDX-License-Identifier: Apache-2.0
// Cluster commands: the line protocol of `cdp-loadgen cluster --commands`,
// through which a script (bench/lib.sh) drives one LocalCluster
// (loadgen/local_cluster.h) while it runs: start, stop and restart single
// daemons, with other flags, another volume image or more config lines.
//
// One command per line on stdin, words separated by blanks; one reply line
// per command on stdout: "ok", or "error: MESSAGE" (details on stderr).
//
//   start ROLE [FLAG...]     start ROLE with these command-line flags (they
//                            replace the ones it had; none = no flags)
//   restart ROLE             start ROLE again with its flags, on its ports
//                            (retried while another socket still holds one)
//   stop ROLE                SIGTERM, SIGKILL after 20 s
//   kill9 ROLE               SIGKILL
//   volume NAME=PATH         the agent protects PATH (existing) as NAME, from
//   its next start direct on|off            the agent ships to the MT (on) or
//   the PS, from the next starts set ROLE [KEY=VALUE...]  replaces ROLE's extra
//   config lines ("KEY = VALUE"), from its next start quit stop every daemon
//   and exit (so does the end of stdin)
//
// ROLE: mt | mtb (the second master target) | ps | agent. After each command
// the env file (ClusterEnv) is written again: PIDs change as daemons come and
// go.
//
// Thread safety: the functions are pure, except RunClusterCommand (drives the
// cluster).
#pragma once

#include <string>
#include <vector>

#include "common/base/result.h"
#include "common/base/status.h"
#include "loadgen/local_cluster.h"

namespace cdp::loadgen {

struct ClusterCommand {
  enum class Kind { kStart, kRestart, kStop, kKill9, kVolume, kDirect, kSet, kQuit } kind = Kind::kQuit;
  Role role = Role::kAgent;        // start, restart, stop, kill9, set
  std::vector<std::string> words;  // start: the flags; set: the KEY=VALUE lines
  std::string name, path;          // volume
  bool on = false;                 // direct
};

// Parses one line. kInvalidArgument naming what is wrong (unknown command or
// role, missing or extra words, a KEY=VALUE without '=', a path with a
// newline).
Result<ClusterCommand> ParseClusterCommand(const std::string &line);

// "mt" | "mtb" | "ps" | "agent" -> the role; kInvalidArgument otherwise.
Result<Role> ParseRole(const std::string &word);

// Carries out a command (not quit). Failure: the cluster's status (with the
// tail of the logs for a daemon that did not start).
Status RunClusterCommand(LocalCluster &c, const ClusterCommand &cmd);

// The cluster's endpoints as shell assignments (values quoted; PIDs "" for a
// daemon not running): CDP_DIR CDP_TENANT CDP_VOLUME CDP_SOURCE CDP_REPLICA
// CDP_NBD_URI CDP_AGENT_NBD_SOCKET CDP_{AGENT,PS,MT,MTB}_CONTROL (HOST:PORT;
// the MTs' on mt_host) CDP_{PS,MT,MTB}_DATA CDP_MT_NBD
// CDP_{AGENT,PS,MT,MTB}_TOKEN_FILE CDP_{AGENT,PS,MT,MTB}_PID CDP_PKI_DIR
// CDP_MT_NBD_TLS_DIR ("" with TLS off). The MTB entries are "" without a second
// master target.
std::string ClusterEnv(LocalCluster &c);

}  // namespace cdp::loadgen

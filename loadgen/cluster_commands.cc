// SPDX-License-Identifier: Apache-2.0
#include "loadgen/cluster_commands.h"

#include <sstream>

namespace cdp::loadgen {
namespace {

std::string Quote(const std::string &v) {
  std::string q = "'";
  for (char c : v) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::vector<std::string> Words(const std::string &line) {
  std::istringstream in(line);
  std::vector<std::string> w;
  for (std::string s; in >> s;) w.push_back(s);
  return w;
}

}  // namespace

Result<Role> ParseRole(const std::string &word) {
  if (word == "mt") return Role::kMasterTarget;
  if (word == "mtb") return Role::kMasterTargetB;
  if (word == "ps") return Role::kProcessServer;
  if (word == "agent") return Role::kAgent;
  return Status::InvalidArgument("unknown role '" + word + "' (mt, mtb, ps, agent)");
}

Result<ClusterCommand> ParseClusterCommand(const std::string &line) {
  if (line.find('\n') != std::string::npos) return Status::InvalidArgument("a command is one line");
  std::vector<std::string> w = Words(line);
  if (w.empty()) return Status::InvalidArgument("empty command");
  ClusterCommand c;
  const std::string &verb = w[0];
  auto want = [&](size_t n) -> Status {
    if (w.size() != n) return Status::InvalidArgument("'" + verb + "' takes " + std::to_string(n - 1) + " word(s)");
    return Status::OK();
  };
  if (verb == "quit") {
    CDP_RETURN_IF_ERROR(want(1));
    c.kind = ClusterCommand::Kind::kQuit;
    return c;
  }
  if (verb == "volume") {
    CDP_RETURN_IF_ERROR(want(2));
    const auto eq = w[1].find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == w[1].size())
      return Status::InvalidArgument("volume wants NAME=PATH, not '" + w[1] + "'");
    c.kind = ClusterCommand::Kind::kVolume;
    c.name = w[1].substr(0, eq);
    c.path = w[1].substr(eq + 1);
    return c;
  }
  if (verb == "direct") {
    CDP_RETURN_IF_ERROR(want(2));
    if (w[1] != "on" && w[1] != "off") return Status::InvalidArgument("direct wants on or off");
    c.kind = ClusterCommand::Kind::kDirect;
    c.on = w[1] == "on";
    return c;
  }
  if (verb == "start")
    c.kind = ClusterCommand::Kind::kStart;
  else if (verb == "restart")
    c.kind = ClusterCommand::Kind::kRestart;
  else if (verb == "stop")
    c.kind = ClusterCommand::Kind::kStop;
  else if (verb == "kill9")
    c.kind = ClusterCommand::Kind::kKill9;
  else if (verb == "set")
    c.kind = ClusterCommand::Kind::kSet;
  else
    return Status::InvalidArgument("unknown command '" + verb + "'");
  if (w.size() < 2) return Status::InvalidArgument("'" + verb + "' needs a role");
  CDP_ASSIGN_OR_RETURN(c.role, ParseRole(w[1]));
  c.words.assign(w.begin() + 2, w.end());
  if ((c.kind == ClusterCommand::Kind::kRestart || c.kind == ClusterCommand::Kind::kStop ||
       c.kind == ClusterCommand::Kind::kKill9) &&
      !c.words.empty())
    return Status::InvalidArgument("'" + verb + "' takes a role only");
  if (c.kind == ClusterCommand::Kind::kSet) {
    for (const auto &kv : c.words) {
      const auto eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) return Status::InvalidArgument("set wants KEY=VALUE, not '" + kv + "'");
    }
  }
  return c;
}

Status RunClusterCommand(LocalCluster &c, const ClusterCommand &cmd) {
  switch (cmd.kind) {
    case ClusterCommand::Kind::kStart:
      c.SetArgs(cmd.role, cmd.words);
      return c.StartOne(cmd.role);
    case ClusterCommand::Kind::kRestart:
      return c.Restart(cmd.role);
    case ClusterCommand::Kind::kStop:
      if (!c.Running(cmd.role)) return Status::OK();  // stopped already (or never started): nothing to do
      return c.Stop(cmd.role, std::chrono::seconds(20));
    case ClusterCommand::Kind::kKill9:
      return c.Kill9(cmd.role);
    case ClusterCommand::Kind::kVolume:
      return c.SetVolume(cmd.name, cmd.path);
    case ClusterCommand::Kind::kDirect:
      return c.SetDirectAgent(cmd.on);
    case ClusterCommand::Kind::kSet: {
      std::string lines;
      for (const auto &kv : cmd.words) {
        const auto eq = kv.find('=');
        lines += kv.substr(0, eq) + " = " + kv.substr(eq + 1) + "\n";
      }
      return c.SetExtraConfig(cmd.role, lines);
    }
    case ClusterCommand::Kind::kQuit:
      return Status::InvalidArgument("quit is the caller's");
  }
  return Status::InvalidArgument("unknown command");
}

std::string ClusterEnv(LocalCluster &c) {
  const LocalClusterOptions &o = c.options();
  const bool b = o.master_targets == 2;
  auto hp = [&](uint16_t port) { return Quote(o.host + ":" + std::to_string(port)); };
  auto mhp = [&](uint16_t port) { return Quote(c.mt_host() + ":" + std::to_string(port)); };
  auto pid = [&](Role r) { return c.Running(r) ? std::to_string(c.pid(r)) : std::string(); };
  std::string e;
  auto add = [&](const char *k, const std::string &v) { e += std::string(k) + "=" + v + "\n"; };
  add("CDP_DIR", Quote(o.dir));
  add("CDP_TENANT", Quote(o.tenant));
  add("CDP_VOLUME", Quote(o.volume));
  add("CDP_SOURCE", Quote(c.source_path()));
  add("CDP_REPLICA", Quote(c.replica_path()));
  add("CDP_NBD_URI", Quote(c.nbd_uri()));
  add("CDP_AGENT_NBD_SOCKET", Quote(c.agent_nbd_socket()));
  add("CDP_AGENT_CONTROL", hp(c.control_port(Role::kAgent)));
  add("CDP_PS_CONTROL", hp(c.control_port(Role::kProcessServer)));
  add("CDP_MT_CONTROL", mhp(c.control_port(Role::kMasterTarget)));
  add("CDP_MTB_CONTROL", b ? mhp(c.control_port(Role::kMasterTargetB)) : "''");
  add("CDP_PS_DATA", hp(c.ps_data_port()));
  add("CDP_MT_DATA", mhp(c.mt_data_port()));
  add("CDP_MTB_DATA", b ? mhp(c.mtb_data_port()) : "''");
  add("CDP_MT_NBD", mhp(c.mt_nbd_port()));
  add("CDP_AGENT_TOKEN_FILE", Quote(c.token_path(Role::kAgent)));
  add("CDP_PS_TOKEN_FILE", Quote(c.token_path(Role::kProcessServer)));
  add("CDP_MT_TOKEN_FILE", Quote(c.token_path(Role::kMasterTarget)));
  add("CDP_MTB_TOKEN_FILE", b ? Quote(c.token_path(Role::kMasterTargetB)) : "''");
  add("CDP_AGENT_PID", pid(Role::kAgent));
  add("CDP_PS_PID", pid(Role::kProcessServer));
  add("CDP_MT_PID", pid(Role::kMasterTarget));
  add("CDP_MTB_PID", pid(Role::kMasterTargetB));
  add("CDP_PKI_DIR", Quote(o.tls ? c.pki_dir() : std::string()));
  // The site CA that the HTTPS control ports verify against (cdpctl reads
  // CDP_TLS_CA; curl --cacert), "" when they speak plain HTTP.
  add("CDP_TLS_CA", Quote(c.control_ca()));
  // The tenant's NBD client certificates (libnbd tls-certificates=), "" with
  // TLS off.
  add("CDP_MT_NBD_TLS_DIR", Quote(o.tls ? c.nbd_client_dir() : std::string()));
  return e;
}

}  // namespace cdp::loadgen

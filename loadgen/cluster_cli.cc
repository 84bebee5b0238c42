// SPDX-License-Identifier: Apache-2.0
// `cdp-loadgen cluster`: the whole product on loopback through LocalCluster
// (loadgen/local_cluster.h), optionally driven by commands on stdin
// (loadgen/cluster_commands.h).
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <iostream>
#include <string>
#include <vector>

#include "common/base/log.h"
#include "common/env/env.h"
#include "loadgen/cli.h"
#include "loadgen/cluster_commands.h"
#include "loadgen/local_cluster.h"

namespace po = boost::program_options;

namespace cdp::loadgen {

namespace {

// "a b  c" -> {"a", "b", "c"} (the flags of --mt-args and the like).
std::vector<std::string> SplitWords(const std::string& s) {
  std::vector<std::string> w;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    size_t j = i;
    while (j < s.size() && !std::isspace(static_cast<unsigned char>(s[j]))) ++j;
    if (j > i) w.push_back(s.substr(i, j - i));
    i = j;
  }
  return w;
}

// KEY=VALUE options (--agent-set and the like) -> config lines.
Result<std::string> ConfigLines(const po::variables_map& vm, const char* option) {
  std::string lines;
  if (!vm.count(option)) return lines;
  for (const auto& kv : vm[option].as<std::vector<std::string>>()) {
    const auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0 || kv.find('\n') != std::string::npos)
      return Status::InvalidArgument("bad --" + std::string(option) + " '" + kv + "': want KEY=VALUE");
    lines += kv.substr(0, eq) + " = " + kv.substr(eq + 1) + "\n";
  }
  return lines;
}

Status WriteEnvFile(const std::string& path, const std::string& env) {
  if (path.empty()) return Status::OK();
  return WriteFileAtomic(DefaultEnv(), path, ByteSpan(reinterpret_cast<const uint8_t*>(env.data()), env.size()));
}

// --commands: one command a line from stdin (loadgen/cluster_commands.h), one
// reply a line on stdout, until quit, the end of stdin, SIGTERM or SIGINT
// (blocked in `stop`, taken with sigtimedwait between polls of stdin).
int ServeCommands(LocalCluster& c, const std::string& env_file, const sigset_t& stop) {
  std::cout << "ok" << std::endl;
  std::string buf;
  char chunk[4096];
  for (;;) {
    const timespec zero{};
    if (sigtimedwait(&stop, nullptr, &zero) > 0) break;
    size_t nl = buf.find('\n');
    if (nl == std::string::npos) {
      pollfd p{0, POLLIN, 0};
      if (::poll(&p, 1, 200) <= 0) continue;
      const ssize_t n = ::read(0, chunk, sizeof(chunk));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // end of stdin: the script is gone or done
      buf.append(chunk, size_t(n));
      continue;
    }
    const std::string line = buf.substr(0, nl);
    buf.erase(0, nl + 1);
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto cmd = ParseClusterCommand(line);
    if (cmd.ok() && cmd->kind == ClusterCommand::Kind::kQuit) break;
    Status s = cmd.ok() ? RunClusterCommand(c, *cmd) : cmd.status();
    if (s.ok()) s = WriteEnvFile(env_file, ClusterEnv(c));
    if (s.ok()) {
      std::cout << "ok" << std::endl;
    } else {
      std::cerr << "cdp-loadgen cluster: " << line << ": " << s.ToString() << "\n";
      std::string first = s.ToString();
      first = first.substr(0, first.find('\n'));
      std::cout << "error: " << first << std::endl;
    }
  }
  std::cerr << "cdp-loadgen cluster: stopping the daemons\n";
  c.StopAll();
  return 0;
}

}  // namespace

int CmdCluster(int argc, char** argv) {
  po::options_description d("cluster options");
  d.add_options()("build", po::value<std::string>()->default_value("build"), "build directory with the daemons")(
      "dir", po::value<std::string>()->default_value(""), "working directory (created; kept after exit)")(
      "volume", po::value<std::string>()->default_value("vol"), "protected volume name")(
      "volume-size", po::value<ByteSize>()->default_value(ByteSize{1ull << 30}), "sparse source volume size")(
      "volume-image", po::value<std::string>()->default_value(""),
      "the protected volume's file (default DIR/source.img; made sparse of --volume-size when missing)")(
      "tenant", po::value<std::string>()->default_value("local"), "tenant name")(
      "secret", po::value<std::string>()->default_value(""), "the tenant's secret (default: the harness's)")(
      "codec", po::value<std::string>()->default_value("zstd"), "process server codec: none | lz4 | zstd")(
      "level", po::value<int>()->default_value(1), "compression level")(
      "point-interval", po::value<std::string>()->default_value(""), "MT crash-consistent point interval")(
      "tls", po::value<std::string>()->default_value("on"), "TLS on the data links: on | off")(
      "pki-dir", po::value<std::string>()->default_value(""),
      "site CA and certificates (ca, mt, ps, agent .crt/.key; missing ones are made); default DIR/pki")(
      "host", po::value<std::string>()->default_value("127.0.0.1"),
      "the address every daemon listens on (e.g. a network namespace's, when run under ip netns exec)")(
      "mt-host", po::value<std::string>()->default_value(""),
      "the master targets' address (default --host), e.g. the far side of wanem with --mt-wrapper \"ip netns exec NS\"")(
      "start", po::value<std::string>()->default_value("mt,ps,agent"),
      "daemons started at once: mt,ps,agent or mt,ps (the agent later, with --commands)")(
      "agent-ps", po::value<std::string>()->default_value(""),
      "HOST:PORT: the agent ships there (a test peer), and neither MT nor PS starts")(
      "master-targets", po::value<int>()->default_value(1), "1, or 2: a second MT, and the PS ships a copy to each")(
      "direct-agent", po::value<bool>()->default_value(false)->implicit_value(true),
      "the agent ships straight to the MT (the MT lists the tenant in direct_agents)")(
      "mt-bin", po::value<std::string>()->default_value(""), "another cdp-master-target (default BUILD's)")(
      "mt-wrapper", po::value<std::string>()->default_value(""), "a command prefix for the MT, e.g. \"valgrind --tool=callgrind\"")(
      "mt-args", po::value<std::string>()->default_value(""), "more MT flags, blank-separated (after --config)")(
      "ps-args", po::value<std::string>()->default_value(""), "more PS flags, blank-separated")(
      "agent-args", po::value<std::string>()->default_value(""), "more agent flags, blank-separated")(
      "env-file", po::value<std::string>()->default_value(""),
      "write the endpoints here as shell assignments once every daemon answers (and after every command)")(
      "commands", po::value<bool>()->default_value(false)->implicit_value(true),
      "read commands from stdin, one a line, and answer each with one line (loadgen/cluster_commands.h)")(
      "agent-set", po::value<std::vector<std::string>>()->composing(),
      "KEY=VALUE: one more line of the agent's config, e.g. anomaly.enabled=false (repeatable)")(
      "ps-set", po::value<std::vector<std::string>>()->composing(), "KEY=VALUE: one more line of the PS's config")(
      "mt-set", po::value<std::vector<std::string>>()->composing(), "KEY=VALUE: one more line of the MTs' config");
  LoadedConfig cfg;
  if (int rc = Load(argc, argv, d, "Starts cdp-master-target, cdp-process-server and cdp-agent on loopback, "
                                   "prints their endpoints and runs until SIGTERM or SIGINT.",
                    &cfg);
      rc >= 0)
    return rc;
  const po::variables_map& vm = cfg.vars;
  if (vm["dir"].as<std::string>().empty()) return Fail("cluster", Status::InvalidArgument("--dir is required"));
  // Blocked before any thread or child exists; waited for below.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  LocalClusterOptions o = LocalClusterOptionsFor(vm["build"].as<std::string>(), vm["dir"].as<std::string>());
  o.volume = vm["volume"].as<std::string>();
  o.volume_bytes = vm["volume-size"].as<ByteSize>().bytes;
  o.volume_image = vm["volume-image"].as<std::string>();
  o.tenant = vm["tenant"].as<std::string>();
  if (!vm["secret"].as<std::string>().empty()) o.secret = vm["secret"].as<std::string>();
  o.codec = vm["codec"].as<std::string>();
  o.level = vm["level"].as<int>();
  o.point_interval = vm["point-interval"].as<std::string>();
  const std::string tls = vm["tls"].as<std::string>();
  if (tls != "on" && tls != "off") return Fail("cluster", Status::InvalidArgument("--tls must be on or off"));
  o.tls = tls == "on";
  o.pki_dir = vm["pki-dir"].as<std::string>();
  o.host = vm["host"].as<std::string>();
  o.mt_host = vm["mt-host"].as<std::string>();
  const std::string start = vm["start"].as<std::string>();
  if (start != "mt,ps,agent" && start != "mt,ps")
    return Fail("cluster", Status::InvalidArgument("--start must be mt,ps,agent or mt,ps"));
  o.start_agent = start == "mt,ps,agent";
  o.master_targets = vm["master-targets"].as<int>();
  o.agent_ps = vm["agent-ps"].as<std::string>();
  o.direct_agent = vm["direct-agent"].as<bool>();
  if (!vm["mt-bin"].as<std::string>().empty()) o.mt_bin = vm["mt-bin"].as<std::string>();
  o.mt_wrapper = SplitWords(vm["mt-wrapper"].as<std::string>());
  o.mt_args = SplitWords(vm["mt-args"].as<std::string>());
  o.ps_args = SplitWords(vm["ps-args"].as<std::string>());
  o.agent_args = SplitWords(vm["agent-args"].as<std::string>());
  for (auto [option, lines] : {std::pair{"agent-set", &o.agent_extra_config}, std::pair{"ps-set", &o.ps_extra_config},
                               std::pair{"mt-set", &o.mt_extra_config}}) {
    auto l = ConfigLines(vm, option);
    if (!l.ok()) return Fail("cluster", l.status());
    *lines = *l;
  }
  const bool commands = vm["commands"].as<bool>();
  o.die_with_parent = true;  // a kill -9 of this command takes the daemons with it
  LocalCluster c(o);
  if (Status s = c.Start(); !s.ok()) return Fail("cluster", s);
  const std::string env = ClusterEnv(c);
  const std::string env_file = vm["env-file"].as<std::string>();
  if (Status s = WriteEnvFile(env_file, env); !s.ok()) return Fail("cluster", s);
  if (commands) return ServeCommands(c, env_file, stop);
  std::cout << env << std::flush;
  int sig = 0;
  sigwait(&stop, &sig);
  std::cerr << "cdp-loadgen cluster: " << (sig == SIGINT ? "SIGINT" : "SIGTERM") << ", stopping the daemons\n";
  c.StopAll();
  return 0;
}


}  // namespace cdp::loadgen

// cdp-agent: protects block volumes behind an NBD capture tap and ships every
// write to the process server. See docs/agent.md.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "agent/agent.h"
#include "common/config.h"
#include "common/host_port.h"
#include "common/log.h"

namespace {

int Fail(const std::string& msg) {
  std::cerr << "cdp-agent: " << msg << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using cdp::po::value;
  cdp::po::options_description desc("cdp-agent options");
  desc.add_options()
      ("volume", value<std::vector<std::string>>()->composing(), "NAME=PATH: protect backing file/device PATH as volume NAME (repeatable)")
      ("export_name", value<std::vector<std::string>>()->composing(), "NAME=EXPORT: NBD export name of volume NAME (default: NAME)")
      ("nbd_listen", value<std::string>()->default_value("127.0.0.1:10809"), "NBD TCP listener host:port ('none' = off)")
      ("nbd_unix", value<std::string>()->default_value(""), "NBD unix socket path ('' = off)")
      ("nbd_workers", value<int>()->default_value(2), "threads executing NBD requests")
      ("ps", value<std::string>()->default_value("127.0.0.1:7400"), "process server host:port")
      ("tenant", value<std::string>()->default_value(""), "tenant name")
      ("secret", value<std::string>()->default_value(""), "tenant secret")
      ("secret_file", value<std::string>()->default_value(""), "file holding the tenant secret")
      ("client_id", value<std::string>()->default_value(""), "agent id sent to the process server (default: host name)")
      ("capture_only", value<bool>()->default_value(false), "do not connect to a process server (tap benchmarks)")
      ("budget", value<cdp::ByteSize>()->default_value(cdp::ByteSize{64ull << 20}), "capture queue memory per volume")
      ("region_size", value<cdp::ByteSize>()->default_value(cdp::ByteSize{1u << 20}), "dirty bitmap region size")
      ("bitmap_dir", value<std::string>()->default_value("/var/lib/opencdp/agent"), "directory of the dirty bitmaps")
      ("batch_bytes", value<cdp::ByteSize>()->default_value(cdp::ByteSize{4u << 20}), "data bytes per write batch")
      ("max_inflight", value<int>()->default_value(4), "write batches in flight")
      ("control", value<std::string>()->default_value("127.0.0.1:9100"), "control/metrics HTTP host:port ('none' = off)")
      ("freeze_command", value<std::string>()->default_value(""), "run before a tag (e.g. 'fsfreeze -f /data')")
      ("thaw_command", value<std::string>()->default_value(""), "run after a tag, always (e.g. 'fsfreeze -u /data')")
      ("freeze_timeout", value<cdp::Duration>()->default_value(cdp::Duration{10'000'000}), "bound on the freeze window")
      ("log.level", value<std::string>()->default_value(""), "trace|debug|info|warn|error")
      ("log.file", value<std::string>()->default_value(""), "log file ('' = stderr)");
  cdp::ConfigOptions co;
  co.program = "cdp-agent";
  co.summary = "OpenCDP agent: NBD capture tap with write-order capture, dirty bitmap and resync";
  co.default_config_path = "/etc/opencdp/agent.conf";
  auto loaded = cdp::LoadConfig(argc, argv, desc, co);
  if (!loaded.ok()) return Fail(loaded.status().message());
  if (const std::string* answer = loaded->Answer()) {
    std::cout << *answer;
    return 0;
  }
  const auto& vm = loaded->vars;
  cdp::log::Options lo;
  lo.level = vm["log.level"].as<std::string>();
  lo.file = vm["log.file"].as<std::string>();
  if (auto s = cdp::log::Init(lo); !s.ok()) return Fail(s.message());

  cdp::agent::AgentOptions ao;
  ao.env = cdp::DefaultEnv();
  ao.clock = cdp::SystemClock::Get();
  std::map<std::string, std::string> exports;
  if (vm.count("export_name")) {
    for (const auto& e : vm["export_name"].as<std::vector<std::string>>()) {
      auto eq = e.find('=');
      if (eq == std::string::npos) return Fail("export_name must be NAME=EXPORT: '" + e + "'");
      exports[e.substr(0, eq)] = e.substr(eq + 1);
    }
  }
  if (vm.count("volume")) {
    for (const auto& v : vm["volume"].as<std::vector<std::string>>()) {
      auto eq = v.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == v.size()) return Fail("volume must be NAME=PATH: '" + v + "'");
      cdp::agent::VolumeConfig vc{v.substr(0, eq), v.substr(eq + 1), ""};
      if (!cdp::proto::ValidName(vc.name)) return Fail("bad volume name '" + vc.name + "'");
      if (auto it = exports.find(vc.name); it != exports.end()) vc.export_name = it->second;
      ao.volumes.push_back(vc);
    }
  }
  if (ao.volumes.empty()) return Fail("no volume configured (volume = NAME=PATH)");
  const auto listener = cdp::HostPort::Rules::OptionalListen();
  auto nbd_listen = cdp::ParseHostPort(vm["nbd_listen"].as<std::string>(), listener);
  if (!nbd_listen.ok()) return Fail("nbd_listen: " + nbd_listen.status().message());
  ao.nbd.tcp_host = nbd_listen->host;
  ao.nbd.tcp_port = nbd_listen->off() ? -1 : nbd_listen->port;
  ao.nbd.unix_path = vm["nbd_unix"].as<std::string>();
  ao.nbd.worker_threads = std::max(1, vm["nbd_workers"].as<int>());
  ao.budget = vm["budget"].as<cdp::ByteSize>().bytes;
  uint64_t region = vm["region_size"].as<cdp::ByteSize>().bytes;
  if (region < 4096 || region > (1u << 30) || (region & (region - 1)) != 0) return Fail("region_size must be a power of two in 4KiB..1GiB");
  ao.region_size = uint32_t(region);
  ao.bitmap_dir = vm["bitmap_dir"].as<std::string>();
  ao.sender_enabled = !vm["capture_only"].as<bool>();
  auto ps = cdp::ParseHostPort(vm["ps"].as<std::string>());
  if (!ps.ok()) return Fail("ps: " + ps.status().message());
  ao.sender.ps_host = ps->host;
  ao.sender.ps_port = ps->port;
  ao.sender.tenant = vm["tenant"].as<std::string>();
  ao.sender.secret = vm["secret"].as<std::string>();
  std::string secret_file = vm["secret_file"].as<std::string>();
  if (!secret_file.empty()) {
    auto data = cdp::ReadWholeFile(ao.env, secret_file);
    if (!data.ok()) return Fail(data.status().ToString());
    ao.sender.secret.assign(data->begin(), data->end());
    while (!ao.sender.secret.empty() && (ao.sender.secret.back() == '\n' || ao.sender.secret.back() == '\r')) ao.sender.secret.pop_back();
  }
  if (ao.sender_enabled && (!cdp::proto::ValidName(ao.sender.tenant) || ao.sender.secret.empty())) {
    return Fail("tenant and secret (or secret_file) are required unless capture_only = true");
  }
  ao.sender.client_id = vm["client_id"].as<std::string>();
  if (ao.sender.client_id.empty()) {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    ao.sender.client_id = host;
    if (!cdp::proto::ValidName(ao.sender.client_id)) ao.sender.client_id = "agent";
  }
  ao.sender.batch_bytes = std::max<uint64_t>(4096, vm["batch_bytes"].as<cdp::ByteSize>().bytes);
  ao.sender.max_inflight = std::max(1, vm["max_inflight"].as<int>());
  auto control = cdp::ParseHostPort(vm["control"].as<std::string>(), listener);
  if (!control.ok()) return Fail("control: " + control.status().message());
  ao.control_host = control->host;
  ao.control_port = control->off() ? -1 : control->port;
  ao.freeze_command = vm["freeze_command"].as<std::string>();
  ao.thaw_command = vm["thaw_command"].as<std::string>();
  ao.freeze_timeout_ms = vm["freeze_timeout"].as<cdp::Duration>().millis();

  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);

  cdp::agent::Agent agent(ao);
  if (auto s = agent.Start(); !s.ok()) return Fail(s.ToString());
  std::printf("cdp-agent ready: nbd_port=%u control_port=%u\n", agent.nbd_port(), agent.control_port());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&sigs, &sig);
  cdp::log::Get("agent")->info("signal {}: stopping", sig);
  agent.Stop();
  return 0;
}

// cdp-master-target: the provider-side daemon. See master-target/server.h for
// the protocol and control API, docs/recovery.md for operating it.
#include <csignal>
#include <cstdio>
#include <iostream>
#include <string>
#include <tuple>
#include <vector>

#include "common/clock.h"
#include "common/config.h"
#include "common/host_port.h"
#include "common/env.h"
#include "common/log.h"
#include "master-target/server.h"

namespace {

using cdp::Status;

// Adds "name:secret" or "name = secret" / "name secret" lines to `tenants`.
bool AddTenant(const std::string& line, std::map<std::string, std::string>* tenants, std::string* err) {
  std::string t = line;
  auto trim = [](std::string x) {
    size_t a = x.find_first_not_of(" \t\r"), b = x.find_last_not_of(" \t\r");
    return a == std::string::npos ? std::string() : x.substr(a, b - a + 1);
  };
  t = trim(t);
  if (t.empty() || t[0] == '#') return true;
  size_t sep = t.find_first_of(":= \t");
  if (sep == std::string::npos) {
    *err = "tenant entry '" + t + "' is not NAME:SECRET";
    return false;
  }
  std::string name = trim(t.substr(0, sep)), rest = t.substr(sep + 1);
  size_t a = rest.find_first_not_of(":= \t");
  std::string secret = a == std::string::npos ? "" : trim(rest.substr(a));
  if (!cdp::proto::ValidName(name) || secret.empty()) {
    *err = "bad tenant entry for '" + name + "'";
    return false;
  }
  (*tenants)[name] = secret;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  namespace po = boost::program_options;
  po::options_description desc("Options");
  desc.add_options()
      ("listen", po::value<std::string>()->default_value("0.0.0.0:7500"), "data listener for process servers (host:port)")
      ("control", po::value<std::string>()->default_value("127.0.0.1:9102"), "control API, /metrics, /status (host:port)")
      ("nbd", po::value<std::string>()->default_value("127.0.0.1:10810"), "point-in-time NBD exports (host:port)")
      ("data_dir", po::value<std::string>()->default_value("/var/lib/opencdp/master-target"), "replicas, journals, indexes")
      ("tenant", po::value<std::vector<std::string>>()->composing(), "a tenant as NAME:SECRET (repeatable)")
      ("tenants_file", po::value<std::string>(), "file of tenants, one 'NAME = SECRET' per line")
      ("tenant_quota", po::value<std::vector<std::string>>()->composing(),
       "NAME:SIZE, bytes of volumes + journals a tenant may use (repeatable)")
      ("segment_size", po::value<cdp::ByteSize>()->default_value(cdp::ByteSize{64ull << 20}), "undo journal segment size")
      ("point_interval", po::value<cdp::Duration>()->default_value(cdp::Duration{5'000'000}),
       "at most one crash-consistent point per interval")
      ("retention.max_age", po::value<cdp::Duration>(), "keep points younger than this (unset: no age limit)")
      ("retention.max_bytes", po::value<cdp::ByteSize>(), "journal size limit per volume (unset: none)")
      ("retention.check_interval", po::value<cdp::Duration>()->default_value(cdp::Duration{10'000'000}),
       "how often retention runs")
      ("log.level", po::value<std::string>()->default_value(""), "trace, debug, info, warn, error")
      ("log.file", po::value<std::string>()->default_value(""), "log file (default stderr)");
  cdp::ConfigOptions co;
  co.program = "cdp-master-target";
  co.summary = "OpenCDP master target: applies replicated writes behind an undo journal";
  co.default_config_path = "/etc/opencdp/master-target.conf";
  auto cfg = cdp::LoadConfig(argc, argv, desc, co);
  if (!cfg.ok()) {
    std::cerr << "cdp-master-target: " << cfg.status().message() << "\n";
    return 2;
  }
  if (const std::string* answer = cfg->Answer()) {
    std::cout << *answer;
    return 0;
  }
  const auto& vm = cfg->vars;
  cdp::log::Options lo;
  lo.level = vm["log.level"].as<std::string>();
  lo.file = vm["log.file"].as<std::string>();
  if (Status s = cdp::log::Init(lo); !s.ok()) {
    std::cerr << "cdp-master-target: " << s.ToString() << "\n";
    return 2;
  }
  auto log = cdp::log::Get("mt");

  cdp::mt::MasterTargetOptions o;
  o.env = cdp::DefaultEnv();
  o.clock = cdp::SystemClock::Get();
  o.data_dir = vm["data_dir"].as<std::string>();
  std::string err;
  for (auto [key, host, port] : {std::tuple{"listen", &o.listen_host, &o.listen_port},
                                  std::tuple{"control", &o.control_host, &o.control_port},
                                  std::tuple{"nbd", &o.nbd_host, &o.nbd_port}}) {
    auto hp = cdp::ParseHostPort(vm[key].as<std::string>(), cdp::HostPort::Rules::Listen());
    if (!hp.ok()) {
      std::cerr << "cdp-master-target: " << key << ": " << hp.status().message() << "\n";
      return 2;
    }
    *host = hp->host;
    *port = hp->port;
  }
  if (vm.count("tenant")) {
    for (const auto& t : vm["tenant"].as<std::vector<std::string>>()) {
      if (!AddTenant(t, &o.tenants, &err)) {
        std::cerr << "cdp-master-target: " << err << "\n";
        return 2;
      }
    }
  }
  if (vm.count("tenants_file")) {
    auto text = cdp::ReadWholeFile(o.env, vm["tenants_file"].as<std::string>());
    if (!text.ok()) {
      std::cerr << "cdp-master-target: " << text.status().ToString() << "\n";
      return 2;
    }
    std::string all(text->begin(), text->end());
    size_t pos = 0;
    while (pos <= all.size()) {
      size_t nl = all.find('\n', pos);
      std::string line = all.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
      if (!AddTenant(line, &o.tenants, &err)) {
        std::cerr << "cdp-master-target: " << vm["tenants_file"].as<std::string>() << ": " << err << "\n";
        return 2;
      }
      if (nl == std::string::npos) break;
      pos = nl + 1;
    }
  }
  if (vm.count("tenant_quota")) {
    for (const auto& q : vm["tenant_quota"].as<std::vector<std::string>>()) {
      auto c = q.find(':');
      auto size = c == std::string::npos ? cdp::Result<cdp::ByteSize>(cdp::Status::InvalidArgument("missing ':'"))
                                         : cdp::ParseByteSize(q.substr(c + 1));
      if (!size.ok() || !o.tenants.count(q.substr(0, c))) {
        std::cerr << "cdp-master-target: bad tenant_quota '" << q << "' (NAME:SIZE of a configured tenant)\n";
        return 2;
      }
      o.tenant_quota_bytes[q.substr(0, c)] = size->bytes;
    }
  }
  if (o.tenants.empty()) log->warn("no tenants configured: every connection will be refused");
  o.segment_bytes = vm["segment_size"].as<cdp::ByteSize>().bytes;
  o.point_interval_us = vm["point_interval"].as<cdp::Duration>().micros;
  if (vm.count("retention.max_age")) o.retention.max_age_us = vm["retention.max_age"].as<cdp::Duration>().micros;
  if (vm.count("retention.max_bytes")) o.retention.max_bytes = vm["retention.max_bytes"].as<cdp::ByteSize>().bytes;
  o.retention_check_us = vm["retention.check_interval"].as<cdp::Duration>().micros;

  // Signals are taken synchronously by this thread; every other thread blocks them.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  cdp::mt::MasterTarget mt(o);
  if (Status s = mt.Start(); !s.ok()) {
    log->critical("start failed: {}", s.ToString());
    return 1;
  }
  int sig = 0;
  sigwait(&set, &sig);
  log->info("signal {}: stopping", sig);
  mt.Stop();
  return 0;
}

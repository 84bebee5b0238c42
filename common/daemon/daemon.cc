// SPDX-License-Identifier: Apache-2.0
#include "common/daemon/daemon.h"

#include <malloc.h>
#include <sys/resource.h>

#include <csignal>

#include "common/base/names.h"

namespace cdp {

StopSignals::StopSignals() {
  sigemptyset(&set_);
  sigaddset(&set_, SIGINT);
  sigaddset(&set_, SIGTERM);
  sigaddset(&set_, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set_, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
}

uint64_t RaiseOpenFileLimit() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return 0;
  if (lim.rlim_cur < lim.rlim_max) {
    rlimit raised = lim;
    raised.rlim_cur = lim.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) lim = raised;
  }
  return uint64_t(lim.rlim_cur);
}

bool TuneMalloc() {
  const bool threshold = ::mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;
  const bool trim = ::mallopt(M_TRIM_THRESHOLD, 64 << 20) == 1;
  return threshold && trim;
}

int StopSignals::Wait(const std::function<void()>& on_hup) {
  for (;;) {
    int sig = 0;
    if (sigwait(&set_, &sig) != 0) continue;
    if (sig != SIGHUP) return sig;
    if (on_hup) on_hup();
  }
}

namespace {
std::string_view Trim(std::string_view s) {
  size_t a = s.find_first_not_of(" \t\r");
  if (a == std::string_view::npos) return {};
  size_t b = s.find_last_not_of(" \t\r");
  return s.substr(a, b - a + 1);
}
}  // namespace

Result<std::pair<std::string, std::string>> ParseTenantEntry(std::string_view line) {
  std::string_view t = Trim(line);
  size_t sep = t.find_first_of(":= \t");
  if (sep == std::string_view::npos) {
    return Status::InvalidArgument("tenant entry for '" + std::string(t.substr(0, 64)) + "' is not NAME:SECRET");
  }
  std::string name(Trim(t.substr(0, sep)));
  std::string_view rest = t.substr(sep + 1);
  // A CR between name and secret is white space here too, as it is at the
  // ends: "acme \r= s" is "acme = s", not the secret "= s" (found by fuzz/mt_tenants).
  size_t a = rest.find_first_not_of(":= \t\r");
  std::string secret = a == std::string_view::npos ? std::string() : std::string(Trim(rest.substr(a)));
  if (!ValidName(name) || secret.empty()) {
    return Status::InvalidArgument("bad tenant entry for '" + name + "' (want NAME:SECRET)");
  }
  return std::make_pair(std::move(name), std::move(secret));
}

Status AddTenantEntry(std::string_view line, std::map<std::string, std::string>* tenants) {
  CDP_ASSIGN_OR_RETURN(auto entry, ParseTenantEntry(line));
  if (!tenants->emplace(entry.first, std::move(entry.second)).second) {
    return Status::InvalidArgument("tenant '" + entry.first + "' given twice");
  }
  return Status::OK();
}

Status CheckSecretStrength(std::string_view secret, std::string_view what) {
  const std::string fix = " (make one with: openssl rand -hex 32)";
  if (secret == kPlaceholderSecret) {
    return Status::InvalidArgument(std::string(what) + ": the secret is the example's placeholder '" +
                                   std::string(kPlaceholderSecret) + "'" + fix);
  }
  const bool hex = !secret.empty() && secret.find_first_not_of("0123456789abcdefABCDEF") == std::string_view::npos;
  if (secret.size() < 16 || (hex && secret.size() < 32)) {
    return Status::InvalidArgument(std::string(what) + ": the secret is under 128 bits (" +
                                   std::to_string(secret.size()) + (hex ? " hex digits; 32 at least" : " bytes; 16 at least") +
                                   ")" + fix);
  }
  return Status::OK();
}

void AddConnectionCapOptions(boost::program_options::options_description* desc) {
  namespace po = boost::program_options;
  const ConnectionCaps defaults;
  desc->add_options()("max_connections", po::value<size_t>()->default_value(defaults.total),
                      "peer connections at most, in all (more are closed at once)")(
      "max_connections_per_peer", po::value<size_t>()->default_value(defaults.per_peer),
      "peer connections at most from one IP address")(
      "control_max_connections_per_peer", po::value<size_t>()->default_value(defaults.control_per_peer),
      "control (HTTP) connections at most from one IP address");
}

Result<ConnectionCaps> GetConnectionCaps(const boost::program_options::variables_map& vm) {
  ConnectionCaps c;
  c.total = vm["max_connections"].as<size_t>();
  c.per_peer = vm["max_connections_per_peer"].as<size_t>();
  if (c.total < 1 || c.total > 65536) return Status::InvalidArgument("'max_connections' must be 1..65536");
  if (c.per_peer < 1 || c.per_peer > 65536) return Status::InvalidArgument("'max_connections_per_peer' must be 1..65536");
  c.control_per_peer = vm["control_max_connections_per_peer"].as<size_t>();
  if (c.control_per_peer < 1 || c.control_per_peer > 65536)
    return Status::InvalidArgument("'control_max_connections_per_peer' must be 1..65536");
  return c;
}

void AddTlsOptions(boost::program_options::options_description* desc) {
  namespace po = boost::program_options;
  desc->add_options()("tls", po::value<std::string>()->default_value("on"),
                      "TLS 1.3 with mutual certificates on the data path: on | off (off = clear text)")(
      "tls_ca", po::value<std::string>()->default_value(""), "site CA certificate (PEM)")(
      "tls_cert", po::value<std::string>()->default_value(""), "this daemon's certificate (PEM)")(
      "tls_key", po::value<std::string>()->default_value(""), "this daemon's private key (PEM)")(
      "tls_crl", po::value<std::string>()->default_value(""),
      "the site CA's revocation list (PEM, cdpctl pki revoke); reloaded on SIGHUP");
}

Result<TlsSettings> GetTlsSettings(const boost::program_options::variables_map& vm) {
  TlsSettings t;
  const std::string mode = vm["tls"].as<std::string>();
  if (mode == "on") t.enabled = true;
  else if (mode == "off") t.enabled = false;
  else return Status::InvalidArgument("'tls' must be on or off, not '" + mode + "'");
  t.ca = vm["tls_ca"].as<std::string>();
  t.cert = vm["tls_cert"].as<std::string>();
  t.key = vm["tls_key"].as<std::string>();
  t.crl = vm["tls_crl"].as<std::string>();
  if (t.enabled) {
    for (auto [key, value] : {std::pair{"tls_ca", &t.ca}, {"tls_cert", &t.cert}, {"tls_key", &t.key}}) {
      if (value->empty()) return Status::InvalidArgument(std::string("'") + key + "' is required with tls = on");
    }
  }
  return t;
}

}  // namespace cdp

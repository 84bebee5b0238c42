// SPDX-License-Identifier: Apache-2.0
#include "common/http/control_token.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <sys/stat.h>

#include <cstdlib>

#include "common/base/host_port.h"
#include "common/base/log.h"
#include "common/base/names.h"

namespace cdp {

namespace {

constexpr char kHex[] = "0123456789abcdef";

std::string ToHex(const uint8_t* p, size_t n) {
  std::string s;
  s.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    s += kHex[p[i] >> 4];
    s += kHex[p[i] & 15];
  }
  return s;
}

bool FromHex(std::string_view hex, uint8_t* out, size_t n) {
  if (hex.size() != 2 * n) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (size_t i = 0; i < n; ++i) {
    int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = uint8_t(hi << 4 | lo);
  }
  return true;
}

std::array<uint8_t, 32> DigestOf(std::string_view token) {
  std::array<uint8_t, 32> d{};
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), d.data());
  return d;
}

// A token is [0-9A-Za-z_-]+; `where` names its source in the error.
Status CheckToken(std::string_view token, const std::string& where) {
  for (char c : token) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == '-')) {
      return Status::InvalidArgument(where + " has characters other than [0-9A-Za-z_-]");
    }
  }
  return Status::OK();
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

}  // namespace

Result<std::string> NewControlToken() {
  uint8_t raw[32];
  if (RAND_bytes(raw, sizeof raw) != 1) return Status::IOError("RAND_bytes failed");
  std::string t = ToHex(raw, sizeof raw);
  OPENSSL_cleanse(raw, sizeof raw);
  return t;
}

Result<std::string> ReadTokenFile(Env* env, const std::string& path) {
  CDP_ASSIGN_OR_RETURN(Bytes data, ReadWholeFile(env, path));
  std::string_view text(reinterpret_cast<const char*>(data.data()), data.size());
  std::string_view line = Trim(text.substr(0, text.find('\n')));
  if (line.empty()) return Status::InvalidArgument(path + ": no token in the file");
  CDP_RETURN_IF_ERROR(CheckToken(line, path + ": the token"));
  return std::string(line);
}

Result<std::string> ClientToken(const std::string& token_file) {
  if (!token_file.empty()) return ReadTokenFile(DefaultEnv(), token_file);
  if (const char* t = std::getenv("CDP_TOKEN"); t != nullptr && *t != '\0') {
    std::string_view v = Trim(t);
    CDP_RETURN_IF_ERROR(CheckToken(v, "CDP_TOKEN"));
    return std::string(v);
  }
  if (const char* f = std::getenv("CDP_TOKEN_FILE"); f != nullptr && *f != '\0') {
    return ReadTokenFile(DefaultEnv(), f);
  }
  return std::string();
}

Result<std::unique_ptr<ControlTokens>> ControlTokens::Open(Env* env, const std::string& admin_path,
                                                          const std::string& tenant_path) {
  std::unique_ptr<ControlTokens> t(new ControlTokens(env, admin_path, tenant_path));
  if (!env->Exists(admin_path)) {
    CDP_ASSIGN_OR_RETURN(std::string fresh, NewControlToken());
    CDP_RETURN_IF_ERROR(env->CreateDirs(DirName(admin_path)));
    std::string line = fresh + "\n";
    CDP_RETURN_IF_ERROR(WriteFileAtomic(env, admin_path, ByteSpan(reinterpret_cast<const uint8_t*>(line.data()), line.size()), 0600));
  }
  CDP_RETURN_IF_ERROR(CheckPrivateFile(env, admin_path, "a token file"));
  CDP_ASSIGN_OR_RETURN(std::string admin, ReadTokenFile(env, admin_path));
  t->admin_ = DigestOf(admin);

  if (!tenant_path.empty() && env->Exists(tenant_path)) {
    CDP_RETURN_IF_ERROR(CheckPrivateFile(env, tenant_path, "a token file"));
    CDP_ASSIGN_OR_RETURN(Bytes data, ReadWholeFile(env, tenant_path));
    std::string_view text(reinterpret_cast<const char*>(data.data()), data.size());
    size_t lineno = 0;
    while (!text.empty()) {
      ++lineno;
      size_t nl = text.find('\n');
      std::string_view line = Trim(text.substr(0, nl));
      text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
      if (line.empty() || line.front() == '#') continue;
      size_t sp = line.find(' ');
      Digest d{};
      std::string_view name = line.substr(0, sp);
      if (sp == std::string_view::npos || !ValidName(name) || !FromHex(Trim(line.substr(sp + 1)), d.data(), d.size())) {
        return Status::Corruption(tenant_path + " line " + std::to_string(lineno) +
                                  ": not 'TENANT SHA256HEX' (the file is written by cdpctl token issue)");
      }
      t->tenants_.emplace_back(std::string(name), d);
    }
  }
  return t;
}

std::optional<http::Caller> ControlTokens::Authenticate(std::string_view token) const {
  const Digest d = DigestOf(token);
  std::lock_guard<std::mutex> lk(mu_);
  if (CRYPTO_memcmp(d.data(), admin_.data(), d.size()) == 0) return http::Caller{true, ""};
  std::optional<http::Caller> found;
  for (const auto& [tenant, digest] : tenants_) {  // no early exit: every entry is compared
    if (CRYPTO_memcmp(d.data(), digest.data(), d.size()) == 0 && !found) found = http::Caller{false, tenant};
  }
  return found;
}

Status ControlTokens::SaveTenants(const std::vector<std::pair<std::string, Digest>>& tenants) {
  std::string text = "# tenant control tokens (SHA-256 of each token): cdpctl token issue|revoke\n";
  for (const auto& [name, d] : tenants) text += name + " " + ToHex(d.data(), d.size()) + "\n";
  CDP_RETURN_IF_ERROR(env_->CreateDirs(DirName(tenant_path_)));
  return WriteFileAtomic(env_, tenant_path_, ByteSpan(reinterpret_cast<const uint8_t*>(text.data()), text.size()), 0600);
}

Result<std::string> ControlTokens::IssueTenantToken(const std::string& tenant) {
  if (tenant_path_.empty()) return Status::NotSupported("this daemon keeps no tenant tokens");
  if (!ValidName(tenant)) return Status::InvalidArgument("bad tenant name '" + tenant + "'");
  CDP_ASSIGN_OR_RETURN(std::string token, NewControlToken());
  std::lock_guard<std::mutex> lk(mu_);
  auto next = tenants_;
  next.emplace_back(tenant, DigestOf(token));
  CDP_RETURN_IF_ERROR(SaveTenants(next));
  tenants_ = std::move(next);
  return token;
}

Result<size_t> ControlTokens::RevokeTenantTokens(const std::string& tenant) {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<std::pair<std::string, Digest>> next;
  for (const auto& e : tenants_) {
    if (e.first != tenant) next.push_back(e);
  }
  const size_t removed = tenants_.size() - next.size();
  if (removed == 0) return Status::NotFound("tenant '" + tenant + "' has no control token");
  CDP_RETURN_IF_ERROR(SaveTenants(next));
  tenants_ = std::move(next);
  return removed;
}

std::map<std::string, size_t> ControlTokens::TenantTokenCounts() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::map<std::string, size_t> out;
  for (const auto& e : tenants_) ++out[e.first];
  return out;
}

void AddControlAuthOptions(boost::program_options::options_description* desc) {
  namespace po = boost::program_options;
  desc->add_options()
      ("control_auth", po::value<std::string>()->default_value("token"),
       "control API authentication: token | off")
      ("control_token_file", po::value<std::string>()->default_value(""),
       "admin token file, made at first start with mode 0600 (default: control.token in the state directory)")
      ("metrics_public", po::value<bool>()->default_value(false), "serve /metrics without a token")
      ("control_tls", po::value<std::string>()->default_value("on"),
       "on: HTTPS on the control port with the daemon's TLS credentials (when tls = on); off: plain HTTP, "
       "only on a loopback address")
      ("allowed_hosts", po::value<std::string>()->default_value(""),
       "host names accepted in the Host header besides IP literals and localhost (a reverse proxy's name), "
       "comma-separated");
}

Result<ControlAuthSettings> GetControlAuthSettings(const boost::program_options::variables_map& vm) {
  ControlAuthSettings a;
  const std::string mode = vm.count("control_auth") ? vm["control_auth"].as<std::string>() : "token";
  if (mode == "off") {
    a.enabled = false;
  } else if (mode != "token") {
    return Status::InvalidArgument("bad value '" + mode + "' for 'control_auth' (token | off)");
  }
  if (vm.count("control_token_file")) a.token_file = vm["control_token_file"].as<std::string>();
  if (vm.count("metrics_public")) a.metrics_public = vm["metrics_public"].as<bool>();
  const std::string ctls = vm.count("control_tls") ? vm["control_tls"].as<std::string>() : "on";
  if (ctls == "off") {
    a.tls = false;
  } else if (ctls != "on") {
    return Status::InvalidArgument("bad value '" + ctls + "' for 'control_tls' (on | off)");
  }
  if (vm.count("allowed_hosts")) {
    std::string list = vm["allowed_hosts"].as<std::string>();
    for (size_t at = 0; at <= list.size();) {
      size_t comma = list.find(',', at);
      if (comma == std::string::npos) comma = list.size();
      std::string h = list.substr(at, comma - at);
      h.erase(0, h.find_first_not_of(" \t"));
      h.erase(h.find_last_not_of(" \t") + 1);
      if (!h.empty()) {
        if (!ValidHostName(h)) return Status::InvalidArgument("bad host name '" + h + "' in 'allowed_hosts'");
        a.allowed_hosts.push_back(h);
      }
      at = comma + 1;
    }
  }
  return a;
}

Result<std::shared_ptr<ControlTokens>> ApplyControlAuth(const ControlAuthSettings& settings,
                                                        const std::string& default_token_file,
                                                        const std::string& tenant_path, std::string_view who,
                                                        http::ServerOptions* opts, const TlsCredentials* tls) {
  auto log = log::Get(std::string(who));
  opts->metrics_public = settings.metrics_public;
  opts->allowed_hosts = settings.allowed_hosts;
  if (!settings.tls) {
    if (!IsLoopbackHost(opts->host))
      return Status::InvalidArgument("control_tls = off serves plain HTTP, which is allowed on a loopback address "
                                     "only, not on " + opts->host);
    log->warn("INSECURE: control_tls = off: the control API at {}:{} speaks plain HTTP (loopback only); tokens "
              "and answers cross in clear text", opts->host, opts->port);
  } else if (tls == nullptr) {
    log->warn("INSECURE: tls = off: the control API at {}:{} speaks plain HTTP; tokens cross in clear text",
              opts->host, opts->port);
  } else {
    opts->tls = tls;
  }
  if (!settings.enabled) {
    log->warn("control_auth = off: anyone who reaches {}:{} controls this daemon", opts->host, opts->port);
    return std::shared_ptr<ControlTokens>();
  }
  const std::string path = settings.token_file.empty() ? default_token_file : settings.token_file;
  auto tokens = ControlTokens::Open(DefaultEnv(), path, tenant_path);
  if (!tokens.ok()) return tokens.status().WithContext("control token");
  std::shared_ptr<ControlTokens> shared(std::move(*tokens));
  opts->authenticate = [shared](std::string_view token) { return shared->Authenticate(token); };
  log->info("control API: admin token in {}{}", path, settings.metrics_public ? "; /metrics is public" : "");
  return shared;
}

}  // namespace cdp

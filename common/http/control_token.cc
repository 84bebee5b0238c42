// SPDX-License-Identifier: Apache-2.0
#include "common/http/control_token.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <sys/stat.h>

#include <cstdlib>
#include <ctime>

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

std::string_view TokenScopeName(TokenScope scope) {
  switch (scope) {
    case TokenScope::kAdmin: return "admin";
    case TokenScope::kTenant: return "tenant";
    case TokenScope::kTenantRead: return "tenant-read";
  }
  return "?";
}

Result<TokenScope> ParseTokenScope(std::string_view text) {
  for (TokenScope s : {TokenScope::kAdmin, TokenScope::kTenant, TokenScope::kTenantRead}) {
    if (text == TokenScopeName(s)) return s;
  }
  return Status::InvalidArgument("bad token scope '" + std::string(text) + "' (admin | tenant | tenant-read)");
}

Result<uint64_t> ParseTokenLifetime(std::string_view text) {
  auto bad = [&] {
    return Status::InvalidArgument("bad token lifetime '" + std::string(text) +
                                   "': give a number and one unit s, m, h or d (e.g. 30d, 12h), at most 365d");
  };
  if (text.size() < 2) return bad();
  uint64_t unit = 0;
  switch (text.back()) {
    case 's': unit = 1; break;
    case 'm': unit = 60; break;
    case 'h': unit = 3600; break;
    case 'd': unit = 86400; break;
    default: return bad();
  }
  std::string_view digits = text.substr(0, text.size() - 1);
  if (digits.size() > 9) return bad();
  uint64_t n = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return bad();
    n = n * 10 + uint64_t(c - '0');
  }
  if (n == 0 || n * unit > kMaxTokenLifetimeSeconds) return bad();
  return n * unit;
}

namespace {

// 12 random hex digits: a token's public id.
Result<std::string> NewTokenId() {
  uint8_t raw[6];
  if (RAND_bytes(raw, sizeof raw) != 1) return Status::IOError("RAND_bytes failed");
  return ToHex(raw, sizeof raw);
}

bool ValidTokenId(std::string_view id) {
  if (id.size() != 12) return false;
  for (char c : id) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

bool ParseUint(std::string_view s, uint64_t* out) {
  if (s.empty() || s.size() > 19) return false;
  uint64_t n = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    n = n * 10 + uint64_t(c - '0');
  }
  *out = n;
  return true;
}

// "2025-01-02T03:04:05Z" for the expiry message.
std::string UtcText(uint64_t us) {
  const time_t t = time_t(us / 1'000'000);
  struct tm tm {};
  gmtime_r(&t, &tm);
  char buf[32];
  strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::vector<std::string_view> Fields(std::string_view line) {
  std::vector<std::string_view> out;
  while (!line.empty()) {
    size_t sp = line.find_first_of(" \t");
    if (sp != 0) out.push_back(line.substr(0, sp));
    if (sp == std::string_view::npos) break;
    line.remove_prefix(sp + 1);
  }
  return out;
}

}  // namespace

Result<std::unique_ptr<ControlTokens>> ControlTokens::Open(Env* env, const std::string& admin_path,
                                                          const std::string& tenant_path, const Clock* clock) {
  std::unique_ptr<ControlTokens> t(new ControlTokens(env, admin_path, tenant_path, clock));
  if (!env->Exists(admin_path)) {
    CDP_ASSIGN_OR_RETURN(std::string fresh, NewControlToken());
    CDP_RETURN_IF_ERROR(env->CreateDirs(DirName(admin_path)));
    std::string line = fresh + "\n";
    CDP_RETURN_IF_ERROR(WriteFileAtomic(env, admin_path, ByteSpan(reinterpret_cast<const uint8_t*>(line.data()), line.size()), 0600));
  }
  CDP_RETURN_IF_ERROR(CheckPrivateFile(env, admin_path, "a token file"));
  CDP_ASSIGN_OR_RETURN(std::string admin, ReadTokenFile(env, admin_path));
  t->admin_ = DigestOf(admin);
  if (!tenant_path.empty() && env->Exists(tenant_path)) CDP_RETURN_IF_ERROR(t->LoadIssued());
  return t;
}

// The format: docs/formats/control-tokens.md.
Status ControlTokens::LoadIssued() {
  CDP_RETURN_IF_ERROR(CheckPrivateFile(env_, tenant_path_, "a token file"));
  CDP_ASSIGN_OR_RETURN(Bytes data, ReadWholeFile(env_, tenant_path_));
  std::string_view text(reinterpret_cast<const char*>(data.data()), data.size());
  const uint64_t now = clock_->WallMicros();
  bool legacy = false;
  size_t lineno = 0;
  std::vector<Entry> entries;
  while (!text.empty()) {
    ++lineno;
    size_t nl = text.find('\n');
    std::string_view line = Trim(text.substr(0, nl));
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    if (line.empty() || line.front() == '#') continue;
    const std::string where = tenant_path_ + " line " + std::to_string(lineno) + ": ";
    std::vector<std::string_view> f = Fields(line);
    Entry e;
    if (f.size() == 2) {  // the first format: TENANT SHA256HEX
      if (!ValidName(f[0]) || !FromHex(f[1], e.digest.data(), e.digest.size())) {
        return Status::Corruption(where + "not 'TENANT SHA256HEX' (the file is written by cdpctl token issue)");
      }
      CDP_ASSIGN_OR_RETURN(e.info.id, NewTokenId());
      e.info.scope = TokenScope::kTenant;
      e.info.tenant = std::string(f[0]);
      e.info.created_us = now;
      e.info.expires_us = now + kDefaultTokenLifetimeSeconds * 1'000'000;
      legacy = true;
    } else if (!f.empty() && f[0] == "v2") {
      // v2 ID SCOPE TENANT CREATED_S EXPIRES_S SHA256HEX
      if (f.size() != 7) return Status::Corruption(where + "a v2 line has 7 fields, not " + std::to_string(f.size()));
      if (!ValidTokenId(f[1])) return Status::Corruption(where + "bad token id '" + std::string(f[1]) + "'");
      auto scope = ParseTokenScope(f[2]);
      if (!scope.ok()) return Status::Corruption(where + scope.status().message());
      e.info.id = std::string(f[1]);
      e.info.scope = *scope;
      if (*scope == TokenScope::kAdmin ? f[3] != "-" : !ValidName(f[3])) {
        return Status::Corruption(where + "bad tenant '" + std::string(f[3]) + "' for scope " + std::string(f[2]));
      }
      if (*scope != TokenScope::kAdmin) e.info.tenant = std::string(f[3]);
      uint64_t created = 0, expires = 0;
      if (!ParseUint(f[4], &created) || !ParseUint(f[5], &expires) || expires > UINT64_MAX / 1'000'000) {
        return Status::Corruption(where + "bad created or expiry time (seconds since the epoch)");
      }
      e.info.created_us = created * 1'000'000;
      e.info.expires_us = expires * 1'000'000;
      if (!FromHex(f[6], e.digest.data(), e.digest.size())) {
        return Status::Corruption(where + "bad digest (64 lower-case hex digits)");
      }
    } else {
      return Status::Corruption(where + "neither a v2 line nor 'TENANT SHA256HEX' (the file is written by cdpctl token issue)");
    }
    for (const Entry& x : entries) {
      if (x.info.id == e.info.id) return Status::Corruption(where + "token id " + e.info.id + " appears twice");
    }
    entries.push_back(std::move(e));
  }
  // First-format lines are rewritten now, so their ids and expiry stay put.
  if (legacy) CDP_RETURN_IF_ERROR(SaveIssued(entries));
  issued_ = std::move(entries);
  return Status::OK();
}

Result<http::Caller> ControlTokens::Authenticate(std::string_view token) const {
  const Digest d = DigestOf(token);
  const uint64_t now = clock_->WallMicros();
  std::lock_guard<std::mutex> lk(mu_);
  if (CRYPTO_memcmp(d.data(), admin_.data(), d.size()) == 0) return http::Caller{true, "", false, ""};
  Entry* found = nullptr;
  for (Entry& e : issued_) {  // no early exit: every entry is compared
    if (CRYPTO_memcmp(d.data(), e.digest.data(), d.size()) == 0 && found == nullptr) found = &e;
  }
  if (found == nullptr) return Status::PermissionDenied("the control token is not valid here");
  const TokenInfo& info = found->info;
  if (now >= info.expires_us) {
    return Status::PermissionDenied("the control token " + info.id + " expired at " + UtcText(info.expires_us) +
                                    " (an admin issues a new one: cdpctl token issue)");
  }
  found->info.last_used_us = now;
  http::Caller c;
  c.admin = info.scope == TokenScope::kAdmin;
  c.tenant = info.tenant;
  c.read_only = info.scope == TokenScope::kTenantRead;
  c.token_id = info.id;
  return c;
}

Status ControlTokens::SaveIssued(const std::vector<Entry>& entries) {
  std::string text =
      "# control tokens issued by cdpctl token issue (docs/formats/control-tokens.md)\n"
      "# v2 ID SCOPE TENANT CREATED_S EXPIRES_S SHA256HEX\n";
  for (const Entry& e : entries) {
    text += "v2 " + e.info.id + " " + std::string(TokenScopeName(e.info.scope)) + " " +
            (e.info.tenant.empty() ? "-" : e.info.tenant) + " " + std::to_string(e.info.created_us / 1'000'000) + " " +
            std::to_string(e.info.expires_us / 1'000'000) + " " + ToHex(e.digest.data(), e.digest.size()) + "\n";
  }
  CDP_RETURN_IF_ERROR(env_->CreateDirs(DirName(tenant_path_)));
  return WriteFileAtomic(env_, tenant_path_, ByteSpan(reinterpret_cast<const uint8_t*>(text.data()), text.size()), 0600);
}

Result<IssuedToken> ControlTokens::Issue(TokenScope scope, const std::string& tenant, uint64_t lifetime_s) {
  if (tenant_path_.empty()) return Status::NotSupported("this daemon keeps no issued tokens");
  if (scope == TokenScope::kAdmin && !tenant.empty()) {
    return Status::InvalidArgument("an admin-scoped token has no tenant");
  }
  if (scope != TokenScope::kAdmin && !ValidName(tenant)) {
    return Status::InvalidArgument("bad tenant name '" + tenant + "'");
  }
  if (lifetime_s == 0 || lifetime_s > kMaxTokenLifetimeSeconds) {
    return Status::InvalidArgument("a token lives 1 second to 365 days, not " + std::to_string(lifetime_s) + " seconds");
  }
  IssuedToken out;
  CDP_ASSIGN_OR_RETURN(out.token, NewControlToken());
  Entry e;
  e.digest = DigestOf(out.token);
  e.info.scope = scope;
  e.info.tenant = tenant;
  // Whole seconds, as the file keeps them.
  e.info.created_us = clock_->WallMicros() / 1'000'000 * 1'000'000;
  e.info.expires_us = e.info.created_us + lifetime_s * 1'000'000;
  std::lock_guard<std::mutex> lk(mu_);
  for (bool unique = false; !unique;) {
    CDP_ASSIGN_OR_RETURN(e.info.id, NewTokenId());
    unique = true;
    for (const Entry& x : issued_) unique = unique && x.info.id != e.info.id;
  }
  auto next = issued_;
  next.push_back(e);
  CDP_RETURN_IF_ERROR(SaveIssued(next));
  issued_ = std::move(next);
  out.info = e.info;
  return out;
}

Result<std::string> ControlTokens::IssueTenantToken(const std::string& tenant) {
  CDP_ASSIGN_OR_RETURN(IssuedToken t, Issue(TokenScope::kTenant, tenant));
  return std::move(t.token);
}

Result<TokenInfo> ControlTokens::Revoke(const std::string& id, const std::string& tenant) {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<Entry> next;
  std::optional<TokenInfo> removed;
  for (const Entry& e : issued_) {
    if (e.info.id == id && (tenant.empty() || e.info.tenant == tenant)) {
      removed = e.info;
    } else {
      next.push_back(e);
    }
  }
  if (!removed) {
    return Status::NotFound("no control token with id '" + id + "'" + (tenant.empty() ? "" : " of tenant " + tenant));
  }
  CDP_RETURN_IF_ERROR(SaveIssued(next));
  issued_ = std::move(next);
  return *removed;
}

Result<size_t> ControlTokens::RevokeTenantTokens(const std::string& tenant) {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<Entry> next;
  for (const Entry& e : issued_) {
    if (e.info.tenant != tenant || e.info.scope == TokenScope::kAdmin) next.push_back(e);
  }
  const size_t removed = issued_.size() - next.size();
  if (removed == 0) return Status::NotFound("tenant '" + tenant + "' has no control token");
  CDP_RETURN_IF_ERROR(SaveIssued(next));
  issued_ = std::move(next);
  return removed;
}

std::vector<TokenInfo> ControlTokens::List() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<TokenInfo> out;
  for (const Entry& e : issued_) out.push_back(e.info);
  return out;
}

std::map<std::string, size_t> ControlTokens::TenantTokenCounts() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::map<std::string, size_t> out;
  for (const Entry& e : issued_) {
    if (e.info.scope != TokenScope::kAdmin) ++out[e.info.tenant];
  }
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
  if (tls == nullptr) opts->insecure.push_back("tls = off");  // the data links in clear text too
  if (!settings.tls) {
    if (!IsLoopbackHost(opts->host))
      return Status::InvalidArgument("control_tls = off serves plain HTTP, which is allowed on a loopback address "
                                     "only, not on " + opts->host);
    log->warn("INSECURE: control_tls = off: the control API at {}:{} speaks plain HTTP (loopback only); tokens "
              "and answers cross in clear text", opts->host, opts->port);
    opts->insecure.push_back("control_tls = off");
  } else if (tls == nullptr) {
    log->warn("INSECURE: tls = off: the control API at {}:{} speaks plain HTTP; tokens cross in clear text",
              opts->host, opts->port);
  } else {
    opts->tls = tls;
  }
  if (!settings.enabled) {
    log->warn("INSECURE: control_auth = off: anyone who reaches {}:{} controls this daemon", opts->host, opts->port);
    opts->insecure.push_back("control_auth = off");
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

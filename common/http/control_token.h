// SPDX-License-Identifier: Apache-2.0
// Control tokens: who may call a daemon's control API (common/http/http_server.h).
//
// Every daemon has one admin token. It is made at first start (256 random bits
// from OpenSSL's CSPRNG, 64 hex digits) in a file created with mode 0600, and
// read from that file at every later start; an operator who deletes the file
// gets a new token at the next start. The token file's path is the config key
// `control_token_file` (default: control.token in the daemon's state
// directory). A daemon refuses to start when that file is readable or writable
// by group or others.
//
// The master target also keeps tenant tokens: `cdpctl token issue --tenant T`
// (an admin call, POST /v1/tokens) makes one and shows it once; the MT stores
// only its SHA-256, one line "TENANT HEXDIGEST" per token in a 0600 file
// (`tenant_tokens_file`), written atomically through the Env. A tenant token
// acts on its tenant's volumes only (master-target/mt_control_api.h).
// `cdpctl token revoke --tenant T` removes every token of T.
//
// Presented tokens are compared as SHA-256 digests with CRYPTO_memcmp, so the
// time taken does not depend on how much of a token matched.
//
// Clients (cdpctl, tests, scripts) send "Authorization: Bearer TOKEN".
// ClientToken() is where cdpctl finds its token: --token-file, else the
// environment variable CDP_TOKEN, else CDP_TOKEN_FILE.
//
// Thread safety: a ControlTokens is safe to use from many threads (one mutex).
#pragma once

#include <array>
#include <boost/program_options.hpp>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/result.h"
#include "common/base/status.h"
#include "common/env/env.h"
#include "common/http/http_server.h"

namespace cdp {

class TlsCredentials;

class ControlTokens {
 public:
  // Reads the admin token at `admin_path`, creating the file (and its missing
  // parent directories) when absent; loads the tenant tokens from
  // `tenant_path` when it is non-empty and exists. Fails with
  // kPermissionDenied when a token file is open to group or others (POSIX Env
  // only; checked with stat), kCorruption naming the file and line for a
  // malformed file, or the Env's error.
  static Result<std::unique_ptr<ControlTokens>> Open(Env* env, const std::string& admin_path,
                                                     const std::string& tenant_path = "");

  // The caller a presented token stands for, or nullopt for an unknown token.
  std::optional<http::Caller> Authenticate(std::string_view token) const;

  // Makes a new token for `tenant` (a ValidName), persists its digest
  // and returns the token. kNotSupported without a tenant token file;
  // kInvalidArgument for a bad name; the Env's error (nothing changed then).
  Result<std::string> IssueTenantToken(const std::string& tenant);
  // Removes every token of `tenant`; returns how many. kNotFound when it had none.
  Result<size_t> RevokeTenantTokens(const std::string& tenant);
  // Tenant -> number of tokens.
  std::map<std::string, size_t> TenantTokenCounts() const;

  const std::string& admin_path() const { return admin_path_; }

 private:
  using Digest = std::array<uint8_t, 32>;
  ControlTokens(Env* env, std::string admin_path, std::string tenant_path)
      : env_(env), admin_path_(std::move(admin_path)), tenant_path_(std::move(tenant_path)) {}
  Status SaveTenants(const std::vector<std::pair<std::string, Digest>>& tenants);

  Env* const env_;
  const std::string admin_path_;
  const std::string tenant_path_;
  mutable std::mutex mu_;
  Digest admin_{};
  std::vector<std::pair<std::string, Digest>> tenants_;  // guarded by mu_
};

// A new random token: 64 lower-case hex digits.
Result<std::string> NewControlToken();

// The token in a token file: its first line, white space trimmed. kInvalidArgument
// for an empty file or one whose token has characters other than [0-9a-zA-Z_-].
Result<std::string> ReadTokenFile(Env* env, const std::string& path);

// The control-API keys of every daemon's config:
//   control_auth = token | off   token by default; off answers every caller
//                                (logged as a warning; loopback-only labs)
//   control_token_file = FILE    the admin token (default: control.token in
//                                the daemon's state directory)
//   metrics_public = false       true: /metrics without a token (Prometheus)
//   control_tls = on | off       on (default): HTTPS with the daemon's TLS
//                                credentials when tls = on; off: plain HTTP,
//                                refused unless the control host is loopback
//   allowed_hosts = a,b          Host header names accepted besides IP
//                                literals and localhost (a reverse proxy)
struct ControlAuthSettings {
  bool enabled = true;
  std::string token_file;  // "" = the daemon's default
  bool metrics_public = false;
  bool tls = true;
  std::vector<std::string> allowed_hosts;

  static ControlAuthSettings Off() {
    ControlAuthSettings a;
    a.enabled = false;
    return a;
  }
};
void AddControlAuthOptions(boost::program_options::options_description* desc);
Result<ControlAuthSettings> GetControlAuthSettings(const boost::program_options::variables_map& vm);

// What a daemon does with its settings: with auth enabled, opens its tokens
// (ControlTokens::Open on settings.token_file or `default_token_file`, and
// `tenant_path`) and sets opts->authenticate and opts->metrics_public; with
// auth off, logs a warning and returns null. Sets opts->allowed_hosts, and
// opts->tls = `tls` (the daemon's credentials; null with tls = off) unless
// control_tls = off, which is refused (kInvalidArgument) on a host that is
// not loopback. Every plain-HTTP outcome is logged as INSECURE. `who` names
// the daemon in logs.
Result<std::shared_ptr<ControlTokens>> ApplyControlAuth(const ControlAuthSettings& settings,
                                                        const std::string& default_token_file,
                                                        const std::string& tenant_path, std::string_view who,
                                                        http::ServerOptions* opts, const TlsCredentials* tls);

// Where a client finds its token: `token_file` when non-empty, else the
// environment variable CDP_TOKEN, else the file named by CDP_TOKEN_FILE; ""
// when none is given (requests then go without a token and get 401).
Result<std::string> ClientToken(const std::string& token_file);

}  // namespace cdp

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
// The master target also keeps issued tokens (<data_dir>/tenant_tokens; the
// format is docs/formats/control-tokens.md): `cdpctl token issue` (an admin
// call, POST /v1/tokens) makes one and shows it once; the MT stores only its
// SHA-256, in a 0600 file written atomically through the Env. Each issued
// token has
//   - an id: 12 random hex digits, public (token list shows it, revoke takes
//     it); never derived from the secret;
//   - a scope: `admin` (what the daemon's own admin token may do), `tenant`
//     (its tenant's volumes only: master-target/mt_control_api.h) or
//     `tenant-read` (as `tenant`, but read-only: http::Caller::read_only, which
//     the router enforces for every route, http_server.h);
//   - an expiry: issued for a lifetime (default 90 days, at most 365); an
//     expired token is refused with a message that says so (a 401);
//   - a last use, kept in memory only (not persisted; 0 after a restart).
// `cdpctl token revoke ID` removes one token; `--tenant T` every token of T.
// Files of the first format ("TENANT SHA256HEX" lines) still load: each such
// line becomes a `tenant` token expiring 90 days after that load, and the file
// is rewritten at once in the current format so the expiry stays put.
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

#include "common/base/clock.h"
#include "common/base/result.h"
#include "common/base/status.h"
#include "common/env/env.h"
#include "common/http/http_server.h"

namespace cdp {

class TlsCredentials;

enum class TokenScope { kAdmin, kTenant, kTenantRead };
// "admin", "tenant", "tenant-read".
std::string_view TokenScopeName(TokenScope scope);
// The inverse; kInvalidArgument naming the text and the three scopes.
Result<TokenScope> ParseTokenScope(std::string_view text);

inline constexpr uint64_t kDefaultTokenLifetimeSeconds = 90ull * 86400;
inline constexpr uint64_t kMaxTokenLifetimeSeconds = 365ull * 86400;
// A token lifetime as cdpctl --expires takes it: a positive whole number and
// one unit, s, m, h or d ("30d", "12h", "90s"), at most 365d. kInvalidArgument
// otherwise (there is no "never": every token expires).
Result<uint64_t> ParseTokenLifetime(std::string_view text);

// What the daemon knows about one issued token (never its secret).
struct TokenInfo {
  std::string id;
  TokenScope scope = TokenScope::kTenant;
  std::string tenant;         // "" for kAdmin
  uint64_t created_us = 0;    // wall clock, microseconds since the epoch
  uint64_t expires_us = 0;    // refused from this instant on
  uint64_t last_used_us = 0;  // last accepted use since this daemon started; 0: none
};

struct IssuedToken {
  std::string token;  // the secret, shown once
  TokenInfo info;
};

class ControlTokens {
 public:
  // Reads the admin token at `admin_path`, creating the file (and its missing
  // parent directories) when absent; loads the issued tokens from
  // `tenant_path` when it is non-empty and exists (rewriting a file that has
  // first-format lines, see above). Fails with kPermissionDenied when a token
  // file is open to group or others (POSIX Env only; checked with stat),
  // kCorruption naming the file and line for a malformed file, or the Env's
  // error. `clock` (its WallMicros) decides expiry and must outlive the object.
  static Result<std::unique_ptr<ControlTokens>> Open(Env* env, const std::string& admin_path,
                                                     const std::string& tenant_path = "",
                                                     const Clock* clock = SystemClock::Get());

  // The caller a presented token stands for: the admin file's token is the
  // admin; an issued token is its scope's caller (Caller::token_id set,
  // read_only for tenant-read) and its last use is recorded. Failure is
  // always kPermissionDenied, with the message for the 401: an unknown token
  // ("the control token is not valid here"), or an expired one (naming its id
  // and when it expired).
  Result<http::Caller> Authenticate(std::string_view token) const;

  // Makes a new token of `scope` for `tenant` (a ValidName; "" for kAdmin)
  // that expires `lifetime_s` seconds from now (1..kMaxTokenLifetimeSeconds),
  // persists its digest and returns it with its info. kNotSupported without a
  // tenant token file; kInvalidArgument for a bad name, scope/tenant mismatch
  // or lifetime; the Env's error (nothing changed then).
  Result<IssuedToken> Issue(TokenScope scope, const std::string& tenant,
                            uint64_t lifetime_s = kDefaultTokenLifetimeSeconds);
  // Issue(kTenant, tenant), returning the token only.
  Result<std::string> IssueTenantToken(const std::string& tenant);
  // Removes the token `id` (when `tenant` is non-empty: only if it is a token
  // of that tenant); returns its info. kNotFound when no such token exists.
  Result<TokenInfo> Revoke(const std::string& id, const std::string& tenant = "");
  // Removes every token of `tenant`; returns how many. kNotFound when it had none.
  Result<size_t> RevokeTenantTokens(const std::string& tenant);
  // Every issued token (expired ones too, until revoked), in issue order.
  std::vector<TokenInfo> List() const;
  // Tenant -> number of tokens (admin-scoped tokens not counted).
  std::map<std::string, size_t> TenantTokenCounts() const;

  const std::string& admin_path() const { return admin_path_; }

 private:
  using Digest = std::array<uint8_t, 32>;
  struct Entry {
    TokenInfo info;
    Digest digest{};
  };
  ControlTokens(Env* env, std::string admin_path, std::string tenant_path, const Clock* clock)
      : env_(env), admin_path_(std::move(admin_path)), tenant_path_(std::move(tenant_path)), clock_(clock) {}
  Status LoadIssued();
  Status SaveIssued(const std::vector<Entry>& entries);

  Env* const env_;
  const std::string admin_path_;
  const std::string tenant_path_;
  const Clock* const clock_;
  mutable std::mutex mu_;
  Digest admin_{};
  mutable std::vector<Entry> issued_;  // guarded by mu_ (mutable: last use)
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

// SPDX-License-Identifier: Apache-2.0
// cdpctl pki, token, keys: certificates, control tokens and the tenant key
// file (commands.h).
#include "cdpctl/commands.h"


#include <boost/json.hpp>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <thread>

#include "common/base/host_port.h"
#include "common/base/version.h"
#include "common/crypto/pki.h"
#include "common/crypto/seal.h"
#include "common/http/control_token.h"
#include "common/http/http_client.h"

namespace cdp::ctl {

// pki issue --dir DIR --role agent|ps|mt|admin|tenant --name NAME [--out PREFIX] [--days N] [--hosts H1,H2]
//   (--tenant T for agent, ps and tenant; admin and tenant are people on the control API)
//   --hosts: the names and addresses its HTTPS control port answers on (subjectAltName)
// pki show CERT
// pki revoke --dir DIR CERT   adds CERT to DIR/crl.pem (the daemons' tls_crl; reload them with SIGHUP)
int Pki(const Options& o, const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  if (args[1] == "revoke") {
    if (args.size() != 5 || args[2] != "--dir") return err << "cdpctl: pki revoke wants --dir DIR CERT\n", 2;
    cdp::Status s = pki::Revoke(args[3], args[4]);
    if (!s.ok()) return err << "cdpctl: " << s.ToString() << "\n", 1;
    auto id = pki::IdentityOfFile(args[4]);
    out << "revoked: " << args[4] << (id.ok() ? " (" + std::string(pki::RoleName(id->role)) + " " + id->name + ")" : "")
        << " in " << args[3] << "/crl.pem\n"
        << "  copy it to every daemon's tls_crl and send them SIGHUP (systemctl reload): new connections are refused\n"
        << "  at once, live sessions end within a second\n";
    return 0;
  }
  if (args[1] == "show" && args.size() != 3) return err << "cdpctl: pki show wants one CERT file\n", 2;
  if (args[1] == "show") {
    std::string not_after;
    auto id = pki::IdentityOfFile(args[2], &not_after);
    if (!id.ok()) return err << "cdpctl: " << id.status().ToString() << "\n", 1;
    out << "role " << pki::RoleName(id->role) << "\ntenant " << (id->tenant.empty() ? "-" : id->tenant) << "\nname "
        << id->name << "\nnot after " << not_after << "\n";
    return 0;
  }
  std::map<std::string, std::string> flags;
  for (size_t i = 2; i < args.size(); i += 2) {
    static const std::set<std::string> known{"--dir", "--name", "--days", "--role", "--out", "--hosts"};
    if (!known.count(args[i]) || i + 1 >= args.size()) {
      err << "cdpctl: pki: unexpected '" << args[i] << "'\n";
      return 2;
    }
    flags[args[i]] = args[i + 1];
  }
  if (!flags.count("--dir")) return err << "cdpctl: pki " << args[1] << " needs --dir DIR\n", 2;
  const std::string dir = flags["--dir"];
  int days = 0;
  if (flags.count("--days")) {
    const std::string& d = flags["--days"];
    auto [p, ec] = std::from_chars(d.data(), d.data() + d.size(), days);
    if (ec != std::errc() || p != d.data() + d.size() || days < 1) {
      return err << "cdpctl: --days must be a positive number\n", 2;
    }
  }
  if (args[1] == "init") {
    pki::CaOptions co;
    if (flags.count("--name")) co.name = flags["--name"];
    if (days > 0) co.valid_days = days;
    cdp::Status s = pki::InitCa(dir, co);
    if (!s.ok()) return err << "cdpctl: " << s.ToString() << "\n", 1;
    out << "site CA: " << dir << "/ca.crt (key " << dir << "/ca.key, mode 0600)\n";
    return 0;
  }
  if (args[1] == "issue") {
    if (!flags.count("--role") || !flags.count("--name")) {
      return err << "cdpctl: pki issue needs --role agent|ps|mt|admin|tenant and --name NAME\n", 2;
    }
    auto role = pki::ParseRole(flags["--role"]);
    if (!role.ok()) return err << "cdpctl: " << role.status().message() << "\n", 2;
    if (!pki::HasTenant(*role) && !o.tenant.empty()) {
      return err << "cdpctl: a certificate of role " << flags["--role"] << " has no tenant: drop --tenant\n", 2;
    }
    if (pki::HasTenant(*role) && o.tenant.empty()) {
      return err << "cdpctl: pki issue --role " << flags["--role"] << " needs --tenant T\n", 2;
    }
    pki::IssueOptions io;
    io.identity = pki::Identity{*role, o.tenant, flags["--name"]};
    if (days > 0) io.not_after_s = int64_t(days) * 86400;
    if (flags.count("--hosts")) {
      const std::string& list = flags["--hosts"];
      for (size_t at = 0; at <= list.size();) {
        size_t comma = list.find(',', at);
        if (comma == std::string::npos) comma = list.size();
        if (comma > at) io.hosts.push_back(list.substr(at, comma - at));
        at = comma + 1;
      }
    }
    std::string prefix = flags.count("--out") ? flags["--out"]
                                              : dir + "/" + flags["--role"] + "-" +
                                                    (o.tenant.empty() ? "" : o.tenant + "-") + flags["--name"];
    cdp::Status s = pki::Issue(dir, io, prefix + ".key", prefix + ".crt");
    if (!s.ok()) return err << "cdpctl: " << s.ToString() << "\n", 1;
    out << "certificate: " << prefix << ".crt (key " << prefix << ".key, mode 0600)\n";
    return 0;
  }
  err << "cdpctl: pki wants init, issue or show\n";
  return 2;
}

namespace {

// "2025-01-02 03:04 UTC"; "-" for 0.
std::string UtcMinute(uint64_t us) {
  if (us == 0) return "-";
  const time_t t = time_t(us / 1'000'000);
  struct tm tm {};
  gmtime_r(&t, &tm);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%d %H:%M UTC", &tm);
  return b;
}

}  // namespace

// Issued control tokens at the master target (admin token needed):
//   token issue --tenant T [--scope tenant|tenant-read] [--expires DURATION]
//   token issue --scope admin [--expires DURATION]
//   token revoke ID [--tenant T] | token revoke --tenant T
//   token list
int Token(const Options& o, const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  const std::string& sub = args[1];
  if (sub == "list" && args.size() == 2) {
    Call c = Http(o, o.mt, "GET", "/v1/tokens");
    if (!c.reached || c.status != 200) return Fail(err, "token list", c);
    if (o.json) return out << json::serialize(c.body) << "\n", 0;
    const json::object& body = c.body.as_object();
    const json::array* list = body.contains("tokens") ? body.at("tokens").if_array() : nullptr;
    if (list == nullptr || list->empty()) return out << "no issued tokens\n", 0;
    char line[256];
    std::snprintf(line, sizeof line, "%-12s  %-11s  %-16s  %-20s  %-20s  %s\n", "ID", "SCOPE", "TENANT", "EXPIRES",
                  "LAST USE", "");
    out << line;
    const uint64_t now = uint64_t(std::chrono::duration_cast<std::chrono::microseconds>(
                                      std::chrono::system_clock::now().time_since_epoch()).count());
    for (const json::value& v : *list) {
      const json::object& t = v.as_object();
      const uint64_t expires = uint64_t(Num(t, "expires_us"));
      const std::string tenant = Str(t, "tenant");
      std::snprintf(line, sizeof line, "%-12s  %-11s  %-16s  %-20s  %-20s  %s\n", Str(t, "id").c_str(),
                    Str(t, "scope").c_str(), tenant.empty() ? "-" : tenant.c_str(), UtcMinute(expires).c_str(),
                    UtcMinute(uint64_t(Num(t, "last_used_us"))).c_str(), expires <= now ? "expired" : "");
      out << line;
    }
    return 0;
  }
  if (sub == "issue") {
    json::object req;
    std::string scope = "tenant";
    for (size_t i = 2; i < args.size(); i += 2) {
      if ((args[i] != "--scope" && args[i] != "--expires") || i + 1 >= args.size()) {
        return err << "cdpctl: token issue: unexpected '" << args[i] << "'\n", 2;
      }
      if (args[i] == "--scope") {
        auto s = ParseTokenScope(args[i + 1]);
        if (!s.ok()) return err << "cdpctl: " << s.status().message() << "\n", 2;
        scope = args[i + 1];
      } else {
        auto life = ParseTokenLifetime(args[i + 1]);
        if (!life.ok()) return err << "cdpctl: " << life.status().message() << "\n", 2;
        req["expires_seconds"] = *life;
      }
    }
    if (scope == "admin" && !o.tenant.empty()) return err << "cdpctl: an admin-scoped token has no tenant: drop --tenant\n", 2;
    if (scope != "admin" && o.tenant.empty()) return err << "cdpctl: token issue needs --tenant T\n", 2;
    req["scope"] = scope;
    if (!o.tenant.empty()) req["tenant"] = o.tenant;
    Call c = Http(o, o.mt, "POST", "/v1/tokens", req);
    if (!c.reached || c.status != 200) return Fail(err, "token issue", c);
    if (o.json) return out << json::serialize(c.body) << "\n", 0;
    const json::object& b = c.body.as_object();
    // The token alone on stdout, so `cdpctl token issue --tenant T > t.token` makes a token file.
    out << Str(b, "token") << "\n";
    err << "cdpctl: control token " << Str(b, "id") << " (scope " << Str(b, "scope")
        << (o.tenant.empty() ? "" : ", tenant " + o.tenant) << ", expires " << UtcMinute(uint64_t(Num(b, "expires_us")))
        << "; shown once: keep it in a file of mode 0600 and give it with --token-file)\n";
    return 0;
  }
  if (sub == "revoke") {
    json::object req;
    if (args.size() == 3) {
      req["id"] = args[2];
      if (!o.tenant.empty()) req["tenant"] = o.tenant;  // then only a token of that tenant
    } else if (args.size() == 2 && !o.tenant.empty()) {
      req["tenant"] = o.tenant;
    } else {
      return err << "cdpctl: token revoke wants one token ID (from token list), or --tenant T for all of T's\n", 2;
    }
    Call c = Http(o, o.mt, "POST", "/v1/tokens/revoke", req);
    if (!c.reached || c.status != 200) return Fail(err, "token revoke", c);
    if (o.json) return out << json::serialize(c.body) << "\n", 0;
    if (req.contains("id")) {
      out << "token " << args[2] << " revoked\n";
    } else {
      out << uint64_t(Num(c.body.as_object(), "revoked")) << " token(s) of tenant " << o.tenant << " revoked\n";
    }
    return 0;
  }
  err << "cdpctl: token wants issue, revoke or list\n";
  return 2;
}

// keys init --out FILE | keys show FILE: the tenant key file (common/crypto/seal.h).
int Keys(const Options& o, const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  if (args.size() == 4 && args[1] == "init" && args[2] == "--out") {
    auto key = seal::GenerateTenantKey();
    if (!key.ok()) return err << "cdpctl: " << key.status().message() << "\n", 1;
    if (::cdp::Status s = seal::SaveTenantKey(DefaultEnv(), args[3], *key); !s.ok()) {
      err << "cdpctl: " << s.message() << "\n";
      return 1;
    }
    if (o.json) {
      out << json::serialize(json::object{{"key_file", args[3]}, {"fingerprint", key->Fingerprint()}}) << "\n";
      return 0;
    }
    out << "tenant key " << key->Fingerprint() << " written to " << args[3] << " (mode 0600)\n"
        << "  Back it up now, away from this site and from the provider: without it no encrypted replica can\n"
        << "  ever be read again (docs/encryption.md, \"Key backup\"). cdpctl keys show FILE checks a copy.\n";
    return 0;
  }
  if (args.size() == 3 && args[1] == "show") {
    auto key = seal::LoadTenantKey(DefaultEnv(), args[2]);
    if (!key.ok()) return err << "cdpctl: " << key.status().message() << "\n", 1;
    if (o.json) {
      out << json::serialize(json::object{{"key_file", args[2]}, {"fingerprint", key->Fingerprint()}}) << "\n";
    } else {
      out << "tenant key " << key->Fingerprint() << " (" << args[2] << ")\n";
    }
    return 0;
  }
  err << "cdpctl: keys wants 'init --out FILE' or 'show FILE'\n";
  return 2;
}

// verify VOLUME [--region-size BYTES] [--repair] [--max-rate MB/s], options in any order.

}  // namespace cdp::ctl

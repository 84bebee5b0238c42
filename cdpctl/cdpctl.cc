// SPDX-License-Identifier: Apache-2.0
#include "cdpctl/cdpctl.h"

#include "cdpctl/commands.h"

#include <boost/json.hpp>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
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

namespace {

constexpr const char* kUsage =
    "usage: cdpctl [--agent H:P] [--ps H:P] [--mt H:P] [--tenant T] [--json] [--tls-ca CA [--tls-cert C --tls-key K]] COMMAND\n"
    "  status | tag NAME | points VOLUME | rollback VOLUME --to POINT [--discard-history] |\n"
    "  anomalies VOLUME [--ack ID] |\n"
    "  export VOLUME@POINT [--writable] | unexport EXPORT |\n"
    "  serve VOLUME@POINT|VOLUME@failover --key-file F --socket PATH [--tls-certificates DIR]\n"
    "        (a sealed volume decrypted here; the keys never leave this host) |\n"
    "  keys init --out FILE | keys show FILE |\n"
    "  resolve cdp://TENANT/VOLUME@POINT   (export VOLUME@POINT takes the URI too) |\n"
    "  verify VOLUME [--region-size BYTES] [--repair] [--max-rate MB/s] |\n"
    "  failover VOLUME --to POINT [--test] | failover VOLUME --undo | failover VOLUME --commit |\n"
    "  failback VOLUME [--passes N] | branches |\n"
    "  reprotect VOLUME |\n"
    "  group create G --member AGENT:VOLUME [--member ...] [--interval MS] [--hold-max MS] [--hold-timeout MS]\n"
    "    [--at ps|mt]   (mt: members behind several process servers, coordinated at the master target) |\n"
    "  group list | group remove G | group point G | group points G |\n"
    "  tag --group G NAME [--freeze-ms MS]   (every member agent's freeze hook: an application-consistent point) |\n"
    "  failover --group G --to GPOINT | rollback --group G --to GPOINT | export --group G --to GPOINT |\n"
    "  failback --group G --member-agent AGENT=HOST:PORT[@TOKEN_FILE] ... [--passes N]\n"
    "    (GPOINT: latest, a round, a marker or a group tag's NAME from 'group points'; groups need --tenant) |\n"
    "  token issue --tenant T [--scope tenant|tenant-read] [--expires DURATION] |\n"
    "  token issue --scope admin [--expires DURATION] |\n"
    "  token revoke ID | token revoke --tenant T | token list\n"
    "    (DURATION: a number and s, m, h or d; default 90d, at most 365d. tenant-read: list, status and\n"
    "     read-only exports, nothing that changes state)\n"
    "  control tokens: --token-file F, --agent-token-file F, --ps-token-file F, --mt-token-file F,\n"
    "                  or CDP_TOKEN / CDP_TOKEN_FILE in the environment\n"
    "  pki init --dir DIR [--name NAME] [--days N] |\n"
    "  pki issue --dir DIR --role agent|ps|mt|admin|tenant [--tenant T] --name NAME [--out PREFIX] [--days N]\n"
    "            [--hosts H1,H2] |\n"
    "  pki show CERT | pki revoke --dir DIR CERT\n"
    "  --help | --version\n";

}  // namespace

// Bad usage: names the first option no command takes, then the usage; exit 2.
int Usage(const std::vector<std::string>& args, std::ostream& err) {
  for (const std::string& a : args) {
    if (a.size() > 1 && a[0] == '-' && a != "--to" && a != "--writable" && a != "--region-size" && a != "--repair" &&
        a != "--max-rate" && a != "--scope" && a != "--expires" && a != "--test" && a != "--undo" && a != "--commit" &&
        a != "--key-file" && a != "--out" && a != "--socket" && a != "--tls-certificates" && a != "--hosts" && a != "--group" &&
        a != "--member" && a != "--interval" && a != "--hold-max" && a != "--hold-timeout" && a != "--freeze-ms" &&
        a != "--member-agent" && a != "--passes" && a != "--at") {
      err << "cdpctl: unknown option '" << a << "'\n";
      break;
    }
  }
  err << kUsage;
  return 2;
}

::cdp::Status ResolveTokens(const TokenFiles& files, Options* opts) {
  CDP_ASSIGN_OR_RETURN(std::string common, ClientToken(files.all));
  for (auto [file, ep] : {std::pair{&files.agent, &opts->agent}, std::pair{&files.ps, &opts->ps},
                          std::pair{&files.mt, &opts->mt}}) {
    if (file->empty()) {
      ep->token = common;
    } else {
      CDP_ASSIGN_OR_RETURN(ep->token, ReadTokenFile(DefaultEnv(), *file));
    }
  }
  return Status::OK();
}

bool ParseEndpoint(const std::string& text, Endpoint* ep) {
  auto hp = ParseHostPort(text);
  if (!hp.ok()) return false;
  ep->host = hp->host;
  ep->port = hp->port;
  return true;
}

std::string ProgressBar(double fraction, int width) {
  if (!(fraction >= 0)) fraction = 0;
  if (fraction > 1) fraction = 1;
  int fill = int(std::lround(fraction * width));
  char pct[16];
  std::snprintf(pct, sizeof pct, "%5.1f%%", fraction * 100);
  return "[" + std::string(size_t(fill), '#') + std::string(size_t(width - fill), '.') + "] " + pct;
}

int Run(const Options& o, const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  if (args.empty()) return Usage(args, err);
  const std::string& cmd = args[0];
  if (cmd == "--help" && args.size() == 1) return out << kUsage, 0;
  if (cmd == "--version" && args.size() == 1) return out << VersionText("cdpctl"), 0;
  if (cmd == "status" && args.size() == 1) return Status(o, out, err);
  if (cmd == "group" && args.size() >= 2) return GroupCommand(o, args, out, err);
  if ((cmd == "failover" || cmd == "rollback" || cmd == "export") && args.size() == 5 && args[1] == "--group" &&
      args[3] == "--to")
    return GroupRecovery(o, cmd, args[2], args[4], out, err);
  if (cmd == "failback" && args.size() >= 3 && args[1] == "--group") return GroupFailback(o, args, out, err);
  if (cmd == "tag" && args.size() == 2) return Tag(o, args[1], out, err);
  if (cmd == "tag" && args.size() >= 4 && args[1] == "--group" &&
      (args.size() == 4 || (args.size() == 6 && args[4] == "--freeze-ms")))
    return GroupTag(o, args[2], args[3], args.size() == 6 ? args[5] : "", out, err);
  if (cmd == "points" && args.size() == 2) return Points(o, args[1], out, err);
  if (cmd == "anomalies" && args.size() == 2) return Anomalies(o, args[1], "", out, err);
  if (cmd == "anomalies" && args.size() == 4 && args[2] == "--ack") return Anomalies(o, args[1], args[3], out, err);
  if (cmd == "rollback" && (args.size() == 4 || (args.size() == 5 && args[4] == "--discard-history")) &&
      args[2] == "--to")
    return Rollback(o, args[1], args[3], args.size() == 5, out, err);
  if (cmd == "export" && (args.size() == 2 || (args.size() == 3 && args[2] == "--writable"))) {
    return Export(o, args[1], args.size() == 3, out, err);
  }
  if ((cmd == "export" || cmd == "resolve" || cmd == "failover") &&
      std::find(args.begin(), args.end(), "--key-file") != args.end()) {
    err << "cdpctl: " << cmd << " takes no key: the master target never receives one. Read a sealed volume "
        << "decrypted at your site: cdpctl serve VOLUME@POINT (or VOLUME@failover) --key-file F --socket PATH\n";
    return 2;
  }
  if (cmd == "resolve" && args.size() == 2 && args[1].rfind("cdp://", 0) == 0) {
    return Export(o, args[1], false, out, err, true);
  }
  if (cmd == "serve" && args.size() >= 2 && args.size() % 2 == 0) {
    std::string key_file, socket, tls_dir;
    for (size_t i = 2; i + 1 < args.size(); i += 2) {
      if (args[i] == "--key-file") key_file = args[i + 1];
      else if (args[i] == "--socket") socket = args[i + 1];
      else if (args[i] == "--tls-certificates") tls_dir = args[i + 1];
      else return Usage({args[i]}, err);
    }
    return Serve(o, args[1], key_file, tls_dir, socket, out, err);
  }
  if (cmd == "keys" && args.size() >= 2) return Keys(o, args, out, err);
  if (cmd == "unexport" && args.size() == 2) return Unexport(o, args[1], out, err);
  if (cmd == "failover" && args.size() == 5 && args[2] == "--to" && args[4] == "--test") {
    return Export(o, args[1] + "@" + args[3], true, out, err);  // today's test failover
  }
  if (cmd == "failover" && args.size() == 4 && args[2] == "--to") return Failover(o, args[1], "--to", args[3], out, err);
  if (cmd == "failover" && args.size() == 3 && (args[2] == "--undo" || args[2] == "--commit")) {
    return Failover(o, args[1], args[2], "", out, err);
  }
  if (cmd == "pki" && args.size() >= 2) return Pki(o, args, out, err);
  if (cmd == "reprotect" && args.size() == 2) return Reprotect(o, args[1], out, err);
  if (cmd == "failback" && args.size() == 2) return Failback(o, args[1], 5, out, err);
  if (cmd == "failback" && args.size() == 4 && args[2] == "--passes") {
    int n = 0;
    try {
      n = std::stoi(args[3]);
    } catch (...) {
      n = 0;
    }
    if (n < 1 || n > 100) {
      err << "cdpctl: --passes wants 1..100\n";
      return 2;
    }
    return Failback(o, args[1], n, out, err);
  }
  if (cmd == "branches" && args.size() == 1) return Branches(o, out, err);
  if (cmd == "token" && args.size() >= 2) return Token(o, args, out, err);
  if (cmd == "verify" && args.size() >= 2 && args[1][0] != '-') return VerifyCommand(o, args, out, err);
  return Usage(args, err);
}

}  // namespace cdp::ctl

// SPDX-License-Identifier: Apache-2.0
// cdpctl: the operator CLI. It talks to each daemon's control endpoint (JSON over
// HTTP, common/http/http_server.h) and prints either human tables or the daemons'
// JSON (--json).
//
//   cdpctl [--agent H:P] [--ps H:P] [--mt H:P] [--tenant T] [--json] COMMAND ...
//     status                        every reachable daemon, one line per volume
//     tag NAME                      one consistency tag across the agent's volumes
//     points VOLUME                 recovery points held by the master target
//     rollback VOLUME --to POINT    fail over: rewind the replica to a point
//     export VOLUME@POINT [--writable]   serve the point over NBD (test failover)
//                                   (an encrypted volume: its stored blocks and MACs)
//     serve VOLUME@POINT|VOLUME@failover --key-file F --socket PATH [--tls-certificates DIR]
//                                   an encrypted volume decrypted at the tenant's
//                                   site (keys derived here, never sent), served
//                                   on a Unix socket until SIGINT/SIGTERM
//     keys init --out FILE | keys show FILE   the tenant key file (common/crypto/seal.h)
//     resolve cdp://TENANT/VOLUME@POINT   a recovery point's URI:
//                                   exports the point read-only and prints
//                                   its NBD URI alone (export takes the URI too)
//     failover VOLUME --to POINT [--test]   promote the point as a persistent
//                                   read-write export, fence the old primary
//                                   (--test: a writable export, as export --writable)
//     failover VOLUME --undo | --commit     back to protecting (before a commit)
//                                   | make the failover final
//     unexport EXPORT               stop an export
//     verify VOLUME [--region-size B] [--repair] [--max-rate MB/s]
//                                   online verify: source vs replica at the same
//                                   sequence, differing 4 KiB extents (and repair)
//     failback VOLUME [--passes N]  bring a failed-over volume home: passes pull
//                                   what differs while the provider runs, then
//                                   a final pass with its export quiesced
//     branches                      the original site's saved failback branches
//     reprotect VOLUME              the next generation at the MT, the PS and the agent (history kept)
//     token issue --tenant T [--scope tenant|tenant-read] [--expires DURATION]
//                                   a control token at the master target (admin);
//                                   the token alone on stdout, its id on stderr;
//                                   --scope admin (no --tenant): another admin token
//     token revoke ID | token revoke --tenant T
//                                   one token, or every token of T
//     token list                    ids, scopes, tenants, expiry, last use
//
//   HTTPS (the default of every daemon): --tls-ca FILE (or CDP_TLS_CA) is the
//   site CA that the daemons' certificates must verify against; without it
//   cdpctl speaks plain HTTP, which only a daemon with control_tls = off on
//   loopback answers.
//   Control tokens (common/http/control_token.h): --token-file F for every daemon,
//   --agent-token-file / --ps-token-file / --mt-token-file for one; else the
//   environment: CDP_TOKEN (the token) or CDP_TOKEN_FILE (its file).
//     pki init|issue|show ...       the site CA and the daemons' certificates (common/crypto/pki.h)
//
// The functions below are split from main() so that tests can run a command
// and check its exit code and output. Thread safety: none needed (one thread).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "common/base/status.h"

namespace cdp::ctl {

struct Endpoint {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  std::string token;  // control token sent to this daemon ("" = none; common/http/control_token.h)
};

struct Options {
  Endpoint agent{"127.0.0.1", 9100, ""};
  Endpoint ps{"127.0.0.1", 9101, ""};
  Endpoint mt{"127.0.0.1", 9102, ""};
  std::string tenant;     // empty: the master target's only tenant
  bool json = false;
  int timeout_ms = 10000;
  // HTTPS to every daemon (common/http/http_client.h): the site CA the
  // daemons' certificates must verify against (--tls-ca, else CDP_TLS_CA);
  // "" = plain HTTP (a daemon with control_tls = off, on loopback). An
  // optional client certificate and key (--tls-cert/--tls-key).
  std::string tls_ca;
  std::string tls_cert, tls_key;
};

// Runs one command (`args` = the command and its operands). Writes the result
// to `out` and problems to `err`. Returns the process exit code: 0 success,
// 1 the command failed (daemon refused, verify found differences), 2 usage.
int Run(const Options& opts, const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// Fills each endpoint's token: from its own token file when given (e.g.
// --mt-token-file), else from `token_file` (--token-file), else CDP_TOKEN,
// else the file named by CDP_TOKEN_FILE. kInvalidArgument / the file's error
// for an unreadable or malformed token file.
struct TokenFiles {
  std::string all, agent, ps, mt;
};
Status ResolveTokens(const TokenFiles& files, Options* opts);

// "host:port" -> Endpoint; false if malformed.
bool ParseEndpoint(const std::string& text, Endpoint* ep);

// A text progress bar: "[#####.....]  50.0%".
std::string ProgressBar(double fraction, int width = 20);

}  // namespace cdp::ctl

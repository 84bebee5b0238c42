// SPDX-License-Identifier: Apache-2.0
// cdpctl's commands and the client they share. cdpctl.cc parses the command
// line and dispatches (Run); each file holds one group of commands:
//   client.cc       Http (one call to a daemon's control API), the JSON and
//                   number helpers, Fail
//   status.cc       status, tag, points, anomalies
//   recovery.cc     rollback, reprotect, failback, export / resolve,
//                   failover, branches, unexport
//   verify.cc       verify (and repair)
//   group.cc        group, and failover / rollback / export --group
//   serve.cc        serve (a sealed volume decrypted at the tenant's site)
//   credentials.cc  pki, token, keys
// Every command returns the process exit code (cdpctl.h: 0, 1 failed, 2
// usage) and writes to `out` and `err` only.
//
// Thread safety: none needed (one thread).
#pragma once

#include <boost/json.hpp>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "cdpctl/cdpctl.h"

namespace cdp::ctl {

namespace json = boost::json;

// ---- client.cc ----
struct Call {
  bool reached = false;  // the daemon answered at all
  int status = 0;        // HTTP status
  json::value body;      // parsed body (null if not JSON)
  std::string error;     // transport or daemon error text
};
// One request with the endpoint's token; the body as JSON when not null.
Call Http(const Options& o, const Endpoint& ep, std::string_view method, const std::string& target,
          const json::value& body = nullptr);
std::string Where(const Endpoint& ep);             // "host:port"
std::string Q(std::string_view s);                 // a percent-encoded query value
std::string TenantParam(const Options& o);         // "&tenant=T", or "" without --tenant
double Num(const json::object& o, std::string_view key, double dflt = 0);
std::string Str(const json::object& o, std::string_view key, std::string dflt = "");
std::string Bytes(double b);                       // "1.5 MiB"
std::string Secs(double s);                        // "1.2s", "3m04s", "1.5h"; "-" when negative
const json::array* Volumes(const json::value& body);  // body["volumes"], or null
// The point parameters of a request (volume, and point/seq/tag/time from
// POINT: an id from `points`, seq:N, a UTC time, or a tag's name), with --tenant.
json::object PointArg(const std::string& volume, const std::string& point, const Options& o);
// A recovery point's URI, cdp://TENANT/VOLUME@POINT: the tenant and
// VOLUME@POINT. False when `uri` is not one.
bool ParsePointUri(const std::string& uri, std::string* tenant, std::string* spec);
// "cdpctl: WHAT: error" on `err`; returns 1.
int Fail(std::ostream& err, const std::string& what, const Call& c);

// ---- cdpctl.cc ----
// Bad usage: names the first option no command takes, then the usage; 2.
int Usage(const std::vector<std::string>& args, std::ostream& err);

// ---- status.cc ----
int Status(const Options& o, std::ostream& out, std::ostream& err);
int Tag(const Options& o, const std::string& name, std::ostream& out, std::ostream& err);
int Points(const Options& o, const std::string& volume, std::ostream& out, std::ostream& err);
int Anomalies(const Options& o, const std::string& volume, const std::string& ack, std::ostream& out,
              std::ostream& err);

// ---- recovery.cc ----
int Rollback(const Options& o, const std::string& volume, const std::string& point, bool discard_history,
             std::ostream& out, std::ostream& err);
int Reprotect(const Options& o, const std::string& volume, std::ostream& out, std::ostream& err);
int Failback(const Options& o, const std::string& volume, int max_passes, std::ostream& out, std::ostream& err);
// VOLUME@POINT or cdp://TENANT/VOLUME@POINT; `uri_only`: print the NBD URI alone (resolve).
// A sealed volume's export serves its stored blocks and MACs (read them
// decrypted with serve).
int Export(const Options& opts, const std::string& spec_or_uri, bool writable, std::ostream& out, std::ostream& err,
           bool uri_only = false);
// `action`: --to (with `point`), --undo or --commit.
int Failover(const Options& o, const std::string& volume, const std::string& action, const std::string& point,
             std::ostream& out, std::ostream& err);
int Branches(const Options& o, std::ostream& out, std::ostream& err);
int Unexport(const Options& o, const std::string& name, std::ostream& out, std::ostream& err);

// ---- group.cc ----
// group create G --member AGENT:VOLUME ... | group list | group remove G |
// group point G | group points G  (`args` from "group").
int GroupCommand(const Options& o, const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
// failover | rollback | export of every member of `group` at its group point
// `point` ("latest", a round or a marker): the single-volume step of each
// member at its marker's sequence.
// tag --group G NAME [--freeze-ms MS]: an application-consistent group
// point (docs/groups.md): the PS has every member agent freeze, holds and
// marks the group, and every agent thaws.
int GroupTag(const Options& o, const std::string& group, const std::string& tag, const std::string& freeze_ms,
             std::ostream& out, std::ostream& err);
// failback --group G --member-agent AGENT=HOST:PORT[@TOKEN_FILE] ...
// [--passes N]: shows the plan per member (its agent, its volume's state and
// failover at the master target), then runs each member's failback at its
// own agent, one after another; stops at the first failure (the same
// command finishes the job: every step is idempotent).
int GroupFailback(const Options& o, const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
int GroupRecovery(const Options& o, const std::string& action, const std::string& group, const std::string& point,
                  std::ostream& out, std::ostream& err);
// The groups of a process server's /status or /v1/groups body, as lines of
// cdpctl status (nothing when it has none).
void GroupLines(const json::value& ps_body, std::ostream& out);
// The groups' recoverable points as the master target holds them (its
// /v1/groups body), as lines of cdpctl status.
void MtGroupLines(const json::value& mt_groups, std::ostream& out);

// ---- serve.cc ----
// serve VOLUME@POINT | VOLUME@failover --key-file F --socket PATH [--tls-certificates DIR]:
// the volume decrypted at the tenant's site, on a Unix socket, until SIGINT
// or SIGTERM (a sealed volume: common/nbd/sealed_device.h). The keys are
// derived here and never sent. Exit 1 when a block failed its check.
int Serve(const Options& opts, const std::string& spec_or_uri, const std::string& key_file,
          const std::string& tls_dir, const std::string& socket, std::ostream& out, std::ostream& err);

// ---- verify.cc ----
// verify VOLUME [--region-size BYTES] [--repair] [--max-rate MB/s] (`args` from "verify").
int VerifyCommand(const Options& o, const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// ---- credentials.cc ---- (`args` from the command's name)
int Pki(const Options& o, const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
int Token(const Options& o, const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
int Keys(const Options& o, const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace cdp::ctl

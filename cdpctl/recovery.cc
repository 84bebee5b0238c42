// SPDX-License-Identifier: Apache-2.0
// cdpctl rollback, reprotect, failback, export, resolve, failover, branches,
// unexport: recovery (commands.h, docs/recovery.md).
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
#include "common/base/names.h"
#include "common/base/version.h"
#include "common/crypto/pki.h"
#include "common/crypto/seal.h"
#include "common/http/control_token.h"
#include "common/http/http_client.h"

namespace cdp::ctl {


namespace {



}  // namespace

int Rollback(const Options& o, const std::string& volume, const std::string& point, bool discard_history,
             std::ostream& out, std::ostream& err) {
  json::object body = PointArg(volume, point, o);
  if (discard_history) body["discard_history"] = true;
  Call c = Http(o, o.mt, "POST", "/v1/rollback", body);
  if (!c.reached || c.status != 200) return Fail(err, "rollback " + volume, c);
  if (o.json) {
    out << json::serialize(c.body) << "\n";
    return 0;
  }
  const json::object& b = c.body.as_object();
  out << "volume " << volume << " rolled back to sequence " << uint64_t(Num(b, "rollback_to")) << "; state "
      << Str(b, "state") << "; " << uint64_t(Num(b, "rolled_back_points"))
      << " later points kept on the rolled-back branch (cdpctl points)\n";
  return 0;
}

// Re-protect: the master target accepts the next generation (history
// kept), the process server lets it replace the volume's spool (once that
// delivered what it holds), then the agent moves to it. A PS that has no
// spool of the volume (a direct agent, or a move to another PS) answers 404
// and is left out; none answering at --ps (a site of direct agents) is left
// out with a note: if the volume does replicate through it, its refusal names
// cdpctl reprotect, and running it again finishes the job. Any other PS
// error fails the command before the agent moves. Re-running it after an
// interruption finishes the job (the agent ignores a generation it is at
// already, the MT arms the same one until it is opened).
int Reprotect(const Options& o, const std::string& volume, std::ostream& out, std::ostream& err) {
  json::object b{{"volume", volume}};
  if (!o.tenant.empty()) b["tenant"] = o.tenant;
  Call c = Http(o, o.mt, "POST", "/v1/reprotect", b);
  if (!c.reached || c.status != 200) return Fail(err, "reprotect " + volume, c);
  const json::object& r = c.body.as_object();
  const uint64_t gen = uint64_t(Num(r, "generation"));
  Call p = Http(o, o.ps, "POST", "/v1/reprotect", b);
  const bool via_ps = p.reached && p.status == 200;
  if (!p.reached) {
    err << "note: no process server answered at " << o.ps.host << ":" << o.ps.port << " (" << p.error
        << "); left out. If " << volume << " replicates through one, run this again once it answers\n";
  } else if (!via_ps && p.status != 404) {
    return Fail(err, "reprotect " + volume + " at the process server", p);
  }
  if (via_ps && uint64_t(Num(p.body.as_object(), "generation")) != gen) {
    err << "reprotect " << volume << ": the process server's spool would move to generation "
        << uint64_t(Num(p.body.as_object(), "generation")) << ", the master target allows " << gen << "\n";
    return 1;
  }
  Call a = Http(o, o.agent, "POST", "/v1/reprotect", json::object{{"volume", volume}, {"generation", gen}});
  if (!a.reached || a.status != 200) return Fail(err, "reprotect " + volume + " at the agent", a);
  if (o.json) {
    out << json::serialize(json::object{{"master_target", c.body},
                                        {"process_server", via_ps ? p.body : json::value(nullptr)},
                                        {"agent", a.body}})
        << "\n";
    return 0;
  }
  out << "volume " << volume << ": re-protected as generation " << gen << "; the agent replicates again ("
      << Str(a.body.as_object(), "phase") << "); the " << uint64_t(Num(r, "points"))
      << " recovery points of earlier generations are kept until retention expires them\n";
  if (via_ps) {
    if (uint64_t n = uint64_t(Num(p.body.as_object(), "undelivered_records")); n > 0)
      out << "  the process server delivers the " << n << " records it still holds first\n";
  }
  return 0;
}

// failback VOLUME [--passes N] (docs/recovery.md, "Failback"): brings a
// failed-over volume home to the original site's agent. Every step is
// idempotent at its daemon, so re-running the command after any
// interruption (a daemon killed, a network cut) finishes the job.
int Failback(const Options& o, const std::string& volume, int max_passes, std::ostream& out, std::ostream& err) {
  json::object b{{"volume", volume}};
  if (!o.tenant.empty()) b["tenant"] = o.tenant;
  const json::object av{{"volume", volume}};
  json::object report{{"volume", volume}};
  json::array passes;
  Call st = Http(o, o.mt, "POST", "/v1/failback/start", b);
  if (!st.reached || st.status != 200) return Fail(err, "failback " + volume, st);
  const bool finished = Str(st.body.as_object(), "state") == "failed-back";
  Call begin = Http(o, o.agent, "POST", "/v1/failback/begin", av);
  if (!finished && (!begin.reached || begin.status != 200)) return Fail(err, "failback " + volume + " at the agent", begin);
  auto pass = [&](const char* kind) -> json::object* {
    Call p = Http(o, o.agent, "POST", "/v1/failback/pass", av);
    if (!p.reached || p.status != 200) {
      Fail(err, "failback " + volume + ": a pass", p);
      return nullptr;
    }
    json::object j = p.body.as_object();
    j["kind"] = kind;
    passes.push_back(j);
    const json::object& x = passes.back().as_object();
    if (!o.json)
      out << "  " << kind << " pass: " << uint64_t(Num(x, "compared_blocks")) << " blocks compared ("
          << uint64_t(Num(x, "plan_blocks")) << " changed at the provider side, " << uint64_t(Num(x, "local_blocks"))
          << " never shipped from here), " << uint64_t(Num(x, "pulled_blocks")) << " pulled ("
          << uint64_t(Num(x, "wire_bytes_in")) << " bytes received), " << uint64_t(Num(x, "saved_blocks"))
          << " saved to the branch\n";
    return &passes.back().as_object();
  };
  if (!finished) {
    if (!o.json) out << "volume " << volume << ": failing back to the original site\n";
    // Passes while the application still runs at the provider, until one pulls nothing.
    for (int k = 0; k < std::max(1, max_passes); ++k) {
      json::object* p = pass("live");
      if (p == nullptr) return 1;
      if (Num(*p, "pulled_blocks") == 0) break;
    }
    Call q = Http(o, o.mt, "POST", "/v1/failback/quiesce", b);
    if (!q.reached || q.status != 200) return Fail(err, "failback " + volume + ": quiesce", q);
    if (!o.json) out << "  the provider's export is quiesced (writes refused) for the final pass\n";
    if (pass("final") == nullptr) return 1;
    Call f = Http(o, o.mt, "POST", "/v1/failback/finish", b);
    if (!f.reached || f.status != 200) return Fail(err, "failback " + volume + ": finish", f);
    report["finish"] = f.body;
    if (!o.json)
      out << "  the master target's replica now equals the provider's image (" << uint64_t(Num(f.body.as_object(), "blocks"))
          << " blocks applied as history, tag \"failback\")\n";
  }
  Call end = Http(o, o.agent, "POST", "/v1/failback/end", av);
  if (!end.reached || end.status != 200) return Fail(err, "failback " + volume + " at the agent", end);
  Call br = Http(o, o.agent, "GET", "/v1/branches", json::value());
  report["passes"] = passes;
  report["agent"] = end.body;
  if (br.reached && br.status == 200) report["branches"] = br.body;
  if (o.json) {
    out << json::serialize(report) << "\n";
    return 0;
  }
  out << "volume " << volume << ": failed back; the original site holds the provider's image\n";
  if (br.reached && br.status == 200) {
    for (const json::value& x : br.body.as_object().at("branches").as_array()) {
      const json::object& bx = x.as_object();
      if (Str(bx, "volume") != volume) continue;
      out << "  the original site's own writes that failback replaced: branch " << Str(bx, "path") << ".{img,idx}, "
          << uint64_t(Num(bx, "saved_blocks")) << " blocks, NBD export " << Str(bx, "export")
          << " at the agent (copy it before new writes if you need it whole)\n";
    }
  }
  out << "  next: cdpctl reprotect " << volume << " (replication resumes, no resync)\n";
  return 0;
}



int Export(const Options& opts, const std::string& spec_or_uri, bool writable, std::ostream& out, std::ostream& err,
           bool uri_only) {
  Options o = opts;
  std::string spec = spec_or_uri;
  if (spec_or_uri.rfind("cdp://", 0) == 0 && !ParsePointUri(spec_or_uri, &o.tenant, &spec)) {
    err << "cdpctl: a point URI is cdp://TENANT/VOLUME@POINT, not '" << spec_or_uri << "'\n";
    return 2;
  }
  size_t at = spec.find('@');
  if (at == std::string::npos || at == 0 || at + 1 == spec.size()) {
    err << "cdpctl: export wants VOLUME@POINT (POINT: an id from 'points', seq:N, a tag or a UTC time)\n";
    return 2;
  }
  json::object b = PointArg(spec.substr(0, at), spec.substr(at + 1), o);
  b["writable"] = writable;
  Call c = Http(o, o.mt, "POST", "/v1/export", b);
  if (!c.reached || c.status != 200) return Fail(err, "export " + spec, c);
  if (o.json) {
    out << json::serialize(c.body) << "\n";
    return 0;
  }
  const json::object& r = c.body.as_object();
  const json::value* tls = r.if_contains("tls");
  const bool nbds = tls != nullptr && tls->is_bool() && tls->as_bool();
  if (uri_only) {  // cdpctl resolve: the NBD URI alone, for scripts
    out << (nbds ? "nbds://" : "nbd://") << o.mt.host << ":" << uint64_t(Num(r, "port")) << "/" << Str(r, "export")
        << "\n";
    return 0;
  }
  out << (nbds ? "nbds://" : "nbd://") << o.mt.host << ":" << uint64_t(Num(r, "port")) << "/" << Str(r, "export")
      << "  (sequence "
      << uint64_t(Num(r, "seq")) << (writable ? ", writable overlay discarded at unexport" : ", read-only")
      << ")\n";
  if (Str(r, "serves") == "ciphertext") {
    out << "  encrypted volume: this export serves the stored (encrypted) blocks and their MACs; read it decrypted\n"
        << "  at your site with: cdpctl serve " << spec << " --key-file F --socket PATH --tls-certificates DIR\n";
  }
  if (nbds) out << "  NBD TLS: append ?tls-certificates=DIR, a directory with the tenant's ca-cert.pem, client-cert.pem, client-key.pem\n";
  return 0;
}

// failover VOLUME --to POINT | --undo | --commit (docs/recovery.md, "Failover").
int Failover(const Options& o, const std::string& volume, const std::string& action, const std::string& point,
             std::ostream& out, std::ostream& err) {
  json::object b{{"volume", volume}};
  if (!o.tenant.empty()) b["tenant"] = o.tenant;
  std::string route = "/v1/failover";
  if (action == "--to") b = PointArg(volume, point, o);
  else route += action == "--undo" ? "/undo" : "/commit";
  Call c = Http(o, o.mt, "POST", route, b);
  if (!c.reached || c.status != 200) return Fail(err, "failover " + volume, c);
  if (o.json) {
    out << json::serialize(c.body) << "\n";
    return 0;
  }
  const json::object& r = c.body.as_object();
  const bool changed = Str(r, "changed") == "yes";
  const json::value* fv = r.if_contains("failover");
  const json::object* f = fv ? fv->if_object() : nullptr;
  if (action == "--to" && f) {
    const json::value* tls = r.if_contains("tls");
    const bool nbds = tls != nullptr && tls->is_bool() && tls->as_bool();
    out << "volume " << volume << (changed ? " failed over" : " is already failed over") << " to point "
        << uint64_t(Num(*f, "point")) << " (sequence " << uint64_t(Num(*f, "history_seq")) << ")"
        << (changed ? "" : "; nothing changed") << "\n"
        << "  read-write export: " << (nbds ? "nbds://" : "nbd://") << o.mt.host << ":" << uint64_t(Num(r, "port"))
        << "/" << Str(r, "export") << " (persistent; survives a restart of the master target)\n"
        << "  the replica and the journal after the point are kept; the old primary is fenced\n"
        << "  undo (before a commit): cdpctl failover " << volume << " --undo; make it final: cdpctl failover "
        << volume << " --commit\n";
    if (nbds) out << "  NBD TLS: append ?tls-certificates=DIR, a directory with the tenant's ca-cert.pem, client-cert.pem, client-key.pem\n";
    const json::value* sealed = r.if_contains("sealed");
    if (sealed != nullptr && sealed->is_bool() && sealed->as_bool()) {
      out << "  encrypted volume: the export holds the stored blocks and their MACs; serve it decrypted to the\n"
          << "  recovered machine at your site: cdpctl serve " << volume
          << "@failover --key-file F --socket PATH --tls-certificates DIR\n";
    }
  } else if (action == "--undo") {
    if (changed) {
      out << "volume " << volume << ": failover undone; protecting again from sequence "
          << uint64_t(Num(r, "applied_seq")) << " (the promoted export and what was written to it are discarded)\n";
    } else {
      out << "volume " << volume << " is " << Str(r, "state") << "; nothing to undo\n";
    }
  } else if (action == "--commit" && f) {
    out << "volume " << volume << ": failover to point " << uint64_t(Num(*f, "point")) << " (sequence "
        << uint64_t(Num(*f, "history_seq")) << ") " << (changed ? "committed" : "was committed already")
        << "; undo is refused from now on\n";
  } else {
    out << "volume " << volume << ": state " << Str(r, "state") << "\n";
  }
  return 0;
}

// branches: the failback branches the agent keeps (the original site's
// writes that a failback replaced), each with its NBD export.
int Branches(const Options& o, std::ostream& out, std::ostream& err) {
  Call c = Http(o, o.agent, "GET", "/v1/branches", json::value());
  if (!c.reached || c.status != 200) return Fail(err, "branches", c);
  if (o.json) {
    out << json::serialize(c.body) << "\n";
    return 0;
  }
  const json::array& a = c.body.as_object().at("branches").as_array();
  if (a.empty()) out << "no failback branches\n";
  for (const json::value& x : a) {
    const json::object& b = x.as_object();
    out << Str(b, "volume") << "  generation " << uint64_t(Num(b, "generation")) << "  "
        << uint64_t(Num(b, "saved_blocks")) << " blocks (" << uint64_t(Num(b, "saved_bytes")) << " bytes)  export "
        << Str(b, "export") << "  files " << Str(b, "path") << ".{img,idx}\n";
  }
  return 0;
}

int Unexport(const Options& o, const std::string& name, std::ostream& out, std::ostream& err) {
  Call c = Http(o, o.mt, "POST", "/v1/unexport", json::object{{"export", name}});
  if (!c.reached || c.status != 200) return Fail(err, "unexport " + name, c);
  if (o.json) out << json::serialize(c.body) << "\n";
  else out << "export " << name << " removed\n";
  return 0;
}



}  // namespace cdp::ctl

// SPDX-License-Identifier: Apache-2.0
// cdpctl status, tag, points, anomalies: what the daemons say (commands.h).
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

int Status(const Options& o, std::ostream& out, std::ostream& err) {
  Call a = Http(o, o.agent, "GET", "/status");
  Call p = Http(o, o.ps, "GET", "/status");
  Call m = Http(o, o.mt, "GET", "/status");
  Call mg = m.reached ? Http(o, o.mt, "GET", "/v1/groups" + std::string(o.tenant.empty() ? "" : "?tenant=" + Q(o.tenant)))
                      : Call{};
  if (o.json) {
    json::object all;
    all["agent"] = a.reached ? a.body : json::value(json::object{{"error", a.error}});
    all["process_server"] = p.reached ? p.body : json::value(json::object{{"error", p.error}});
    all["master_target"] = m.reached ? m.body : json::value(json::object{{"error", m.error}});
    if (mg.reached && mg.status == 200) {
      all["groups"] = mg.body.as_object()["groups"];
      all["coordinated_groups"] = mg.body.as_object()["coordinated"];  // groups coordinated at the MT
    }
    out << json::serialize(all) << "\n";
    return (a.reached || p.reached || m.reached) ? 0 : 1;
  }
  char line[512];
  // Every insecure setting a daemon has in force, loudly, first.
  for (const auto& [who, c] : {std::pair{"agent", &a}, std::pair{"process server", &p}, std::pair{"master target", &m}}) {
    const json::object* st = c->body.if_object();
    const json::value* ins = st ? st->if_contains("insecure") : nullptr;
    if (ins == nullptr || !ins->is_array()) continue;
    for (const auto& x : ins->as_array()) {
      if (x.is_string()) out << "INSECURE: " << who << ": " << std::string(x.as_string()) << "\n";
    }
  }
  out << "agent " << Where(o.agent) << (a.reached ? "" : "  unreachable: " + a.error) << "\n";
  if (auto* vols = Volumes(a.body)) {
    std::snprintf(line, sizeof line, "  %-16s %-9s %-5s %10s %10s %12s %12s  %s\n", "VOLUME", "MODE", "LINK",
                  "RPO LAG", "QUEUE", "CAPTURED", "SENT", "RESYNC");
    out << line;
    for (const auto& v : *vols) {
      const json::object& x = v.as_object();
      double total = Num(x, "resync_total_bytes"), left = Num(x, "resync_remaining_bytes");
      std::string resync = "-";
      if (total > 0 && left > 0) {
        resync = ProgressBar(1.0 - left / total) + " ETA " + Secs(Num(x, "resync_eta_seconds", -1));
      } else if (left > 0) {
        resync = Bytes(left) + " pending";
      }
      std::snprintf(line, sizeof line, "  %-16s %-9s %-5s %10s %10s %12s %12s  %s\n", Str(x, "name").c_str(),
                    Str(x, "mode").c_str(), Str(x, "connected", "-").c_str(),
                    Secs(Num(x, "rpo_lag_seconds", -1)).c_str(), Bytes(Num(x, "queue_bytes")).c_str(),
                    Bytes(Num(x, "captured_bytes")).c_str(), Bytes(Num(x, "bytes_sent")).c_str(), resync.c_str());
      out << line;
      const json::value* cf = x.if_contains("confirmed");
      const bool unconfirmed = cf && cf->is_bool() && !cf->as_bool();
      if (std::string fenced = Str(x, "fenced"); !fenced.empty()) {
        out << "    FENCED: " << fenced << "\n";
      } else if (unconfirmed) {
        out << "    UNCONFIRMED: the process server has not answered since the agent started; the queue and RPO "
               "shown are the agent's own, not known to be delivered\n";
        if (std::string e = Str(x, "last_error"); !e.empty()) out << "    LAST ERROR: " << e << "\n";
      } else if (std::string e = Str(x, "last_error"); !e.empty()) {
        out << "    LAST ERROR: " << e << "\n";  // why it is not shipping (cleared once it ships)
      }
      if (std::string phase = Str(x, "phase"); !phase.empty() && phase != "protecting")
        out << "    " << phase << " (generation " << uint64_t(Num(x, "generation")) << "): " << Str(x, "write_fence")
            << "\n";
    }
  }
  out << "process server " << Where(o.ps) << (p.reached ? "" : "  unreachable: " + p.error) << "\n";
  if (auto* vols = Volumes(p.body)) {
    std::snprintf(line, sizeof line, "  %-16s %-10s %10s %10s %9s %12s %12s %7s\n", "VOLUME", "TENANT", "BACKLOG",
                  "OLDEST", "BUSY", "IN", "OUT", "RATIO");
    out << line;
    for (const auto& v : *vols) {
      const json::object& x = v.as_object();
      std::snprintf(line, sizeof line, "  %-16s %-10s %10s %10s %9s %12s %12s %7.2f\n", Str(x, "volume").c_str(),
                    Str(x, "tenant").c_str(), Bytes(Num(x, "backlog_bytes")).c_str(),
                    Secs(Num(x, "oldest_record_age_seconds")).c_str(), Str(x, "busy", "-").c_str(),
                    Bytes(Num(x, "bytes_in")).c_str(), Bytes(Num(x, "bytes_out")).c_str(),
                    Num(x, "compression_ratio", 1.0));
      out << line;
      // Copies to several master targets: each one's own lag (the backlog
      // above is the slowest copy's).
      const json::value* cv = x.if_contains("copies");
      const bool per_copy = cv && cv->is_array() && cv->as_array().size() > 1;
      if (!per_copy) {  // one copy: its state on the volume
        if (std::string f = Str(x, "fenced"); !f.empty()) {
          out << "    FENCED: " << f << "\n";
        } else if (std::string st = Str(x, "stalled"); !st.empty()) {
          out << "    STALLED: " << st << "\n";
        }
      }
      if (per_copy) {
        for (const auto& c : cv->as_array()) {
          if (!c.is_object()) continue;
          const json::object& y = c.as_object();
          std::string state = Str(y, "link");
          if (std::string st = Str(y, "stalled"); !st.empty()) state = "STALLED: " + st;
          if (std::string f = Str(y, "fenced"); !f.empty()) state = "FENCED: " + f;
          std::snprintf(line, sizeof line, "    copy %.0f %-24s acked %10.0f  lag %8.0f rec %10s %10s  ",
                        Num(y, "copy"), Str(y, "mt").c_str(), Num(y, "acked_seq"), Num(y, "lag_records"),
                        Bytes(Num(y, "lag_bytes")).c_str(), Secs(Num(y, "lag_seconds")).c_str());
          out << line << state << "\n";
        }
      }
    }
  }
  GroupLines(p.body, out);  // consistency groups coordinated there
  out << "master target " << Where(o.mt) << (m.reached ? "" : "  unreachable: " + m.error) << "\n";
  if (auto* vols = Volumes(m.body)) {
    std::snprintf(line, sizeof line, "  %-16s %-10s %-17s %12s %12s %7s\n", "VOLUME", "TENANT", "STATE", "APPLIED",
                  "JOURNAL", "POINTS");
    out << line;
    for (const auto& v : *vols) {
      const json::object& x = v.as_object();
      std::snprintf(line, sizeof line, "  %-16s %-10s %-17s %12.0f %12s %7.0f\n", Str(x, "volume").c_str(),
                    Str(x, "tenant").c_str(), Str(x, "state").c_str(), Num(x, "applied_seq"),
                    Bytes(Num(x, "journal_bytes")).c_str(), Num(x, "points"));
      out << line;
      if (const json::value* sv = x.if_contains("stall"); sv && sv->is_object()) {
        const json::object& st = sv->as_object();
        out << "    APPLY STALLED (" << Str(st, "cause") << "), " << uint64_t(Num(st, "failures"))
            << " failed attempt(s): " << Str(st, "message") << "\n";
      }
      if (uint64_t open = uint64_t(Num(x, "anomalies_open")); open > 0) {
        out << "    ANOMALY: possible ransomware at the protected host (" << open
            << " open; cdpctl anomalies " << Str(x, "volume") << "): " << Str(x, "last_anomaly") << "\n";
      }
      if (const json::value* fv = x.if_contains("failover"); fv && fv->is_object()) {
        const json::object& f = fv->as_object();
        out << "    failed over to point " << uint64_t(Num(f, "point")) << " (sequence " << uint64_t(Num(f, "history_seq"))
            << ")" << (Str(f, "committed") == "yes" ? ", committed" : ", not committed (undo possible)")
            << "; export " << Str(f, "export") << (Str(f, "served") == "yes" ? "" : " NOT SERVED") << ", "
            << uint64_t(Num(f, "provider_written_blocks")) << " blocks written at the provider\n";
      }
    }
  }
  if (mg.reached && mg.status == 200) {
    // Groups coordinated at the master target (members behind several process servers), then every group's points.
    if (const json::value* cg = mg.body.as_object().if_contains("coordinated"))
      GroupLines(json::object{{"groups", *cg}}, out);
    MtGroupLines(mg.body, out);
  }
  // Volumes on the MT's storage it cannot open (another MT holds the Ceph
  // lock, an I/O error): it serves nothing of them.
  if (const json::object* mo = m.body.if_object()) {
    if (const json::value* rv = mo->if_contains("refused"); rv && rv->is_array()) {
      for (const auto& v : rv->as_array()) {
        if (!v.is_object()) continue;
        const json::object& x = v.as_object();
        out << "  REFUSED " << Str(x, "tenant") << "/" << Str(x, "volume") << " (" << Str(x, "cause")
            << "): " << Str(x, "why") << "\n";
      }
    }
  }
  if (!a.reached && !p.reached && !m.reached) {
    err << "cdpctl: no daemon answered\n";
    return 1;
  }
  return 0;
}


int Tag(const Options& o, const std::string& name, std::ostream& out, std::ostream& err) {
  Call c = Http(o, o.agent, "POST", "/v1/tag", json::object{{"name", name}});
  if (!c.reached || c.status != 200) return Fail(err, "tag " + name, c);
  if (o.json) {
    out << json::serialize(c.body) << "\n";
    return 0;
  }
  out << "tag '" << name << "' inserted:\n";
  if (const json::object* b = c.body.if_object()) {
    if (const json::value* s = b->if_contains("seqs"); s && s->is_object()) {
      for (const auto& [vol, seq] : s->as_object()) out << "  " << std::string(vol) << " at sequence " << seq << "\n";
    }
  }
  return 0;
}

int Points(const Options& o, const std::string& volume, std::ostream& out, std::ostream& err) {
  Call c = Http(o, o.mt, "GET", "/v1/points?volume=" + Q(volume) + TenantParam(o));
  if (!c.reached || c.status != 200) return Fail(err, "points " + volume, c);
  if (o.json) {
    out << json::serialize(c.body) << "\n";
    return 0;
  }
  const json::object& b = c.body.as_object();
  out << "volume " << Str(b, "volume") << " (tenant " << Str(b, "tenant") << "), applied sequence "
      << uint64_t(Num(b, "applied_seq")) << "\n";
  char line[256];
  std::snprintf(line, sizeof line, "  %6s %-16s %12s  %-26s %s\n", "POINT", "KIND", "SEQUENCE", "TIME (UTC)", "NAME");
  out << line;
  if (const json::value* pts = b.if_contains("points"); pts && pts->is_array()) {
    for (const auto& pv : pts->as_array()) {
      const json::object& p = pv.as_object();
      std::string when = Str(p, "time");
      if (when.empty()) {
        double us = Num(p, "time_us");
        std::time_t t = std::time_t(us / 1e6);
        char tb[64];
        std::strftime(tb, sizeof tb, "%Y-%m-%d %H:%M:%S", std::gmtime(&t));
        when = tb;
      }
      const json::value* rb = p.if_contains("rolled_back");
      const std::string name = Str(p, "name") + (rb && rb->is_bool() && rb->as_bool() ? " [rolled back]" : "");
      std::snprintf(line, sizeof line, "  %6.0f %-16s %12.0f  %-26s %s\n", Num(p, "id"), Str(p, "kind").c_str(),
                    Num(p, "seq"), when.c_str(), name.c_str());
      out << line;
    }
  }
  return 0;
}

// `cdpctl anomalies VOLUME [--ack ID]`: the possible ransomware attacks the
// agent saw, each with its suspect-clean point; --ack (admin) releases one.
int Anomalies(const Options& o, const std::string& volume, const std::string& ack, std::ostream& out,
              std::ostream& err) {
  if (!ack.empty()) {
    json::object body{{"volume", volume}};
    if (!o.tenant.empty()) body["tenant"] = o.tenant;
    int64_t id = 0;
    auto [p, ec] = std::from_chars(ack.data(), ack.data() + ack.size(), id);
    if (ec != std::errc() || p != ack.data() + ack.size()) {
      err << "cdpctl: --ack takes an anomaly id (cdpctl anomalies " << volume << ")\n";
      return 2;
    }
    body["id"] = id;
    Call c = Http(o, o.mt, "POST", "/v1/anomalies/ack", body);
    if (!c.reached || c.status != 200) return Fail(err, "anomalies " + volume + " --ack " + ack, c);
    if (o.json) {
      out << json::serialize(c.body) << "\n";
      return 0;
    }
    out << "anomaly " << ack << " of " << volume
        << (Str(c.body.as_object(), "changed") == "yes" ? " acknowledged: its suspect-clean point is no longer held\n"
                                                         : " was already acknowledged\n");
    return 0;
  }
  Call c = Http(o, o.mt, "GET", "/v1/anomalies?volume=" + Q(volume) + TenantParam(o));
  if (!c.reached || c.status != 200) return Fail(err, "anomalies " + volume, c);
  if (o.json) {
    out << json::serialize(c.body) << "\n";
    return 0;
  }
  const json::object& b = c.body.as_object();
  out << "volume " << Str(b, "volume") << " (tenant " << Str(b, "tenant") << ")\n";
  char line[160];
  std::snprintf(line, sizeof line, "  %4s %-20s %8s %12s  %-12s %s\n", "ID", "TIME (UTC)", "POINT", "CLEAN SEQ", "STATE",
                "WHAT");
  out << line;
  if (const json::value* list = b.if_contains("anomalies"); list && list->is_array()) {
    for (const auto& v : list->as_array()) {
      const json::object& a = v.as_object();
      std::time_t t = std::time_t(Num(a, "time_us") / 1e6);
      char tb[64];
      std::strftime(tb, sizeof tb, "%Y-%m-%d %H:%M:%S", std::gmtime(&t));
      const std::string state = Str(a, "acknowledged") == "yes" ? "acknowledged" : Str(a, "held") == "yes" ? "HELD" : "expired";
      std::snprintf(line, sizeof line, "  %4.0f %-20s %8.0f %12.0f  %-12s ", Num(a, "id"), tb, Num(a, "point"),
                    Num(a, "clean_seq"), state.c_str());
      out << line << Str(a, "message") << "\n";
    }
  }
  return 0;
}


}  // namespace cdp::ctl

// SPDX-License-Identifier: Apache-2.0
#include "cdpctl/cdpctl.h"

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

#include "common/control_token.h"
#include "common/host_port.h"
#include "common/http_client.h"
#include "common/pki.h"
#include "common/protocol.h"
#include "common/seal.h"
#include "common/version.h"

namespace cdp::ctl {
namespace json = boost::json;

namespace {

struct Call {
  bool reached = false;  // the daemon answered at all
  int status = 0;        // HTTP status
  json::value body;      // parsed body (null if not JSON)
  std::string error;     // transport or daemon error text
};

Call Http(const Options& o, const Endpoint& ep, std::string_view method, const std::string& target,
          const json::value& body = nullptr) {
  Call c;
  std::string payload = body.is_null() ? std::string() : json::serialize(body);
  http::ClientOptions co;
  co.bearer_token = ep.token;
  auto r = http::HttpRequest(ep.host, ep.port, method, target, payload, std::chrono::milliseconds(o.timeout_ms), co);
  if (!r.ok()) {
    c.error = r.status().ToString();
    return c;
  }
  c.reached = true;
  c.status = r->status;
  boost::system::error_code ec;
  c.body = json::parse(r->body, ec);
  if (ec) c.body = nullptr;
  if (c.status / 100 != 2) {
    const json::object* o2 = c.body.if_object();
    const json::value* e = o2 ? o2->if_contains("error") : nullptr;
    c.error = (e && e->is_string()) ? std::string(e->as_string()) : r->body;
  }
  return c;
}

std::string Where(const Endpoint& ep) { return ep.host + ":" + std::to_string(ep.port); }

// Percent-encodes a query value.
std::string Q(std::string_view s) {
  std::string out;
  for (unsigned char ch : s) {
    if (std::isalnum(ch) || ch == '-' || ch == '_' || ch == '.' || ch == '~') {
      out += char(ch);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", ch);
      out += buf;
    }
  }
  return out;
}

std::string TenantParam(const Options& o) { return o.tenant.empty() ? "" : "&tenant=" + Q(o.tenant); }

double Num(const json::object& o, std::string_view key, double dflt = 0) {
  const json::value* v = o.if_contains(key);
  if (!v) return dflt;
  if (v->is_double()) return v->as_double();
  if (v->is_int64()) return double(v->as_int64());
  if (v->is_uint64()) return double(v->as_uint64());
  return dflt;
}

std::string Str(const json::object& o, std::string_view key, std::string dflt = "") {
  const json::value* v = o.if_contains(key);
  if (v && v->is_string()) return std::string(v->as_string());
  if (v && v->is_bool()) return v->as_bool() ? "yes" : "no";
  return dflt;
}

std::string Bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", b, units[u]);
  return buf;
}

std::string Secs(double s) {
  char buf[32];
  if (s < 0) return "-";
  if (s < 120) std::snprintf(buf, sizeof buf, "%.1fs", s);
  else if (s < 7200) std::snprintf(buf, sizeof buf, "%.0fm%02.0fs", std::floor(s / 60), std::fmod(s, 60));
  else std::snprintf(buf, sizeof buf, "%.1fh", s / 3600);
  return buf;
}

const json::array* Volumes(const json::value& body) {
  const json::object* o = body.if_object();
  if (!o) return nullptr;
  const json::value* v = o->if_contains("volumes");
  return v ? v->if_array() : nullptr;
}

int Status(const Options& o, std::ostream& out, std::ostream& err) {
  Call a = Http(o, o.agent, "GET", "/status");
  Call p = Http(o, o.ps, "GET", "/status");
  Call m = Http(o, o.mt, "GET", "/status");
  if (o.json) {
    json::object all;
    all["agent"] = a.reached ? a.body : json::value(json::object{{"error", a.error}});
    all["process_server"] = p.reached ? p.body : json::value(json::object{{"error", p.error}});
    all["master_target"] = m.reached ? m.body : json::value(json::object{{"error", m.error}});
    out << json::serialize(all) << "\n";
    return (a.reached || p.reached || m.reached) ? 0 : 1;
  }
  char line[512];
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

int Fail(std::ostream& err, const std::string& what, const Call& c) {
  err << "cdpctl: " << what << ": " << (c.error.empty() ? "HTTP " + std::to_string(c.status) : c.error) << "\n";
  return 1;
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

// POINT is an id from `points`, "seq:N" for an exact sequence, a UTC time
// (the newest point written at or before it), or a tag's name.
json::object PointArg(const std::string& volume, const std::string& point, const Options& o) {
  json::object b{{"volume", volume}};
  if (!o.tenant.empty()) b["tenant"] = o.tenant;
  // Numbers go as JSON numbers; anything else as given, for the daemon's 400 naming it.
  auto number = [](std::string_view t) -> json::value {
    int64_t v = 0;
    auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    if (!t.empty() && ec == std::errc() && p == t.data() + t.size()) return v;
    return json::string(t);
  };
  // A UTC time (YYYY-MM-DDTHH:MM...): the newest point written at or before it.
  const bool is_time = point.size() >= 10 && point[4] == '-' && point[7] == '-' &&
                       std::all_of(point.begin(), point.begin() + 4, [](char ch) { return ch >= '0' && ch <= '9'; });
  if (point.rfind("seq:", 0) == 0) {
    b["seq"] = number(std::string_view(point).substr(4));
  } else if (is_time) {
    b["time"] = point;
  } else if (json::value n = number(point); n.is_int64()) {
    b["point"] = n;
  } else {
    b["tag"] = point;
  }
  return b;
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

// The tenant key never leaves this host: only `volume`'s derived keys go to
// the master target (over the control channel's TLS), as "keys" in `body`.
bool AddVolumeKeys(const std::string& key_file, const std::string& volume, json::object* body, std::ostream& err) {
  auto key = seal::LoadTenantKey(DefaultEnv(), key_file);
  if (!key.ok()) {
    err << "cdpctl: " << key.status().message() << "\n";
    return false;
  }
  auto keys = seal::DeriveVolumeKeys(*key, volume);
  if (!keys.ok()) {
    err << "cdpctl: " << keys.status().message() << "\n";
    return false;
  }
  (*body)["keys"] = seal::EncodeVolumeKeys(*keys);
  return true;
}

// A recovery point's URI, cdp://TENANT/VOLUME@POINT (POINT as for export:
// an id, seq:N or a tag name): the tenant and VOLUME@POINT. False when
// `uri` is not one.
bool ParsePointUri(const std::string& uri, std::string* tenant, std::string* spec) {
  constexpr std::string_view kScheme = "cdp://";
  if (uri.rfind(kScheme, 0) != 0) return false;
  const std::string rest = uri.substr(kScheme.size());
  const size_t slash = rest.find('/');
  if (slash == std::string::npos || !proto::ValidName(rest.substr(0, slash))) return false;
  *tenant = rest.substr(0, slash);
  *spec = rest.substr(slash + 1);
  return spec->find('@') != std::string::npos;
}

int Export(const Options& opts, const std::string& spec_or_uri, bool writable, std::ostream& out, std::ostream& err,
           const std::string& key_file = "", bool uri_only = false) {
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
  if (!key_file.empty() && !AddVolumeKeys(key_file, spec.substr(0, at), &b, err)) return 1;
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
    out << "  encrypted volume: this export serves the stored (encrypted) blocks; add --key-file to read them\n";
  } else if (Str(r, "serves") == "plaintext") {
    out << "  encrypted volume: decrypted with your key; every block's integrity is checked on read\n";
  }
  if (nbds) out << "  NBD TLS: append ?tls-certificates=DIR, a directory with the tenant's ca-cert.pem, client-cert.pem, client-key.pem\n";
  return 0;
}

// failover VOLUME --to POINT | --undo | --commit (docs/recovery.md, "Failover").
int Failover(const Options& o, const std::string& volume, const std::string& action, const std::string& point,
             std::ostream& out, std::ostream& err, const std::string& key_file = "") {
  json::object b{{"volume", volume}};
  if (!o.tenant.empty()) b["tenant"] = o.tenant;
  std::string route = "/v1/failover";
  if (action == "--to") b = PointArg(volume, point, o);
  else route += action == "--undo" ? "/undo" : "/commit";
  if (!key_file.empty() && !AddVolumeKeys(key_file, volume, &b, err)) return 1;
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

// ---- verify ----
//
// Online verify (docs/operations.md, "Verify"): the agent hashes each region in
// a window with no write to it and says which sequence S the hash describes;
// the master target hashes its replica as it was at S (through the undo
// journal). Equal sequences make every difference real. Regions that differ
// are descended into at 4 KiB, the same way, so the output names blocks.
//
//   page of regions --agent /v1/hashes--> (seq, hash) | busy
//        --group runs of one seq--> MT /v1/hashes?at_seq=seq (409: wait)
//        --differ--> 4 KiB leaves of the region (same scheme) --> extents
//        --repair--> agent /v1/repair, wait for the replica, verify the extents again

constexpr uint64_t kBlock = 4096;
constexpr auto kReplicaWait = std::chrono::seconds(60);
constexpr auto kReplicaPoll = std::chrono::milliseconds(100);

struct VerifyArgs {
  std::string volume;
  uint64_t region_size = 1 << 20;
  bool repair = false;
  double max_rate_mb = 200;  // MB/s (10^6 bytes) of source reads
};

struct Extent {
  uint64_t offset = 0;
  uint64_t length = 0;
};

enum class Cmp { kEqual, kDiffer, kBusy };

class Verifier {
 public:
  Verifier(const Options& o, const VerifyArgs& a, std::ostream& err)
      : o_(o), a_(a), err_(err), start_(std::chrono::steady_clock::now()) {}

  // Compares units [first, first+count) of `unit` bytes; appends one Cmp per
  // unit to *out. False on an error (already reported).
  bool Compare(uint64_t unit, uint64_t first, uint64_t count, std::vector<Cmp>* out);
  // The exact 4 KiB blocks of [offset, offset+len) that differ, as extents
  // appended to *out (merged with a last extent they touch). *busy set when a
  // part could not be compared.
  bool Blocks(uint64_t offset, uint64_t len, std::vector<Extent>* out, bool* busy);
  // Whether the agent is still the process, with the same numbering, that
  // every difference found rests on; false on error. Differences found under
  // another one are not reported (their sequences changed meaning).
  bool NumberingStill(bool* same);
  // Waits until the replica has applied `seq`.
  bool WaitApplied(uint64_t seq);

  uint64_t size() const { return size_; }

 private:
  struct AgentUnit {
    bool busy = true;
    uint64_t seq = 0;
    uint64_t instance = 0;  // the agent process that answered
    uint64_t numbering = 0;
    std::string hash;
  };
  bool AgentUnits(uint64_t unit, uint64_t first, uint64_t count, std::vector<AgentUnit>* out);
  // 1: hashes, 0: the sequence is outside the replica's history (410), -1: error.
  int MtUnitsAt(uint64_t unit, uint64_t first, uint64_t count, uint64_t seq, std::vector<std::string>* out);
  void Pace(uint64_t bytes);

  const Options& o_;
  const VerifyArgs& a_;
  std::ostream& err_;
  std::chrono::steady_clock::time_point start_;
  uint64_t paced_bytes_ = 0;
  uint64_t size_ = 0;
  std::set<std::pair<uint64_t, uint64_t>> numberings_;  // (instance, numbering) differences rest on
};

void Verifier::Pace(uint64_t bytes) {
  if (!(a_.max_rate_mb > 0)) return;
  paced_bytes_ += bytes;
  auto due = start_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                          std::chrono::duration<double>(double(paced_bytes_) / (a_.max_rate_mb * 1e6)));
  std::this_thread::sleep_until(due);
}

bool Verifier::AgentUnits(uint64_t unit, uint64_t first, uint64_t count, std::vector<AgentUnit>* out) {
  std::string target = "/v1/hashes?volume=" + Q(a_.volume) + "&region_size=" + std::to_string(unit) +
                       "&first=" + std::to_string(first) + "&count=" + std::to_string(count);
  Call c = Http(o_, o_.agent, "GET", target);
  if (!c.reached || c.status != 200) {
    Fail(err_, "source hashes of " + a_.volume, c);
    return false;
  }
  const json::object* b = c.body.if_object();
  const json::value* rs = b ? b->if_contains("regions") : nullptr;
  if (!rs || !rs->is_array() || rs->as_array().size() != count) {
    err_ << "cdpctl: the agent at " << Where(o_.agent) << " sent no region digests (an agent without online verify?)\n";
    return false;
  }
  size_ = uint64_t(Num(*b, "size"));
  const uint64_t instance = uint64_t(Num(*b, "instance"));
  for (const auto& v : rs->as_array()) {
    AgentUnit u;
    const json::object* r = v.if_object();
    if (r && !r->contains("busy") && r->contains("hash")) {
      u.busy = false;
      u.seq = uint64_t(Num(*r, "seq"));
      u.instance = instance;
      u.numbering = uint64_t(Num(*r, "numbering"));
      u.hash = Str(*r, "hash");
    }
    out->push_back(std::move(u));
  }
  Pace(count * unit);
  return true;
}

int Verifier::MtUnitsAt(uint64_t unit, uint64_t first, uint64_t count, uint64_t seq, std::vector<std::string>* out) {
  std::string target = "/v1/hashes?volume=" + Q(a_.volume) + TenantParam(o_) + "&region_size=" +
                       std::to_string(unit) + "&first=" + std::to_string(first) + "&count=" + std::to_string(count) +
                       "&at_seq=" + std::to_string(seq);
  const auto deadline = std::chrono::steady_clock::now() + kReplicaWait;
  for (;;) {
    Call c = Http(o_, o_.mt, "GET", target);
    if (c.reached && c.status == 409 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(kReplicaPoll);  // the replica has not applied `seq` yet
      continue;
    }
    if (c.reached && c.status == 410) {
      err_ << "cdpctl: the replica no longer holds sequence " << seq
           << " (outside its retained history): those regions were not compared\n";
      return 0;
    }
    if (!c.reached || c.status != 200) {
      Fail(err_, "replica hashes of " + a_.volume + " at sequence " + std::to_string(seq), c);
      return -1;
    }
    const json::object* b = c.body.if_object();
    const json::value* hs = b ? b->if_contains("hashes") : nullptr;
    if (b && seq == 0 && uint64_t(Num(*b, "seq")) != 0) {
      // at_seq 0 asks for the current image: the source has no write in its
      // numbering yet, the replica has applied some: not comparable.
      err_ << "cdpctl: the source has captured nothing yet but the replica has applied sequence "
           << uint64_t(Num(*b, "seq")) << ": not compared\n";
      return 0;
    }
    if (!b || uint64_t(Num(*b, "seq")) != seq || !hs || !hs->is_array() || hs->as_array().size() != count) {
      err_ << "cdpctl: the master target at " << Where(o_.mt) << " did not answer for sequence " << seq << "\n";
      return -1;
    }
    for (const auto& h : hs->as_array()) out->push_back(h.is_string() ? std::string(h.as_string()) : "");
    return 1;
  }
}

bool Verifier::Compare(uint64_t unit, uint64_t first, uint64_t count, std::vector<Cmp>* out) {
  // One agent request reads at most 64 MiB (the control server answers one
  // request at a time).
  const uint64_t page = std::clamp<uint64_t>((64ull << 20) / unit, 1, proto::kMaxHashes);
  for (uint64_t p = first; p < first + count; p += page) {
    const uint64_t n = std::min(page, first + count - p);
    std::vector<AgentUnit> src;
    if (!AgentUnits(unit, p, n, &src)) return false;
    for (uint64_t i = 0; i < n;) {
      if (src[i].busy) {
        out->push_back(Cmp::kBusy);
        ++i;
        continue;
      }
      // A run of units described at one sequence: one replica request.
      uint64_t j = i + 1;
      while (j < n && !src[j].busy && src[j].seq == src[i].seq && src[j].numbering == src[i].numbering &&
             src[j].instance == src[i].instance) {
        ++j;
      }
      std::vector<std::string> rep;
      int got = MtUnitsAt(unit, p + i, j - i, src[i].seq, &rep);
      if (got < 0) return false;
      for (uint64_t k = i; k < j; ++k) {
        if (got == 0) {
          out->push_back(Cmp::kBusy);
        } else if (rep[k - i] == src[k].hash) {
          out->push_back(Cmp::kEqual);
        } else {
          out->push_back(Cmp::kDiffer);
          numberings_.insert({src[k].instance, src[k].numbering});
        }
      }
      i = j;
    }
  }
  return true;
}

bool Verifier::Blocks(uint64_t offset, uint64_t len, std::vector<Extent>* out, bool* busy) {
  std::vector<Cmp> leaves;
  if (!Compare(kBlock, offset / kBlock, (len + kBlock - 1) / kBlock, &leaves)) return false;
  for (size_t i = 0; i < leaves.size(); ++i) {
    if (leaves[i] == Cmp::kBusy) *busy = true;
    if (leaves[i] != Cmp::kDiffer) continue;
    const uint64_t off = offset + i * kBlock;
    const uint64_t n = std::min(kBlock, size_ - off);
    if (!out->empty() && out->back().offset + out->back().length == off) {
      out->back().length += n;
    } else {
      out->push_back({off, n});
    }
  }
  return true;
}

bool Verifier::NumberingStill(bool* same) {
  Call c = Http(o_, o_.agent, "GET",
                "/v1/hashes?volume=" + Q(a_.volume) + "&region_size=4096&first=0&count=1&max_retries=0");
  if (!c.reached || c.status != 200) {
    Fail(err_, "source hashes of " + a_.volume, c);
    return false;
  }
  const json::object* b = c.body.if_object();
  if (!b) {
    err_ << "cdpctl: the agent at " << Where(o_.agent) << " sent no JSON\n";
    return false;
  }
  const std::pair<uint64_t, uint64_t> now{uint64_t(Num(*b, "instance")), uint64_t(Num(*b, "numbering"))};
  *same = numberings_.empty() || (numberings_.size() == 1 && *numberings_.begin() == now);
  return true;
}

bool Verifier::WaitApplied(uint64_t seq) {
  std::vector<std::string> ignored;
  return MtUnitsAt(kBlock, 0, 1, seq, &ignored) > 0;
}

json::array ExtentsJson(const std::vector<Extent>& xs) {
  json::array a;
  for (const Extent& x : xs) a.push_back(json::object{{"offset", x.offset}, {"length", x.length}});
  return a;
}

int Verify(const Options& o, const VerifyArgs& a, std::ostream& out, std::ostream& err) {
  Verifier v(o, a, err);
  // The first page tells the volume's size.
  std::vector<Cmp> regions;
  if (!v.Compare(a.region_size, 0, 1, &regions)) return 1;
  const uint64_t count = (v.size() + a.region_size - 1) / a.region_size;
  if (count > 1 && !v.Compare(a.region_size, 1, count - 1, &regions)) return 1;
  uint64_t busy = 0, compared = 0, descended = 0;
  std::vector<Extent> diffs;
  for (uint64_t r = 0; r < regions.size(); ++r) {
    if (regions[r] == Cmp::kBusy) ++busy;
    if (regions[r] != Cmp::kDiffer) {
      compared += regions[r] == Cmp::kEqual;
      continue;
    }
    // Different at one sequence: which blocks? (Compared afresh: the region
    // may have been written since, then only what still differs counts.)
    ++descended;
    bool part_busy = false;
    const uint64_t off = r * a.region_size;
    if (!v.Blocks(off, std::min(a.region_size, v.size() - off), &diffs, &part_busy)) return 1;
    if (part_busy) ++busy;
    else ++compared;
  }
  bool same_numbering = true;
  if (!diffs.empty() && !v.NumberingStill(&same_numbering)) return 1;
  if (!same_numbering) {
    err << "cdpctl: the agent restarted or renumbered its sequences during the verify (a reconnect to a process "
           "server with another history): nothing is reported; verify again\n";
    return 1;
  }
  std::vector<Extent> repaired, unrepaired;
  if (a.repair && !diffs.empty()) {
    uint64_t last = 0;
    for (const Extent& x : diffs) {
      Options ro = o;
      ro.timeout_ms = std::max(o.timeout_ms, 30000);
      Call c = Http(ro, o.agent, "POST", "/v1/repair",
                    json::object{{"volume", a.volume}, {"offset", x.offset}, {"length", x.length}});
      if (!c.reached || c.status != 200) return Fail(err, "repair of " + a.volume, c);
      const json::object* b = c.body.if_object();
      const json::value* seqs = b ? b->if_contains("seqs") : nullptr;
      if (!seqs || !seqs->is_array()) {
        err << "cdpctl: the agent's repair answer has no seqs\n";
        return 1;
      }
      for (const auto& s : seqs->as_array()) {
        if (s.is_uint64() || s.is_int64()) last = std::max(last, json::value_to<uint64_t>(s));
      }
    }
    if (!v.WaitApplied(last)) return 1;
    for (const Extent& x : diffs) {
      std::vector<Extent> still;
      bool part_busy = false;
      if (!v.Blocks(x.offset, x.length, &still, &part_busy)) return 1;
      if (still.empty() && !part_busy) {
        repaired.push_back(x);
      } else {
        unrepaired.push_back(x);
      }
    }
  }
  uint64_t diff_bytes = 0;
  for (const Extent& x : diffs) diff_bytes += x.length;
  if (o.json) {
    json::object j{{"volume", a.volume},        {"region_size", a.region_size}, {"regions", count},
                   {"compared", compared},      {"busy", busy},                 {"descended", descended},
                   {"differences", ExtentsJson(diffs)}};
    if (a.repair) {
      j["repaired"] = ExtentsJson(repaired);
      j["unrepaired"] = ExtentsJson(unrepaired);
    }
    out << json::serialize(j) << "\n";
  } else {
    for (const Extent& x : diffs) out << a.volume << " " << x.offset << " " << x.length << "\n";
    for (const Extent& x : repaired) out << a.volume << " " << x.offset << " " << x.length << " repaired\n";
    for (const Extent& x : unrepaired) out << a.volume << " " << x.offset << " " << x.length << " NOT repaired\n";
    out << "verify " << a.volume << ": " << count << " regions of " << Bytes(double(a.region_size)) << ", "
        << compared << " compared, " << busy << " busy: ";
    if (diffs.empty()) out << "identical\n";
    else out << diffs.size() << " difference(s), " << Bytes(double(diff_bytes)) << "\n";
    if (busy > 0) out << "  " << busy << " region(s) could not be compared now (written throughout, or resync pending): verify again\n";
  }
  // 1: something differs (and was not repaired); 3: nothing differs, but not
  // everything could be compared (busy regions): not a clean bill of health.
  if (!diffs.empty() && !(a.repair && unrepaired.empty())) return 1;
  return busy > 0 ? 3 : 0;
}

// pki init --dir DIR [--name NAME] [--days N]
// pki issue --dir DIR --role agent|ps|mt --name NAME [--out PREFIX] [--days N]   (tenant: --tenant)
// pki show CERT
int Pki(const Options& o, const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
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
    static const std::set<std::string> known{"--dir", "--name", "--days", "--role", "--out"};
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
      return err << "cdpctl: pki issue needs --role agent|ps|mt and --name NAME\n", 2;
    }
    auto role = pki::ParseRole(flags["--role"]);
    if (!role.ok()) return err << "cdpctl: " << role.status().message() << "\n", 2;
    if (*role == pki::CertRole::kMasterTarget && !o.tenant.empty()) {
      return err << "cdpctl: a master target certificate has no tenant: drop --tenant\n", 2;
    }
    if (*role != pki::CertRole::kMasterTarget && o.tenant.empty()) {
      return err << "cdpctl: pki issue --role " << flags["--role"] << " needs --tenant T\n", 2;
    }
    pki::IssueOptions io;
    io.identity = pki::Identity{*role, o.tenant, flags["--name"]};
    if (days > 0) io.not_after_s = int64_t(days) * 86400;
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

// Tenant control tokens at the master target (admin token needed).
int Token(const Options& o, const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  const std::string& sub = args[1];
  if (sub == "list" && args.size() == 2) {
    Call c = Http(o, o.mt, "GET", "/v1/tokens");
    if (!c.reached || c.status != 200) return Fail(err, "token list", c);
    if (o.json) return out << json::serialize(c.body) << "\n", 0;
    for (const auto& kv : c.body.as_object().at("tenants").as_object()) {
      out << kv.key() << ": " << kv.value().to_number<uint64_t>() << " token(s)\n";
    }
    return 0;
  }
  if ((sub == "issue" || sub == "revoke") && args.size() == 2) {
    if (o.tenant.empty()) return err << "cdpctl: token " << sub << " needs --tenant T\n", 2;
    Call c = Http(o, o.mt, "POST", sub == "issue" ? "/v1/tokens" : "/v1/tokens/revoke",
                  json::object{{"tenant", o.tenant}});
    if (!c.reached || c.status != 200) return Fail(err, "token " + sub, c);
    if (o.json) return out << json::serialize(c.body) << "\n", 0;
    if (sub == "issue") {
      // The token alone on stdout, so `cdpctl token issue --tenant T > t.token` makes a token file.
      out << Str(c.body.as_object(), "token") << "\n";
      err << "cdpctl: a control token for tenant " << o.tenant
          << " (shown once; keep it in a file of mode 0600 and give it with --token-file)\n";
    } else {
      out << uint64_t(Num(c.body.as_object(), "revoked")) << " token(s) of tenant " << o.tenant << " revoked\n";
    }
    return 0;
  }
  err << "cdpctl: token wants issue, revoke or list\n";
  return 2;
}

constexpr const char* kUsage =
    "usage: cdpctl [--agent H:P] [--ps H:P] [--mt H:P] [--tenant T] [--json] COMMAND\n"
    "  status | tag NAME | points VOLUME | rollback VOLUME --to POINT [--discard-history] |\n"
    "  anomalies VOLUME [--ack ID] |\n"
    "  export VOLUME@POINT [--writable | --key-file F] | unexport EXPORT |\n"
    "  keys init --out FILE | keys show FILE |\n"
    "  resolve cdp://TENANT/VOLUME@POINT [--key-file F]   (export VOLUME@POINT takes the URI too) |\n"
    "  verify VOLUME [--region-size BYTES] [--repair] [--max-rate MB/s] |\n"
    "  failover VOLUME --to POINT [--test | --key-file F] | failover VOLUME --undo | failover VOLUME --commit |\n"
    "  failback VOLUME [--passes N] | branches |\n"
    "  reprotect VOLUME | token issue|revoke (with --tenant T) | token list\n"
    "  control tokens: --token-file F, --agent-token-file F, --ps-token-file F, --mt-token-file F,\n"
    "                  or CDP_TOKEN / CDP_TOKEN_FILE in the environment\n"
    "  pki init --dir DIR [--name NAME] [--days N] |\n"
    "  pki issue --dir DIR --role agent|ps|mt [--tenant T] --name NAME [--out PREFIX] [--days N] |\n"
    "  pki show CERT\n"
    "  --help | --version\n";

// Bad usage: names the first option no command takes, then the usage; exit 2.
int Usage(const std::vector<std::string>& args, std::ostream& err) {
  for (const std::string& a : args) {
    if (a.size() > 1 && a[0] == '-' && a != "--to" && a != "--writable" && a != "--region-size" && a != "--repair" &&
        a != "--max-rate" && a != "--test" && a != "--undo" && a != "--commit" && a != "--key-file" && a != "--out") {
      err << "cdpctl: unknown option '" << a << "'\n";
      break;
    }
  }
  err << kUsage;
  return 2;
}

// keys init --out FILE | keys show FILE: the tenant key file (common/seal.h).
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
int VerifyCommand(const Options& o, const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  VerifyArgs a;
  a.volume = args[1];
  for (size_t i = 2; i < args.size(); ++i) {
    const std::string& k = args[i];
    const bool has_value = i + 1 < args.size();
    if (k == "--repair") {
      a.repair = true;
    } else if (k == "--region-size" && has_value) {
      const std::string& t = args[++i];
      auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), a.region_size);
      if (ec != std::errc() || p != t.data() + t.size() || a.region_size < 4096 || a.region_size > (1ull << 30) ||
          (a.region_size & (a.region_size - 1))) {
        err << "cdpctl: --region-size must be a power of two in 4096..1073741824\n";
        return 2;
      }
    } else if (k == "--max-rate" && has_value) {
      const std::string& t = args[++i];
      char* end = nullptr;
      a.max_rate_mb = std::strtod(t.c_str(), &end);
      if (t.empty() || end != t.c_str() + t.size() || !(a.max_rate_mb > 0) || !std::isfinite(a.max_rate_mb)) {
        err << "cdpctl: --max-rate must be a positive number of MB/s\n";
        return 2;
      }
    } else {
      return Usage(args, err);
    }
  }
  return Verify(o, a, out, err);
}

}  // namespace

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
  if (cmd == "tag" && args.size() == 2) return Tag(o, args[1], out, err);
  if (cmd == "points" && args.size() == 2) return Points(o, args[1], out, err);
  if (cmd == "anomalies" && args.size() == 2) return Anomalies(o, args[1], "", out, err);
  if (cmd == "anomalies" && args.size() == 4 && args[2] == "--ack") return Anomalies(o, args[1], args[3], out, err);
  if (cmd == "rollback" && (args.size() == 4 || (args.size() == 5 && args[4] == "--discard-history")) &&
      args[2] == "--to")
    return Rollback(o, args[1], args[3], args.size() == 5, out, err);
  if (cmd == "export" && (args.size() == 2 || (args.size() == 3 && args[2] == "--writable"))) {
    return Export(o, args[1], args.size() == 3, out, err);
  }
  if (cmd == "export" && args.size() == 4 && args[2] == "--key-file") return Export(o, args[1], false, out, err, args[3]);
  if (cmd == "resolve" && args.size() == 2 && args[1].rfind("cdp://", 0) == 0) {
    return Export(o, args[1], false, out, err, "", true);
  }
  if (cmd == "resolve" && args.size() == 4 && args[1].rfind("cdp://", 0) == 0 && args[2] == "--key-file") {
    return Export(o, args[1], false, out, err, args[3], true);
  }
  if (cmd == "keys" && args.size() >= 2) return Keys(o, args, out, err);
  if (cmd == "unexport" && args.size() == 2) return Unexport(o, args[1], out, err);
  if (cmd == "failover" && args.size() == 5 && args[2] == "--to" && args[4] == "--test") {
    return Export(o, args[1] + "@" + args[3], true, out, err);  // today's test failover
  }
  if (cmd == "failover" && args.size() == 4 && args[2] == "--to") return Failover(o, args[1], "--to", args[3], out, err);
  if (cmd == "failover" && args.size() == 6 && args[2] == "--to" && args[4] == "--key-file") {
    return Failover(o, args[1], "--to", args[3], out, err, args[5]);
  }
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

// SPDX-License-Identifier: Apache-2.0
// control_bench: latency of the operator's control operations (issue 17; the
// metadata micro-benchmark table of the Ringer seed: mean of 1000 runs).
//
// Operations, and the HTTP requests they are (the ones cdpctl makes):
//   status    GET /status of the agent, the process server and the master
//             target, one after another (cdpctl status)
//   points    GET /v1/points?volume=V&tenant=T at the master target
//   export    POST /v1/export {volume, tenant, point, writable: false} at the MT
//   unexport  POST /v1/unexport {export} at the MT (of the export just made:
//             export and unexport run in pairs)
//   tag       POST /v1/tag {name} at the agent (a consistency tag in every
//             volume of the agent; each run a new name)
//
// Two ways to time each run:
//   api     the requests from this process with common/http/http_client.h, the
//           client cdpctl uses: a new TCP connection per request
//           (Connection: close), as cdpctl.
//   cdpctl  the cdpctl process end to end (fork, exec, the same requests,
//           output to a pipe that is drained, exit), as an operator's script
//           sees it. --cdpctl PATH selects this.
//
// Prints CSV: label,method,op,runs,mean_us,p50_us,p99_us,max_us
//
// Usage: control_bench --agent H:P --ps H:P --mt H:P --agent_token F
//                      --ps_token F --mt_token F --tenant T --volume V
//                      --point POINT (an id, seq:N or a tag, as cdpctl export)
//                      [--runs 1000] [--ops status,points,export,tag]
//                      [--cdpctl PATH] [--label L] [--no_header] [--tls_ca CA]
//   --tls_ca: the site CA of HTTPS control ports (the product's default); without it, plain HTTP
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/http/http_client.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Endpoint {
  std::string host;
  uint16_t port = 0;
  std::string spec;  // host:port as given
  std::string token_file;
  std::string token;
};

struct Args {
  Endpoint agent, ps, mt;
  std::string tenant, volume, point;
  int runs = 1000;
  std::vector<std::string> ops{"status", "points", "export", "tag"};
  std::string cdpctl;
  std::string tls_ca;  // HTTPS control ports: the site CA ("" = plain HTTP)
  std::string label = "loopback";
  bool header = true;
};

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "control_bench: %s\n", what.c_str());
  std::exit(2);
}

Endpoint ParseEndpoint(const std::string& s) {
  Endpoint e;
  const size_t c = s.rfind(':');
  if (c == std::string::npos) Die("want HOST:PORT, not '" + s + "'");
  e.host = s.substr(0, c);
  e.port = uint16_t(std::atoi(s.c_str() + c + 1));
  e.spec = s;
  return e;
}

std::string ReadToken(const std::string& path) {
  std::ifstream f(path);
  std::string t;
  if (!f || !std::getline(f, t)) Die("cannot read token file " + path);
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r' || t.back() == ' ')) t.pop_back();
  return t;
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) {
    if (!x.empty()) v.push_back(x);
  }
  return v;
}

Args Parse(int argc, char** argv) {
  Args a;
  std::map<std::string, std::string> kv;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (k == "--no_header") {
      a.header = false;
      continue;
    }
    if (k == "--help" || k == "-h") {
      std::printf("usage: see the comment at the top of bench/control_bench.cc\n");
      std::exit(0);
    }
    if (k.rfind("--", 0) != 0 || i + 1 >= argc) Die("bad argument " + k);
    kv[k.substr(2)] = argv[++i];
  }
  auto need = [&](const std::string& k) {
    auto it = kv.find(k);
    if (it == kv.end()) Die("--" + k + " is required");
    std::string v = it->second;
    kv.erase(it);
    return v;
  };
  auto opt = [&](const std::string& k, const std::string& d) {
    auto it = kv.find(k);
    if (it == kv.end()) return d;
    std::string v = it->second;
    kv.erase(it);
    return v;
  };
  a.agent = ParseEndpoint(need("agent"));
  a.ps = ParseEndpoint(need("ps"));
  a.mt = ParseEndpoint(need("mt"));
  a.agent.token_file = need("agent_token");
  a.ps.token_file = need("ps_token");
  a.mt.token_file = need("mt_token");
  for (Endpoint* e : {&a.agent, &a.ps, &a.mt}) e->token = ReadToken(e->token_file);
  a.tenant = need("tenant");
  a.volume = need("volume");
  a.point = need("point");
  a.runs = std::atoi(opt("runs", "1000").c_str());
  a.ops = Split(opt("ops", "status,points,export,tag"));
  a.cdpctl = opt("cdpctl", "");
  a.tls_ca = opt("tls_ca", "");
  a.label = opt("label", "loopback");
  if (!kv.empty()) Die("unknown option --" + kv.begin()->first);
  if (a.runs < 1) Die("--runs must be >= 1");
  return a;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// The JSON of cdpctl's PointArg: an id, seq:N, or a tag's name.
std::string PointJson(const std::string& point) {
  auto digits = [](const std::string& s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (point.rfind("seq:", 0) == 0 && digits(point.substr(4))) return "\"seq\":" + point.substr(4);
  if (digits(point)) return "\"point\":" + point;
  return "\"tag\":" + JsonString(point);
}

// The string value of "key" in a flat JSON object ("" if absent).
std::string JsonField(const std::string& body, const std::string& key) {
  const std::string k = "\"" + key + "\":\"";
  size_t p = body.find(k);
  if (p == std::string::npos) return "";
  p += k.size();
  size_t q = body.find('"', p);
  return q == std::string::npos ? "" : body.substr(p, q - p);
}

std::string g_tls_ca;  // --tls_ca

std::string Call(const Endpoint& e, std::string_view method, const std::string& target, const std::string& body) {
  cdp::http::ClientOptions o;
  o.bearer_token = e.token;
  o.tls_ca = g_tls_ca;
  auto r = cdp::http::HttpRequest(e.host, e.port, method, target, body, std::chrono::milliseconds(30000), o);
  if (!r.ok()) Die(std::string(method) + " " + target + ": " + r.status().ToString());
  if (r->status != 200) Die(std::string(method) + " " + target + ": HTTP " + std::to_string(r->status) + " " + r->body);
  return r->body;
}

// Runs cdpctl with `args` after the endpoint and token options; returns its stdout.
std::string RunCdpctl(const Args& a, const std::vector<std::string>& args) {
  std::vector<std::string> argv{a.cdpctl,
                                "--agent", a.agent.spec, "--ps", a.ps.spec, "--mt", a.mt.spec,
                                "--tenant", a.tenant,
                                "--agent-token-file", a.agent.token_file,
                                "--ps-token-file", a.ps.token_file,
                                "--mt-token-file", a.mt.token_file};
  if (!a.tls_ca.empty()) argv.insert(argv.end(), {"--tls-ca", a.tls_ca});
  argv.insert(argv.end(), args.begin(), args.end());
  int fds[2];
  if (pipe(fds) != 0) Die("pipe");
  const pid_t pid = fork();
  if (pid < 0) Die("fork");
  if (pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> cargv;
    for (auto& s : argv) cargv.push_back(s.data());
    cargv.push_back(nullptr);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  close(fds[1]);
  std::string out;
  char buf[65536];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    out.append(buf, size_t(n));
  }
  close(fds[0]);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) Die("cdpctl " + args[0] + " failed (status " + std::to_string(st) + ")");
  return out;
}

double Us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

void Report(const Args& a, const std::string& op, std::vector<double> v) {
  double sum = 0;
  for (double x : v) sum += x;
  std::sort(v.begin(), v.end());
  auto pct = [&](double p) { return v[std::min(v.size() - 1, size_t(p * double(v.size() - 1) + 0.5))]; };
  std::printf("%s,%s,%s,%zu,%.1f,%.1f,%.1f,%.1f\n", a.label.c_str(), a.cdpctl.empty() ? "api" : "cdpctl", op.c_str(),
              v.size(), sum / double(v.size()), pct(0.5), pct(0.99), v.back());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = Parse(argc, argv);
  g_tls_ca = a.tls_ca;
  const bool api = a.cdpctl.empty();
  const std::string tenant_q = "&tenant=" + a.tenant;  // names are [A-Za-z0-9._-]: no escaping needed
  const std::string export_body = "{\"volume\":" + JsonString(a.volume) + ",\"tenant\":" + JsonString(a.tenant) +
                                  "," + PointJson(a.point) + ",\"writable\":false}";
  if (a.header) std::printf("label,method,op,runs,mean_us,p50_us,p99_us,max_us\n");
  const std::string run_id = std::to_string(getpid());
  for (const std::string& op : a.ops) {
    std::vector<double> lat, lat2;
    for (int i = 0; i < a.runs; ++i) {
      const auto t0 = Clock::now();
      if (op == "status") {
        if (api) {
          Call(a.agent, "GET", "/status", "");
          Call(a.ps, "GET", "/status", "");
          Call(a.mt, "GET", "/status", "");
        } else {
          RunCdpctl(a, {"status"});
        }
      } else if (op == "points") {
        if (api) Call(a.mt, "GET", "/v1/points?volume=" + a.volume + tenant_q, "");
        else RunCdpctl(a, {"points", a.volume});
      } else if (op == "tag") {
        const std::string name = "cb-" + run_id + "-" + std::to_string(i);
        if (api) Call(a.agent, "POST", "/v1/tag", "{\"name\":" + JsonString(name) + "}");
        else RunCdpctl(a, {"tag", name});
      } else if (op == "export") {
        // export, then unexport of the same export; both timed.
        std::string body = api ? Call(a.mt, "POST", "/v1/export", export_body)
                               : RunCdpctl(a, {"--json", "export", a.volume + "@" + a.point});
        const std::string name = JsonField(body, "export");
        if (name.empty()) Die("no export name in " + body);
        const auto t1 = Clock::now();
        lat.push_back(Us(t1 - t0));
        if (api) Call(a.mt, "POST", "/v1/unexport", "{\"export\":" + JsonString(name) + "}");
        else RunCdpctl(a, {"unexport", name});
        lat2.push_back(Us(Clock::now() - t1));
        continue;
      } else {
        Die("unknown op " + op);
      }
      lat.push_back(Us(Clock::now() - t0));
    }
    Report(a, op, std::move(lat));
    if (op == "export") Report(a, "unexport", std::move(lat2));
  }
  return 0;
}

// SPDX-License-Identifier: Apache-2.0
#include "loadgen/sweep_run.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <thread>

#include "common/http/http_client.h"
#include "common/nbd/nbd_client.h"
#include "loadgen/tree.h"

extern char** environ;

namespace cdp::loadgen {
namespace {

void SleepMicros(uint64_t us) { std::this_thread::sleep_for(std::chrono::microseconds(us)); }

Result<DaemonSnapshot> Snapshot(const SweepTargets& t, const Clock* clock) {
  DaemonSnapshot s;
  struct Item {
    const std::string* url;
    const std::string* token;
    MetricSums* out;
    const char* who;
  } items[] = {{&t.agent_metrics, &t.agent_token, &s.agent, "agent"},
               {&t.ps_metrics, &t.ps_token, &s.ps, "process server"},
               {&t.mt_metrics, &t.mt_token, &s.mt, "master target"}};
  for (auto& it : items) {
    CDP_ASSIGN_OR_RETURN(HttpUrl u, ParseHttpUrl(*it.url));
    u.token = *it.token;
    u.tls_ca = t.tls_ca;
    auto m = Scrape(u);
    if (!m.ok()) return m.status().WithContext(std::string("scrape ") + it.who + " " + *it.url);
    *it.out = std::move(*m);
  }
  s.wall_s = double(clock->WallMicros()) / 1e6;
  return s;
}

// Removes the files and directories of a tree written by WriteTree.
Status RemoveTree(Env* env, const std::string& root, const TreePlan& plan) {
  for (const auto& f : plan.files) {
    Status s = env->Remove(JoinPath(root, f.path));
    if (!s.ok() && !s.IsNotFound()) return s;
  }
  for (auto it = plan.dirs.rbegin(); it != plan.dirs.rend(); ++it) {
    Status s = env->RemoveDir(JoinPath(root, *it));
    if (!s.ok() && !s.IsNotFound()) return s;
  }
  Status s = env->RemoveDir(root);
  return s.ok() || s.IsNotFound() ? Status::OK() : s;
}

// One measurement window of the gentesttree loop.
Status RunWindow(const SweepTargets& t, const TreeOptions& topt, const SweepRunOptions& o, Env* env,
                 const Clock* clock, NbdClient* nbd, uint64_t* cursor) {
  CDP_ASSIGN_OR_RETURN(TreePlan plan, PlanTree(topt));
  const uint64_t end = clock->NowMicros() + o.window_us;
  while (clock->NowMicros() < end) {
    if (nbd) {
      const uint64_t chunk = std::min<uint64_t>(nbd->max_block(), 1u << 20);
      for (const auto& f : plan.files) {
        Bytes data = TreeFileContent(topt, f);
        for (uint64_t off = 0; off < data.size() && clock->NowMicros() < end;) {
          if (*cursor >= nbd->size()) *cursor = 0;
          uint64_t n = std::min({chunk, uint64_t(data.size()) - off, nbd->size() - *cursor});
          CDP_RETURN_IF_ERROR(nbd->Write(*cursor, ByteSpan(data.data() + off, size_t(n))));
          *cursor += n;
          off += n;
        }
        if (clock->NowMicros() >= end) break;
      }
      CDP_RETURN_IF_ERROR(nbd->Flush());
    } else {
      CDP_RETURN_IF_ERROR(WriteTree(env, t.dir, topt).status());
    }
    uint64_t now = clock->NowMicros();
    if (now < end) SleepMicros(std::min(o.pause_us, end - now));
    if (!nbd) CDP_RETURN_IF_ERROR(RemoveTree(env, t.dir, plan));
  }
  return Status::OK();
}

}  // namespace

Status WaitDrained(const SweepTargets& t, uint64_t timeout_us, const Clock* clock) {
  const uint64_t deadline = clock->NowMicros() + timeout_us;
  for (;;) {
    CDP_ASSIGN_OR_RETURN(DaemonSnapshot s, Snapshot(t, clock));
    // A series not exported yet (the agent has not opened its volume at the
    // PS yet) is not "drained": a sample begun then would lack it.
    auto q = s.agent.find("cdp_agent_queue_bytes");
    auto b = s.ps.find("cdp_ps_backlog_bytes");
    const char* missing = q == s.agent.end() ? "cdp_agent_queue_bytes"
                          : b == s.ps.end()    ? "cdp_ps_backlog_bytes"
                                               : nullptr;
    if (missing == nullptr && q->second == 0 && b->second == 0) return Status::OK();
    if (clock->NowMicros() >= deadline) {
      const std::string state =
          missing != nullptr ? std::string(missing) + " not exported (is the volume open at the process server?)"
                             : "agent queue " + std::to_string(uint64_t(q->second)) + " bytes, PS backlog " +
                                   std::to_string(uint64_t(b->second)) + " bytes";
      return Status::Busy("not drained after " + std::to_string(timeout_us / 1000000) + " s: " + state);
    }
    SleepMicros(200'000);
  }
}

Result<std::vector<SweepSample>> RunSweepPhase(const SweepTargets& t, bool compression, const SweepRunOptions& o,
                                               Env* env, const Clock* clock) {
  if (t.nbd_uri.empty() == t.dir.empty()) return Status::InvalidArgument("sweep: give exactly one of an NBD target or a directory");
  std::unique_ptr<NbdClient> nbd;
  if (!t.nbd_uri.empty()) {
    CDP_ASSIGN_OR_RETURN(NbdUri u, ParseNbdUri(t.nbd_uri));
    CDP_ASSIGN_OR_RETURN(nbd, NbdClient::Connect(u));
  }
  uint64_t cursor = 0;
  std::vector<SweepSample> out;
  if (o.warmup_us > 0 && !o.sizes_mb.empty()) {
    TreeOptions topt;
    topt.size_bytes = o.sizes_mb[0] << 20;
    topt.seed = o.seed;
    topt.compressibility = o.compressibility;
    SweepRunOptions w = o;
    w.window_us = o.warmup_us;
    CDP_RETURN_IF_ERROR(RunWindow(t, topt, w, env, clock, nbd.get(), &cursor));
  }
  for (uint64_t size : o.sizes_mb) {
    CDP_RETURN_IF_ERROR(WaitDrained(t, o.drain_timeout_us, clock));
    TreeOptions topt;
    topt.size_bytes = size << 20;
    topt.seed = o.seed;
    topt.compressibility = o.compressibility;
    SweepSample s;
    s.size_mb = size;
    s.seed = o.seed;
    s.compression = compression;
    CDP_ASSIGN_OR_RETURN(s.begin, Snapshot(t, clock));
    CDP_RETURN_IF_ERROR(RunWindow(t, topt, o, env, clock, nbd.get(), &cursor));
    CDP_ASSIGN_OR_RETURN(s.end, Snapshot(t, clock));
    if (o.log) {
      auto b = s.begin.agent.find("cdp_agent_captured_bytes_total"), e = s.end.agent.find("cdp_agent_captured_bytes_total");
      double cap = (b != s.begin.agent.end() && e != s.end.agent.end()) ? e->second - b->second : 0;
      o.log("compression " + std::string(compression ? "on" : "off") + ", size " + std::to_string(size) +
            " MB: captured " + std::to_string(uint64_t(cap / 1e6)) + " MB in " +
            std::to_string(uint64_t(s.end.wall_s - s.begin.wall_s)) + " s");
    }
    out.push_back(std::move(s));
  }
  if (nbd) CDP_RETURN_IF_ERROR(nbd->Close());
  return out;
}

Status RemoveAll(Env* env, const std::string& path) {
  auto names = env->ListDir(path);
  if (names.ok()) {
    for (const auto& n : *names) CDP_RETURN_IF_ERROR(RemoveAll(env, JoinPath(path, n)));
    return env->RemoveDir(path);
  }
  Status s = env->Remove(path);
  return s.ok() || s.IsNotFound() ? Status::OK() : s;
}

SweepTargets TargetsOf(const LocalCluster& c) {
  const std::string scheme = c.control_ca().empty() ? "http://" : "https://";
  auto metrics = [&](Role r) { return scheme + "127.0.0.1:" + std::to_string(c.control_port(r)) + "/metrics"; };
  SweepTargets t;
  t.tls_ca = c.control_ca();
  t.agent_metrics = metrics(Role::kAgent);
  t.ps_metrics = metrics(Role::kProcessServer);
  t.mt_metrics = metrics(Role::kMasterTarget);
  t.agent_token = c.token(Role::kAgent);
  t.ps_token = c.token(Role::kProcessServer);
  t.mt_token = c.token(Role::kMasterTarget);
  t.nbd_uri = c.nbd_uri();
  return t;
}

}  // namespace cdp::loadgen

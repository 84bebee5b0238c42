#include "loadgen/sweep_run.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <thread>

#include "common/http_client.h"
#include "loadgen/nbd_client.h"
#include "loadgen/tree.h"

extern char** environ;

namespace cdp::loadgen {
namespace {

void SleepMicros(uint64_t us) { std::this_thread::sleep_for(std::chrono::microseconds(us)); }

Result<DaemonSnapshot> Snapshot(const SweepTargets& t, const Clock* clock) {
  DaemonSnapshot s;
  struct Item {
    const std::string* url;
    MetricSums* out;
    const char* who;
  } items[] = {{&t.agent_metrics, &s.agent, "agent"}, {&t.ps_metrics, &s.ps, "process server"},
               {&t.mt_metrics, &s.mt, "master target"}};
  for (auto& it : items) {
    CDP_ASSIGN_OR_RETURN(HttpUrl u, ParseHttpUrl(*it.url));
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
    auto q = s.agent.find("cdp_agent_queue_bytes");
    auto b = s.ps.find("cdp_ps_backlog_bytes");
    double queue = q == s.agent.end() ? 0 : q->second, backlog = b == s.ps.end() ? 0 : b->second;
    if (queue == 0 && backlog == 0) return Status::OK();
    if (clock->NowMicros() >= deadline)
      return Status::Busy("not drained after " + std::to_string(timeout_us / 1000000) + " s: agent queue " +
                          std::to_string(uint64_t(queue)) + " bytes, PS backlog " + std::to_string(uint64_t(backlog)) +
                          " bytes");
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

Result<uint16_t> FreeLoopbackPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::FromErrno(errno, "socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    Status s = Status::FromErrno(errno, "bind 127.0.0.1:0");
    ::close(fd);
    return s;
  }
  ::close(fd);
  return uint16_t(ntohs(a.sin_port));
}

LocalDeployment::~LocalDeployment() { Stop(); }

namespace {

Status WriteText(Env* env, const std::string& path, const std::string& text) {
  return WriteFileAtomic(env, path, ByteSpan(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

std::string LogTail(Env* env, const std::string& path) {
  auto b = ReadWholeFile(env, path);
  if (!b.ok()) return "(no log)";
  std::string s(b->begin(), b->end());
  return s.size() > 1500 ? s.substr(s.size() - 1500) : s;
}

}  // namespace

Status LocalDeployment::Spawn(const std::string& name, const std::string& bin, const std::string& conf,
                              uint16_t control_port) {
  Env* env = DefaultEnv();
  const std::string log = JoinPath(o_.work_dir, name + ".out");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  std::vector<std::string> args = {bin, "--config", conf};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, bin.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return Status::FromErrno(rc, "start " + bin);
  pids_.push_back(pid);
  const Clock* clock = SystemClock::Get();
  const uint64_t deadline = clock->NowMicros() + 30'000'000;
  for (;;) {
    int st = 0;
    if (::waitpid(pid, &st, WNOHANG) == pid) {
      pids_.erase(std::find(pids_.begin(), pids_.end(), pid));
      return Status::Unavailable(name + " exited at start: " + LogTail(env, log) +
                                 LogTail(env, JoinPath(o_.work_dir, name + ".log")));
    }
    auto r = http::HttpRequest("127.0.0.1", control_port, "GET", "/status", {}, std::chrono::milliseconds(1000));
    if (r.ok() && r->status == 200) return Status::OK();
    if (clock->NowMicros() >= deadline) return Status::Unavailable(name + " did not answer /status within 30 s");
    SleepMicros(100'000);
  }
}

Status LocalDeployment::Start() {
  Env* env = DefaultEnv();
  const std::string& d = o_.work_dir;
  for (const char* sub : {"mt", "spool", "agent"}) CDP_RETURN_IF_ERROR(env->CreateDirs(JoinPath(d, sub)));
  {
    OpenOptions oo;
    oo.create = true;
    CDP_ASSIGN_OR_RETURN(auto f, env->Open(JoinPath(d, "source.img"), oo));
    CDP_RETURN_IF_ERROR(f->Truncate(o_.volume_bytes));
  }
  uint16_t p[7];
  for (auto& x : p) {
    CDP_ASSIGN_OR_RETURN(x, FreeLoopbackPort());
  }
  const uint16_t mt_data = p[0], mt_ctl = p[1], mt_nbd = p[2], ps_data = p[3], ps_ctl = p[4], ag_nbd = p[5], ag_ctl = p[6];
  const std::string tenant = "sweep", secret = "sweep-secret-0123456789abcdef";
  auto s = [](uint16_t port) { return "127.0.0.1:" + std::to_string(port); };
  CDP_RETURN_IF_ERROR(WriteText(env, JoinPath(d, "secret"), secret + "\n"));
  CDP_RETURN_IF_ERROR(WriteText(env, JoinPath(d, "master-target.conf"),
                                "listen = " + s(mt_data) + "\ncontrol = " + s(mt_ctl) + "\nnbd = " + s(mt_nbd) +
                                    "\ndata_dir = " + JoinPath(d, "mt") + "\ntenant = " + tenant + ":" + secret +
                                    "\n[log]\nfile = " + JoinPath(d, "master-target.log") + "\n"));
  CDP_RETURN_IF_ERROR(WriteText(env, JoinPath(d, "process-server.conf"),
                                "listen = " + s(ps_data) + "\ncontrol = " + s(ps_ctl) + "\nmt = " + s(mt_data) +
                                    "\ntenant = " + tenant + ":" + secret + "\nspool_dir = " + JoinPath(d, "spool") +
                                    "\ncodec = " + o_.codec + "\nlevel = " + std::to_string(o_.level) +
                                    "\n[log]\nfile = " + JoinPath(d, "process-server.log") + "\n"));
  CDP_RETURN_IF_ERROR(WriteText(env, JoinPath(d, "agent.conf"),
                                "volume = vol=" + JoinPath(d, "source.img") + "\nnbd_listen = " + s(ag_nbd) +
                                    "\nps = " + s(ps_data) + "\ntenant = " + tenant + "\nsecret_file = " +
                                    JoinPath(d, "secret") + "\nclient_id = sweep\nbitmap_dir = " + JoinPath(d, "agent") +
                                    "\ncontrol = " + s(ag_ctl) + "\n[log]\nfile = " + JoinPath(d, "agent.log") + "\n"));
  CDP_RETURN_IF_ERROR(Spawn("master-target", o_.mt_bin, JoinPath(d, "master-target.conf"), mt_ctl));
  CDP_RETURN_IF_ERROR(Spawn("process-server", o_.ps_bin, JoinPath(d, "process-server.conf"), ps_ctl));
  CDP_RETURN_IF_ERROR(Spawn("agent", o_.agent_bin, JoinPath(d, "agent.conf"), ag_ctl));
  targets_.agent_metrics = "http://" + s(ag_ctl) + "/metrics";
  targets_.ps_metrics = "http://" + s(ps_ctl) + "/metrics";
  targets_.mt_metrics = "http://" + s(mt_ctl) + "/metrics";
  targets_.nbd_uri = "nbd://" + s(ag_nbd) + "/vol";
  return Status::OK();
}

void LocalDeployment::Stop() {
  // Agent first, then PS, then MT: the reverse of the start order.
  for (auto it = pids_.rbegin(); it != pids_.rend(); ++it) {
    ::kill(*it, SIGTERM);
    bool gone = false;
    for (int i = 0; i < 200 && !gone; ++i) {
      int st = 0;
      if (::waitpid(*it, &st, WNOHANG) == *it) gone = true;
      else SleepMicros(50'000);
    }
    if (!gone) {
      ::kill(*it, SIGKILL);
      int st = 0;
      ::waitpid(*it, &st, 0);
    }
  }
  pids_.clear();
}

}  // namespace cdp::loadgen

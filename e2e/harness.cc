// SPDX-License-Identifier: Apache-2.0
#include "e2e/harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/json.hpp>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "common/http/http_client.h"

namespace cdp::e2e {
namespace json = boost::json;
using testing::RunCommand;

bool WaitFor(const std::function<bool()>& cond, std::chrono::milliseconds timeout, std::chrono::milliseconds poll) {
  return testing::WaitUntil(cond, timeout, poll);
}

namespace {
std::string g_control_ca;  // the site CA of the cluster made last
}  // namespace

http::ClientOptions ControlClient(const std::string& token) {
  http::ClientOptions co;
  co.bearer_token = token;
  co.tls_ca = g_control_ca;
  return co;
}

Answer Call(uint16_t port, const std::string& method, const std::string& target, const std::string& token,
            const std::string& body) {
  auto r = http::HttpRequest("127.0.0.1", port, method, target, body, std::chrono::milliseconds(20000),
                             ControlClient(token));
  if (!r.ok()) return Answer{0, method + " " + target + ": " + r.status().ToString()};
  return Answer{r->status, r->body};
}

std::optional<json::value> GetJson(uint16_t port, const std::string& target, const std::string& token) {
  return GetJson(port, target, ControlClient(token));
}

std::optional<json::value> GetJson(uint16_t port, const std::string& target, const http::ClientOptions& co) {
  auto r = http::HttpRequest("127.0.0.1", port, "GET", target, {}, std::chrono::milliseconds(5000), co);
  if (!r.ok() || r->status != 200) return std::nullopt;
  boost::system::error_code ec;
  json::value v = json::parse(r->body, ec);
  if (ec) return std::nullopt;
  return v;
}

std::string Sha256File(const std::string& path) {
  auto r = RunCommand({"sha256sum", path}, 120000);
  if (r.exit_code != 0 || r.output.size() < 64) return "";
  return r.output.substr(0, 64);
}

bool MakeSparseFile(const std::string& path, uint64_t size) {
  int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  bool ok = ::ftruncate(fd, off_t(size)) == 0;
  return ::close(fd) == 0 && ok;
}

bool CopyFile(const std::string& from, const std::string& to) {
  return RunCommand({"cp", "--sparse=always", from, to}, 120000).exit_code == 0;
}

// ---------------------------------------------------------------- Daemon

bool Daemon::Start(const std::vector<std::string>& argv, const std::string& log) {
  if (p_.Running()) return false;
  log_ = log;
  SpawnOptions o;
  o.argv = argv;
  o.output_file = log;
  o.die_with_parent = true;  // whatever happens to the test process
  auto p = Subprocess::Spawn(o);
  if (!p.ok()) return false;
  p_ = std::move(*p);
  return true;
}

int Daemon::Stop(int sig) { return p_.Stop(sig, std::chrono::seconds(20)); }

// ---------------------------------------------------------------- Cluster

namespace {

loadgen::LocalClusterOptions LocalOptions(const ClusterOptions& o, const std::string& dir) {
  loadgen::LocalClusterOptions l;
  l.agent_bin = CDP_AGENT_BIN;
  l.ps_bin = CDP_PS_BIN;
  l.mt_bin = CDP_MT_BIN;
  l.dir = dir;
  l.volume = o.volume;
  l.volume_bytes = o.volume_size;
  l.tenant = o.tenant;
  l.secret = o.secret;
  l.codec = o.codec;
  l.compress_threads = 1;
  l.master_targets = o.master_targets;
  l.agent_budget = o.agent_budget;
  l.point_interval = o.point_interval;
  l.client_id = "e2e-agent";
  l.die_with_parent = true;
  l.mt_extra_config = o.mt_extra_config;
  l.ps_extra_config = o.ps_extra_config;
  l.agent_extra_config = o.agent_extra_config;
  l.direct_agent = o.direct_agent;
  l.control_plain = o.control_plain;
  return l;
}

}  // namespace

Cluster::Cluster(ClusterOptions o) : o_(std::move(o)), c_(LocalOptions(o_, scratch_.path())) {
  g_control_ca = c_.control_ca();
}

Cluster::~Cluster() = default;  // the LocalCluster SIGKILLs its daemons before the scratch dir goes

bool Cluster::Start() {
  if (scratch_.path().empty()) {
    why_ = "no scratch directory";
    return false;
  }
  if (Status s = c_.Start(); !s.ok()) {
    why_ = s.ToString();
    return false;
  }
  // A new volume starts with an initial sync (every region compared with the
  // replica); until it is done the agent refuses tags. Tests start after it.
  bool synced = WaitFor(
      [&] {
        auto a = StatusOf(Which::kAgent);
        if (!a) return false;
        for (const auto& v : a->at("volumes").as_array()) {
          const json::object& o = v.as_object();
          if (o.at("name").as_string() == o_.volume) {
            return json::value_to<uint64_t>(o.at("resync_remaining")) == 0 && o.at("mode").as_string() == "data" &&
                   o.at("connected").as_bool();
          }
        }
        return false;
      },
      std::chrono::seconds(60));
  if (!synced) why_ = "the agent's initial sync did not finish in 60 s\n" + Logs();
  return synced;
}

bool Cluster::StartOne(Which w) {
  Status s = c_.Restart(w);
  if (!s.ok()) why_ = s.ToString();
  return s.ok();
}

bool Cluster::Stop(Which w) {
  Status s = c_.Stop(w, std::chrono::seconds(20));
  if (!s.ok()) why_ = s.ToString();
  return s.ok();
}

bool Cluster::SetDirectAgent(bool direct) {
  Status s = c_.SetDirectAgent(direct);
  if (!s.ok()) why_ = s.ToString();
  return s.ok();
}

bool Cluster::SetMtExtraConfig(const std::string& lines) {
  Status s = c_.SetMtExtraConfig(lines);
  if (!s.ok()) why_ = s.ToString();
  return s.ok();
}

bool Cluster::Kill9(Which w) {
  Status s = c_.Kill9(w);
  if (!s.ok()) why_ = s.ToString();
  return s.ok();
}

bool Cluster::WaitDrained(std::chrono::milliseconds timeout) {
  std::string last;
  bool ok = WaitFor(
      [&] {
        auto a = StatusOf(Which::kAgent);
        auto m = StatusOf(Which::kMasterTarget);
        if (!a || !m) {
          last = "a daemon did not answer /status";
          return false;
        }
        const json::object* av = nullptr;
        for (const auto& v : a->at("volumes").as_array()) {
          if (v.as_object().at("name").as_string() == o_.volume) av = &v.as_object();
        }
        const json::object* mv = nullptr;
        for (const auto& v : m->at("volumes").as_array()) {
          if (v.as_object().at("volume").as_string() == o_.volume) mv = &v.as_object();
        }
        if (!av || !mv) {
          last = "volume not yet known to the agent or the master target";
          return false;
        }
        auto u = [](const json::object& o, const char* k) { return json::value_to<uint64_t>(o.at(k)); };
        uint64_t last_seq = u(*av, "next_seq") - 1;
        uint64_t acked = u(*av, "acked_seq"), applied = u(*mv, "applied_seq");
        uint64_t records = u(*av, "queue_records"), dirty = u(*av, "dirty_regions");
        uint64_t resync = u(*av, "resync_remaining");
        std::string mode(av->at("mode").as_string());
        // Not drained before the PS answered the agent's open (issue 38 F8).
        const json::value* cf = av->if_contains("confirmed");
        const bool confirmed = cf != nullptr && cf->is_bool() && cf->as_bool();
        last = "agent last_seq " + std::to_string(last_seq) + " acked " + std::to_string(acked) + " queue_records " +
               std::to_string(records) + " dirty " + std::to_string(dirty) + " resync " + std::to_string(resync) +
               " mode " + mode + (confirmed ? "" : " unconfirmed") + "; mt applied " + std::to_string(applied);
        return confirmed && records == 0 && resync == 0 && dirty == 0 && acked == last_seq && applied == last_seq &&
               mode == "data";
      },
      timeout, std::chrono::milliseconds(100));
  if (!ok) why_ = "not drained: " + last + "\n" + Logs();
  return ok;
}

uint64_t Cluster::AgentU64(const char* key) const {
  auto s = StatusOf(Which::kAgent);
  if (!s) return 0;
  for (const auto& v : s->at("volumes").as_array()) {
    if (v.as_object().at("name").as_string() == o_.volume) return json::value_to<uint64_t>(v.at(key));
  }
  return 0;
}

std::optional<json::value> Cluster::StatusOf(Which w) const {
  return GetJson(c_.control_port(w), "/status", c_.token(w));
}

testing::CommandResult Cluster::Cdpctl(const std::vector<std::string>& args, int timeout_ms) {
  return RunCommand(CdpctlArgv(args), timeout_ms);
}

std::vector<std::string> Cluster::CdpctlArgv(const std::vector<std::string>& args) const {
  auto hp = [](uint16_t p) { return "127.0.0.1:" + std::to_string(p); };
  std::vector<std::string> argv = {CDP_CTL_BIN,  "--agent",        hp(agent_control()), "--ps", hp(ps_control()),
                                   "--mt",       hp(mt_control()), "--tenant",           o_.tenant,
                                   "--agent-token-file", token_path(Which::kAgent),
                                   "--ps-token-file", token_path(Which::kProcessServer),
                                   "--mt-token-file", token_path(Which::kMasterTarget)};
  if (const std::string ca = c_.control_ca(); !ca.empty()) {
    argv.insert(argv.end(), {"--tls-ca", ca});
  }
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

std::optional<Cluster::Served> Cluster::Serve(const std::string& spec, const std::string& key_file) {
  static int n = 0;
  const std::string name = "serve-" + std::to_string(++n);
  const std::string socket = Path(name + ".sock"), log = Path(name + ".log");
  SpawnOptions so;
  so.argv = CdpctlArgv({"serve", spec, "--key-file", key_file, "--socket", socket, "--tls-certificates",
                        nbd_client_dir()});
  so.output_file = log;
  so.truncate_output = true;
  so.die_with_parent = true;
  auto p = Subprocess::Spawn(so);
  if (!p.ok()) {
    why_ = "cdpctl serve: " + p.status().ToString();
    return std::nullopt;
  }
  Served s{std::move(*p), "nbd+unix:///" + spec.substr(0, spec.find('@')) + "?socket=" + socket, log};
  auto text = [&] {
    std::ifstream f(log, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  const bool up = testing::WaitUntil(
      [&] {
        return !s.process.Running() ||
               (::access(socket.c_str(), F_OK) == 0 && text().find("serving ") != std::string::npos);
      },
      std::chrono::seconds(30));
  if (!up || !s.process.Running()) {
    why_ = "cdpctl serve " + spec + " did not start: " + text();
    return std::nullopt;
  }
  return s;
}

int Cluster::Served::Stop() {
  const int st = process.Stop(SIGTERM, std::chrono::seconds(20));
  return st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

std::optional<json::value> Cluster::CdpctlJson(const std::vector<std::string>& args) {
  std::vector<std::string> a = {"--json"};
  a.insert(a.end(), args.begin(), args.end());
  auto r = Cdpctl(a);
  if (r.exit_code != 0) {
    why_ = "cdpctl failed: " + r.output;
    return std::nullopt;
  }
  boost::system::error_code ec;
  json::value v = json::parse(r.output, ec);
  if (ec) {
    why_ = "cdpctl printed no JSON: " + r.output;
    return std::nullopt;
  }
  return v;
}

bool Cluster::CopyExport(const std::string& point, const std::string& dest) {
  auto e = CdpctlJson({"export", o_.volume + "@" + point});
  if (!e) return false;
  std::string name(e->at("export").as_string());
  std::string uri = c_.mt_export_uri(name);
  auto c = RunCommand({"nbdcopy", uri, dest}, 120000);
  auto u = Cdpctl({"unexport", name});
  if (c.exit_code != 0) {
    why_ = "nbdcopy " + uri + " failed: " + c.output;
    return false;
  }
  if (u.exit_code != 0) {
    why_ = "cdpctl unexport failed: " + u.output;
    return false;
  }
  return true;
}

int64_t Cluster::TagPointId(const std::string& tag) {
  auto p = CdpctlJson({"points", o_.volume});
  if (!p) return -1;
  for (const auto& v : p->at("points").as_array()) {
    const json::object& o = v.as_object();
    const json::value* n = o.if_contains("name");
    if (n && n->is_string() && n->as_string() == tag) return json::value_to<int64_t>(o.at("id"));
  }
  why_ = "no point named " + tag + " in " + json::serialize(*p);
  return -1;
}

// ---------------------------------------------------------------- workload

namespace {

// `size` bytes: random data in the first and last third, a hole (never
// written, reads as zeroes) in the middle.
bool WriteHoleyRandomFile(const std::string& path, uint64_t size, uint64_t seed) {
  int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> buf(8192);
  const uint64_t hole_begin = (size / 3) & ~uint64_t(4095), hole_end = (2 * size / 3) & ~uint64_t(4095);
  bool ok = ::ftruncate(fd, off_t(size)) == 0;
  for (uint64_t off = 0; ok && off < size;) {
    if (off >= hole_begin && off < hole_end) {
      off = hole_end;
      continue;
    }
    uint64_t n = std::min<uint64_t>(buf.size() * 8, (off < hole_begin ? hole_begin : size) - off);
    for (auto& x : buf) x = rng();
    ok = ::pwrite(fd, buf.data(), n, off_t(off)) == ssize_t(n);
    off += n;
  }
  return ::close(fd) == 0 && ok;
}

}  // namespace

std::string RandomWrites(const std::string& uri, uint64_t volume_size, uint32_t seed, int rounds,
                         int writes_per_round, uint64_t nbdcopy_bytes, const std::string& scratch) {
  std::mt19937_64 rng(seed);
  const uint64_t kMaxIo = 256 << 10;
  for (int r = 0; r < rounds; ++r) {
    std::vector<std::string> argv = {"qemu-io", "-f", "raw"};
    for (int i = 0; i < writes_per_round; ++i) {
      // Unaligned offsets and lengths too: the tap must handle any byte range.
      uint64_t len = 1 + rng() % kMaxIo;
      uint64_t off = rng() % (volume_size - len);
      if (rng() % 4 != 0) {
        off &= ~uint64_t(511);
        len = (len + 511) & ~uint64_t(511);
        if (off + len > volume_size) off = volume_size - len;
      }
      unsigned pattern = unsigned(rng() % 255) + 1;
      int kind = int(rng() % 10);
      std::string cmd;
      if (kind == 0) cmd = "write -z " + std::to_string(off) + " " + std::to_string(len);
      else if (kind == 1) cmd = "discard " + std::to_string(off & ~uint64_t(4095)) + " " + std::to_string((len + 4095) & ~uint64_t(4095));
      else cmd = "write -P " + std::to_string(pattern) + " " + std::to_string(off) + " " + std::to_string(len);
      if (kind == 1 && (off & ~uint64_t(4095)) + ((len + 4095) & ~uint64_t(4095)) > volume_size) continue;
      argv.push_back("-c");
      argv.push_back(cmd);
    }
    argv.push_back("-c");
    argv.push_back("flush");
    argv.push_back(uri);
    auto q = RunCommand(argv, 120000);
    if (q.exit_code != 0) return "qemu-io failed: " + q.output;
    if (nbdcopy_bytes > 0) {
      // A random image with a hole in its middle: nbdcopy sends WRITEs for the
      // data and zeroes (WRITE_ZEROES/TRIM) for the hole.
      std::string img = scratch + "/nbdcopy-src-" + std::to_string(r) + ".img";
      if (!WriteHoleyRandomFile(img, nbdcopy_bytes, rng())) return "cannot write " + img;
      auto c = RunCommand({"nbdcopy", "--flush", img, uri}, 120000);
      ::unlink(img.c_str());
      if (c.exit_code != 0) return "nbdcopy failed: " + c.output;
    }
  }
  return "";
}

}  // namespace cdp::e2e

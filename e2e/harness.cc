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

#include "common/http_client.h"

namespace cdp::e2e {
namespace json = boost::json;
using testing::RunCommand;

bool WaitFor(const std::function<bool()>& cond, std::chrono::milliseconds timeout, std::chrono::milliseconds poll) {
  return testing::WaitUntil(cond, timeout, poll);
}

std::optional<json::value> GetJson(uint16_t port, const std::string& target) {
  auto r = http::HttpRequest("127.0.0.1", port, "GET", target, {}, std::chrono::milliseconds(5000));
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

Daemon::~Daemon() {
  if (pid_ > 0) Stop(SIGKILL);
}

bool Daemon::Start(const std::vector<std::string>& argv, const std::string& log) {
  if (pid_ > 0) return false;
  log_ = log;
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) return false;
  if (pid == 0) {
    int fd = ::open(log.c_str(), O_CREAT | O_APPEND | O_WRONLY, 0644);
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    // Die with the test process, whatever happens to it.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::execv(args[0], args.data());
    _exit(127);
  }
  pid_ = pid;
  return true;
}

int Daemon::Stop(int sig) {
  if (pid_ <= 0) return -1;
  ::kill(pid_, sig);
  int status = -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (;;) {
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_ || (r < 0 && errno != EINTR)) break;
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid_, SIGKILL);
      while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  pid_ = -1;
  return status;
}

bool Daemon::Running() {
  if (pid_ <= 0) return false;
  int status = 0;
  pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    pid_ = -1;
    return false;
  }
  return true;
}

// ---------------------------------------------------------------- Cluster

const char* Name(Which w) {
  switch (w) {
    case Which::kMasterTarget: return "master-target";
    case Which::kProcessServer: return "process-server";
    case Which::kAgent: return "agent";
  }
  return "?";
}

Cluster::Cluster(ClusterOptions o) : o_(std::move(o)) {}

Cluster::~Cluster() {
  // SIGKILL: nothing to keep, and a wedged daemon must not hang the test.
  agent_.Stop(SIGKILL);
  ps_.Stop(SIGKILL);
  mt_.Stop(SIGKILL);
}

Daemon& Cluster::daemon(Which w) {
  switch (w) {
    case Which::kMasterTarget: return mt_;
    case Which::kProcessServer: return ps_;
    case Which::kAgent: return agent_;
  }
  return agent_;
}

std::string Cluster::replica_path() const {
  return scratch_.Join("mt/tenants/" + o_.tenant + "/volumes/" + o_.volume + "/replica.img");
}

std::string Cluster::nbd_uri() const { return "nbd://127.0.0.1:" + std::to_string(agent_nbd_) + "/" + o_.volume; }

void Cluster::WriteConfigs() {
  auto hp = [](uint16_t p) { return "127.0.0.1:" + std::to_string(p); };
  RunCommand({"mkdir", "-p", Path("etc"), Path("mt"), Path("ps/spool"), Path("agent")}, 10000);
  {
    std::ofstream f(Path("etc/master-target.conf"));
    f << "# written by the e2e harness\n"
      << "listen = " << hp(mt_data_) << "\n"
      << "control = " << hp(mt_ctl_) << "\n"
      << "nbd = " << hp(mt_nbd_) << "\n"
      << "data_dir = " << Path("mt") << "\n"
      << "tenant = " << o_.tenant << ":" << o_.secret << "\n"
      << "point_interval = " << o_.point_interval << "\n"
      << "[log]\nlevel = info\n";
  }
  {
    std::ofstream f(Path("etc/process-server.conf"));
    f << "listen = " << hp(ps_data_) << "\n"
      << "control = " << hp(ps_ctl_) << "\n"
      << "mt = " << hp(mt_data_) << "\n"
      << "tenant = " << o_.tenant << ":" << o_.secret << "\n"
      << "spool_dir = " << Path("ps/spool") << "\n"
      << "codec = " << o_.codec << "\n"
      << "compress_threads = 1\n"
      << "[log]\nlevel = info\n";
  }
  {
    std::ofstream s(Path("etc/agent.secret"));
    s << o_.secret << "\n";
    std::ofstream f(Path("etc/agent.conf"));
    f << "volume = " << o_.volume << "=" << source_path() << "\n"
      << "nbd_listen = " << hp(agent_nbd_) << "\n"
      << "ps = " << hp(ps_data_) << "\n"
      << "tenant = " << o_.tenant << "\n"
      << "secret_file = " << Path("etc/agent.secret") << "\n"
      << "client_id = e2e-agent\n"
      << "bitmap_dir = " << Path("agent") << "\n"
      << "budget = " << o_.agent_budget << "\n"
      << "control = " << hp(agent_ctl_) << "\n"
      << "[log]\nlevel = info\n";
  }
}

bool Cluster::Start() {
  if (scratch_.path().empty()) {
    why_ = "no scratch directory";
    return false;
  }
  if (!MakeSparseFile(source_path(), o_.volume_size)) {
    why_ = "cannot create " + source_path();
    return false;
  }
  // A port found free can be taken (by another test's outgoing connection)
  // before the daemon binds it: then start again on other ports.
  for (int attempt = 0;; ++attempt) {
    mt_data_ = FreePort(), mt_ctl_ = FreePort(), mt_nbd_ = FreePort();
    ps_data_ = FreePort(), ps_ctl_ = FreePort();
    agent_nbd_ = FreePort(), agent_ctl_ = FreePort();
    WriteConfigs();
    if (StartOne(Which::kMasterTarget) && StartOne(Which::kProcessServer) && StartOne(Which::kAgent)) break;
    if (attempt == 2 || why_.find("Address already in use") == std::string::npos) return false;
    agent_.Stop(SIGKILL);
    ps_.Stop(SIGKILL);
    mt_.Stop(SIGKILL);
    RunCommand({"rm", "-rf", Path("mt"), Path("ps"), Path("agent")}, 30000);
    for (const char* n : {"master-target.log", "process-server.log", "agent.log"}) ::unlink(Path(n).c_str());
  }
  // A new volume starts with an initial sync (every region compared with the
  // replica); until it is done the agent refuses tags. Tests start after it.
  bool synced = WaitFor(
      [&] {
        auto a = GetJson(agent_ctl_, "/status");
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
  std::string bin, conf;
  switch (w) {
    case Which::kMasterTarget: bin = CDP_MT_BIN, conf = "etc/master-target.conf"; break;
    case Which::kProcessServer: bin = CDP_PS_BIN, conf = "etc/process-server.conf"; break;
    case Which::kAgent: bin = CDP_AGENT_BIN, conf = "etc/agent.conf"; break;
  }
  Daemon& d = daemon(w);
  if (!d.Start({bin, "--config", Path(conf)}, Path(std::string(Name(w)) + ".log"))) {
    why_ = std::string("cannot start ") + bin;
    return false;
  }
  return WaitReady(w, std::chrono::seconds(30));
}

bool Cluster::WaitReady(Which w, std::chrono::milliseconds timeout) {
  uint16_t port = w == Which::kMasterTarget ? mt_ctl_ : w == Which::kProcessServer ? ps_ctl_ : agent_ctl_;
  Daemon& d = daemon(w);
  bool ok = WaitFor([&] { return !d.Running() || GetJson(port, "/status").has_value(); }, timeout);
  if (!ok || !d.Running()) {
    why_ = std::string(Name(w)) + (d.Running() ? " did not answer /status" : " exited at start") + "\n" + Logs();
    return false;
  }
  return true;
}

bool Cluster::Kill9(Which w) {
  Daemon& d = daemon(w);
  if (!d.Running()) {
    why_ = std::string(Name(w)) + " is not running";
    return false;
  }
  int st = d.Stop(SIGKILL);
  if (!(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL)) {
    why_ = std::string(Name(w)) + " did not die of SIGKILL";
    return false;
  }
  return true;
}

void Cluster::StopAll() {
  agent_.Stop(SIGTERM);
  ps_.Stop(SIGTERM);
  mt_.Stop(SIGTERM);
}

bool Cluster::WaitDrained(std::chrono::milliseconds timeout) {
  std::string last;
  bool ok = WaitFor(
      [&] {
        auto a = GetJson(agent_ctl_, "/status");
        auto m = GetJson(mt_ctl_, "/status");
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
        last = "agent last_seq " + std::to_string(last_seq) + " acked " + std::to_string(acked) + " queue_records " +
               std::to_string(records) + " dirty " + std::to_string(dirty) + " resync " + std::to_string(resync) +
               " mode " + mode + "; mt applied " + std::to_string(applied);
        return records == 0 && resync == 0 && dirty == 0 && acked == last_seq && applied == last_seq &&
               mode == "data";
      },
      timeout, std::chrono::milliseconds(100));
  if (!ok) why_ = "not drained: " + last + "\n" + Logs();
  return ok;
}

testing::CommandResult Cluster::Cdpctl(const std::vector<std::string>& args, int timeout_ms) {
  auto hp = [](uint16_t p) { return "127.0.0.1:" + std::to_string(p); };
  std::vector<std::string> argv = {CDP_CTL_BIN,  "--agent", hp(agent_ctl_), "--ps", hp(ps_ctl_),
                                   "--mt",       hp(mt_ctl_), "--tenant", o_.tenant};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv, timeout_ms);
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
  uint64_t port = json::value_to<uint64_t>(e->at("port"));
  std::string uri = "nbd://127.0.0.1:" + std::to_string(port) + "/" + name;
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

std::string Cluster::Logs(size_t tail_bytes) const {
  std::string out;
  for (const char* n : {"master-target", "process-server", "agent"}) {
    std::ifstream f(scratch_.Join(std::string(n) + ".log"));
    std::stringstream ss;
    ss << f.rdbuf();
    std::string s = ss.str();
    if (s.size() > tail_bytes) s = "..." + s.substr(s.size() - tail_bytes);
    out += std::string("---- ") + n + ".log\n" + s;
  }
  return out;
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

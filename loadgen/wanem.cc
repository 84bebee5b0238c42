// SPDX-License-Identifier: Apache-2.0
#include "loadgen/wanem.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <thread>
#include <tuple>
#include <vector>

#include "common/base/clock.h"
#include "common/base/host_port.h"
#include "common/daemon/config.h"
#include "common/env/env.h"
#include "common/env/subprocess.h"

extern char** environ;

namespace cdp::loadgen {

bool DelayLine::Push(Bytes packet, uint64_t now_us) {
  if (loss_ > 0 && rng_.Unit() < loss_) {
    ++dropped_;
    return false;
  }
  if (bytes_ + packet.size() > max_bytes_) {
    ++dropped_;
    return false;
  }
  bytes_ += packet.size();
  q_.push_back({now_us + delay_us_, std::move(packet)});
  return true;
}

uint64_t DelayLine::NextDueIn(uint64_t now_us) const {
  if (q_.empty()) return UINT64_MAX;
  return q_.front().due > now_us ? q_.front().due - now_us : 0;
}

bool DelayLine::PopDue(uint64_t now_us, Bytes* out) {
  if (q_.empty() || q_.front().due > now_us) return false;
  *out = std::move(q_.front().data);
  bytes_ -= out->size();
  q_.pop_front();
  return true;
}

std::vector<std::vector<std::string>> PortShapingCommands(const std::string& dev, double rate_mbit,
                                                          const std::vector<uint16_t>& ports) {
  char rate[64];
  std::snprintf(rate, sizeof(rate), "%gmbit", rate_mbit);
  std::vector<std::vector<std::string>> cmds = {
      {"tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "99", "r2q", "1000"},
      {"tc", "class", "add", "dev", dev, "parent", "1:", "classid", "1:99", "htb", "rate", "100gbit"},
  };
  int cls = 10;
  for (uint16_t port : ports) {
    for (const char* dir : {"dport", "sport"}) {
      const std::string id = "1:" + std::to_string(cls++);
      cmds.push_back({"tc", "class", "add", "dev", dev, "parent", "1:", "classid", id, "htb", "rate", rate, "ceil", rate,
                      "burst", "256kb"});
      cmds.push_back({"tc", "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32", "match",
                      "ip", dir, std::to_string(port), "0xffff", "flowid", id});
    }
  }
  return cmds;
}

namespace {

namespace po = boost::program_options;

constexpr const char* kAddrA = "10.77.0.1";
constexpr const char* kAddrB = "10.77.0.2";
constexpr const char* kTun = "dly0";
constexpr const char* kVeth = "veth0";

volatile sig_atomic_t g_stop = 0;  // the forwarder process's stop flag (a signal handler needs a global)
void OnSignal(int) { g_stop = 1; }

bool ValidName(const std::string& n) {
  if (n.empty() || n.size() > 12) return false;
  for (char c : n)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_')) return false;
  return true;
}

// Runs a shell command line built from validated values; failure carries its output.
Status Sh(const std::string& cmd) {
  CDP_ASSIGN_OR_RETURN(CommandResult r, RunCommand({"sh", "-c", cmd}, std::chrono::minutes(2)));
  if (r.timed_out) return Status::IOError("'" + cmd + "' timed out: " + r.output);
  if (r.exit_code != 0) return Status::IOError("'" + cmd + "' failed: " + r.output);
  return Status::OK();
}

Result<int> OpenTunIn(const std::string& ns) {
  int self = ::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  if (self < 0) return Status::FromErrno(errno, "open /proc/self/ns/net");
  int nsfd = ::open(("/var/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
  if (nsfd < 0) {
    Status s = Status::FromErrno(errno, "open netns " + ns);
    ::close(self);
    return s;
  }
  Status s;
  int fd = -1;
  if (::setns(nsfd, CLONE_NEWNET) != 0) {
    s = Status::FromErrno(errno, "setns " + ns);
  } else {
    fd = ::open("/dev/net/tun", O_RDWR | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
      s = Status::FromErrno(errno, "open /dev/net/tun");
    } else {
      ifreq ifr{};
      ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
      std::strncpy(ifr.ifr_name, kTun, IFNAMSIZ - 1);
      if (::ioctl(fd, TUNSETIFF, &ifr) != 0) {
        s = Status::FromErrno(errno, "TUNSETIFF dly0 in " + ns);
        ::close(fd);
        fd = -1;
      }
    }
    if (::setns(self, CLONE_NEWNET) != 0 && s.ok()) s = Status::FromErrno(errno, "setns back");
  }
  ::close(nsfd);
  ::close(self);
  if (!s.ok()) return s;
  return fd;
}

int Usage() {
  std::cerr << "usage: cdp-loadgen wanem up|down|forward|probe|ports [options] (--help for each)\n";
  return 2;
}

// Runs one command (no shell); failure carries its output.
Status Run(const std::vector<std::string>& argv) {
  CDP_ASSIGN_OR_RETURN(CommandResult r, RunCommand(argv, std::chrono::minutes(1)));
  std::string line;
  for (const auto& a : argv) line += (line.empty() ? "" : " ") + a;
  if (r.timed_out) return Status::IOError("'" + line + "' timed out: " + r.output);
  if (r.exit_code != 0) return Status::IOError("'" + line + "' failed: " + r.output);
  return Status::OK();
}

// True when `dev`'s root qdisc is the HTB of `ports up` (handle 1:).
Result<bool> PortShapingOn(const std::string& dev) {
  CDP_ASSIGN_OR_RETURN(CommandResult r, RunCommand({"tc", "qdisc", "show", "dev", dev, "root"}, std::chrono::minutes(1)));
  if (r.exit_code != 0) return Status::IOError("tc qdisc show dev " + dev + " failed: " + r.output);
  return r.output.find("qdisc htb 1: root") != std::string::npos;
}

Status PortsDown(const std::string& dev) {
  CDP_ASSIGN_OR_RETURN(bool on, PortShapingOn(dev));
  if (!on) return Status::OK();
  return Run({"tc", "qdisc", "del", "dev", dev, "root"});
}

Status PortsUp(const std::string& dev, double rate_mbit, const std::vector<uint16_t>& ports) {
  CDP_RETURN_IF_ERROR(PortsDown(dev));
  for (const auto& argv : PortShapingCommands(dev, rate_mbit, ports)) {
    Status s = Run(argv);
    if (!s.ok()) {
      (void)PortsDown(dev);
      return s;
    }
  }
  return Status::OK();
}

int Err(const Status& s) {
  std::cerr << "cdp-loadgen wanem: " << s.ToString() << "\n";
  return 1;
}

int Parse(int argc, char** argv, po::options_description& d, const std::string& summary, po::variables_map* vm) {
  ConfigOptions co;
  co.program = std::string("cdp-loadgen wanem ") + argv[0];
  co.summary = summary;
  auto r = LoadConfig(argc, argv, d, co);
  if (!r.ok()) {
    std::cerr << co.program << ": " << r.status().message() << "\n";
    return 2;
  }
  if (r->help) {
    std::cout << r->help_text;
    return 0;
  }
  *vm = r->vars;
  return -1;
}

std::string PidFile(const std::string& name) { return "/run/cdp-wanem-" + name + ".pid"; }

int Forward(const std::string& name, double delay_ms, double loss, const std::string& ready_file) {
  auto a = OpenTunIn(name + "-a");
  if (!a.ok()) return Err(a.status());
  auto b = OpenTunIn(name + "-b");
  if (!b.ok()) return Err(b.status());
  struct sigaction sa{};
  sa.sa_handler = OnSignal;
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  if (!ready_file.empty()) {
    Status s = WriteFileAtomic(DefaultEnv(), ready_file, ByteSpan());
    if (!s.ok()) return Err(s);
  }
  const uint64_t delay = uint64_t(delay_ms * 1000);
  const int fds[2] = {*a, *b};
  DelayLine lines[2] = {DelayLine(delay, loss, 64u << 20, 1), DelayLine(delay, loss, 64u << 20, 2)};
  const Clock* clock = SystemClock::Get();
  Bytes buf(65536);
  while (!g_stop) {
    uint64_t now = clock->NowMicros();
    uint64_t wait = std::min(lines[0].NextDueIn(now), lines[1].NextDueIn(now));
    pollfd p[2] = {{fds[0], POLLIN, 0}, {fds[1], POLLIN, 0}};
    timespec ts{};
    if (wait != UINT64_MAX) {
      ts.tv_sec = time_t(wait / 1000000);
      ts.tv_nsec = long(wait % 1000000) * 1000;
    } else {
      ts.tv_sec = 1;
    }
    int rc = ::ppoll(p, 2, &ts, nullptr);
    if (rc < 0 && errno != EINTR) return Err(Status::FromErrno(errno, "ppoll"));
    now = clock->NowMicros();
    for (int i = 0; i < 2; ++i) {
      if (rc > 0 && (p[i].revents & POLLIN)) {
        for (int k = 0; k < 256; ++k) {
          ssize_t n = ::read(fds[i], buf.data(), buf.size());
          if (n <= 0) break;
          lines[i].Push(Bytes(buf.begin(), buf.begin() + n), now);
        }
      }
      Bytes pkt;
      while (lines[i].PopDue(now, &pkt)) {
        ssize_t w = ::write(fds[i], pkt.data(), pkt.size());
        (void)w;  // a full TUN queue drops the packet, as a router would
      }
    }
  }
  std::fprintf(stderr, "wanem forwarder stopping; dropped %llu + %llu packets\n",
               (unsigned long long)lines[0].dropped(), (unsigned long long)lines[1].dropped());
  return 0;
}

Status Down(const std::string& name) {
  auto pid = ReadWholeFile(DefaultEnv(), PidFile(name));
  if (pid.ok()) {
    pid_t p = pid_t(std::atoi(std::string(pid->begin(), pid->end()).c_str()));
    if (p > 1 && ::kill(p, SIGTERM) == 0) {
      for (int i = 0; i < 100 && ::kill(p, 0) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    (void)DefaultEnv()->Remove(PidFile(name));
  }
  (void)DefaultEnv()->Remove("/run/cdp-wanem-" + name + ".ready");
  (void)DefaultEnv()->Remove("/run/cdp-wanem-" + name + ".log");
  Status s;
  for (const char* side : {"-a", "-b"}) {
    if (DefaultEnv()->Exists("/var/run/netns/" + name + side)) {
      Status d = Sh("ip netns del " + name + side);
      if (s.ok()) s = d;
    }
  }
  return s;
}

Status Up(const std::string& name, double rate_mbit, double delay_ms, double loss, double queue_ms, const char* self) {
  const std::string A = name + "-a", B = name + "-b";
  if (DefaultEnv()->Exists("/var/run/netns/" + A) || DefaultEnv()->Exists("/var/run/netns/" + B))
    return Status::AlreadyExists("wanem '" + name + "' is already up (wanem down --name " + name + ")");
  char rate[64], burst[64], lat[64];
  std::snprintf(rate, sizeof(rate), "%.3fmbit", rate_mbit);
  // tbf needs a bucket of at least one timer tick of traffic (4 ms at HZ=250) and an MTU.
  std::snprintf(burst, sizeof(burst), "%llu", (unsigned long long)std::max(15140.0, rate_mbit * 1e6 / 8 * 0.004));
  std::snprintf(lat, sizeof(lat), "%.0fms", queue_ms);
  const std::string tmpa = "cdpw" + std::to_string(::getpid()) + "a", tmpb = "cdpw" + std::to_string(::getpid()) + "b";
  std::vector<std::string> cmds = {
      "ip netns add " + A,
      "ip netns add " + B,
      "ip link add " + tmpa + " type veth peer name " + tmpb,
      "ip link set " + tmpa + " netns " + A,
      "ip link set " + tmpb + " netns " + B,
      "ip -n " + A + " link set " + tmpa + " name " + kVeth,
      "ip -n " + B + " link set " + tmpb + " name " + kVeth,
  };
  for (const auto& [ns, me, peer] : {std::tuple{A, kAddrA, kAddrB}, std::tuple{B, kAddrB, kAddrA}}) {
    const std::string x = "ip netns exec " + ns + " ";
    for (std::string c : {"sysctl -qw net.ipv4.ip_forward=1", "sysctl -qw net.ipv4.conf.all.rp_filter=0",
                          "sysctl -qw net.ipv4.conf.default.rp_filter=0"})
      cmds.push_back(x + c);
    cmds.push_back("ip -n " + ns + " link set lo up");
    cmds.push_back("ip -n " + ns + " addr add " + me + "/32 dev " + kVeth);
    cmds.push_back("ip -n " + ns + " link set " + kVeth + " up");
    cmds.push_back(x + "sysctl -qw net.ipv4.conf." + kVeth + ".rp_filter=0");
    cmds.push_back("ip -n " + ns + " tuntap add mode tun dev " + kTun);
    cmds.push_back(x + "sysctl -qw net.ipv4.conf." + kTun + ".rp_filter=0");
    cmds.push_back(x + "sysctl -qw net.ipv4.conf." + kTun + ".accept_local=1");
    cmds.push_back("ip -n " + ns + " link set " + kTun + " up");
    cmds.push_back("tc -n " + ns + " qdisc replace dev " + kVeth + " root tbf rate " + rate + " burst " + burst +
                   " latency " + lat);
    cmds.push_back("ip -n " + ns + " route add " + peer + "/32 dev " + kTun + " src " + me);
    cmds.push_back("ip -n " + ns + " route add " + peer + "/32 dev " + kVeth + " table 100");
    cmds.push_back("ip -n " + ns + " rule add iif " + kTun + " lookup 100 pref 100");
  }
  for (const auto& c : cmds) {
    Status s = Sh(c);
    if (!s.ok()) {
      (void)Down(name);
      return s;
    }
  }
  // The forwarder: detached (own session), logs to /run/cdp-wanem-NAME.log.
  const std::string ready = "/run/cdp-wanem-" + name + ".ready", log = "/run/cdp-wanem-" + name + ".log";
  (void)DefaultEnv()->Remove(ready);
  char d[32], l[32];
  std::snprintf(d, sizeof(d), "%g", delay_ms);
  std::snprintf(l, sizeof(l), "%g", loss);
  SpawnOptions so;
  so.argv = {self, "wanem", "forward", "--name", name, "--delay-ms", d, "--loss", l, "--ready-file", ready};
  so.output_file = log;
  so.truncate_output = true;
  so.new_session = true;
  auto fwd = Subprocess::Spawn(so);
  if (!fwd.ok()) {
    (void)Down(name);
    return fwd.status().WithContext("start the forwarder");
  }
  const pid_t pid = fwd->pid();
  std::string pidtext = std::to_string(pid) + "\n";
  Status s = WriteFileAtomic(DefaultEnv(), PidFile(name), ByteSpan(reinterpret_cast<const uint8_t*>(pidtext.data()), pidtext.size()));
  for (int i = 0; i < 250 && s.ok() && !DefaultEnv()->Exists(ready); ++i) {
    if (!fwd->Running()) {
      s = Status::IOError("the forwarder exited at start; see " + log);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (s.ok() && !DefaultEnv()->Exists(ready)) s = Status::Unavailable("the forwarder did not start within 5 s; see " + log);
  if (!s.ok()) {
    (void)Down(name);
    return s;
  }
  fwd->Release();  // it runs until `wanem down`
  std::printf("wanem %s up: %g Mbit/s each way (tbf), one-way delay %g ms (RTT %g ms), loss %g%%\n", name.c_str(),
              rate_mbit, delay_ms, 2 * delay_ms, loss * 100);
  std::printf("  side A: netns %s, address %s\n  side B: netns %s, address %s\n", A.c_str(), kAddrA, B.c_str(), kAddrB);
  std::printf("  run: ip netns exec %s <command>   forwarder pid %d (log %s)\n", A.c_str(), int(pid), log.c_str());
  return Status::OK();
}

// ---- probe: TCP goodput and connect RTT -------------------------------------

Result<sockaddr_in> ParseAddr(const std::string& hp) {
  CDP_ASSIGN_OR_RETURN(HostPort parsed, ParseHostPort(hp));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  if (::inet_pton(AF_INET, parsed.host.c_str(), &a.sin_addr) != 1)
    return Status::InvalidArgument("bad address '" + hp + "' (IPv4:PORT)");
  a.sin_port = htons(parsed.port);
  return a;
}

int ProbeServer(const std::string& listen, double seconds) {
  auto a = ParseAddr(listen);
  if (!a.ok()) return Err(a.status());
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&*a), sizeof(*a)) != 0 || ::listen(fd, 64) != 0)
    return Err(Status::FromErrno(errno, "listen " + listen));
  std::atomic<uint64_t> total{0};
  std::vector<std::thread> threads;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    int c = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;
    threads.emplace_back([c, &total] {
      std::vector<char> buf(1 << 20);
      ssize_t n;
      while ((n = ::read(c, buf.data(), buf.size())) > 0) total += uint64_t(n);
      ::close(c);  // EOF read: tell the sender that everything arrived
    });
  }
  for (auto& t : threads) t.join();
  ::close(fd);
  std::printf("probe server received %llu bytes\n", (unsigned long long)total.load());
  return 0;
}

int ProbeClient(const std::string& connect, int streams, double seconds, bool json) {
  auto a = ParseAddr(connect);
  if (!a.ok()) return Err(a.status());
  std::vector<int> fds;
  std::vector<double> rtts;
  // A server that is still starting refuses connections: retry those for up to 10 s.
  const auto connect_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (int i = 0; i < streams; ++i) {
    for (;;) {
      int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) return Err(Status::FromErrno(errno, "socket"));
      auto t0 = std::chrono::steady_clock::now();
      if (::connect(fd, reinterpret_cast<sockaddr*>(&*a), sizeof(*a)) == 0) {
        rtts.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        fds.push_back(fd);
        break;
      }
      int err = errno;
      ::close(fd);
      if (err != ECONNREFUSED || std::chrono::steady_clock::now() >= connect_deadline)
        return Err(Status::FromErrno(err, "connect " + connect));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  std::atomic<uint64_t> total{0};
  const auto start = std::chrono::steady_clock::now();
  const auto end = start + std::chrono::duration<double>(seconds);
  std::vector<std::thread> threads;
  for (int fd : fds) {
    threads.emplace_back([fd, end, &total] {
      std::vector<char> buf(1 << 16, 'x');
      while (std::chrono::steady_clock::now() < end) {
        ssize_t n = ::send(fd, buf.data(), buf.size(), MSG_NOSIGNAL);
        if (n <= 0) break;
        total += uint64_t(n);
      }
      ::shutdown(fd, SHUT_WR);
      char c;
      while (::read(fd, &c, 1) > 0) {
      }
      ::close(fd);
    });
  }
  for (auto& t : threads) t.join();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::sort(rtts.begin(), rtts.end());
  double mbit = double(total.load()) * 8 / secs / 1e6;
  if (json)
    std::printf("{\"streams\":%d,\"seconds\":%.3f,\"bytes\":%llu,\"goodput_mbit\":%.3f,\"connect_rtt_ms\":%.3f}\n", streams,
                secs, (unsigned long long)total.load(), mbit, rtts[rtts.size() / 2]);
  else
    std::printf("%d stream(s): %llu bytes in %.3f s = %.2f Mbit/s goodput; TCP connect RTT %.2f ms (median)\n", streams,
                (unsigned long long)total.load(), secs, mbit, rtts[rtts.size() / 2]);
  return 0;
}

}  // namespace

namespace {

// `wanem ports up|down` (argv[0] == "ports").
int CmdPorts(int argc, char** argv) {
  if (argc < 2 || (std::string(argv[1]) != "up" && std::string(argv[1]) != "down")) {
    std::cerr << "usage: cdp-loadgen wanem ports up --rate-mbit N --port P [--port P...] | ports down\n";
    return 2;
  }
  const std::string action = argv[1];
  po::variables_map vm;
  po::options_description d("wanem ports " + action + " options");
  d.add_options()("dev", po::value<std::string>()->default_value("lo"), "the device (the loopback)");
  if (action == "up") {
    d.add_options()("rate-mbit", po::value<double>()->required(), "link rate each way per port, Mbit/s")(
        "port", po::value<std::vector<int>>()->composing()->required(), "a TCP port to shape (repeatable)");
  }
  // Parse names the program after argv[0]: "ports up", not "up".
  std::string program = "ports " + action;
  std::vector<char*> args(argv + 1, argv + argc);
  args[0] = program.data();
  if (int rc = Parse(int(args.size()), args.data(), d, "A WAN link on the loopback: HTB classes per port (root).", &vm);
      rc >= 0)
    return rc;
  const std::string dev = vm["dev"].as<std::string>();
  if (!ValidName(dev)) return Err(Status::InvalidArgument("--dev: 1..12 characters of [A-Za-z0-9_-]"));
  if (::geteuid() != 0) return Err(Status::PermissionDenied("wanem ports needs root (tc)"));
  if (action == "down") {
    Status s = PortsDown(dev);
    if (!s.ok()) return Err(s);
    std::printf("wanem ports down on %s\n", dev.c_str());
    return 0;
  }
  const double rate = vm["rate-mbit"].as<double>();
  if (!(rate > 0 && rate <= 100000)) return Err(Status::InvalidArgument("--rate-mbit must be in (0, 100000]"));
  std::vector<uint16_t> ports;
  for (int p : vm["port"].as<std::vector<int>>()) {
    if (p < 1 || p > 65535) return Err(Status::InvalidArgument("--port must be 1..65535"));
    ports.push_back(uint16_t(p));
  }
  Status s = PortsUp(dev, rate, ports);
  if (!s.ok()) return Err(s);
  std::printf("wanem ports up on %s: %g Mbit/s each way for %zu port(s)\n", dev.c_str(), rate, ports.size());
  return 0;
}

}  // namespace

int CmdWanem(int argc, char** argv) {
  if (argc < 2) return Usage();
  std::string sub = argv[1];
  if (sub == "ports") return CmdPorts(argc - 1, argv + 1);
  po::variables_map vm;
  po::options_description d("wanem " + sub + " options");
  d.add_options()("name", po::value<std::string>()->default_value("cdpwan"), "emulator name (netns NAME-a, NAME-b)");
  if (sub == "up" || sub == "forward") {
    d.add_options()("delay-ms", po::value<double>()->default_value(12.5), "one-way delay, ms (RTT = 2x)")(
        "loss", po::value<double>()->default_value(0.0), "packet loss per direction, 0..1");
  }
  if (sub == "up") {
    d.add_options()("rate-mbit", po::value<double>()->default_value(100), "link rate each way, Mbit/s")(
        "queue-ms", po::value<double>()->default_value(100), "tbf queue (latency), ms");
  }
  if (sub == "forward") d.add_options()("ready-file", po::value<std::string>()->default_value(""), "touched when ready");
  if (sub == "probe") {
    d.add_options()("mode", po::value<std::string>()->required(), "server | client")(
        "listen", po::value<std::string>()->default_value("0.0.0.0:5201"), "server: IPv4:PORT")(
        "connect", po::value<std::string>()->default_value(""), "client: IPv4:PORT")(
        "streams", po::value<int>()->default_value(1), "client: parallel TCP connections")(
        "seconds", po::value<double>()->default_value(10), "client: send time; server: run time")(
        "json", po::value<bool>()->default_value(false)->implicit_value(true), "client: JSON result");
  }
  if (sub != "up" && sub != "down" && sub != "forward" && sub != "probe") return Usage();
  if (int rc = Parse(argc - 1, argv + 1, d, "Emulated WAN between two network namespaces (root).", &vm); rc >= 0) return rc;
  const std::string name = vm["name"].as<std::string>();
  if (!ValidName(name)) return Err(Status::InvalidArgument("--name: 1..12 characters of [A-Za-z0-9_-]"));
  if (sub == "probe") {
    if (vm["mode"].as<std::string>() == "server") return ProbeServer(vm["listen"].as<std::string>(), vm["seconds"].as<double>());
    int streams = vm["streams"].as<int>();
    if (streams < 1 || streams > 64) return Err(Status::InvalidArgument("--streams must be 1..64"));
    return ProbeClient(vm["connect"].as<std::string>(), streams, vm["seconds"].as<double>(), vm["json"].as<bool>());
  }
  if (::geteuid() != 0) return Err(Status::PermissionDenied("wanem " + sub + " needs root (network namespaces, tc)"));
  if (sub == "down") {
    Status s = Down(name);
    if (!s.ok()) return Err(s);
    std::printf("wanem %s down\n", name.c_str());
    return 0;
  }
  double delay = vm["delay-ms"].as<double>(), loss = vm["loss"].as<double>();
  if (!(delay >= 0 && delay <= 10000)) return Err(Status::InvalidArgument("--delay-ms must be 0..10000"));
  if (!(loss >= 0 && loss < 1)) return Err(Status::InvalidArgument("--loss must be in [0, 1)"));
  if (sub == "forward") return Forward(name, delay, loss, vm["ready-file"].as<std::string>());
  double rate = vm["rate-mbit"].as<double>(), q = vm["queue-ms"].as<double>();
  if (!(rate > 0 && rate <= 100000)) return Err(Status::InvalidArgument("--rate-mbit must be in (0, 100000]"));
  if (!(q > 0)) return Err(Status::InvalidArgument("--queue-ms must be > 0"));
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return Err(Status::FromErrno(errno, "readlink /proc/self/exe"));
  self[n] = '\0';
  Status s = Up(name, rate, delay, loss, q, self);
  return s.ok() ? 0 : Err(s);
}

}  // namespace cdp::loadgen

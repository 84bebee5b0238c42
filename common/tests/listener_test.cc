// SPDX-License-Identifier: Apache-2.0
// The one listener: caps in total and per peer, EMFILE survival, both socket
// kinds, clean stop with live connections. Real sockets on loopback.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <malloc.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "common/daemon/daemon.h"
#include "common/daemon/metrics.h"
#include "common/net/listener.h"
#include "common/tests/test_util.h"

namespace {

using cdp::Listener;
using cdp::testing::WaitUntil;

// A client socket connected to 127.0.0.1:port, optionally bound to `from` first.
int ConnectTcp(uint16_t port, const char* from = nullptr) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  if (from != nullptr) {
    sockaddr_in b{};
    b.sin_family = AF_INET;
    ::inet_pton(AF_INET, from, &b.sin_addr);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&b), sizeof b) == 0);
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

int ConnectUnix(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.data(), path.size());
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

// True when the server closed the connection: read sees EOF or a reset.
bool ClosedByServer(int fd) {
  char c;
  ssize_t n = ::recv(fd, &c, 1, 0);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

// Thread-mode handlers that echo one byte back, then hold the connection until
// the client closes it (or Shutdown() wakes them).
struct Holder {
  std::mutex mu;
  std::vector<std::string> peers;
  std::atomic<int> running{0};
  std::atomic<int> finished{0};
  bool authenticate_all = false;

  Listener::Handler Handler() {
    return [this](Listener::Connection c) {
      running.fetch_add(1);
      {
        std::lock_guard<std::mutex> l(mu);
        peers.push_back(c.peer);
      }
      char b;
      if (::recv(c.fd, &b, 1, 0) == 1) {
        // 'a' (or every byte, with authenticate_all) authenticates the connection.
        if (b == 'a' || authenticate_all) c.slot.MarkAuthenticated();
        (void)!::send(c.fd, &b, 1, MSG_NOSIGNAL);
      }
      while (::recv(c.fd, &b, 1, 0) > 0) {
      }
      ::close(c.fd);
      running.fetch_sub(1);
      finished.fetch_add(1);
    };
  }
};

// Sends one byte and waits for its echo: the connection is being served
// (and, for 'a', marked authenticated before the echo).
bool Echoes(int fd, char b = 'x') {
  if (::send(fd, &b, 1, MSG_NOSIGNAL) != 1) return false;
  const char sent = b;
  return ::recv(fd, &b, 1, 0) == 1 && b == sent;
}

// True when nothing (no data, no EOF, no error) is waiting on `fd`: the
// server has not closed it.
bool StillOpen(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 0;
}

Listener::Options ThreadOptions() {
  Listener::Options o;
  o.name = "test";
  o.tcp = {"127.0.0.1", 0};
  o.mode = Listener::Mode::kThreadPerConnection;
  return o;
}

TEST_CASE("listener: the total cap closes exactly the connections over it", "[listener]") {
  Holder h;
  h.authenticate_all = true;  // none may be evicted
  cdp::metrics::Registry reg;
  auto o = ThreadOptions();
  o.max_connections = 3;
  o.registry = &reg;
  Listener l(o, h.Handler());
  REQUIRE(l.Start().ok());
  REQUIRE(l.tcp_port() != 0);
  std::vector<int> fds;
  for (int i = 0; i < 3; ++i) {
    fds.push_back(ConnectTcp(l.tcp_port()));
    REQUIRE(Echoes(fds.back()));
  }
  int over = ConnectTcp(l.tcp_port());
  CHECK(ClosedByServer(over));
  ::close(over);
  auto s = l.stats();
  CHECK(s.accepted == 3);
  CHECK(s.refused_total_cap == 1);
  CHECK(s.refused_peer_cap == 0);
  CHECK(s.live == 3);
  CHECK(reg.RenderPrometheus().find("cdp_listener_refused_total{listener=\"test\"} 1") != std::string::npos);

  // A place freed is a place taken again.
  ::close(fds.back());
  fds.pop_back();
  REQUIRE(WaitUntil([&] { return l.stats().live == 2; }));
  fds.push_back(ConnectTcp(l.tcp_port()));
  CHECK(Echoes(fds.back()));
  CHECK(l.stats().accepted == 4);
  for (int fd : fds) ::close(fd);
  REQUIRE(WaitUntil([&] { return l.stats().live == 0; }));
  l.Stop();
  CHECK(h.finished == 4);
}

TEST_CASE("listener: at the cap the oldest unauthenticated connection gives way (thread mode)", "[listener]") {
  Holder h;
  cdp::metrics::Registry reg;
  auto o = ThreadOptions();
  o.max_connections = 3;
  o.registry = &reg;
  Listener l(o, h.Handler());
  REQUIRE(l.Start().ok());
  int c1 = ConnectTcp(l.tcp_port());
  REQUIRE(Echoes(c1, 'a'));  // authenticated: never evicted
  int c2 = ConnectTcp(l.tcp_port());
  int c3 = ConnectTcp(l.tcp_port());
  REQUIRE(WaitUntil([&] { return h.running == 3; }));
  // Over the cap: c2, the oldest idle one, is shut down and c4 is served.
  int c4 = ConnectTcp(l.tcp_port());
  CHECK(ClosedByServer(c2));
  CHECK(Echoes(c4, 'a'));
  int c5 = ConnectTcp(l.tcp_port());
  CHECK(ClosedByServer(c3));
  CHECK(Echoes(c5, 'a'));
  REQUIRE(WaitUntil([&] { return h.finished == 2 && l.stats().live == 3; }));
  // Every connection authenticated: the next one is refused, none evicted.
  int c6 = ConnectTcp(l.tcp_port());
  CHECK(ClosedByServer(c6));
  CHECK(StillOpen(c1));
  CHECK(StillOpen(c4));
  CHECK(StillOpen(c5));
  auto s = l.stats();
  CHECK(s.evicted == 2);
  CHECK(s.refused_total_cap == 1);
  CHECK(s.accepted == 5);
  CHECK(reg.RenderPrometheus().find("cdp_listener_evicted_total{listener=\"test\"} 2") != std::string::npos);
  for (int fd : {c1, c2, c3, c4, c5, c6}) ::close(fd);
  l.Stop();
  CHECK(h.finished == 5);
}

TEST_CASE("listener: hand-off mode evicts through its own duplicate, and evictions in progress are bounded",
          "[listener]") {
  std::mutex mu;
  std::vector<Listener::Connection> held;
  Listener::Options o;
  o.tcp = {"127.0.0.1", 0};
  o.max_connections = 2;
  Listener l(o, [&](Listener::Connection c) {
    std::lock_guard<std::mutex> lk(mu);
    held.push_back(std::move(c));
  });
  REQUIRE(l.Start().ok());
  int a = ConnectTcp(l.tcp_port());
  int b = ConnectTcp(l.tcp_port());
  REQUIRE(WaitUntil([&] { return l.stats().accepted == 2; }));
  int c = ConnectTcp(l.tcp_port());
  CHECK(ClosedByServer(a));  // the owner still holds a's descriptor and Slot
  REQUIRE(WaitUntil([&] { return l.stats().accepted == 3; }));
  CHECK(l.stats().live == 3);  // over the cap by the eviction in progress
  int d = ConnectTcp(l.tcp_port());
  CHECK(ClosedByServer(b));
  REQUIRE(WaitUntil([&] { return l.stats().accepted == 4; }));
  // The owner never lets a and b go: two evictions in progress reach the
  // bound (max_connections), so the next connection is refused.
  int e = ConnectTcp(l.tcp_port());
  CHECK(ClosedByServer(e));
  CHECK(l.stats().refused_total_cap == 1);
  CHECK(StillOpen(c));
  CHECK(StillOpen(d));
  {
    std::lock_guard<std::mutex> lk(mu);
    REQUIRE(held.size() == 4);
    held[2].slot.MarkAuthenticated();  // c
    ::close(held[0].fd);
    ::close(held[1].fd);
    held.erase(held.begin(), held.begin() + 2);  // a and b released at last
  }
  CHECK(l.stats().live == 2);
  int f = ConnectTcp(l.tcp_port());
  CHECK(ClosedByServer(d));  // d, not the authenticated c
  REQUIRE(WaitUntil([&] { return l.stats().accepted == 5; }));
  CHECK(StillOpen(c));
  CHECK(l.stats().evicted == 3);
  l.Stop();
  {
    std::lock_guard<std::mutex> lk(mu);
    for (auto& h : held) ::close(h.fd);
    held.clear();
  }
  for (int fd : {a, b, c, d, e, f}) ::close(fd);
}

TEST_CASE("listener: the per-peer cap refuses one address and serves another", "[listener]") {
  Holder h;
  auto o = ThreadOptions();
  o.tcp.host = "0.0.0.0";
  o.max_per_peer = 2;
  Listener l(o, h.Handler());
  REQUIRE(l.Start().ok());
  int a1 = ConnectTcp(l.tcp_port(), "127.0.0.1");
  int a2 = ConnectTcp(l.tcp_port(), "127.0.0.1");
  REQUIRE(Echoes(a1));
  REQUIRE(Echoes(a2));
  int a3 = ConnectTcp(l.tcp_port(), "127.0.0.1");
  CHECK(ClosedByServer(a3));
  int b1 = ConnectTcp(l.tcp_port(), "127.0.0.2");
  CHECK(Echoes(b1));
  auto s = l.stats();
  CHECK(s.accepted == 3);
  CHECK(s.refused_peer_cap == 1);
  CHECK(s.refused_total_cap == 0);
  for (int fd : {a1, a2, a3, b1}) ::close(fd);
  l.Stop();
  CHECK(h.finished == 3);
}

TEST_CASE("listener: serves TCP and Unix sockets from one loop", "[listener]") {
  cdp::testing::ScratchDir dir;
  Holder h;
  auto o = ThreadOptions();
  o.unix_path = dir.Join("l.sock");
  Listener l(o, h.Handler());
  REQUIRE(l.Start().ok());
  int t = ConnectTcp(l.tcp_port());
  int u = ConnectUnix(o.unix_path);
  CHECK(Echoes(t));
  CHECK(Echoes(u));
  {
    std::lock_guard<std::mutex> lk(h.mu);
    std::set<std::string> peers(h.peers.begin(), h.peers.end());
    CHECK(peers.count("unix:" + o.unix_path) == 1);
    CHECK(peers.size() == 2);
    for (const auto& p : peers) {
      if (p.rfind("unix:", 0) != 0) CHECK(p.rfind("127.0.0.1:", 0) == 0);
    }
  }
  ::close(t);
  ::close(u);
  l.Stop();
  CHECK(::access(o.unix_path.c_str(), F_OK) != 0);  // the socket file is removed
}

TEST_CASE("listener: Stop wakes and joins handlers blocked on live connections", "[listener]") {
  Holder h;
  Listener l(ThreadOptions(), h.Handler());
  REQUIRE(l.Start().ok());
  std::vector<int> fds;
  for (int i = 0; i < 5; ++i) {
    fds.push_back(ConnectTcp(l.tcp_port()));
    REQUIRE(Echoes(fds.back()));
  }
  CHECK(h.running == 5);
  l.Stop();  // the clients never close: Stop must not wait for them
  CHECK(h.running == 0);
  CHECK(h.finished == 5);
  CHECK(l.stats().live == 0);
  for (int fd : fds) {
    CHECK(ClosedByServer(fd));
    ::close(fd);
  }
}

TEST_CASE("listener: hand-off mode gives the slot to the connection", "[listener]") {
  std::mutex mu;
  std::vector<Listener::Connection> held;
  Listener::Options o;
  o.tcp = {"127.0.0.1", 0};
  o.max_connections = 1;
  Listener l(o, [&](Listener::Connection c) {
    std::lock_guard<std::mutex> lk(mu);
    c.slot.MarkAuthenticated();
    held.push_back(std::move(c));
  });
  REQUIRE(l.Start().ok());
  int a = ConnectTcp(l.tcp_port());
  REQUIRE(WaitUntil([&] { return l.stats().accepted == 1; }));
  int b = ConnectTcp(l.tcp_port());
  CHECK(ClosedByServer(b));
  CHECK(l.stats().refused_total_cap == 1);
  {
    std::lock_guard<std::mutex> lk(mu);
    REQUIRE(held.size() == 1);
    boost::asio::io_context io;
    boost::asio::ip::tcp::socket s(io);
    REQUIRE(cdp::AssignTo(held[0], s).ok());
    CHECK(held[0].fd == -1);
    boost::asio::local::stream_protocol::socket wrong(io);
    Listener::Connection none{-1, AF_INET, "x", {}};
    CHECK(cdp::AssignTo(none, wrong).code() == cdp::Code::kInvalidArgument);
    held.clear();  // the socket closes with `s`; the slot is released here
  }
  CHECK(l.stats().live == 0);
  int c = ConnectTcp(l.tcp_port());
  CHECK(WaitUntil([&] { return l.stats().accepted == 2; }));
  l.Stop();
  for (int fd : {a, b, c}) ::close(fd);
}

TEST_CASE("listener: survives EMFILE with a back-off and accepts again", "[listener]") {
  Holder h;
  Listener l(ThreadOptions(), h.Handler());
  REQUIRE(l.Start().ok());
  int first = ConnectTcp(l.tcp_port());
  REQUIRE(Echoes(first));
  // The client socket is made now; its connect comes once the table is full.
  int waiting = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(waiting >= 0);

  // Fill the descriptor table: the soft limit just above the highest open
  // descriptor, and every hole below it taken.
  int highest = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (dirent* e = ::readdir(d)) highest = std::max(highest, std::atoi(e->d_name));
    ::closedir(d);
  }
  rlimit saved{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
  rlimit low = saved;
  low.rlim_cur = rlim_t(highest + 1);
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  std::vector<int> fillers;
  for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) fillers.push_back(fd);
  CHECK(errno == EMFILE);

  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(l.tcp_port());
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  REQUIRE(::connect(waiting, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);  // queued in the backlog
  bool failed = WaitUntil([&] { return l.stats().accept_errors >= 2; }, std::chrono::seconds(20));

  for (int fd : fillers) ::close(fd);
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &saved) == 0);
  REQUIRE(failed);  // backed off and retried at least once, without spinning or stopping
  CHECK(l.stats().accept_errors < 200);  // 10 ms doubling to 1 s: a handful, not thousands
  CHECK(Echoes(waiting));                // and accepting resumed
  CHECK(l.stats().accepted == 2);
  ::close(first);
  ::close(waiting);
  l.Stop();
}

TEST_CASE("listener: bad endpoints are refused and leave nothing bound", "[listener]") {
  cdp::testing::ScratchDir dir;
  Holder h;
  Listener::Options none;
  CHECK(Listener(none, h.Handler()).Start().code() == cdp::Code::kInvalidArgument);

  std::string file = dir.Join("plain");
  ::close(::open(file.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600));
  auto o = ThreadOptions();
  o.unix_path = file;
  Listener l1(o, h.Handler());
  CHECK(l1.Start().code() == cdp::Code::kAlreadyExists);
  CHECK(l1.tcp_port() == 0);

  Listener taken(ThreadOptions(), h.Handler());
  REQUIRE(taken.Start().ok());
  auto o2 = ThreadOptions();
  o2.tcp.port = taken.tcp_port();
  Listener l2(o2, h.Handler());
  cdp::Status s = l2.Start();
  CHECK(s.code() == cdp::Code::kIOError);
  CHECK(s.message().find(std::to_string(taken.tcp_port())) != std::string::npos);
}

}  // namespace

TEST_CASE("RaiseOpenFileLimit lifts the soft descriptor limit to the hard one", "[listener][daemon]") {
  rlimit saved{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
  rlimit low = saved;
  low.rlim_cur = std::min<rlim_t>(saved.rlim_max, 512);
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  const uint64_t now = cdp::RaiseOpenFileLimit();
  rlimit after{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &after) == 0);
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &saved) == 0);
  CHECK(after.rlim_cur == saved.rlim_max);
  CHECK(now == uint64_t(saved.rlim_max));
  CHECK(cdp::RaiseOpenFileLimit() == uint64_t(saved.rlim_max));  // already there: unchanged
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &saved) == 0);
}

TEST_CASE("TuneMalloc keeps a freed 8 MiB buffer in the heap for the next one", "[daemon]") {
#if defined(__SANITIZE_ADDRESS__)
  // AddressSanitizer's allocator stands in for glibc's: nothing to tune, and
  // its mallopt refuses.
  CHECK_FALSE(cdp::TuneMalloc());
#else
  REQUIRE(cdp::TuneMalloc());
  const size_t mapped_before = ::mallinfo2().hblkhd;  // bytes in chunks mmapped on their own
  constexpr size_t kSize = 8u << 20;
  for (int i = 0; i < 4; ++i) {
    auto* p = static_cast<volatile uint8_t*>(std::malloc(kSize));
    REQUIRE(p != nullptr);
    p[0] = 1;
    p[kSize - 1] = 1;
    // Not a mapping of its own (glibc's default for over 128 KiB), so no
    // page of it goes back to the kernel at free.
    CHECK(::mallinfo2().hblkhd == mapped_before);
    std::free(const_cast<uint8_t*>(p));
  }
#endif
}

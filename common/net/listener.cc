// SPDX-License-Identifier: Apache-2.0
#include "common/net/listener.h"

#include <arpa/inet.h>
#include <grp.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "common/base/asio_status.h"
#include "common/base/log.h"
#include "common/daemon/metrics.h"

namespace cdp {

// The caps' bookkeeping, shared with every Slot (which may outlive the Listener).
struct Listener::Slot::State {
  // A connection not yet authenticated: the listener's duplicate of its
  // descriptor (-1 once evicted) and the peer, for the log.
  struct Unauthenticated {
    int dup_fd = -1;
    std::string peer;
    bool evicted = false;
  };

  std::mutex mu;
  size_t live = 0;
  std::map<std::string, size_t> per_peer;
  std::map<uint64_t, Unauthenticated> unauthenticated;  // by id: oldest first
  size_t evicting = 0;  // evicted, Slot not yet released
  uint64_t next_id = 1;
  std::shared_ptr<metrics::Gauge> live_gauge;  // may be null

  void Release(const std::string& key, uint64_t id) {
    std::lock_guard<std::mutex> lock(mu);
    --live;
    auto it = per_peer.find(key);
    if (it != per_peer.end() && --it->second == 0) per_peer.erase(it);
    if (auto u = unauthenticated.find(id); u != unauthenticated.end()) {
      if (u->second.evicted) --evicting;
      if (u->second.dup_fd >= 0) ::close(u->second.dup_fd);
      unauthenticated.erase(u);
    }
    if (live_gauge) live_gauge->Add(-1);
  }

  void MarkAuthenticated(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu);
    auto u = unauthenticated.find(id);
    if (u == unauthenticated.end() || u->second.evicted) return;
    ::close(u->second.dup_fd);
    unauthenticated.erase(u);
  }

  // Shuts the oldest unauthenticated connection down, unless evictions in
  // progress already reach `max_evicting`. Returns its peer, or "" (none).
  // Caller holds mu.
  std::string EvictOldest(size_t max_evicting) {
    if (evicting >= max_evicting) return "";
    for (auto& [id, u] : unauthenticated) {
      if (u.evicted) continue;
      ::shutdown(u.dup_fd, SHUT_RDWR);
      ::close(u.dup_fd);
      u.dup_fd = -1;
      u.evicted = true;
      ++evicting;
      return u.peer;
    }
    return "";
  }
};

Listener::Slot& Listener::Slot::operator=(Slot&& o) noexcept {
  if (this != &o) {
    Release();
    state_ = std::move(o.state_);
    key_ = std::move(o.key_);
    id_ = o.id_;
  }
  return *this;
}

void Listener::Slot::Release() {
  if (state_) state_->Release(key_, id_);
  state_.reset();
}

void Listener::Slot::MarkAuthenticated() {
  if (state_) state_->MarkAuthenticated(id_);
}

namespace listener_detail {
Status AssignFailed(Listener::Connection& c, const boost::system::error_code& ec) {
  ::close(c.fd);
  c.fd = -1;
  return FromAsioError(ec, "adopt connection from " + c.peer);
}
Status WrongFamily(Listener::Connection& c) {
  ::close(c.fd);
  c.fd = -1;
  return Status::InvalidArgument("connection from " + c.peer + ": socket of another protocol family");
}
}  // namespace listener_detail

namespace {

// A connection served on its own thread (thread mode).
struct Worker {
  std::thread thread;
  int dup_fd = -1;  // the listener's duplicate, for shutdown(2) at Shutdown()
  std::atomic<bool> done{false};
};

std::string IpText(const sockaddr_storage& ss, bool with_port) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
    return with_port ? std::string(buf) + ":" + std::to_string(ntohs(a->sin_port)) : std::string(buf);
  }
  auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
  ::inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
  return with_port ? "[" + std::string(buf) + "]:" + std::to_string(ntohs(a->sin6_port)) : std::string(buf);
}

bool ResourceShortage(int err) { return err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM; }

}  // namespace

struct Listener::Impl {
  Options opt;
  Handler handler;
  std::shared_ptr<spdlog::logger> log = log::Get("listener");
  std::shared_ptr<Slot::State> caps = std::make_shared<Slot::State>();

  int tcp_fd = -1;
  int unix_fd = -1;
  int stop_fd = -1;  // eventfd: readable once Shutdown() was called
  bool started = false;
  bool shut_down = false;
  bool stopped = false;
  std::thread accept_thread;

  std::mutex workers_mu;
  std::list<std::unique_ptr<Worker>> workers;  // thread mode

  std::atomic<uint64_t> accepted{0}, refused_total{0}, refused_peer{0}, errors{0}, evicted{0};
  std::shared_ptr<metrics::Counter> m_accepted, m_refused, m_errors, m_evicted;

  ~Impl() {
    for (int fd : {tcp_fd, unix_fd, stop_fd})
      if (fd >= 0) ::close(fd);
  }

  Status BindTcp(uint16_t* port);
  Status BindUnix();
  void Loop();
  void AcceptOne(int listen_fd, std::chrono::milliseconds* backoff);
  void Serve(int fd, int family, std::string peer, std::string key, uint64_t id);
  void ReapFinished();
};

Listener::Listener(Options options, Handler handler) : impl_(std::make_unique<Impl>()) {
  impl_->opt = std::move(options);
  impl_->handler = std::move(handler);
}

Listener::~Listener() { Stop(); }

Status Listener::Impl::BindTcp(uint16_t* port) {
  const std::string where = opt.name + ": listen on " + opt.tcp.ToString();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(opt.tcp.host.c_str(), std::to_string(opt.tcp.port).c_str(),
                         &hints, &res);
  if (rc != 0 || res == nullptr) return Status::InvalidArgument(where + ": cannot resolve: " + ::gai_strerror(rc));
  Status s;
  int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  int one = 1;
  if (fd < 0) {
    s = Status::FromErrno(errno, where);
  } else if (::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
             ::bind(fd, res->ai_addr, res->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
    s = Status::FromErrno(errno, where);
  }
  ::freeaddrinfo(res);
  if (!s.ok()) {
    if (fd >= 0) ::close(fd);
    return s;
  }
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  *port = ntohs(ss.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&ss)->sin_port
                                        : reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  tcp_fd = fd;
  return Status::OK();
}

Status Listener::Impl::BindUnix() {
  const std::string where = opt.name + ": listen on unix:" + opt.unix_path;
  sockaddr_un sa{};
  if (opt.unix_path.size() >= sizeof sa.sun_path) return Status::InvalidArgument(where + ": path too long");
  struct stat sb;
  if (::lstat(opt.unix_path.c_str(), &sb) == 0) {
    if (!S_ISSOCK(sb.st_mode)) return Status::AlreadyExists(where + ": the path exists and is not a socket");
    ::unlink(opt.unix_path.c_str());
  }
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, opt.unix_path.data(), opt.unix_path.size());
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return Status::FromErrno(errno, where);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    Status s = Status::FromErrno(errno, where);
    ::close(fd);
    return s;
  }
  // Permissions before listen(): until then every connect() is refused.
  Status s;
  if (!opt.unix_group.empty()) {
    group gr{};
    group* found = nullptr;
    std::vector<char> buf(16384);
    int rc = ::getgrnam_r(opt.unix_group.c_str(), &gr, buf.data(), buf.size(), &found);
    if (found == nullptr) {
      s = Status::InvalidArgument(where + ": unknown group '" + opt.unix_group + "'" +
                                  (rc != 0 ? std::string(": ") + std::strerror(rc) : std::string()));
    } else if (::chown(opt.unix_path.c_str(), uid_t(-1), found->gr_gid) != 0) {
      s = Status::FromErrno(errno, where + ": chown to group " + opt.unix_group);
    }
  }
  if (s.ok() && opt.unix_mode != 0 && ::chmod(opt.unix_path.c_str(), mode_t(opt.unix_mode)) != 0) {
    s = Status::FromErrno(errno, where + ": chmod");
  }
  if (s.ok() && ::listen(fd, SOMAXCONN) != 0) s = Status::FromErrno(errno, where);
  if (!s.ok()) {
    ::close(fd);
    ::unlink(opt.unix_path.c_str());
    return s;
  }
  unix_fd = fd;
  return Status::OK();
}

Status Listener::Start() {
  Impl& m = *impl_;
  if (m.started) return Status::InvalidArgument(m.opt.name + ": already started");
  if (m.opt.tcp.off() && m.opt.unix_path.empty()) {
    return Status::InvalidArgument(m.opt.name + ": neither a TCP port nor a Unix socket path");
  }
  if (m.opt.max_connections == 0) return Status::InvalidArgument(m.opt.name + ": max_connections must be > 0");
  if (!m.opt.tcp.off()) {
    Status s = m.BindTcp(&tcp_port_);
    if (!s.ok()) return s;
  }
  if (!m.opt.unix_path.empty()) {
    Status s = m.BindUnix();
    if (!s.ok()) {
      if (m.tcp_fd >= 0) ::close(m.tcp_fd);
      m.tcp_fd = -1;
      tcp_port_ = 0;
      return s;
    }
  }
  m.stop_fd = ::eventfd(0, EFD_CLOEXEC);
  if (m.stop_fd < 0) return Status::FromErrno(errno, m.opt.name + ": eventfd");
  if (m.opt.registry != nullptr) {
    metrics::Labels l{{"listener", m.opt.name}};
    m.m_accepted = m.opt.registry->GetCounter("cdp_listener_accepted_total", "Connections accepted", l);
    m.m_refused = m.opt.registry->GetCounter("cdp_listener_refused_total",
                                             "Connections closed at once: connection cap reached", l);
    m.m_errors = m.opt.registry->GetCounter("cdp_listener_accept_errors_total",
                                            "accept() failures for lack of descriptors or memory (then a back-off)", l);
    m.m_evicted = m.opt.registry->GetCounter(
        "cdp_listener_evicted_total",
        "Unauthenticated connections closed at the connection cap to admit a new one", l);
    m.caps->live_gauge = m.opt.registry->GetGauge("cdp_listener_connections", "Live connections", l);
  }
  m.started = true;
  m.accept_thread = std::thread([&m] { m.Loop(); });
  return Status::OK();
}

void Listener::Impl::Loop() {
  std::chrono::milliseconds backoff{0};
  for (;;) {
    pollfd pfds[3];
    nfds_t n = 0;
    pfds[n++] = {stop_fd, POLLIN, 0};
    if (backoff.count() <= 0) {
      if (tcp_fd >= 0) pfds[n++] = {tcp_fd, POLLIN, 0};
      if (unix_fd >= 0) pfds[n++] = {unix_fd, POLLIN, 0};
    }
    int rc = ::poll(pfds, n, backoff.count() > 0 ? int(backoff.count()) : -1);
    if (rc < 0 && errno != EINTR) {
      log->error("{}: poll: {}", opt.name, std::strerror(errno));
      return;
    }
    if (pfds[0].revents != 0) return;
    if (rc == 0) {  // the back-off is over: poll the listen sockets again
      backoff = std::chrono::milliseconds(-backoff.count());
      continue;
    }
    for (nfds_t i = 1; i < n && backoff.count() <= 0; ++i) {
      if (pfds[i].revents != 0) AcceptOne(pfds[i].fd, &backoff);
    }
    ReapFinished();
  }
}

// `*backoff`: 0 = none; > 0 = wait that long before accepting again. After a
// back-off it is stored negated, so the next shortage doubles it, and a success
// resets it to 0.
void Listener::Impl::AcceptOne(int listen_fd, std::chrono::milliseconds* backoff) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (!ResourceShortage(err)) return;  // EAGAIN, EINTR, ECONNABORTED, ...: the client is gone
    errors.fetch_add(1, std::memory_order_relaxed);
    if (m_errors) m_errors->Inc();
    auto last = std::chrono::milliseconds(-backoff->count());
    *backoff = last.count() <= 0 ? opt.backoff_min : std::min(last * 2, opt.backoff_max);
    log->warn("{}: accept: {}; accepting again in {} ms", opt.name, std::strerror(err), backoff->count());
    return;
  }
  *backoff = std::chrono::milliseconds(0);
  std::string peer, key;
  int family = ss.ss_family;
  if (family == AF_UNIX) {
    peer = "unix:" + opt.unix_path;
    ucred cred{};
    socklen_t clen = sizeof cred;
    key = ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) == 0 ? "uid:" + std::to_string(cred.uid) : "unix";
  } else {
    peer = IpText(ss, true);
    key = IpText(ss, false);
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(caps->mu);
    const char* refused = nullptr;
    std::string evicted_peer;
    if (opt.max_per_peer > 0 && caps->per_peer[key] >= opt.max_per_peer) {
      refused = "too many connections from this peer";
      refused_peer.fetch_add(1, std::memory_order_relaxed);
    } else if (caps->live - caps->evicting >= opt.max_connections) {
      // At the cap: the oldest connection that has not authenticated gives way.
      evicted_peer = caps->EvictOldest(opt.max_connections);
      if (evicted_peer.empty()) {
        refused = "too many connections";
        refused_total.fetch_add(1, std::memory_order_relaxed);
      }
    }
    int dup_fd = -1;
    if (refused == nullptr) {
      // The duplicate through which this connection can be evicted until it
      // authenticates (the owner's descriptor may be closed and reused).
      dup_fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
      if (dup_fd < 0) {
        refused = "no descriptor left to track it";
        errors.fetch_add(1, std::memory_order_relaxed);
      }
    }
    if (refused != nullptr) {
      if (caps->per_peer[key] == 0) caps->per_peer.erase(key);
      ::close(fd);
      if (m_refused) m_refused->Inc();
      log->warn("{}: connection from {} refused: {}", opt.name, peer, refused);
      return;
    }
    if (!evicted_peer.empty()) {
      evicted.fetch_add(1, std::memory_order_relaxed);
      if (m_evicted) m_evicted->Inc();
      log->warn("{}: at the connection cap ({}): closed the oldest unauthenticated connection, from {}, to admit {}",
                opt.name, opt.max_connections, evicted_peer, peer);
    }
    id = caps->next_id++;
    caps->unauthenticated[id] = Slot::State::Unauthenticated{dup_fd, peer, false};
    ++caps->live;
    ++caps->per_peer[key];
    if (caps->live_gauge) caps->live_gauge->Add(1);
  }
  accepted.fetch_add(1, std::memory_order_relaxed);
  if (m_accepted) m_accepted->Inc();
  if (opt.mode == Mode::kThreadPerConnection) {
    Serve(fd, family, std::move(peer), std::move(key), id);
    return;
  }
  Connection c{fd, family, std::move(peer), Slot()};
  c.slot.state_ = caps;
  c.slot.key_ = std::move(key);
  c.slot.id_ = id;
  handler(std::move(c));
}

void Listener::Impl::Serve(int fd, int family, std::string peer, std::string key, uint64_t id) {
  auto w = std::make_unique<Worker>();
  Worker* raw = w.get();
  raw->dup_fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  Connection c{fd, family, std::move(peer), Slot()};
  c.slot.state_ = caps;
  c.slot.key_ = std::move(key);
  c.slot.id_ = id;
  std::lock_guard<std::mutex> lock(workers_mu);
  if (shut_down && raw->dup_fd >= 0) ::shutdown(raw->dup_fd, SHUT_RDWR);
  raw->thread = std::thread([this, raw, c = std::move(c)]() mutable {
    handler(std::move(c));  // the Slot dies with the handler's copy
    {
      std::lock_guard<std::mutex> l(workers_mu);
      if (raw->dup_fd >= 0) {
        ::shutdown(raw->dup_fd, SHUT_RDWR);
        ::close(raw->dup_fd);
        raw->dup_fd = -1;
      }
    }
    raw->done.store(true, std::memory_order_release);
  });
  workers.push_back(std::move(w));
}

void Listener::Impl::ReapFinished() {
  std::list<std::unique_ptr<Worker>> finished;
  {
    std::lock_guard<std::mutex> lock(workers_mu);
    for (auto it = workers.begin(); it != workers.end();) {
      if ((*it)->done.load(std::memory_order_acquire)) {
        finished.push_back(std::move(*it));
        it = workers.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& w : finished) w->thread.join();
}

void Listener::Shutdown() {
  Impl& m = *impl_;
  if (!m.started || m.shut_down) return;
  {
    std::lock_guard<std::mutex> lock(m.workers_mu);
    m.shut_down = true;
    for (auto& w : m.workers)
      if (w->dup_fd >= 0) ::shutdown(w->dup_fd, SHUT_RDWR);
  }
  uint64_t one = 1;
  (void)!::write(m.stop_fd, &one, sizeof one);
}

void Listener::Stop() {
  Impl& m = *impl_;
  if (!m.started || m.stopped) return;
  Shutdown();
  m.stopped = true;
  if (m.accept_thread.joinable()) m.accept_thread.join();
  for (int* fd : {&m.tcp_fd, &m.unix_fd}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
  if (!m.opt.unix_path.empty()) ::unlink(m.opt.unix_path.c_str());
  std::list<std::unique_ptr<Worker>> workers;
  {
    std::lock_guard<std::mutex> lock(m.workers_mu);
    workers.swap(m.workers);
  }
  for (auto& w : workers) w->thread.join();
}

ListenerStats Listener::stats() const {
  const Impl& m = *impl_;
  ListenerStats s;
  s.accepted = m.accepted.load(std::memory_order_relaxed);
  s.refused_total_cap = m.refused_total.load(std::memory_order_relaxed);
  s.refused_peer_cap = m.refused_peer.load(std::memory_order_relaxed);
  s.evicted = m.evicted.load(std::memory_order_relaxed);
  s.accept_errors = m.errors.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(m.caps->mu);
  s.live = m.caps->live;
  return s;
}

}  // namespace cdp

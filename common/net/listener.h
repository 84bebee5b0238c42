// SPDX-License-Identifier: Apache-2.0
// Listener: the one place where OpenCDP accepts connections (nbdkit's
// server/sockets.c is the model). It binds a TCP endpoint and/or a Unix-domain
// socket, accepts on all of them in one poll(2) loop on its own thread, and
// hands each accepted connection to the owner's handler. The process server,
// the master target, the NBD server, the HTTP server and the test peers all use
// it, so the caps and the error handling below exist once.
//
//   accept loop (one thread)
//     poll(stop eventfd, tcp fd, unix fd)
//       stop readable                -> leave the loop
//       listen fd readable -> accept4:
//         ok: over max_per_peer for the peer's address (TCP: the IP;
//             Unix: the peer's uid) -> closed at once, counted in
//             refused_peer_cap; over max_connections -> the oldest
//             connection not yet authenticated is shut down (counted in
//             evicted) to admit this one; with none, closed at once,
//             counted in refused_total_cap; else the handler gets it
//         EMFILE/ENFILE/ENOBUFS/ENOMEM -> counted (accept_errors), then
//             poll(stop only) for the back-off (doubling from
//             backoff_min to backoff_max, reset by the next success); the
//             listen fds are not polled meanwhile, so the loop never spins
//         EAGAIN/EINTR/ECONNABORTED/EPROTO... (a client gave up) -> next
//
// Two ways to serve a connection:
//  - Mode::kHandOff (async servers: HTTP, NBD): the handler runs on the accept
//    thread, must not block, and takes the connection (usually assigning the
//    descriptor to an Asio socket with AssignTo). Its Slot must live as long
//    as the connection does; destroying the Slot releases its place under the
//    caps. The owner closes its own connections when it stops.
//  - Mode::kThreadPerConnection (blocking servers: PS, MT, test peers): the
//    handler runs on a thread of its own; the connection ends when the handler
//    returns (the listener then shuts the socket down, closes its descriptor and
//    reaps the thread). The listener keeps a duplicate of each descriptor, so
//    Shutdown() can wake every blocked handler (shutdown(2): reads see EOF).
//
// No lock-outs (eviction): a connection counts as unauthenticated from accept
// until its owner calls Slot::MarkAuthenticated() (the frame handshake
// succeeded, an HTTP request carried a valid token, an NBD client reached
// transmission). For each unauthenticated connection the listener keeps a
// duplicate of its descriptor, in age order. At max_connections the oldest
// one is shut down (shutdown(2) on the duplicate: the owner's reads see EOF,
// in either mode) and the new connection is admitted at once; the evicted
// one keeps its Slot until its owner notices and lets it go, so live
// connections may exceed max_connections by the evictions in progress (never
// by more than max_connections: past that, new connections are refused).
// A flood of idle sockets therefore delays a real peer by at most its own
// handshake, unless the flood outruns it; peers that authenticated are
// never evicted.
//
// Lifecycle: construct -> Start() -> [Shutdown()] -> Stop() (or destructor).
//   Shutdown(): stop accepting and, in thread mode, shut every live
//     connection down. Does not wait. Idempotent.
//   Stop(): Shutdown(), wait for the accept thread, close the listen sockets
//     (removing the Unix path) and, in thread mode, wait for every handler to
//     return. Idempotent.
//
// Thread safety: Start/Shutdown/Stop from the owner; stats() from any thread;
// Slots may be destroyed on any thread, also after the Listener is gone.
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/system/error_code.hpp>

#include "common/base/host_port.h"
#include "common/base/status.h"

namespace cdp {

namespace metrics {
class Registry;
}

struct ListenerStats {
  uint64_t accepted = 0;           // handed to the handler
  uint64_t refused_total_cap = 0;  // closed at once: max_connections reached
  uint64_t evicted = 0;            // unauthenticated connections shut down to admit a new one
  uint64_t refused_peer_cap = 0;   // closed at once: max_per_peer reached for that peer
  uint64_t accept_errors = 0;      // EMFILE/ENFILE/ENOBUFS/ENOMEM (each followed by a back-off)
  uint64_t live = 0;               // connections holding a Slot now
};

class Listener {
 public:
  enum class Mode { kHandOff, kThreadPerConnection };

  struct Options {
    std::string name = "listener";  // logs and the metrics' `listener` label
    // TCP: host (name or address; "0.0.0.0" or "::" for every interface) and
    // port; port 0 picks an ephemeral port (see tcp_port()); off() (the
    // default) = no TCP endpoint.
    HostPort tcp;
    // Unix-domain socket path ("" = none). An existing socket file there is
    // replaced; any other existing file is an error (kAlreadyExists).
    std::string unix_path;
    // Permissions of the Unix socket file, applied between bind and listen
    // (so no client connects before): mode (0 = as the umask leaves it) and
    // group name ("" = the daemon's). An unknown group fails Start().
    uint32_t unix_mode = 0;
    std::string unix_group;
    size_t max_connections = 256;  // live connections in all, at most
    size_t max_per_peer = 0;       // live connections per peer address; 0 = no limit
    std::chrono::milliseconds backoff_min{10};
    std::chrono::milliseconds backoff_max{1000};
    Mode mode = Mode::kHandOff;
    metrics::Registry* registry = nullptr;  // counters when set; must outlive the Listener
  };

  // A connection's place under the caps: move-only; destroying it (or Release())
  // gives the place back. Safe to outlive the Listener. Any thread, but one
  // Slot from one thread at a time.
  class Slot {
   public:
    Slot() = default;
    ~Slot() { Release(); }
    Slot(Slot&& o) noexcept : state_(std::move(o.state_)), key_(std::move(o.key_)), id_(o.id_) {}
    Slot& operator=(Slot&& o) noexcept;
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    void Release();
    // The peer proved who it is: from now on this connection is never closed
    // to make room for another (see "No lock-outs" above). Idempotent; no-op
    // on an empty Slot or one already evicted.
    void MarkAuthenticated();

   private:
    friend class Listener;
    struct State;
    std::shared_ptr<State> state_;
    std::string key_;
    uint64_t id_ = 0;  // the connection's age rank (accept order)
  };

  // One accepted connection. `fd` is connected, close-on-exec, blocking; the
  // handler owns it (kHandOff: close it or give it to a socket; in thread mode
  // the listener closes its own duplicate after the handler returns, the
  // handler closes `fd` or gives it to a socket as well).
  struct Connection {
    int fd = -1;
    int family = AF_UNSPEC;  // AF_INET, AF_INET6 or AF_UNIX
    std::string peer;        // "127.0.0.1:41234", "[::1]:7400" or "unix:<path>"
    Slot slot;
  };
  using Handler = std::function<void(Connection)>;

  Listener(Options options, Handler handler);
  ~Listener();  // Stop()s
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  // Binds and listens on every endpoint, then starts the accept thread.
  // Failure: kInvalidArgument (nothing to listen on, bad address),
  // kAlreadyExists (unix_path is not a socket), kIOError naming the endpoint
  // (port in use, ...). Nothing is left bound on failure. Once only.
  Status Start();

  uint16_t tcp_port() const { return tcp_port_; }  // the bound port, 0 before Start()
  void Shutdown();
  void Stop();
  ListenerStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  uint16_t tcp_port_ = 0;
};

// Gives the connection's descriptor to an Asio TCP or Unix stream socket
// (any executor). On success c.fd belongs to the socket (c.fd = -1); on
// failure the descriptor is closed. kInvalidArgument when the socket's
// protocol does not match c.family.
template <typename Socket>
Status AssignTo(Listener::Connection& c, Socket& socket);

// ---------------------------------------------------------------- details

namespace listener_detail {
Status AssignFailed(Listener::Connection& c, const boost::system::error_code& ec);
Status WrongFamily(Listener::Connection& c);
}  // namespace listener_detail

template <typename Socket>
Status AssignTo(Listener::Connection& c, Socket& socket) {
  using Protocol = typename Socket::protocol_type;
  boost::system::error_code ec;
  if constexpr (std::is_same_v<Protocol, boost::asio::ip::tcp>) {
    if (c.family != AF_INET && c.family != AF_INET6) return listener_detail::WrongFamily(c);
    socket.assign(c.family == AF_INET ? Protocol::v4() : Protocol::v6(), c.fd, ec);
  } else {
    static_assert(std::is_same_v<Protocol, boost::asio::local::stream_protocol>, "TCP or Unix sockets only");
    if (c.family != AF_UNIX) return listener_detail::WrongFamily(c);
    socket.assign(Protocol(), c.fd, ec);
  }
  if (ec) return listener_detail::AssignFailed(c, ec);
  c.fd = -1;
  return Status::OK();
}

}  // namespace cdp

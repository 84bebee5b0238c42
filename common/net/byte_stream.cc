// SPDX-License-Identifier: Apache-2.0
#include "common/net/byte_stream.h"

#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <vector>

#include <boost/asio/connect.hpp>
#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/write.hpp>

#include "common/base/asio_status.h"

namespace cdp {

namespace asio = boost::asio;
using GenericSocket = asio::generic::stream_protocol::socket;
using SteadyClock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

namespace {

// Runs `ctx` until the operation flagged by `done` completes or `timeout`
// passes; in the latter case cancels it via `cancel` and runs until the
// handler has seen the cancellation. Returns false on timeout.
// (Asio's blocking_tcp_client example.)
template <typename Cancel>
bool RunWithTimeout(asio::io_context& ctx, const bool& done, SteadyClock::duration timeout, Cancel cancel) {
  ctx.restart();
  if (timeout > SteadyClock::duration::zero()) ctx.run_for(timeout);
  if (done) return true;
  cancel();
  ctx.restart();
  ctx.run();
  return false;
}

std::string EndpointText(const asio::ip::tcp::endpoint& ep) {
  if (ep.address().is_v6()) return "[" + ep.address().to_string() + "]:" + std::to_string(ep.port());
  return ep.address().to_string() + ":" + std::to_string(ep.port());
}

// A connected socket as two descriptors (the second a dup of the first) on two
// io_contexts, so that the reading and the writing thread never share Asio state.
class SocketStream final : public ByteStream {
 public:
  explicit SocketStream(std::string peer) : peer_(std::move(peer)) {}
  ~SocketStream() override = default;

  // Takes ownership of `native` (a connected stream socket descriptor).
  Status Init(const asio::generic::stream_protocol& proto, int native) {
    boost::system::error_code ec;
    rsock_.assign(proto, native, ec);
    if (ec) {
      ::close(native);
      return FromAsioError(ec, "adopt socket " + peer_);
    }
    fd_ = native;
    int dup_fd = ::dup(native);
    if (dup_fd < 0) return Status::FromErrno(errno, "dup socket " + peer_);
    wsock_.assign(proto, dup_fd, ec);
    if (ec) {
      ::close(dup_fd);
      return FromAsioError(ec, "adopt socket " + peer_);
    }
    return Status::OK();
  }

  Result<size_t> ReadSome(std::span<uint8_t> buf, Deadline deadline) override {
    if (shut_.load(std::memory_order_acquire)) return Status::Aborted(peer_ + ": stream shut down");
    bool done = false;
    boost::system::error_code ec;
    size_t n = 0;
    rsock_.async_read_some(asio::buffer(buf.data(), buf.size()), [&](const boost::system::error_code& e, size_t got) {
      ec = e;
      n = got;
      done = true;
    });
    RunWithTimeout(rctx_, done, deadline - SteadyClock::now(), [this] {
      boost::system::error_code ignored;
      rsock_.cancel(ignored);
    });
    if (n > 0) return n;  // bytes that came are never dropped, whatever else happened
    if (shut_.load(std::memory_order_acquire)) return Status::Aborted(peer_ + ": stream shut down");
    if (ec == asio::error::operation_aborted) return Status::Busy(peer_ + ": nothing to read before the deadline");
    if (ec) return FromAsioError(ec, "receive from " + peer_);
    return Status::Unavailable(peer_ + ": read returned nothing");
  }

  Status WriteAll(std::span<const ByteSpan> bufs, Deadline deadline) override {
    if (shut_.load(std::memory_order_acquire)) return Status::Aborted(peer_ + ": stream shut down");
    // Asio wants a sequence of const_buffer; frames are header + payload, so
    // the small array covers the hot path without allocating.
    std::array<asio::const_buffer, 4> small;
    std::vector<asio::const_buffer> large;
    std::span<const asio::const_buffer> seq;
    if (bufs.size() <= small.size()) {
      for (size_t i = 0; i < bufs.size(); ++i) small[i] = asio::buffer(bufs[i].data(), bufs[i].size());
      seq = std::span<const asio::const_buffer>(small.data(), bufs.size());
    } else {
      for (ByteSpan b : bufs) large.push_back(asio::buffer(b.data(), b.size()));
      seq = large;
    }
    bool done = false;
    boost::system::error_code ec;
    asio::async_write(wsock_, seq, [&](const boost::system::error_code& e, size_t) {
      ec = e;
      done = true;
    });
    bool in_time = RunWithTimeout(wctx_, done, deadline - SteadyClock::now(), [this] {
      boost::system::error_code ignored;
      wsock_.cancel(ignored);
    });
    if (shut_.load(std::memory_order_acquire)) return Status::Aborted(peer_ + ": stream shut down");
    if (!in_time) return Status::Busy(peer_ + ": write did not finish before the deadline");
    if (ec) return FromAsioError(ec, "send to " + peer_);
    return Status::OK();
  }

  void Shutdown() override {
    shut_.store(true, std::memory_order_release);
    if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
  }

  const std::string& peer() const override { return peer_; }

 private:
  const std::string peer_;
  asio::io_context rctx_;
  asio::io_context wctx_;
  GenericSocket rsock_{rctx_};
  GenericSocket wsock_{wctx_};
  int fd_ = -1;  // rsock_'s descriptor, for shutdown(2) from any thread
  std::atomic<bool> shut_{false};
};

Result<std::unique_ptr<ByteStream>> Wrap(std::string peer, const asio::generic::stream_protocol& proto, int native) {
  auto s = std::make_unique<SocketStream>(std::move(peer));
  Status st = s->Init(proto, native);
  if (!st.ok()) return st;
  return std::unique_ptr<ByteStream>(std::move(s));
}

}  // namespace

Result<std::unique_ptr<ByteStream>> MakeSocketStream(asio::ip::tcp::socket socket) {
  boost::system::error_code ec;
  asio::ip::tcp::endpoint remote = socket.remote_endpoint(ec);
  if (ec) return FromAsioError(ec, "adopt socket: remote endpoint");
  std::string peer = EndpointText(remote);
  socket.set_option(asio::ip::tcp::no_delay(true), ec);  // acks and heartbeats are small
  if (ec) return FromAsioError(ec, "adopt socket " + peer + ": TCP_NODELAY");
  asio::generic::stream_protocol proto(remote.protocol());
  int native = socket.release(ec);
  if (ec) return FromAsioError(ec, "adopt socket " + peer);
  return Wrap(std::move(peer), proto, native);
}

Result<std::unique_ptr<ByteStream>> MakeSocketStream(asio::local::stream_protocol::socket socket) {
  boost::system::error_code ec;
  std::string path = socket.remote_endpoint(ec).path();
  if (ec) path = socket.local_endpoint(ec).path();  // the accepting side sees an unnamed peer
  std::string peer = "unix:" + path;
  int native = socket.release(ec);
  if (ec) return FromAsioError(ec, "adopt socket " + peer);
  return Wrap(std::move(peer), asio::generic::stream_protocol(AF_UNIX, 0), native);
}

Result<std::pair<std::unique_ptr<ByteStream>, std::unique_ptr<ByteStream>>> MakeStreamPair(
    const std::string& name) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    return Status::FromErrno(errno, "socketpair " + name);
  }
  const asio::generic::stream_protocol proto(AF_UNIX, 0);
  Result<std::unique_ptr<ByteStream>> a = Wrap("pair:" + name + ":a", proto, fds[0]);
  if (!a.ok()) {
    ::close(fds[1]);
    return a.status();
  }
  CDP_ASSIGN_OR_RETURN(std::unique_ptr<ByteStream> b, Wrap("pair:" + name + ":b", proto, fds[1]));
  return std::make_pair(std::move(*a), std::move(b));
}

Result<std::unique_ptr<ByteStream>> ConnectTcpStream(const std::string& host, uint16_t port, Millis timeout) {
  const std::string what = "connect to " + host + ":" + std::to_string(port);
  asio::io_context ctx;
  asio::ip::tcp::resolver resolver(ctx);
  asio::ip::tcp::socket socket(ctx);
  bool done = false;
  boost::system::error_code ec;
  resolver.async_resolve(host, std::to_string(port),
                         [&](const boost::system::error_code& e, asio::ip::tcp::resolver::results_type results) {
                           if (e) {
                             ec = e;
                             done = true;
                             return;
                           }
                           asio::async_connect(socket, results,
                                               [&](const boost::system::error_code& e2,
                                                   const asio::ip::tcp::endpoint&) {
                                                 ec = e2;
                                                 done = true;
                                               });
                         });
  bool in_time = RunWithTimeout(ctx, done, timeout, [&] {
    resolver.cancel();
    boost::system::error_code ignored;
    socket.close(ignored);
  });
  if (!in_time) return Status::Unavailable(what + ": timed out after " + std::to_string(timeout.count()) + " ms");
  if (ec) return FromAsioError(ec, what);
  // TCP simultaneous open: with nothing listening on a port of this host, a
  // connect() that draws that same port as its source connects to itself.
  // The socket would hold the port, and the daemon restarting there could not
  // bind it, for as long as we kept retrying.
  boost::system::error_code lec, rec;
  const auto local = socket.local_endpoint(lec);
  const auto remote = socket.remote_endpoint(rec);
  if (!lec && !rec && local == remote) {
    boost::system::error_code ignored;
    // Reset, not closed: no TIME_WAIT left on the port. (An explicit close:
    // asio's destructor would drop the linger option first.)
    socket.set_option(asio::socket_base::linger(true, 0), ignored);
    socket.close(ignored);
    return Status::Unavailable(what + ": connected to itself (nothing listens there)");
  }
  return MakeSocketStream(std::move(socket));
}

Result<std::unique_ptr<ByteStream>> ConnectUnixStream(const std::string& path, Millis timeout) {
  const std::string what = "connect to unix:" + path;
  asio::io_context ctx;
  asio::local::stream_protocol::socket socket(ctx);
  bool done = false;
  boost::system::error_code ec;
  socket.async_connect(asio::local::stream_protocol::endpoint(path), [&](const boost::system::error_code& e) {
    ec = e;
    done = true;
  });
  bool in_time = RunWithTimeout(ctx, done, timeout, [&] {
    boost::system::error_code ignored;
    socket.close(ignored);
  });
  if (!in_time) return Status::Unavailable(what + ": timed out after " + std::to_string(timeout.count()) + " ms");
  if (ec == boost::system::errc::no_such_file_or_directory) return Status::Unavailable(what + ": no such socket");
  if (ec) return FromAsioError(ec, what);
  return MakeSocketStream(std::move(socket));
}

Result<std::unique_ptr<ByteStream>> MakeSocketStream(Listener::Connection& c) {
  asio::io_context ctx;  // only until the stream has moved the descriptor to its own
  if (c.family == AF_UNIX) {
    asio::local::stream_protocol::socket s(ctx);
    CDP_RETURN_IF_ERROR(AssignTo(c, s));
    return MakeSocketStream(std::move(s));
  }
  asio::ip::tcp::socket s(ctx);
  CDP_RETURN_IF_ERROR(AssignTo(c, s));
  return MakeSocketStream(std::move(s));
}

}  // namespace cdp

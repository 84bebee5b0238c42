// SPDX-License-Identifier: Apache-2.0
// SocketTls: TLS over an Asio socket in which OpenSSL reads and writes the
// socket's file descriptor itself (a socket BIO) and Asio only waits for the
// descriptor to become readable or writable. It replaces
// asio::ssl::stream<Socket&> where a connection's reads and writes already
// run on one strand (the NBD server: common/nbd/nbd_connection.cc).
//
// Why: asio::ssl::stream runs OpenSSL over a memory BIO pair. Every byte sent
// is copied from the record OpenSSL builds into the pair, then from the pair
// into the stream's output buffer, then by the kernel into the socket; every
// byte received takes the same two extra copies the other way
// (docs/benchmarks.md, "TLS on the NBD socket without the memory BIOs"). Here
// OpenSSL encrypts into its own record buffer and write(2)s it; reads take
// ciphertext straight from the socket (read-ahead on, so that one read(2)
// usually brings whole records).
//
// Model: the Asio AsyncReadStream and AsyncWriteStream requirements for
// callable handlers (asio::async_read, asio::async_write and async_read_some
// work on it), plus async_handshake. One read and one write may be
// outstanding at once; every call and every completion of one SocketTls must
// run on one strand (the socket's executor): OpenSSL's SSL object is never
// entered by two threads at once, and a read waiting for the socket does not
// block a write. A completion is never invoked from inside the initiating
// call (posted to the socket's executor).
//
// Errors, as Asio's ssl::stream reports them (callers test these):
//   asio::error::eof                    the peer closed the TLS session
//                                       (close_notify)
//   asio::ssl::error::stream_truncated  the connection ended without one
//   a system error                      of the socket (EPIPE, ECONNRESET, ...)
//   an ssl category error               OpenSSL's (a bad record, an alert, a
//                                       failed handshake)
//   asio::error::operation_aborted      the socket was closed meanwhile
//   asio::error::bad_descriptor         the operation began after the socket
//                                       was closed (the descriptor is never
//                                       used after its close)
//
// The socket is switched to non-blocking mode. SocketTls never closes it;
// SIGPIPE must be ignored (the daemons and test binaries do).
#pragma once

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/ssl/stream_base.hpp>
#include <cerrno>
#include <cstring>
#include <type_traits>
#include <utility>

namespace cdp {

template <typename Socket>
class SocketTls {
 public:
  using executor_type = typename Socket::executor_type;
  using lowest_layer_type = typename Socket::lowest_layer_type;

  // Small buffers of one write are gathered into one record up to this size
  // (a reply header and a small READ's data; nbd_connection.cc gathers up
  // to 64 replies per write).
  static constexpr size_t kGather = 16u << 10;

  // Takes ownership of `ssl` (SSL_new of the context to use); `socket` must
  // outlive this object and stay open until no operation is outstanding.
  SocketTls(Socket& socket, SSL* ssl) : socket_(socket), ssl_(ssl) {
    boost::system::error_code ig;
    socket_.non_blocking(true, ig);
    BIO* bio = BIO_new_socket(int(socket_.native_handle()), BIO_NOCLOSE);
    if (bio != nullptr) SSL_set_bio(ssl_, bio, bio);
    SSL_set_read_ahead(ssl_, 1);
    SSL_set_mode(ssl_, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  }
  ~SocketTls() { SSL_free(ssl_); }
  SocketTls(const SocketTls&) = delete;
  SocketTls& operator=(const SocketTls&) = delete;

  executor_type get_executor() { return socket_.get_executor(); }
  lowest_layer_type& lowest_layer() { return socket_.lowest_layer(); }
  SSL* native_handle() { return ssl_; }

  // handler(error_code).
  template <typename Handler>
  void async_handshake(boost::asio::ssl::stream_base::handshake_type type, Handler&& handler) {
    if (type == boost::asio::ssl::stream_base::server) {
      SSL_set_accept_state(ssl_);
    } else {
      SSL_set_connect_state(ssl_);
    }
    Handshake(std::forward<Handler>(handler));
  }

  // handler(error_code, bytes): reads what OpenSSL has or the socket
  // brings without waiting, at least one byte unless the buffers are empty,
  // into the first non-empty buffer.
  template <typename MutableBuffers, typename Handler>
  void async_read_some(const MutableBuffers& buffers, Handler&& handler) {
    boost::asio::mutable_buffer first;
    for (auto it = boost::asio::buffer_sequence_begin(buffers); it != boost::asio::buffer_sequence_end(buffers);
         ++it) {
      if (it->size() > 0) {
        first = *it;
        break;
      }
    }
    Read(first, std::forward<Handler>(handler));
  }

  // handler(error_code, bytes): writes as much of the buffers as the socket
  // takes without waiting, at least one byte unless they are empty.
  template <typename ConstBuffers, typename Handler>
  void async_write_some(const ConstBuffers& buffers, Handler&& handler) {
    Write(buffers, std::forward<Handler>(handler));
  }

 private:
  using error_code = boost::system::error_code;

  // What the last SSL call's failure means: wait to read, wait to write, or
  // an error to complete with.
  enum class Next { kRead, kWrite, kFail };
  Next Classify(int ret, error_code* ec) {
    const int saved_errno = errno;
    switch (SSL_get_error(ssl_, ret)) {
      case SSL_ERROR_WANT_READ:
        return Next::kRead;
      case SSL_ERROR_WANT_WRITE:
        return Next::kWrite;
      case SSL_ERROR_ZERO_RETURN:
        *ec = boost::asio::error::eof;
        return Next::kFail;
      case SSL_ERROR_SYSCALL: {
        const unsigned long e = ERR_get_error();
        if (e != 0) {
          *ec = error_code(int(e), boost::asio::error::get_ssl_category());
        } else if (saved_errno != 0 && saved_errno != EAGAIN) {
          *ec = error_code(saved_errno, boost::system::system_category());
        } else {
          *ec = boost::asio::ssl::error::stream_truncated;
        }
        return Next::kFail;
      }
      default: {
        const unsigned long e = ERR_get_error();
        if (ERR_GET_LIB(e) == ERR_LIB_SSL && ERR_GET_REASON(e) == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
          *ec = boost::asio::ssl::error::stream_truncated;
        } else {
          *ec = error_code(int(e != 0 ? e : 1), boost::asio::error::get_ssl_category());
        }
        return Next::kFail;
      }
    }
  }

  // An operation started after the socket was closed (a composed write going
  // on after a partial write, say) fails without touching the descriptor:
  // its number may already belong to another connection.
  static boost::asio::error::basic_errors Closed() { return boost::asio::error::bad_descriptor; }

  // Waits for the socket, then runs `again` (on the socket's executor).
  template <typename Again>
  void Wait(Next next, Again&& again) {
    socket_.async_wait(next == Next::kRead ? Socket::wait_read : Socket::wait_write, std::forward<Again>(again));
  }

  // Invokes the handler: at once when the operation resumed after a wait
  // (already on the socket's executor, outside the initiating call),
  // otherwise posted.
  template <typename Handler, typename... Args>
  void Complete(bool resumed, Handler&& handler, Args... args) {
    if (resumed) {
      std::decay_t<Handler> h(std::forward<Handler>(handler));
      return std::move(h)(args...);
    }
    boost::asio::post(socket_.get_executor(),
                      [h = std::forward<Handler>(handler), args...]() mutable { std::move(h)(args...); });
  }

  template <typename Handler>
  void Handshake(Handler&& handler, bool resumed = false) {
    if (!socket_.is_open()) return Complete(resumed, std::forward<Handler>(handler), error_code(Closed()));
    ERR_clear_error();
    errno = 0;
    const int r = SSL_do_handshake(ssl_);
    if (r == 1) return Complete(resumed, std::forward<Handler>(handler), error_code());
    error_code ec;
    const Next next = Classify(r, &ec);
    if (next == Next::kFail) return Complete(resumed, std::forward<Handler>(handler), ec);
    Wait(next, [this, h = std::forward<Handler>(handler)](const error_code& wec) mutable {
      if (wec) return std::move(h)(wec);
      Handshake(std::move(h), /*resumed=*/true);
    });
  }

  template <typename Handler>
  void Read(boost::asio::mutable_buffer buf, Handler&& handler, bool resumed = false) {
    if (!socket_.is_open()) return Complete(resumed, std::forward<Handler>(handler), error_code(Closed()), size_t(0));
    auto* p = static_cast<unsigned char*>(buf.data());
    size_t total = 0;
    error_code ec;
    Next next = Next::kFail;
    while (total < buf.size()) {
      ERR_clear_error();
      errno = 0;
      size_t got = 0;
      const int r = SSL_read_ex(ssl_, p + total, buf.size() - total, &got);
      if (r == 1) {
        total += got;
        continue;
      }
      next = Classify(r, &ec);
      break;
    }
    // Bytes read complete the call; an error after them comes with the next.
    if (total > 0 || buf.size() == 0) return Complete(resumed, std::forward<Handler>(handler), error_code(), total);
    if (next == Next::kFail) return Complete(resumed, std::forward<Handler>(handler), ec, size_t(0));
    Wait(next, [this, buf, h = std::forward<Handler>(handler)](const error_code& wec) mutable {
      if (wec) return std::move(h)(wec, size_t(0));
      Read(buf, std::move(h), /*resumed=*/true);
    });
  }

  // Writes from the start of `buffers` in chunks (see Chunk) until all are
  // written or the socket is full. OpenSSL requires a write it refused for a
  // full socket to be retried with the same leading bytes and no fewer of
  // them: the retry starts at the same byte of the same buffers (here after
  // the wait, or the caller's next call after a partial completion), and a
  // chunk built from one place is never shorter than before.
  template <typename ConstBuffers, typename Handler>
  void Write(const ConstBuffers& buffers, Handler&& handler, bool resumed = false) {
    if (!socket_.is_open()) return Complete(resumed, std::forward<Handler>(handler), error_code(Closed()), size_t(0));
    size_t total = 0;
    error_code ec;
    Next next = Next::kFail;
    for (;;) {
      const boost::asio::const_buffer chunk = Chunk(buffers, total);
      if (chunk.size() == 0) break;
      ERR_clear_error();
      errno = 0;
      size_t put = 0;
      const int r = SSL_write_ex(ssl_, chunk.data(), chunk.size(), &put);
      if (r == 1) {
        total += put;
        continue;
      }
      next = Classify(r, &ec);
      break;
    }
    if (total > 0 || next == Next::kFail) return Complete(resumed, std::forward<Handler>(handler), ec, total);
    Wait(next, [this, buffers, h = std::forward<Handler>(handler)](const error_code& wec) mutable {
      if (wec) return std::move(h)(wec, size_t(0));
      Write(buffers, std::move(h), /*resumed=*/true);
    });
  }

  // The next bytes to write from `skip` bytes into `buffers`: the rest of a
  // buffer of at least kGather bytes as it is, or smaller pieces gathered
  // (copied) into gather_ up to kGather. Empty at the end.
  template <typename ConstBuffers>
  boost::asio::const_buffer Chunk(const ConstBuffers& buffers, size_t skip) {
    size_t n = 0;
    for (auto it = boost::asio::buffer_sequence_begin(buffers); it != boost::asio::buffer_sequence_end(buffers);
         ++it) {
      boost::asio::const_buffer b = *it;
      if (skip >= b.size()) {
        skip -= b.size();
        continue;
      }
      b += skip;
      skip = 0;
      if (n == 0 && b.size() >= kGather) return b;
      const size_t take = std::min(b.size(), kGather - n);
      std::memcpy(gather_ + n, b.data(), take);
      n += take;
      if (n == kGather) break;
    }
    return boost::asio::const_buffer(gather_, n);
  }

  Socket& socket_;
  SSL* ssl_;
  unsigned char gather_[kGather];
};

}  // namespace cdp

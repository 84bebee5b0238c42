// SPDX-License-Identifier: Apache-2.0
// ByteStream: a connected, reliable, ordered byte stream in both directions
// (a TCP or unix-domain socket; later TLS), with blocking reads and writes
// bounded by deadlines. FrameChannel (common/wire/channel.h) speaks the frame
// protocol over one.
//
// Streams stack like nbdkit filters: a filter (common/net/stream_filters.h) is a
// ByteStream that owns the next stream down and forwards each call to it,
// changing what it must on the way (throttle, inject faults, TLS in
// common/net/tls_stream.h). The bottom of every stack is a transport made here.
//
//   FrameChannel -> [TlsStream] -> [FaultFilter] -> [ThrottleFilter] -> SocketStream (TCP | unix)
//
// Errors (a stream is unusable after any error other than a read timeout):
//   kBusy         ReadSome(): nothing arrived before the deadline; nothing is
//                 lost, call again. WriteAll(): the deadline passed (part of
//                 the data may have been written; the stream is then broken).
//   kUnavailable  the peer closed or reset the connection
//   kAborted      Shutdown() was called (any later call fails)
//   kIOError      other local failures
//
// Thread safety: one thread may ReadSome() while another WriteAll()s (the two
// directions share no state). Concurrent calls to the same direction are not
// allowed (the caller serialises them). Shutdown() and peer() may be called
// from any thread at any time; Shutdown() makes a blocked ReadSome()/WriteAll()
// return promptly. The destructor must not race with any other call.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>

#include "common/base/coding.h"
#include "common/base/result.h"
#include "common/base/status.h"
#include "common/net/listener.h"

namespace cdp {

// What a TLS layer of the stack proved about the peer: the identity in its
// certificate (verified against the site CA; format in common/crypto/pki.h) and the
// session's channel binding (RFC 5705 exporter, label "EXPORTER-opencdp-auth",
// 32 bytes), which the frame handshake mixes into its proofs so that a
// handshake relayed from another TLS session fails.
struct TlsPeer {
  std::string role;    // "agent" | "ps" | "mt"
  std::string tenant;  // empty for "mt"
  std::string name;    // the certificate's CN
  std::string serial;  // the certificate's serial number, upper-case hex (revocation)
  std::array<uint8_t, 32> binding{};
};

class ByteStream {
 public:
  using Deadline = std::chrono::steady_clock::time_point;

  virtual ~ByteStream() = default;

  // Waits until at least one byte is readable or `deadline` passes, then reads
  // up to buf.size() bytes into `buf`. Returns the count read (> 0). EOF from
  // the peer is kUnavailable. See the error list above.
  virtual Result<size_t> ReadSome(std::span<uint8_t> buf, Deadline deadline) = 0;

  // Writes every byte of every span in `bufs`, in order (a gather write: the
  // caller's buffers are not copied). OK means all of it is in the kernel's send
  // buffer. The spans must stay live until the call returns.
  virtual Status WriteAll(std::span<const ByteSpan> bufs, Deadline deadline) = 0;

  // Shuts the connection down in both directions: the peer sees EOF and a
  // blocked reader or writer here returns. Idempotent; any thread.
  virtual void Shutdown() = 0;

  // Who is at the other end: "127.0.0.1:41234", "[::1]:7400",
  // "unix:/run/cdp.sock". Fixed at construction.
  virtual const std::string& peer() const = 0;

  // The peer as proven by a TLS layer in this stack, or nullptr for a clear
  // stack. Fixed once the stream is handed out; lives as long as the stream.
  virtual const TlsPeer* tls_peer() const { return nullptr; }
};

// Stacks filters on a freshly connected transport and returns the top of the
// stack (e.g. `return std::make_unique<ThrottleFilter>(std::move(s), &t);`),
// or an error (a TLS handshake that failed: common/net/tls_stream.h TlsWrapper).
using StreamWrapper =
    std::function<Result<std::unique_ptr<ByteStream>>(std::unique_ptr<ByteStream> transport)>;

// Transports over an already connected socket, from any io_context: the
// stream moves the descriptor to its own two io_contexts (one per direction).
// `socket` is left closed. TCP sockets get TCP_NODELAY (acks and heartbeats
// are small). kIOError if the descriptor cannot be duplicated or registered.
Result<std::unique_ptr<ByteStream>> MakeSocketStream(boost::asio::ip::tcp::socket socket);
Result<std::unique_ptr<ByteStream>> MakeSocketStream(boost::asio::local::stream_protocol::socket socket);
// The transport of a connection the Listener accepted (TCP or Unix, by its
// family). The connection's descriptor is taken over.
Result<std::unique_ptr<ByteStream>> MakeSocketStream(Listener::Connection& connection);

// Resolves `host` and connects to the first address that answers, all within
// `timeout`. kUnavailable (retryable) if the name does not resolve, nothing
// answers in time, the connection is refused, or the socket connected to
// itself (source port = destination port, nothing listening).
Result<std::unique_ptr<ByteStream>> ConnectTcpStream(const std::string& host, uint16_t port,
                                                     std::chrono::milliseconds timeout);
// The same over a unix-domain stream socket at `path` (kUnavailable also when
// no socket exists there).
Result<std::unique_ptr<ByteStream>> ConnectUnixStream(const std::string& path,
                                                      std::chrono::milliseconds timeout);

// A connected pair of unix-domain streams (socketpair(2)), for tests and for
// in-process links. Peers are named "pair:<name>:a" and "pair:<name>:b".
Result<std::pair<std::unique_ptr<ByteStream>, std::unique_ptr<ByteStream>>> MakeStreamPair(
    const std::string& name);

}  // namespace cdp

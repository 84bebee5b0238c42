// SPDX-License-Identifier: Apache-2.0
// FrameChannel: one connected stream socket (TCP, or a unix-domain socket)
// speaking the OpenCDP frame protocol (common/wire/protocol.h): Send() encodes a
// message as a frame, Receive() returns the next message. Servers run one
// thread per connection around it; clients use Connect() + ClientHandshake().
//
// Frame sequences: each direction numbers its frames 1, 2, 3, ... Send()
// stamps the next outgoing number; Receive() expects the next incoming number
// and treats any other as kCorruption (a lost, duplicated or spliced frame).
//
// The bytes travel over a ByteStream (common/net/byte_stream.h): a TCP or unix
// transport, possibly under stacked filters (throttle, test faults; see
// common/net/stream_filters.h). Every read and write has a deadline, so a dead or
// silent peer can never hang a thread longer than the timeout given.
//
// Errors (the channel is "broken" after any of them except a Receive timeout;
// a broken channel fails every later call with the same Status):
//   kBusy         Receive(): no complete frame within the timeout. Nothing is
//                 lost (partial bytes stay buffered); call Receive() again.
//   kUnavailable  the peer closed or reset the connection, or Send() timed
//                 out (retryable: reconnect and resume)
//   kCorruption   a bad frame: bad magic/version/CRC, a length over the cap,
//                 a wrong frame sequence, or a payload that does not parse
//   kAborted      Close() was called
//
// Thread safety: one thread may Receive() while any number of threads Send()
// (sends are serialised by a mutex; each frame is written whole). Close() may
// be called from any thread and makes a blocked Receive()/Send() return
// promptly. The destructor must not race with any other call.
// (This relies on the ByteStream contract: one reader and one writer may run
// at once; the socket transport gives each direction its own io_context.)
//
// The handshake (ClientHandshake / ServerHandshake), mutual proof of the
// tenant's secret (proof formulas in common/crypto/auth.h):
//
//   client                                         server
//   ------                                         ------
//   nonce Nc = RandomNonce()
//   Hello{role, tenant, client_id, Nc}  ------->   secret = lookup(tenant), or a
//                                                  random one if the tenant is
//                                                  unknown (same behaviour)
//                                                  nonce Ns = RandomNonce()
//                          <-------  Challenge{Ns, server_proof(secret)}
//   check server_proof; on mismatch send
//     Auth{all zeros} (never a real proof to
//     a server that did not prove itself),
//     return kPermissionDenied
//   Auth{client_proof}  ----------------------->   check client_proof
//                          <-------  AuthResult{accepted, reason}
//   accepted: kOk                                  accepted: returns tenant
//   refused:  kPermissionDenied                    refused:  kPermissionDenied
//
//   Any unexpected message, a malformed one, or the deadline passing ends the
//   handshake with an error on that side; the caller then drops the channel.
//   An unknown tenant and a wrong secret look the same to the client: the
//   same messages and the same error text (no tenant enumeration). Secrets
//   must be high-entropy: the server proves itself first, so anyone may
//   collect server proofs to attack a weak secret offline.
//   On any failure both functions Close() the channel.
//
// Over TLS (the channel's tls_peer() is set) the certificates decide who the
// peer is, and the secret is a second factor bound to the TLS session:
//   - both proofs include the session's channel binding (common/crypto/auth.h);
//   - the server refuses (as "authentication failed") a Hello whose tenant is
//     not the certificate's tenant or whose role is not the certificate's role;
//   - the client refuses a server whose certificate is not the next hop's role:
//     a process server talks to an "mt"; an agent to a "ps", or to an "mt"
//     directly (the master target admits it only for a tenant listed in its
//     `direct_agents`; without that it refuses the agent's certificate).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>

#include "common/base/result.h"
#include "common/base/status.h"
#include "common/net/byte_stream.h"
#include "common/net/listener.h"
#include "common/wire/protocol.h"

namespace cdp {

class FrameChannel {
 public:
  struct Options {
    // Frames whose payload is larger are kCorruption (checked before allocating).
    uint32_t max_payload = proto::kMaxPayload;
    // A Send() that cannot hand its frame to the kernel within this time
    // breaks the channel (the peer stopped reading).
    std::chrono::milliseconds send_timeout{30'000};
  };

  // Takes over a connected socket, from any io_context: the channel moves the
  // descriptor to its own io_contexts. `socket` is left closed. Fails (kIOError)
  // only if the descriptor cannot be duplicated or registered.
  static Result<std::unique_ptr<FrameChannel>> Adopt(boost::asio::ip::tcp::socket socket,
                                                     Options options);
  static Result<std::unique_ptr<FrameChannel>> Adopt(boost::asio::ip::tcp::socket socket) {
    return Adopt(std::move(socket), Options{});
  }
  static Result<std::unique_ptr<FrameChannel>> Adopt(
      boost::asio::local::stream_protocol::socket socket, Options options);
  static Result<std::unique_ptr<FrameChannel>> Adopt(
      boost::asio::local::stream_protocol::socket socket) {
    return Adopt(std::move(socket), Options{});
  }
  // Takes over a connection accepted by the Listener (TCP or Unix); c.fd is
  // consumed either way. The Slot stays with `c` (the caller keeps it while
  // the channel lives).
  static Result<std::unique_ptr<FrameChannel>> Adopt(Listener::Connection& c, Options options);
  static Result<std::unique_ptr<FrameChannel>> Adopt(Listener::Connection& c) { return Adopt(c, Options{}); }

  // Takes over any connected ByteStream (a transport or a stack of filters).
  // Never fails today; Result for symmetry with the socket forms.
  static Result<std::unique_ptr<FrameChannel>> Adopt(std::unique_ptr<ByteStream> stream, Options options);
  static Result<std::unique_ptr<FrameChannel>> Adopt(std::unique_ptr<ByteStream> stream) {
    return Adopt(std::move(stream), Options{});
  }

  ~FrameChannel();
  FrameChannel(const FrameChannel&) = delete;
  FrameChannel& operator=(const FrameChannel&) = delete;

  // Encodes `m` (compressing a WriteBatch with its codec; compression runs in
  // the caller's thread, outside the lock) and writes it as one frame. OK means
  // the whole frame is in the kernel's send buffer, not that the peer has it.
  // kInvalidArgument if `m` breaks a cap or holds a bad name (channel stays usable).
  // `wire_bytes`, when given, receives the frame's size (header included).
  // `cost`, when given, receives what the send took (SendCost).
  struct SendCost {
    uint64_t encode_us = 0;      // encoding and compressing the payload, wall time
    uint64_t encode_cpu_us = 0;  // ... this thread's CPU time in it
    // Waiting for the channel (another thread's frame) and handing the frame
    // to the stream: the filters (TLS encryption, the throttle's wait) and
    // the kernel. CPU time is what the filters and system calls computed;
    // the rest is waiting (throttle, a full send buffer, the other sender).
    uint64_t write_us = 0;
    uint64_t write_cpu_us = 0;
  };
  Status Send(const proto::Message& m, uint64_t* wire_bytes = nullptr, SendCost* cost = nullptr);

  // Waits at most `timeout` for the next frame, checks its sequence and parses
  // it. See the error list above; kBusy (timeout) leaves the channel usable.
  // `wire_bytes`, when given, receives the frame's size (header included).
  Result<proto::Message> Receive(std::chrono::milliseconds timeout, uint64_t* wire_bytes = nullptr);

  // Shuts the socket down in both directions. Idempotent; any thread.
  void Close();

  // Handshake mode, on for the duration of ClientHandshake / ServerHandshake:
  // a frame whose header claims more than proto::kHandshakeMaxPayload breaks
  // the channel (kCorruption) before anything is allocated for it, and a frame
  // of any type but Hello, Challenge, Auth or AuthResult breaks it
  // (kInvalidArgument) as soon as its type byte arrives: nothing of it is read
  // further, parsed or decompressed. Reader thread only.
  void SetHandshakeMode(bool on) { handshake_ = on; }

  // The peer as its TLS certificate proves it, or nullptr on a clear stream.
  const TlsPeer* tls_peer() const { return stream_->tls_peer(); }

  // True after an error (other than a Receive timeout) or Close().
  bool broken() const { return broken_.load(std::memory_order_acquire); }

  // "127.0.0.1:41234", "[::1]:7400" or "unix:/run/cdp.sock": the stream's
  // peer (fixed at Adopt).
  const std::string& peer() const { return peer_; }

  // Counters for metrics (any thread).
  uint64_t frames_sent() const { return frames_sent_.load(std::memory_order_relaxed); }
  uint64_t frames_received() const { return frames_received_.load(std::memory_order_relaxed); }
  uint64_t bytes_sent() const { return bytes_sent_.load(std::memory_order_relaxed); }
  uint64_t bytes_received() const { return bytes_received_.load(std::memory_order_relaxed); }

 private:
  FrameChannel(std::unique_ptr<ByteStream> stream, Options options);
  Status Fail(Status s);  // marks the channel broken, remembers and returns `s`

  const std::unique_ptr<ByteStream> stream_;
  const std::string peer_;
  const Options options_;

  std::mutex send_mu_;
  uint64_t next_send_seq_ = 1;  // guarded by send_mu_

  uint64_t next_recv_seq_ = 1;  // reader thread only
  bool handshake_ = false;      // reader thread only
  Bytes rbuf_;                  // reader thread only: [rbuf_start_, rbuf_end_) received, not decoded
  size_t rbuf_start_ = 0;
  size_t rbuf_end_ = 0;

  std::atomic<bool> broken_{false};
  std::atomic<bool> closed_{false};
  std::mutex error_mu_;
  Status error_;  // guarded by error_mu_; the first error that broke the channel

  std::atomic<uint64_t> frames_sent_{0}, frames_received_{0}, bytes_sent_{0}, bytes_received_{0};
};

// A Listener handler for thread-per-connection servers speaking frames: adopts
// each connection as a FrameChannel, runs `serve` on it (in the connection's
// thread) and closes the channel when `serve` returns. If `wrap` is set, the
// channel runs over wrap(transport) (the server side of TLS), in the
// connection's thread. A connection that cannot be adopted or wrapped is
// logged and dropped.
Listener::Handler ServeFrames(std::function<void(FrameChannel&)> serve, StreamWrapper wrap = {});
// The same, `serve` also given the connection's Slot, to mark it
// authenticated once the handshake succeeded (Listener::Slot::MarkAuthenticated:
// until then the listener may close it at its connection cap).
Listener::Handler ServeFrames(std::function<void(FrameChannel&, Listener::Slot&)> serve, StreamWrapper wrap = {});

// Resolves `host` (name or address) and connects to the first address that
// answers, all within `timeout`. kUnavailable (retryable) if the name does not
// resolve, nothing answers in time or the connection is refused. If `wrap` is
// set, the channel runs over wrap(transport): filters stacked by the caller.
Result<std::unique_ptr<FrameChannel>> Connect(const std::string& host, uint16_t port,
                                              std::chrono::milliseconds timeout,
                                              FrameChannel::Options options = {},
                                              const StreamWrapper& wrap = {});
// The same over a unix-domain stream socket at `path`.
Result<std::unique_ptr<FrameChannel>> ConnectUnix(const std::string& path,
                                                  std::chrono::milliseconds timeout,
                                                  FrameChannel::Options options = {},
                                                  const StreamWrapper& wrap = {});

// Client side of the handshake drawn above, all within `timeout`. OK means both
// sides proved the secret and the server accepted; the channel is then ready
// for VolumeOpen etc. kInvalidArgument for a bad tenant/client_id name or an
// empty secret; kPermissionDenied when either proof fails or the server
// refuses (same text for wrong secret and unknown tenant); channel errors as above.
Status ClientHandshake(FrameChannel& channel, proto::Role role, const std::string& tenant,
                       const std::string& client_id, const std::string& secret,
                       std::chrono::milliseconds timeout);

// Who authenticated. Over TLS, role and tenant are the certificate's and
// cert_name its CN; in clear text role and client_id are claims of the Hello
// and only the tenant is proven.
struct PeerIdentity {
  proto::Role role = proto::Role::kAgent;
  std::string tenant;
  std::string client_id;
  bool tls = false;
  std::string cert_name;
};

// Server side of the handshake, all within `timeout`. `secret_lookup` returns
// the tenant's secret or nullopt if there is no such tenant (it is called once,
// from this thread). Returns the authenticated tenant; fills *peer if given.
// kPermissionDenied for an unknown tenant or a wrong proof (the client is told
// only "authentication failed"); channel errors as above.
Result<std::string> ServerHandshake(
    FrameChannel& channel,
    const std::function<std::optional<std::string>(const std::string& tenant)>& secret_lookup,
    std::chrono::milliseconds timeout, PeerIdentity* peer = nullptr);

}  // namespace cdp

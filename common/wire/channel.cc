// SPDX-License-Identifier: Apache-2.0
#include "common/wire/channel.h"

#include <algorithm>
#include <array>
#include <cstring>

#include <boost/asio/io_context.hpp>

#include "common/base/clock.h"
#include "common/base/log.h"
#include "common/crypto/auth.h"

namespace cdp {

namespace asio = boost::asio;
using Millis = std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

namespace {

constexpr size_t kReadChunk = 256 * 1024;  // initial read buffer
constexpr size_t kMinFree = 64 * 1024;      // room for at least this much per read
constexpr size_t kShrinkAbove = 16u << 20;  // buffer size given back once empty

}  // namespace

FrameChannel::FrameChannel(std::unique_ptr<ByteStream> stream, Options options)
    : stream_(std::move(stream)), peer_(stream_->peer()), options_(options) {
  rbuf_.resize(kReadChunk);
}

FrameChannel::~FrameChannel() = default;

Result<std::unique_ptr<FrameChannel>> FrameChannel::Adopt(std::unique_ptr<ByteStream> stream, Options options) {
  return std::unique_ptr<FrameChannel>(new FrameChannel(std::move(stream), options));
}

Result<std::unique_ptr<FrameChannel>> FrameChannel::Adopt(boost::asio::ip::tcp::socket socket, Options options) {
  CDP_ASSIGN_OR_RETURN(std::unique_ptr<ByteStream> stream, MakeSocketStream(std::move(socket)));
  return Adopt(std::move(stream), options);
}

Result<std::unique_ptr<FrameChannel>> FrameChannel::Adopt(boost::asio::local::stream_protocol::socket socket,
                                                          Options options) {
  CDP_ASSIGN_OR_RETURN(std::unique_ptr<ByteStream> stream, MakeSocketStream(std::move(socket)));
  return Adopt(std::move(stream), options);
}

Result<std::unique_ptr<FrameChannel>> FrameChannel::Adopt(Listener::Connection& c, Options options) {
  CDP_ASSIGN_OR_RETURN(std::unique_ptr<ByteStream> stream, MakeSocketStream(c));
  return Adopt(std::move(stream), options);
}

Listener::Handler ServeFrames(std::function<void(FrameChannel&)> serve, StreamWrapper wrap) {
  return ServeFrames([serve = std::move(serve)](FrameChannel& ch, Listener::Slot&) { serve(ch); }, std::move(wrap));
}

Listener::Handler ServeFrames(std::function<void(FrameChannel&, Listener::Slot&)> serve, StreamWrapper wrap) {
  return [serve = std::move(serve), wrap = std::move(wrap)](Listener::Connection c) {
    Result<std::unique_ptr<ByteStream>> stream = MakeSocketStream(c);
    if (stream.ok() && wrap) stream = wrap(std::move(*stream));
    Result<std::unique_ptr<FrameChannel>> ch =
        stream.ok() ? FrameChannel::Adopt(std::move(*stream)) : Result<std::unique_ptr<FrameChannel>>(stream.status());
    if (!ch.ok()) {
      log::Get("channel")->warn("adopting a connection from {} failed: {}", c.peer, ch.status().ToString());
      return;
    }
    serve(**ch, c.slot);
    (*ch)->Close();
  };
}

Status FrameChannel::Fail(Status s) {
  Status first;
  {
    std::lock_guard<std::mutex> lock(error_mu_);
    if (error_.ok()) error_ = std::move(s);
    first = error_;
  }
  broken_.store(true, std::memory_order_release);
  // Wakes a blocked reader or writer and tells the peer we are gone.
  stream_->Shutdown();
  return first;
}

void FrameChannel::Close() {
  closed_.store(true, std::memory_order_release);
  (void)Fail(Status::Aborted(peer_ + ": channel closed"));
}

Status FrameChannel::Send(const proto::Message& m, uint64_t* wire_bytes, SendCost* cost) {
  if (broken()) {
    std::lock_guard<std::mutex> lock(error_mu_);
    return error_;
  }
  const uint64_t t0 = cost != nullptr ? SystemClock::Get()->NowMicros() : 0;
  const uint64_t c0 = cost != nullptr ? ThreadCpuMicros() : 0;
  // Gathered: the data of a batch's large records goes out from where it is.
  proto::PayloadPieces payload;
  Status encoded = proto::EncodePayloadPieces(m, &payload);
  if (!encoded.ok()) return encoded.WithContext(peer_);
  uint64_t t1 = 0, c1 = 0;
  if (cost != nullptr) {
    t1 = SystemClock::Get()->NowMicros();
    c1 = ThreadCpuMicros();
    cost->encode_us = t1 - t0;
    cost->encode_cpu_us = c1 - c0;
  }
  // Whatever way the send ends below, its write time is what it took.
  struct WriteTimer {
    SendCost* cost;
    uint64_t t1, c1;
    ~WriteTimer() {
      if (cost == nullptr) return;
      cost->write_us = SystemClock::Get()->NowMicros() - t1;
      cost->write_cpu_us = ThreadCpuMicros() - c1;
    }
  } write_timer{cost, t1, c1};

  std::lock_guard<std::mutex> lock(send_mu_);
  if (broken()) {
    std::lock_guard<std::mutex> elock(error_mu_);
    return error_;
  }
  std::array<uint8_t, proto::kHeaderSize> header;
  proto::EncodeHeader(proto::TypeOf(m), 0, next_send_seq_, payload.pieces, header.data());
  std::vector<ByteSpan> buffers;
  buffers.reserve(1 + payload.pieces.size());
  buffers.emplace_back(header);
  buffers.insert(buffers.end(), payload.pieces.begin(), payload.pieces.end());
  Status s = stream_->WriteAll(buffers, SteadyClock::now() + options_.send_timeout);
  if (closed_.load(std::memory_order_acquire)) return Fail(Status::Aborted(peer_ + ": channel closed"));
  if (s.IsBusy()) {
    return Fail(Status::Unavailable(peer_ + ": send timed out after " +
                                    std::to_string(options_.send_timeout.count()) + " ms"));
  }
  if (!s.ok()) return Fail(std::move(s));
  bytes_sent_.fetch_add(header.size() + payload.size, std::memory_order_relaxed);
  if (wire_bytes != nullptr) *wire_bytes = header.size() + payload.size;
  ++next_send_seq_;
  frames_sent_.fetch_add(1, std::memory_order_relaxed);
  return Status::OK();
}

Result<proto::Message> FrameChannel::Receive(Millis timeout, uint64_t* wire_bytes) {
  const SteadyClock::time_point deadline = SteadyClock::now() + timeout;
  for (;;) {
    if (broken()) {
      std::lock_guard<std::mutex> lock(error_mu_);
      return error_;
    }
    proto::Frame frame;
    if (handshake_ && rbuf_end_ - rbuf_start_ > 5) {
      // The type byte is checked as soon as it arrives: nothing of another
      // message is read, allocated or parsed before authentication.
      const auto type = proto::MsgType(rbuf_[rbuf_start_ + 5]);
      if (!(type == proto::MsgType::kHello || type == proto::MsgType::kChallenge || type == proto::MsgType::kAuth ||
            type == proto::MsgType::kAuthResult)) {
        return Fail(Status::InvalidArgument(peer_ + ": message type " + std::to_string(int(type)) +
                                            " before authentication"));
      }
    }
    const uint32_t cap = handshake_ ? std::min(options_.max_payload, proto::kHandshakeMaxPayload)
                                    : options_.max_payload;
    proto::DecodeOutcome o =
        proto::DecodeFrame(ByteSpan(rbuf_.data() + rbuf_start_, rbuf_end_ - rbuf_start_), &frame, cap);
    if (o.state == proto::DecodeState::kBad) return Fail(o.error.WithContext("receive from " + peer_));
    if (o.state == proto::DecodeState::kComplete) {
      rbuf_start_ += o.consumed;
      if (rbuf_start_ == rbuf_end_) rbuf_start_ = rbuf_end_ = 0;
      if (frame.sequence != next_recv_seq_) {
        return Fail(Status::Corruption(peer_ + ": frame sequence " + std::to_string(frame.sequence) +
                                       " where " + std::to_string(next_recv_seq_) + " was due"));
      }
      ++next_recv_seq_;
      frames_received_.fetch_add(1, std::memory_order_relaxed);
      Result<proto::Message> m = proto::ParseMessage(frame);
      if (!m.ok()) return Fail(m.status().WithContext("receive from " + peer_));
      if (wire_bytes != nullptr) *wire_bytes = o.consumed;
      return m;
    }

    // Need more bytes. Make room: slide the undecoded bytes to the front and
    // grow to hold the whole frame once its header (and so its length, already
    // checked against max_payload by DecodeFrame) is known.
    SteadyClock::duration left = deadline - SteadyClock::now();
    if (left <= SteadyClock::duration::zero()) {
      return Status::Busy(peer_ + ": no complete frame within " + std::to_string(timeout.count()) + " ms");
    }
    const size_t have = rbuf_end_ - rbuf_start_;
    if (have == 0 && rbuf_.size() > kShrinkAbove) {
      Bytes fresh(kReadChunk);  // a large frame has passed; give the memory back
      rbuf_.swap(fresh);
      rbuf_start_ = rbuf_end_ = 0;
    }
    size_t want = have + kMinFree;
    if (have >= proto::kHeaderSize) {
      want = std::max(want, proto::kHeaderSize + DecodeFixed32(rbuf_.data() + rbuf_start_ + 8) + kMinFree);
    }
    if (rbuf_.size() - rbuf_start_ < want) {
      if (rbuf_start_ > 0) {
        std::memmove(rbuf_.data(), rbuf_.data() + rbuf_start_, have);
        rbuf_start_ = 0;
        rbuf_end_ = have;
      }
      if (rbuf_.size() < want) rbuf_.resize(std::max(want, rbuf_.size() * 2));
    }

    Result<size_t> n = stream_->ReadSome(std::span<uint8_t>(rbuf_.data() + rbuf_end_, rbuf_.size() - rbuf_end_),
                                         deadline);
    if (n.ok()) {
      rbuf_end_ += *n;
      bytes_received_.fetch_add(*n, std::memory_order_relaxed);
    }
    if (closed_.load(std::memory_order_acquire)) return Fail(Status::Aborted(peer_ + ": channel closed"));
    if (n.ok() || n.status().IsBusy()) continue;  // decode what came; a timeout is reported above
    return Fail(n.status());
  }
}

// ---- connecting ----

namespace {

Result<std::unique_ptr<FrameChannel>> AdoptWrapped(Result<std::unique_ptr<ByteStream>> transport,
                                                  FrameChannel::Options options, const StreamWrapper& wrap) {
  if (!transport.ok()) return transport.status();
  std::unique_ptr<ByteStream> stream = std::move(*transport);
  if (wrap) {
    CDP_ASSIGN_OR_RETURN(stream, wrap(std::move(stream)));
  }
  return FrameChannel::Adopt(std::move(stream), options);
}

}  // namespace

Result<std::unique_ptr<FrameChannel>> Connect(const std::string& host, uint16_t port, Millis timeout,
                                              FrameChannel::Options options, const StreamWrapper& wrap) {
  return AdoptWrapped(ConnectTcpStream(host, port, timeout), options, wrap);
}

Result<std::unique_ptr<FrameChannel>> ConnectUnix(const std::string& path, Millis timeout,
                                                  FrameChannel::Options options, const StreamWrapper& wrap) {
  return AdoptWrapped(ConnectUnixStream(path, timeout), options, wrap);
}

// ---- handshake ----

namespace {

Millis Left(SteadyClock::time_point deadline) {
  auto left = std::chrono::duration_cast<Millis>(deadline - SteadyClock::now());
  return std::max(left, Millis(0));
}

// Receives the next message, which must be a T. Any failure closes the channel.
template <typename T>
Result<T> Expect(FrameChannel& ch, SteadyClock::time_point deadline, const char* what) {
  Result<proto::Message> m = ch.Receive(Left(deadline));
  if (!m.ok()) {
    ch.Close();
    if (m.status().IsBusy()) {
      return Status::Unavailable(ch.peer() + ": handshake timed out waiting for " + what);
    }
    return m.status().WithContext(std::string("handshake: waiting for ") + what);
  }
  if (!std::holds_alternative<T>(*m)) {
    ch.Close();
    return Status::InvalidArgument(ch.peer() + ": handshake: expected " + what + ", got message type " +
                                   std::to_string(int(proto::TypeOf(*m))));
  }
  return std::get<T>(std::move(*m));
}

Status Abort(FrameChannel& ch, Status s) {
  ch.Close();
  return s;
}

// Handshake mode (FrameChannel::SetHandshakeMode) while in scope.
class HandshakeMode {
 public:
  explicit HandshakeMode(FrameChannel& ch) : ch_(ch) { ch_.SetHandshakeMode(true); }
  ~HandshakeMode() { ch_.SetHandshakeMode(false); }
  HandshakeMode(const HandshakeMode&) = delete;
  HandshakeMode& operator=(const HandshakeMode&) = delete;

 private:
  FrameChannel& ch_;
};

}  // namespace

Status ClientHandshake(FrameChannel& ch, proto::Role role, const std::string& tenant,
                       const std::string& client_id, const std::string& secret, Millis timeout) {
  const SteadyClock::time_point deadline = SteadyClock::now() + timeout;
  HandshakeMode mode(ch);
  if (!ValidName(tenant)) return Abort(ch, Status::InvalidArgument("handshake: invalid tenant name"));
  if (!ValidName(client_id)) return Abort(ch, Status::InvalidArgument("handshake: invalid client_id"));
  if (secret.empty()) return Abort(ch, Status::InvalidArgument("handshake: empty secret"));

  std::span<const uint8_t> binding;
  if (const TlsPeer* tls = ch.tls_peer()) {
    // A direct agent's server is a master target (see channel.h).
    const bool agent = role == proto::Role::kAgent;
    const bool fits = agent ? (tls->role == "ps" || tls->role == "mt")
                            : role == proto::Role::kProcessServer && tls->role == "mt";
    if (!fits) {
      return Abort(ch, Status::PermissionDenied(ch.peer() + ": server certificate '" + tls->name + "' has role '" +
                                                tls->role + "', expected " +
                                                (agent ? "'ps' (or 'mt' for a direct agent)" : "'mt'")));
    }
    binding = std::span<const uint8_t>(tls->binding.data(), tls->binding.size());
  }
  Result<auth::Nonce> nc = auth::RandomNonce();
  if (!nc.ok()) return Abort(ch, nc.status());
  proto::Hello hello{role, tenant, client_id, *nc};
  Status s = ch.Send(hello);
  if (!s.ok()) return Abort(ch, s.WithContext("handshake"));

  Result<proto::Challenge> challenge = Expect<proto::Challenge>(ch, deadline, "Challenge");
  if (!challenge.ok()) return challenge.status();
  Result<auth::Proof> expected = auth::ServerProof(secret, *nc, challenge->server_nonce, tenant, binding);
  if (!expected.ok()) return Abort(ch, expected.status());
  if (!auth::ProofsEqual(*expected, challenge->server_proof)) {
    // Tell the server we refuse, without giving it a real proof to work on.
    (void)ch.Send(proto::Auth{});
    return Abort(ch, Status::PermissionDenied(ch.peer() + ": authentication failed"));
  }

  Result<auth::Proof> proof = auth::ClientProof(secret, challenge->server_nonce, *nc, tenant, binding);
  if (!proof.ok()) return Abort(ch, proof.status());
  s = ch.Send(proto::Auth{*proof});
  if (!s.ok()) return Abort(ch, s.WithContext("handshake"));

  Result<proto::AuthResult> result = Expect<proto::AuthResult>(ch, deadline, "AuthResult");
  if (!result.ok()) return result.status();
  if (!result->accepted) {
    return Abort(ch, Status::PermissionDenied(ch.peer() + ": authentication failed: server refused: " +
                                              result->reason));
  }
  return Status::OK();
}

Result<std::string> ServerHandshake(
    FrameChannel& ch, const std::function<std::optional<std::string>(const std::string& tenant)>& secret_lookup,
    Millis timeout, PeerIdentity* peer) {
  const SteadyClock::time_point deadline = SteadyClock::now() + timeout;
  HandshakeMode mode(ch);
  Result<proto::Hello> hello = Expect<proto::Hello>(ch, deadline, "Hello");
  if (!hello.ok()) return hello.status();

  // Over TLS the certificate names the tenant and the role; a Hello claiming
  // others is refused like a wrong secret.
  const TlsPeer* tls = ch.tls_peer();
  std::span<const uint8_t> binding;
  std::string mismatch;
  proto::Role role = hello->role;
  if (tls != nullptr) {
    binding = std::span<const uint8_t>(tls->binding.data(), tls->binding.size());
    if (tls->role == "agent") role = proto::Role::kAgent;
    else if (tls->role == "ps") role = proto::Role::kProcessServer;
    else mismatch = "certificate role '" + tls->role + "' may not open a session";
    if (mismatch.empty() && role != hello->role) {
      mismatch = "Hello claims role " + std::to_string(int(hello->role)) + " but the certificate is '" + tls->role + "'";
    }
    if (mismatch.empty() && tls->tenant != hello->tenant) {
      mismatch = "Hello claims tenant '" + hello->tenant + "' but the certificate is tenant '" + tls->tenant + "'";
    }
  }

  // An unknown tenant gets a random secret: the exchange goes on exactly as for
  // a known tenant with a wrong secret, so the two cannot be told apart.
  std::optional<std::string> secret = secret_lookup(hello->tenant);
  const bool known = secret.has_value() && !secret->empty() && mismatch.empty();
  std::string key;
  if (known) {
    key = std::move(*secret);
  } else {
    Result<auth::Nonce> random = auth::RandomNonce();
    if (!random.ok()) return Abort(ch, random.status());
    key.assign(reinterpret_cast<const char*>(random->data()), random->size());
  }

  Result<auth::Nonce> ns = auth::RandomNonce();
  if (!ns.ok()) return Abort(ch, ns.status());
  Result<auth::Proof> server_proof = auth::ServerProof(key, hello->client_nonce, *ns, hello->tenant, binding);
  if (!server_proof.ok()) return Abort(ch, server_proof.status());
  Status s = ch.Send(proto::Challenge{*ns, *server_proof});
  if (!s.ok()) return Abort(ch, s.WithContext("handshake"));

  Result<proto::Auth> auth_msg = Expect<proto::Auth>(ch, deadline, "Auth");
  if (!auth_msg.ok()) return auth_msg.status();
  Result<auth::Proof> expected = auth::ClientProof(key, *ns, hello->client_nonce, hello->tenant, binding);
  if (!expected.ok()) return Abort(ch, expected.status());
  const bool proof_ok = auth::ProofsEqual(*expected, auth_msg->client_proof);
  if (!proof_ok || !known) {
    (void)ch.Send(proto::AuthResult{false, "authentication failed"});
    return Abort(ch, Status::PermissionDenied(ch.peer() + ": authentication failed for tenant '" +
                                              hello->tenant + "' (client '" + hello->client_id + "')" +
                                              (mismatch.empty() ? "" : ": " + mismatch)));
  }
  s = ch.Send(proto::AuthResult{true, ""});
  if (!s.ok()) return Abort(ch, s.WithContext("handshake"));
  if (peer != nullptr) {
    *peer = PeerIdentity{role, hello->tenant, hello->client_id, tls != nullptr, tls ? tls->name : std::string()};
  }
  return hello->tenant;
}

}  // namespace cdp

// SPDX-License-Identifier: Apache-2.0
// FrameChannel over loopback TCP and unix sockets, the handshake, the auth
// primitives and the Asio error mapping.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/write.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "common/base/asio_status.h"
#include "common/crypto/auth.h"
#include "common/wire/channel.h"
#include "common/wire/frame_inbox.h"

namespace cdp {
namespace {

namespace asio = boost::asio;
using std::chrono::milliseconds;
using tcp = asio::ip::tcp;

// A listening socket on 127.0.0.1 with an ephemeral port.
struct Listener {
  asio::io_context ctx;
  tcp::acceptor acceptor{ctx, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)};
  uint16_t port() const { return acceptor.local_endpoint().port(); }
  std::unique_ptr<FrameChannel> AcceptChannel() {
    tcp::socket s(ctx);
    acceptor.accept(s);
    Result<std::unique_ptr<FrameChannel>> ch = FrameChannel::Adopt(std::move(s));
    REQUIRE(ch.ok());
    return std::move(*ch);
  }
  tcp::socket AcceptRaw() {
    tcp::socket s(ctx);
    acceptor.accept(s);
    return s;
  }
};

// A connected pair of channels over loopback TCP.
std::pair<std::unique_ptr<FrameChannel>, std::unique_ptr<FrameChannel>> Pair() {
  Listener l;
  auto server = std::async(std::launch::async, [&l] { return l.AcceptChannel(); });
  Result<std::unique_ptr<FrameChannel>> client = Connect("127.0.0.1", l.port(), milliseconds(5000));
  REQUIRE(client.ok());
  return {std::move(*client), server.get()};
}

// Raw bytes to a channel: a plain socket the test writes frames into.
struct RawPeer {
  Listener l;
  asio::io_context ctx;
  tcp::socket sock{ctx};
  std::unique_ptr<FrameChannel> server;
  RawPeer() {
    auto fut = std::async(std::launch::async, [this] { return l.AcceptChannel(); });
    sock.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), l.port()));
    server = fut.get();
  }
  void Write(const Bytes& b) { asio::write(sock, asio::buffer(b)); }
};

TEST_CASE("messages cross a loopback channel both ways in order", "[channel]") {
  auto [client, server] = Pair();
  CHECK(client->peer().rfind("127.0.0.1:", 0) == 0);
  for (uint64_t i = 1; i <= 50; ++i) {
    REQUIRE(client->Send(proto::Ack{1, i}).ok());
  }
  for (uint64_t i = 1; i <= 50; ++i) {
    Result<proto::Message> m = server->Receive(milliseconds(5000));
    REQUIRE(m.ok());
    CHECK(std::get<proto::Ack>(*m).durable_seq == i);
  }
  REQUIRE(server->Send(proto::Heartbeat{11, 22}).ok());
  Result<proto::Message> hb = client->Receive(milliseconds(5000));
  REQUIRE(hb.ok());
  CHECK(std::get<proto::Heartbeat>(*hb).echo_us == 22);
  CHECK(client->frames_sent() == 50);
  CHECK(server->frames_received() == 50);
  CHECK(client->bytes_sent() == server->bytes_received());
}

TEST_CASE("a large compressed batch crosses a channel intact", "[channel]") {
  auto [client, server] = Pair();
  proto::WriteBatch wb;
  wb.volume_id = 4;
  wb.codec = proto::Codec::kZstd;
  Bytes data(8u << 20);
  for (size_t i = 0; i < data.size(); ++i) data[i] = uint8_t((i * 2654435761u) >> 13);
  wb.records.push_back({1, 0, uint32_t(data.size()), proto::RecordKind::kData, 5, data});
  wb.records.push_back({2, 0, 0, proto::RecordKind::kFlush, 6, {}});
  // Send from another thread while this one receives (no deadlock on full buffers).
  auto sent = std::async(std::launch::async, [&c = client, &wb] { return c->Send(wb); });
  Result<proto::Message> m = server->Receive(milliseconds(20000));
  REQUIRE(sent.get().ok());
  REQUIRE(m.ok());
  const auto& got = std::get<proto::WriteBatch>(*m);
  REQUIRE(got.records.size() == 2);
  CHECK(got.records[0].data == data);
  CHECK(got.records[1].kind == proto::RecordKind::kFlush);
}

TEST_CASE("a receive timeout is kBusy and leaves the channel usable", "[channel]") {
  auto [client, server] = Pair();
  auto t0 = std::chrono::steady_clock::now();
  Result<proto::Message> m = server->Receive(milliseconds(100));
  auto waited = std::chrono::steady_clock::now() - t0;
  REQUIRE(!m.ok());
  CHECK(m.status().code() == Code::kBusy);
  CHECK(waited >= milliseconds(100));
  CHECK(waited < milliseconds(5000));
  CHECK(!server->broken());
  REQUIRE(client->Send(proto::Heartbeat{1, 0}).ok());
  REQUIRE(server->Receive(milliseconds(5000)).ok());
}

TEST_CASE("half a frame then a timeout, then the rest, yields the frame", "[channel]") {
  RawPeer p;
  Result<Bytes> f = proto::EncodeMessage(proto::Heartbeat{5, 6}, 1);
  REQUIRE(f.ok());
  p.Write(Bytes(f->begin(), f->begin() + 10));
  Result<proto::Message> m = p.server->Receive(milliseconds(100));
  REQUIRE(!m.ok());
  CHECK(m.status().code() == Code::kBusy);
  p.Write(Bytes(f->begin() + 10, f->end()));
  m = p.server->Receive(milliseconds(5000));
  REQUIRE(m.ok());
  CHECK(std::get<proto::Heartbeat>(*m).sent_us == 5);
}

TEST_CASE("a frame with the wrong sequence is kCorruption", "[channel]") {
  RawPeer p;
  Result<Bytes> f1 = proto::EncodeMessage(proto::Heartbeat{1, 0}, 1);
  Result<Bytes> f3 = proto::EncodeMessage(proto::Heartbeat{3, 0}, 3);
  REQUIRE((f1.ok() && f3.ok()));
  p.Write(*f1);
  p.Write(*f3);
  REQUIRE(p.server->Receive(milliseconds(5000)).ok());
  Result<proto::Message> m = p.server->Receive(milliseconds(5000));
  REQUIRE(!m.ok());
  CHECK(m.status().code() == Code::kCorruption);
  CHECK(p.server->broken());
  // Broken for good: the same error again, and sends fail too.
  CHECK(p.server->Receive(milliseconds(10)).status().code() == Code::kCorruption);
  CHECK(p.server->Send(proto::Heartbeat{}).code() == Code::kCorruption);
}

TEST_CASE("garbage and a damaged frame are kCorruption", "[channel]") {
  {
    RawPeer p;
    std::string http = "GET /metrics HTTP/1.1\r\n\r\n";
    p.Write(Bytes(http.begin(), http.end()));
    CHECK(p.server->Receive(milliseconds(5000)).status().code() == Code::kCorruption);
  }
  {
    RawPeer p;
    Result<Bytes> f = proto::EncodeMessage(proto::Ack{1, 2}, 1);
    REQUIRE(f.ok());
    (*f)[f->size() - 1] ^= 0x10;
    p.Write(*f);
    CHECK(p.server->Receive(milliseconds(5000)).status().code() == Code::kCorruption);
  }
}

TEST_CASE("the peer closing is kUnavailable and retryable", "[channel]") {
  auto [client, server] = Pair();
  REQUIRE(client->Send(proto::Ack{1, 1}).ok());
  client.reset();
  // The frame sent before the close is still delivered.
  REQUIRE(server->Receive(milliseconds(5000)).ok());
  Result<proto::Message> m = server->Receive(milliseconds(5000));
  REQUIRE(!m.ok());
  CHECK(m.status().code() == Code::kUnavailable);
  CHECK(m.status().retryable());
}

TEST_CASE("Close from another thread ends a blocked Receive with kAborted", "[channel]") {
  auto [client, server] = Pair();
  auto recv = std::async(std::launch::async, [&s = server] { return s->Receive(milliseconds(60000)); });
  server->Close();
  REQUIRE(recv.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  Result<proto::Message> m = recv.get();
  REQUIRE(!m.ok());
  CHECK(m.status().code() == Code::kAborted);
  // The client notices too.
  CHECK(client->Receive(milliseconds(5000)).status().code() == Code::kUnavailable);
}

TEST_CASE("a send to a peer that stops reading times out", "[channel]") {
  Listener l;
  auto raw = std::async(std::launch::async, [&l] { return l.AcceptRaw(); });
  FrameChannel::Options opts;
  opts.send_timeout = milliseconds(300);
  Result<std::unique_ptr<FrameChannel>> client = Connect("127.0.0.1", l.port(), milliseconds(5000), opts);
  REQUIRE(client.ok());
  tcp::socket peer = raw.get();  // never reads
  proto::WriteBatch wb;
  wb.volume_id = 1;
  wb.records.push_back({1, 0, 4u << 20, proto::RecordKind::kData, 0, Bytes(4u << 20, 0x33)});
  Status s;
  uint64_t seq = 1;
  for (int i = 0; i < 64 && s.ok(); ++i) {
    wb.records[0].seq = seq++;
    s = (*client)->Send(wb);
  }
  CHECK(s.code() == Code::kUnavailable);
  CHECK((*client)->broken());
}

TEST_CASE("Connect to a closed port fails fast as kUnavailable", "[channel]") {
  uint16_t port;
  {
    Listener l;
    port = l.port();
  }
  Result<std::unique_ptr<FrameChannel>> c = Connect("127.0.0.1", port, milliseconds(5000));
  REQUIRE(!c.ok());
  CHECK(c.status().code() == Code::kUnavailable);
}

TEST_CASE("a unix-domain channel works like a TCP one", "[channel]") {
  char dir_template[] = "/tmp/cdp-channel-XXXXXX";
  REQUIRE(mkdtemp(dir_template) != nullptr);
  std::string path = std::string(dir_template) + "/s.sock";
  asio::io_context ctx;
  asio::local::stream_protocol::acceptor acceptor(ctx, asio::local::stream_protocol::endpoint(path));
  auto server = std::async(std::launch::async, [&] {
    asio::local::stream_protocol::socket s(ctx);
    acceptor.accept(s);
    return FrameChannel::Adopt(std::move(s));
  });
  Result<std::unique_ptr<FrameChannel>> client = ConnectUnix(path, milliseconds(5000));
  REQUIRE(client.ok());
  Result<std::unique_ptr<FrameChannel>> srv = server.get();
  REQUIRE(srv.ok());
  CHECK((*client)->peer() == "unix:" + path);
  REQUIRE((*client)->Send(proto::Stats{{{"x", 1.0}}}).ok());
  Result<proto::Message> m = (*srv)->Receive(milliseconds(5000));
  REQUIRE(m.ok());
  CHECK(std::get<proto::Stats>(*m).values.at(0).first == "x");
  CHECK(ConnectUnix(std::string(dir_template) + "/missing.sock", milliseconds(1000)).status().code() ==
        Code::kUnavailable);
  ::unlink(path.c_str());
  ::rmdir(dir_template);
}

// ---- handshake ----

struct HandshakeOutcome {
  Status client;
  Result<std::string> server = Status::Aborted("not run");
  PeerIdentity identity;
};

HandshakeOutcome RunHandshake(const std::string& tenant, const std::string& secret) {
  const std::map<std::string, std::string> secrets = {{"acme", "s3cret-acme-0123456789"},
                                                      {"globex", "globex-secret-abcdef"}};
  auto [client, server] = Pair();
  HandshakeOutcome out;
  auto srv = std::async(std::launch::async, [&] {
    return ServerHandshake(
        *server,
        [&secrets](const std::string& t) -> std::optional<std::string> {
          auto it = secrets.find(t);
          if (it == secrets.end()) return std::nullopt;
          return it->second;
        },
        milliseconds(5000), &out.identity);
  });
  out.client = ClientHandshake(*client, proto::Role::kAgent, tenant, "host-1", secret, milliseconds(5000));
  out.server = srv.get();
  if (out.client.ok()) {
    // The authenticated channel carries traffic.
    REQUIRE(client->Send(proto::Ack{1, 1}).ok());
    REQUIRE(server->Receive(milliseconds(5000)).ok());
  }
  return out;
}

TEST_CASE("handshake succeeds with the right secret", "[channel][auth]") {
  HandshakeOutcome o = RunHandshake("acme", "s3cret-acme-0123456789");
  REQUIRE(o.client.ok());
  REQUIRE(o.server.ok());
  CHECK(*o.server == "acme");
  CHECK(o.identity.tenant == "acme");
  CHECK(o.identity.client_id == "host-1");
  CHECK(o.identity.role == proto::Role::kAgent);
}

TEST_CASE("wrong secret and unknown tenant fail alike", "[channel][auth]") {
  HandshakeOutcome wrong = RunHandshake("acme", "not-the-secret");
  HandshakeOutcome unknown = RunHandshake("initech", "s3cret-acme-0123456789");
  HandshakeOutcome other = RunHandshake("acme", "globex-secret-abcdef");  // another tenant's secret
  for (const HandshakeOutcome* o : {&wrong, &unknown, &other}) {
    CHECK(o->client.code() == Code::kPermissionDenied);
    CHECK(o->server.status().code() == Code::kPermissionDenied);
  }
  // The client sees the same text for both; only the peer's port differs.
  auto strip_peer = [](const std::string& s) { return s.substr(s.find(": ")); };
  CHECK(strip_peer(wrong.client.message()) == strip_peer(unknown.client.message()));
  CHECK(strip_peer(wrong.client.message()) == strip_peer(other.client.message()));
  CHECK(strip_peer(wrong.client.message()) == ": authentication failed");
}

TEST_CASE("a silent client times the server handshake out", "[channel][auth]") {
  auto [client, server] = Pair();
  auto t0 = std::chrono::steady_clock::now();
  Result<std::string> r = ServerHandshake(
      *server, [](const std::string&) { return std::optional<std::string>("x"); }, milliseconds(200));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  REQUIRE(!r.ok());
  CHECK(r.status().code() == Code::kUnavailable);
  CHECK(server->broken());
}

TEST_CASE("a client skipping the handshake is refused", "[channel][auth]") {
  auto [client, server] = Pair();
  auto srv = std::async(std::launch::async, [&s = server] {
    return ServerHandshake(
        *s, [](const std::string&) { return std::optional<std::string>("x"); }, milliseconds(5000));
  });
  REQUIRE(client->Send(proto::Ack{1, 1}).ok());
  Result<std::string> r = srv.get();
  REQUIRE(!r.ok());
  CHECK(r.status().code() == Code::kInvalidArgument);
}

TEST_CASE("before authentication a header claiming 64 MiB breaks the channel at once", "[channel][auth][security]") {
  RawPeer p;
  auto srv = std::async(std::launch::async, [&p] {
    return ServerHandshake(
        *p.server, [](const std::string&) { return std::optional<std::string>("x"); }, milliseconds(10000));
  });
  // A real Hello's header, its length field raised to 64 MiB; no payload follows.
  Result<Bytes> hello = proto::EncodeMessage(proto::Hello{proto::Role::kAgent, "t", "c", {}}, 1);
  REQUIRE(hello.ok());
  Bytes header(hello->begin(), hello->begin() + proto::kHeaderSize);
  EncodeFixed32(header.data() + 8, 64u << 20);
  const auto t0 = std::chrono::steady_clock::now();
  p.Write(header);
  Result<std::string> r = srv.get();
  // Refused on the header alone, not after the 10 s handshake deadline.
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  REQUIRE(!r.ok());
  CHECK(r.status().code() == Code::kCorruption);
  CHECK(r.status().message().find("payload length 67108864 over the cap") != std::string::npos);
}

TEST_CASE("before authentication a write batch is refused on its type byte, never decompressed",
          "[channel][auth][security]") {
  RawPeer p;
  auto srv = std::async(std::launch::async, [&p] {
    return ServerHandshake(
        *p.server, [](const std::string&) { return std::optional<std::string>("x"); }, milliseconds(10000));
  });
  proto::WriteBatch b;
  b.volume_id = 1;
  b.codec = proto::Codec::kZstd;
  b.level = 1;
  proto::Record rec;
  rec.seq = 1;
  rec.length = 1u << 20;
  rec.data.assign(1u << 20, 0);  // compresses to almost nothing
  b.records.push_back(rec);
  Result<Bytes> frame = proto::EncodeMessage(b, 1);
  REQUIRE(frame.ok());
  // Only the first 6 bytes: the type byte alone is enough to refuse it.
  p.Write(Bytes(frame->begin(), frame->begin() + 6));
  Result<std::string> r = srv.get();
  REQUIRE(!r.ok());
  CHECK(r.status().code() == Code::kInvalidArgument);
  CHECK(r.status().message().find("message type 7 before authentication") != std::string::npos);
}

TEST_CASE("client handshake refuses bad arguments before sending", "[channel][auth]") {
  auto [client, server] = Pair();
  CHECK(ClientHandshake(*client, proto::Role::kAgent, "../x", "h", "s", milliseconds(1000)).code() ==
        Code::kInvalidArgument);
}

TEST_CASE("HMAC-SHA256 matches RFC 4231 and proofs are distinct", "[auth]") {
  Result<auth::Proof> p = auth::HmacSha256("Jefe", "what do ya want for nothing?");
  REQUIRE(p.ok());
  std::string hex;
  for (uint8_t b : *p) {
    char t[3];
    std::snprintf(t, sizeof t, "%02x", b);
    hex += t;
  }
  CHECK(hex == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");

  Result<auth::Nonce> a = auth::RandomNonce(), b = auth::RandomNonce();
  REQUIRE((a.ok() && b.ok()));
  CHECK(*a != *b);
  Result<auth::Proof> sp = auth::ServerProof("k", *a, *b, "acme");
  Result<auth::Proof> cp = auth::ClientProof("k", *a, *b, "acme");
  Result<auth::Proof> sp2 = auth::ServerProof("k", *a, *b, "acme");
  Result<auth::Proof> other_tenant = auth::ServerProof("k", *a, *b, "acmf");
  REQUIRE((sp.ok() && cp.ok() && sp2.ok() && other_tenant.ok()));
  CHECK(!auth::ProofsEqual(*sp, *cp));
  CHECK(auth::ProofsEqual(*sp, *sp2));
  CHECK(!auth::ProofsEqual(*sp, *other_tenant));
}

TEST_CASE("Asio errors map to the documented Status codes", "[channel]") {
  namespace e = asio::error;
  CHECK(FromAsioError({}, "x").ok());
  for (auto ec : {make_error_code(e::eof), make_error_code(e::connection_reset), make_error_code(e::broken_pipe),
                  make_error_code(e::timed_out), make_error_code(e::connection_refused)}) {
    Status s = FromAsioError(ec, "recv");
    CHECK(s.code() == Code::kUnavailable);
    CHECK(s.retryable());
    CHECK(s.message().rfind("recv: ", 0) == 0);
  }
  CHECK(FromAsioError(make_error_code(e::operation_aborted), "x").code() == Code::kAborted);
  CHECK(FromAsioError(make_error_code(e::access_denied), "x").code() == Code::kPermissionDenied);
  CHECK(FromAsioError(make_error_code(e::address_in_use), "x").code() == Code::kAlreadyExists);
  Status other = FromAsioError(make_error_code(e::message_size), "x");
  CHECK(other.code() == Code::kIOError);
  CHECK(other.errno_value() == EMSGSIZE);
}

// ---- FrameInbox ----

proto::WriteBatch InboxBatch(uint32_t vid, uint64_t first_seq, size_t records, size_t bytes = 512) {
  proto::WriteBatch wb;
  wb.volume_id = vid;
  for (size_t i = 0; i < records; ++i)
    wb.records.push_back({first_seq + i, 0, uint32_t(bytes), proto::RecordKind::kData, 1, Bytes(bytes, uint8_t(i))});
  return wb;
}

// Waits (deadline 10 s) until the gauge reaches at least `bytes`.
bool WaitGauge(const metrics::Gauge& g, int64_t bytes) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (g.Value() < bytes) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(1));
  }
  return true;
}

TEST_CASE("inbox: messages come out in order, and PopBatchFor takes only the batch that continues the volume's "
          "sequence within the work given",
          "[channel][inbox]") {
  auto [client, server] = Pair();
  metrics::Gauge queued;
  FrameInbox inbox(*server, 64u << 20, &queued);
  REQUIRE(client->Send(InboxBatch(1, 1, 2)).ok());
  REQUIRE(client->Send(InboxBatch(1, 3, 1)).ok());
  REQUIRE(client->Send(InboxBatch(1, 7, 1)).ok());
  REQUIRE(client->Send(InboxBatch(2, 8, 1)).ok());
  REQUIRE(client->Send(proto::Heartbeat{5, 0}).ok());
  auto first = inbox.Pop(milliseconds(5000));
  REQUIRE(first.ok());
  CHECK(std::get<proto::WriteBatch>(*first).records.front().seq == 1);
  // Four more messages, each charged at least its record data.
  REQUIRE(WaitGauge(queued, 3 * 512));
  const size_t kAny = proto::kMaxRecords;

  CHECK_FALSE(inbox.PopBatchFor(2, 3, 1u << 20, kAny));  // another volume's
  CHECK_FALSE(inbox.PopBatchFor(1, 4, 1u << 20, kAny));  // not the sequence that follows
  CHECK_FALSE(inbox.PopBatchFor(1, 3, 100, kAny));       // over the work given
  CHECK_FALSE(inbox.PopBatchFor(1, 3, 512, 0));          // over the records given
  auto next = inbox.PopBatchFor(1, 3, 512, kAny);
  REQUIRE(next);
  CHECK(next->records.front().seq == 3);
  CHECK_FALSE(inbox.PopBatchFor(1, 4, 1u << 20, kAny));  // seq 7 is next: a gap
  auto gap = inbox.Pop(milliseconds(5000));
  REQUIRE(gap.ok());
  CHECK(std::get<proto::WriteBatch>(*gap).records.front().seq == 7);
  CHECK_FALSE(inbox.PopBatchFor(1, 8, 1u << 20, kAny));  // volume 2's batch is next
  auto other = inbox.Pop(milliseconds(5000));
  REQUIRE(other.ok());
  CHECK(std::get<proto::WriteBatch>(*other).volume_id == 2);
  CHECK_FALSE(inbox.PopBatchFor(2, 9, 1u << 20, kAny));  // a heartbeat is next
  auto hb = inbox.Pop(milliseconds(5000));
  REQUIRE(hb.ok());
  CHECK(std::get<proto::Heartbeat>(*hb).sent_us == 5);
  CHECK(queued.Value() == 0);
  auto none = inbox.Pop(milliseconds(20));
  REQUIRE_FALSE(none.ok());
  CHECK(none.status().IsBusy());
}

TEST_CASE("inbox: an urgent message is handed over by the reader while the messages before it wait in the queue",
          "[channel][inbox]") {
  auto [client, server] = Pair();
  std::mutex mu;
  std::condition_variable cv;
  std::vector<uint64_t> urgent;
  FrameInbox inbox(*server, 64u << 20, nullptr, nullptr, [&](proto::Message& m) {
    auto* h = std::get_if<proto::GroupHeld>(&m);
    if (h == nullptr) return false;
    std::lock_guard<std::mutex> l(mu);
    urgent.push_back(h->round);
    cv.notify_all();
    return true;
  });
  REQUIRE(client->Send(InboxBatch(1, 1, 2)).ok());
  REQUIRE(client->Send(proto::GroupHeld{9, proto::GroupHoldStatus::kHeld, ""}).ok());
  REQUIRE(client->Send(proto::Heartbeat{5, 0}).ok());
  {
    // Nobody has popped the batch before it: the answer is out all the same.
    std::unique_lock<std::mutex> l(mu);
    REQUIRE(cv.wait_for(l, std::chrono::seconds(10), [&] { return !urgent.empty(); }));
    CHECK(urgent == std::vector<uint64_t>{9});
  }
  auto first = inbox.Pop(milliseconds(5000));
  REQUIRE(first.ok());
  CHECK(std::holds_alternative<proto::WriteBatch>(*first));
  auto second = inbox.Pop(milliseconds(5000));
  REQUIRE(second.ok());
  CHECK(std::holds_alternative<proto::Heartbeat>(*second));  // the urgent one was not queued
}

TEST_CASE("inbox: the channel's end comes after the messages before it, then again on every Pop", "[channel][inbox]") {
  auto [client, server] = Pair();
  FrameInbox inbox(*server, 1u << 20);
  REQUIRE(client->Send(proto::Heartbeat{1, 0}).ok());
  REQUIRE(client->Send(proto::Heartbeat{2, 0}).ok());
  client.reset();  // the peer closes
  for (uint64_t i = 1; i <= 2; ++i) {
    auto m = inbox.Pop(milliseconds(5000));
    REQUIRE(m.ok());
    CHECK(std::get<proto::Heartbeat>(*m).sent_us == i);
  }
  for (int i = 0; i < 2; ++i) {
    auto end = inbox.Pop(milliseconds(5000));
    REQUIRE_FALSE(end.ok());
    CHECK(end.status().code() == Code::kUnavailable);
  }
}

TEST_CASE("inbox: the reader stops receiving at max_bytes and goes on as messages are taken", "[channel][inbox]") {
  auto [client, server] = Pair();
  metrics::Gauge queued;
  const uint64_t max = 1u << 20;
  FrameInbox inbox(*server, max, &queued);
  constexpr int kBatches = 10;
  constexpr size_t kBytes = 512u << 10;
  auto sender = std::async(std::launch::async, [&c = client] {
    for (int i = 0; i < kBatches; ++i) {
      Status s = c->Send(InboxBatch(1, uint64_t(i) + 1, 1, kBytes));
      if (!s.ok()) return s;
    }
    return Status::OK();
  });
  // Two batches reach max_bytes: the reader waits, the rest stays in the socket.
  REQUIRE(WaitGauge(queued, int64_t(max)));
  const int64_t held = queued.Value();
  CHECK(held < int64_t(max + kBytes + 4096));  // max_bytes plus at most one frame
  for (int i = 0; i < kBatches; ++i) {
    auto m = inbox.Pop(milliseconds(10000));
    REQUIRE(m.ok());
    const auto& wb = std::get<proto::WriteBatch>(*m);
    CHECK(wb.records.front().seq == uint64_t(i) + 1);
    CHECK(wb.records.front().data == Bytes(kBytes, 0));
    CHECK(queued.Value() < int64_t(max + kBytes + 4096));
  }
  REQUIRE(sender.get().ok());
  CHECK(queued.Value() == 0);
}

}  // namespace
}  // namespace cdp

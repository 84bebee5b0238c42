// SPDX-License-Identifier: Apache-2.0
// The agent-facing contract of the process server (server.h), exercised over
// real loopback TCP with the real channel and handshake. The master target is
// absent here (its address refuses connections): the spool side must work alone.
#include "process-server/process_server.h"
#include "process-server/spool.h"
#include "process-server/spooled_volume.h"

#include <catch2/catch.hpp>

#include <atomic>
#include <optional>
#include <set>
#include <thread>

#include <sys/socket.h>
#include <sys/time.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <boost/json.hpp>

#include "common/crypto/auth.h"
#include "common/env/fault_env.h"
#include "common/http/http_client.h"
#include "common/http/http_server.h"
#include "common/net/listener.h"
#include "common/tests/test_util.h"
#include "common/wire/block_digest.h"
#include "common/wire/channel.h"
#include "master-target/export.h"
#include "master-target/master_target.h"

using namespace std::chrono_literals;
using cdp::proto::Record;
using cdp::proto::RecordKind;

namespace {

constexpr const char* kSecret = "0123456789abcdef-acme-secret";

// A loopback port with nothing listening on it.
uint16_t ClosedPort() {
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor a(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
  return a.local_endpoint().port();
}

cdp::ps::ProcessServerOptions Options(cdp::Env* env) {
  cdp::ps::ProcessServerOptions o;
  o.env = env;
  o.clock = cdp::SystemClock::Get();
  o.listen = {"127.0.0.1", 0};
  o.control.port = 0;
  o.mt.port = ClosedPort();
  o.tenants = {{"acme", kSecret}, {"beta", "beta-secret-beta-secret-beta"}};
  o.spool_dir = "/ps/spool";
  o.segment_bytes = 1 << 20;
  o.mt_open_wait_ms = 100;
  o.mt_link.backoff_min_ms = 50;
  o.mt_link.backoff_max_ms = 200;
  return o;
}

std::unique_ptr<cdp::FrameChannel> AgentConnect(uint16_t port, const std::string& tenant = "acme",
                                                const std::string& secret = kSecret) {
  auto ch = cdp::Connect("127.0.0.1", port, 5s);
  REQUIRE(ch.ok());
  cdp::Status s = cdp::ClientHandshake(**ch, cdp::proto::Role::kAgent, tenant, "agent-1", secret, 5s);
  REQUIRE(s.ok());
  return std::move(*ch);
}

cdp::proto::VolumeOpen Vol(const std::string& name, uint64_t generation = 1) {
  cdp::proto::VolumeOpen o;
  o.name = name;
  o.size = 64 << 20;
  o.block_size = 4096;
  o.uuid[0] = 0x42;
  o.generation = generation;
  return o;
}

template <typename T>
T Expect(cdp::FrameChannel& ch) {
  auto m = ch.Receive(10s);
  REQUIRE(m.ok());
  REQUIRE(std::holds_alternative<T>(*m));
  return std::get<T>(*m);
}

cdp::proto::WriteBatch Batch(uint32_t id, uint64_t first, size_t n, uint32_t len = 4096) {
  cdp::proto::WriteBatch b;
  b.volume_id = id;
  for (size_t i = 0; i < n; ++i) {
    Record r;
    r.seq = first + i;
    r.offset = (first + i) * 4096;
    r.length = len;
    r.kind = RecordKind::kData;
    r.timestamp_us = 1'700'000'000'000'000 + first + i;
    r.data.assign(len, uint8_t(first + i));
    b.records.push_back(std::move(r));
  }
  return b;
}

}  // namespace

TEST_CASE("agent contract: open, ack, duplicates, gap, unknown volume, reopen", "[server]") {
  auto env = cdp::NewMemEnv();
  cdp::ps::ProcessServer ps(Options(env.get()));
  REQUIRE(ps.Start().ok());
  {
    auto ch = AgentConnect(ps.agent_port());
    REQUIRE(ch->Send(Vol("db1")).ok());
    auto reply = Expect<cdp::proto::VolumeOpenReply>(*ch);
    CHECK(reply.durable_seq == 0);
    uint32_t id = reply.volume_id;

    REQUIRE(ch->Send(Batch(id, 1, 3)).ok());
    auto a1 = Expect<cdp::proto::Ack>(*ch);
    CHECK(a1.volume_id == id);
    CHECK(a1.durable_seq == 3);

    REQUIRE(ch->Send(Batch(id, 2, 3)).ok());  // 2,3 duplicates, 4 new
    CHECK(Expect<cdp::proto::Ack>(*ch).durable_seq == 4);

    REQUIRE(ch->Send(Batch(id, 7, 1)).ok());
    auto gap = Expect<cdp::proto::Nack>(*ch);
    CHECK(gap.reason == cdp::proto::NackReason::kGap);
    CHECK(gap.expected_seq == 5);

    REQUIRE(ch->Send(Batch(id + 100, 5, 1)).ok());
    CHECK(Expect<cdp::proto::Nack>(*ch).reason == cdp::proto::NackReason::kUnknownVolume);

    auto outside = Batch(id, 5, 1);
    outside.records[0].offset = (64 << 20) - 2048;  // runs past the end of the volume
    REQUIRE(ch->Send(outside).ok());
    CHECK(Expect<cdp::proto::Nack>(*ch).reason == cdp::proto::NackReason::kBadRecord);

    cdp::proto::Heartbeat hb;
    hb.sent_us = 12345;
    REQUIRE(ch->Send(hb).ok());
    CHECK(Expect<cdp::proto::Heartbeat>(*ch).echo_us == 12345);

    // Resync hashes need the master target, which is down here.
    cdp::proto::HashRequest hr;
    hr.volume_id = id;
    hr.request_id = 9;
    hr.count = 4;
    REQUIRE(ch->Send(hr).ok());
    auto hn = Expect<cdp::proto::HashResponse>(*ch);
    CHECK(hn.status == cdp::proto::HashStatus::kFailed);
    CHECK(hn.volume_id == id);
    CHECK(hn.request_id == 9);

    REQUIRE(ch->Send(Vol("db1", 2)).ok());
    CHECK(Expect<cdp::proto::Nack>(*ch).reason == cdp::proto::NackReason::kWrongGeneration);
  }
  {
    // A new connection resumes from the spool's durable sequence.
    auto ch = AgentConnect(ps.agent_port());
    REQUIRE(ch->Send(Vol("db1")).ok());
    CHECK(Expect<cdp::proto::VolumeOpenReply>(*ch).durable_seq == 4);
  }
  // The control API reports the backlog (the MT is unreachable).
  auto r = cdp::http::HttpRequest("127.0.0.1", ps.control_port(), "GET", "/v1/volumes");
  REQUIRE(r.ok());
  REQUIRE(r->status == 200);
  auto j = boost::json::parse(r->body);
  auto& vols = j.at("volumes").as_array();
  REQUIRE(vols.size() == 1);
  CHECK(vols[0].at("volume").as_string() == "db1");
  CHECK(vols[0].at("backlog_records").to_number<uint64_t>() == 4);
  CHECK(vols[0].at("bytes_in").to_number<uint64_t>() == 4 * 4096);
  CHECK(vols[0].at("spool_durable_seq").to_number<uint64_t>() == 4);
  ps.Stop();

  // Restart on the same files: the spool and its volume come back.
  cdp::ps::ProcessServer ps2(Options(env.get()));
  REQUIRE(ps2.Start().ok());
  auto ch = AgentConnect(ps2.agent_port());
  REQUIRE(ch->Send(Vol("db1")).ok());
  CHECK(Expect<cdp::proto::VolumeOpenReply>(*ch).durable_seq == 4);
}

TEST_CASE("one process server per spool_dir: a second one is refused while the first runs", "[server]") {
  auto env = cdp::NewMemEnv();
  cdp::ps::ProcessServer first(Options(env.get()));
  REQUIRE(first.Start().ok());
  {
    cdp::ps::ProcessServer second(Options(env.get()));
    const cdp::Status s = second.Start();
    CHECK(s.code() == cdp::Code::kBusy);
    CHECK(s.message().find("/ps/spool/LOCK is locked by another holder") != std::string::npos);
  }
  first.Stop();
  cdp::ps::ProcessServer third(Options(env.get()));
  CHECK(third.Start().ok());
}

TEST_CASE("agent contract: a wrong secret or an unknown tenant is refused", "[server]") {
  auto env = cdp::NewMemEnv();
  cdp::ps::ProcessServer ps(Options(env.get()));
  REQUIRE(ps.Start().ok());
  for (auto [tenant, secret] : {std::pair<std::string, std::string>{"acme", "not-the-secret-not-the-secret"},
                                {"nobody", "whatever-secret-whatever-secret"}}) {
    auto ch = cdp::Connect("127.0.0.1", ps.agent_port(), 5s);
    REQUIRE(ch.ok());
    cdp::Status s = cdp::ClientHandshake(**ch, cdp::proto::Role::kAgent, tenant, "agent-1", secret, 5s);
    CHECK(s.code() == cdp::Code::kPermissionDenied);
  }
  // Tenants are isolated: beta's volume "db1" is not acme's.
  auto a = AgentConnect(ps.agent_port());
  REQUIRE(a->Send(Vol("db1")).ok());
  uint32_t ida = Expect<cdp::proto::VolumeOpenReply>(*a).volume_id;
  REQUIRE(a->Send(Batch(ida, 1, 5)).ok());
  CHECK(Expect<cdp::proto::Ack>(*a).durable_seq == 5);
  auto b = AgentConnect(ps.agent_port(), "beta", "beta-secret-beta-secret-beta");
  REQUIRE(b->Send(Vol("db1")).ok());
  CHECK(Expect<cdp::proto::VolumeOpenReply>(*b).durable_seq == 0);
}

TEST_CASE("agent contract: over quota the agent gets busy, and is accepted again once drained",
          "[server][quota]") {
  auto env = cdp::NewMemEnv();
  auto o = Options(env.get());
  o.quota_bytes = 10 * (4096 + cdp::ps::kRecordHeaderSize);
  cdp::ps::ProcessServer ps(o);
  REQUIRE(ps.Start().ok());
  auto ch = AgentConnect(ps.agent_port());
  REQUIRE(ch->Send(Vol("db1")).ok());
  uint32_t id = Expect<cdp::proto::VolumeOpenReply>(*ch).volume_id;
  REQUIRE(ch->Send(Batch(id, 1, 10)).ok());
  CHECK(Expect<cdp::proto::Ack>(*ch).durable_seq == 10);
  REQUIRE(ch->Send(Batch(id, 11, 1)).ok());
  auto busy = Expect<cdp::proto::Nack>(*ch);
  CHECK(busy.reason == cdp::proto::NackReason::kBusy);
  // Nothing of the refused batch was kept.
  REQUIRE(ch->Send(Vol("db1")).ok());
  CHECK(Expect<cdp::proto::VolumeOpenReply>(*ch).durable_seq == 10);
}

TEST_CASE("agent contract: a malformed frame closes the connection and spools nothing", "[server]") {
  auto env = cdp::NewMemEnv();
  cdp::ps::ProcessServer ps(Options(env.get()));
  REQUIRE(ps.Start().ok());
  {
    auto ch = AgentConnect(ps.agent_port());
    REQUIRE(ch->Send(Vol("db1")).ok());
    uint32_t id = Expect<cdp::proto::VolumeOpenReply>(*ch).volume_id;
    REQUIRE(ch->Send(Batch(id, 1, 2)).ok());
    CHECK(Expect<cdp::proto::Ack>(*ch).durable_seq == 2);
  }
  // Hand-made handshake on a raw socket, then a frame with one flipped byte.
  namespace asio = boost::asio;
  asio::io_context io;
  asio::ip::tcp::socket sock(io);
  sock.connect({asio::ip::make_address("127.0.0.1"), ps.agent_port()});
  timeval tv{10, 0};
  REQUIRE(setsockopt(sock.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) == 0);
  cdp::Bytes inbuf;
  auto read_msg = [&]() -> cdp::proto::Message {
    for (;;) {
      cdp::proto::Frame f;
      auto d = cdp::proto::DecodeFrame(inbuf, &f);
      if (d.state == cdp::proto::DecodeState::kComplete) {
        auto m = cdp::proto::ParseMessage(f);  // f views inbuf
        inbuf.erase(inbuf.begin(), inbuf.begin() + long(d.consumed));
        REQUIRE(m.ok());
        return *m;
      }
      REQUIRE(d.state == cdp::proto::DecodeState::kNeedMore);
      uint8_t tmp[4096];
      boost::system::error_code ec;
      size_t n = sock.read_some(asio::buffer(tmp), ec);
      REQUIRE(!ec);
      inbuf.insert(inbuf.end(), tmp, tmp + n);
    }
  };
  auto nonce = cdp::auth::RandomNonce();
  REQUIRE(nonce.ok());
  cdp::proto::Hello hello;
  hello.role = cdp::proto::Role::kAgent;
  hello.tenant = "acme";
  hello.client_id = "raw-agent";
  hello.client_nonce = *nonce;
  asio::write(sock, asio::buffer(*cdp::proto::EncodeMessage(hello, 1)));
  auto challenge = std::get<cdp::proto::Challenge>(read_msg());
  auto proof = cdp::auth::ClientProof(kSecret, challenge.server_nonce, *nonce, "acme");
  REQUIRE(proof.ok());
  cdp::proto::Auth auth;
  auth.client_proof = *proof;
  asio::write(sock, asio::buffer(*cdp::proto::EncodeMessage(auth, 2)));
  REQUIRE(std::get<cdp::proto::AuthResult>(read_msg()).accepted);
  asio::write(sock, asio::buffer(*cdp::proto::EncodeMessage(Vol("db1"), 3)));
  auto reply = std::get<cdp::proto::VolumeOpenReply>(read_msg());
  CHECK(reply.durable_seq == 2);
  auto frame = *cdp::proto::EncodeMessage(Batch(reply.volume_id, 3, 4), 4);
  frame[frame.size() - 100] ^= 0x01;
  asio::write(sock, asio::buffer(frame));
  // The server closes the connection: EOF, not a reply.
  uint8_t tmp[64];
  boost::system::error_code ec;
  size_t n = sock.read_some(asio::buffer(tmp), ec);
  CHECK(n == 0);
  CHECK(ec == asio::error::eof);
  // Nothing of the bad frame was spooled.
  auto ch = AgentConnect(ps.agent_port());
  REQUIRE(ch->Send(Vol("db1")).ok());
  CHECK(Expect<cdp::proto::VolumeOpenReply>(*ch).durable_seq == 2);
}

TEST_CASE("agent contract: pipelined batches each get their reply, in order", "[server]") {
  auto env = cdp::NewMemEnv();
  cdp::ps::ProcessServer ps(Options(env.get()));
  REQUIRE(ps.Start().ok());
  auto ch = AgentConnect(ps.agent_port());
  REQUIRE(ch->Send(Vol("db1")).ok());
  uint32_t id = Expect<cdp::proto::VolumeOpenReply>(*ch).volume_id;
  // Six batches without waiting: 1-3, 4-6, ..., 13-15, then one past a gap.
  for (uint64_t first = 1; first <= 13; first += 3) REQUIRE(ch->Send(Batch(id, first, 3, 512)).ok());
  REQUIRE(ch->Send(Batch(id, 20, 2, 512)).ok());
  uint64_t last = 0;
  for (uint64_t first = 1; first <= 13; first += 3) {
    auto a = Expect<cdp::proto::Ack>(*ch);
    CHECK(a.volume_id == id);
    CHECK(a.durable_seq >= first + 2);  // cumulative: at least this batch
    CHECK(a.durable_seq >= last);
    last = a.durable_seq;
  }
  CHECK(last == 15);
  auto gap = Expect<cdp::proto::Nack>(*ch);
  CHECK(gap.reason == cdp::proto::NackReason::kGap);
  CHECK(gap.expected_seq == 16);
  REQUIRE(ch->Send(Vol("db1")).ok());
  CHECK(Expect<cdp::proto::VolumeOpenReply>(*ch).durable_seq == 15);
}

TEST_CASE("agent listener: connections over the per-peer cap are closed at once, before any handshake",
          "[server][security]") {
  auto env = cdp::NewMemEnv();
  auto o = Options(env.get());
  o.connection_caps.per_peer = 2;
  cdp::ps::ProcessServer ps(o);
  REQUIRE(ps.Start().ok());
  auto a = AgentConnect(ps.agent_port());
  auto b = AgentConnect(ps.agent_port());
  // The third from the same address is refused: closed before the server says anything.
  auto c = cdp::Connect("127.0.0.1", ps.agent_port(), 5s);
  REQUIRE(c.ok());
  auto m = (*c)->Receive(5s);
  REQUIRE_FALSE(m.ok());
  CHECK(m.status().code() == cdp::Code::kUnavailable);
  // One closed: a new one is accepted again.
  a->Close();
  a.reset();
  bool accepted = cdp::testing::WaitUntil([&] {
    auto d = cdp::Connect("127.0.0.1", ps.agent_port(), 5s);
    return d.ok() && cdp::ClientHandshake(**d, cdp::proto::Role::kAgent, "acme", "agent-2", kSecret, 5s).ok();
  }, 10s, 50ms);
  CHECK(accepted);
}

namespace {

// A master target that acknowledges every batch with Ack{2^62}: far beyond
// anything the process server sent. Counts connections and batches.
class ForgingMasterTarget {
 public:
  // `open_reply`: the durable sequence claimed in every VolumeOpenReply.
  explicit ForgingMasterTarget(uint64_t open_reply = 0) : open_reply_(open_reply) {
    cdp::Listener::Options lo;
    lo.name = "forging-mt";
    lo.tcp = {"127.0.0.1", 0};
    lo.mode = cdp::Listener::Mode::kThreadPerConnection;
    listener_ = std::make_unique<cdp::Listener>(lo, cdp::ServeFrames([this](cdp::FrameChannel& ch) { Serve(ch); }));
    REQUIRE(listener_->Start().ok());
  }
  ~ForgingMasterTarget() { listener_->Stop(); }
  uint16_t port() const { return listener_->tcp_port(); }
  std::atomic<int> connections{0};
  std::atomic<int> batches{0};
  std::atomic<int> opens{0};
  std::atomic<bool> serving{true};  // false: every session is dropped after the handshake

 private:
  void Serve(cdp::FrameChannel& ch) {
    auto who = cdp::ServerHandshake(
        ch, [](const std::string& t) { return t == "acme" ? std::optional<std::string>(kSecret) : std::nullopt; }, 5s);
    if (!who.ok() || !serving.load()) return;
    ++connections;
    while (!ch.broken()) {
      auto m = ch.Receive(100ms);
      if (!m.ok()) {
        if (m.status().IsBusy()) continue;
        return;
      }
      cdp::Status s;
      if (std::holds_alternative<cdp::proto::VolumeOpen>(*m)) {
        ++opens;
        s = ch.Send(cdp::proto::VolumeOpenReply{1, open_reply_});
      } else if (std::holds_alternative<cdp::proto::WriteBatch>(*m)) {
        ++batches;
        s = ch.Send(cdp::proto::Ack{1, uint64_t(1) << 62});
      } else if (auto* hb = std::get_if<cdp::proto::Heartbeat>(&*m)) {
        if (hb->echo_us == 0) s = ch.Send(cdp::proto::Heartbeat{1, hb->sent_us});
      }
      if (!s.ok()) return;
    }
  }
  const uint64_t open_reply_;
  std::unique_ptr<cdp::Listener> listener_;
};

}  // namespace

// A process server shipping to `mt`, whose agent has had records 1..5 of db1
// spooled and acknowledged.
struct ShippingPs {
  explicit ShippingPs(ForgingMasterTarget& mt) : env(cdp::NewMemEnv()) {
    auto o = Options(env.get());
    o.mt.port = mt.port();
    ps = std::make_unique<cdp::ps::ProcessServer>(o);
    REQUIRE(ps->Start().ok());
    agent = AgentConnect(ps->agent_port());
    REQUIRE(agent->Send(Vol("db1")).ok());
    uint32_t id = Expect<cdp::proto::VolumeOpenReply>(*agent).volume_id;
    REQUIRE(agent->Send(Batch(id, 1, 5)).ok());
    CHECK(Expect<cdp::proto::Ack>(*agent).durable_seq == 5);
  }
  // db1's spool backlog (records) and the sequence the MT has acknowledged.
  std::pair<uint64_t, uint64_t> BacklogAndAcked() {
    auto r = cdp::http::HttpRequest("127.0.0.1", ps->control_port(), "GET", "/v1/volumes");
    REQUIRE(r.ok());
    auto j = boost::json::parse(r->body);
    auto& vols = j.at("volumes").as_array();
    REQUIRE(vols.size() == 1);
    return {vols[0].at("backlog_records").to_number<uint64_t>(), vols[0].at("mt_acked_seq").to_number<uint64_t>()};
  }
  std::unique_ptr<cdp::Env> env;
  std::unique_ptr<cdp::ps::ProcessServer> ps;
  std::unique_ptr<cdp::FrameChannel> agent;
};

TEST_CASE("a forged VolumeOpenReply beyond the spool deletes no spool record", "[server][security]") {
  ForgingMasterTarget mt(uint64_t(1) << 62);
  mt.serving = false;  // the records reach the spool first
  ShippingPs p(mt);
  mt.serving = true;
  // The link opens, hears 2^62, refuses it, and tries again later.
  REQUIRE(cdp::testing::WaitUntil([&] { return mt.opens.load() >= 2; }, 30s, 10ms));
  CHECK(p.BacklogAndAcked() == std::pair<uint64_t, uint64_t>{5, 0});
  // The agent's own resume is untouched: the PS still answers the spool's sequence.
  auto again = AgentConnect(p.ps->agent_port());
  REQUIRE(again->Send(Vol("db1")).ok());
  CHECK(Expect<cdp::proto::VolumeOpenReply>(*again).durable_seq == 5);
}

TEST_CASE("a forged Ack beyond what was sent deletes no spool record", "[server][security]") {
  ForgingMasterTarget mt;
  ShippingPs p(mt);
  // The link ships, gets the forged Ack, drops the session and comes back.
  REQUIRE(cdp::testing::WaitUntil([&] { return mt.batches.load() >= 2 && mt.connections.load() >= 2; }, 30s, 10ms));
  CHECK(p.BacklogAndAcked() == std::pair<uint64_t, uint64_t>{5, 0});
}

TEST_CASE("a trim at 2^40, of 4 GiB or just past the end from an agent never enters the spool: Nack, the volume goes on",
          "[server][security][workcap]") {
  auto env = cdp::NewMemEnv();
  cdp::ps::ProcessServer ps(Options(env.get()));
  REQUIRE(ps.Start().ok());
  auto ch = AgentConnect(ps.agent_port());
  REQUIRE(ch->Send(Vol("db1")).ok());
  const uint32_t id = Expect<cdp::proto::VolumeOpenReply>(*ch).volume_id;
  auto trim = [&](uint64_t offset, uint32_t length) {
    cdp::proto::WriteBatch b;
    b.volume_id = id;
    Record r;
    r.seq = 1;
    r.offset = offset;
    r.length = length;
    r.kind = RecordKind::kTrim;
    b.records.push_back(r);
    return b;
  };
  for (auto b : {trim(uint64_t(1) << 40, 1 << 20), trim(0, 0xffffffffu), trim(64 << 20, 4096)}) {  // (offset + length overflowing u64 cannot even be encoded)
    cdp::Status sent = ch->Send(b);
    INFO(sent.ToString());
    REQUIRE(sent.ok());
    auto n = Expect<cdp::proto::Nack>(*ch);
    CHECK(n.reason == cdp::proto::NackReason::kBadRecord);
    CHECK(n.message == "record seq 1 outside the volume");
  }
  // Nothing was spooled (a restart would have nothing to resend), and a valid batch is taken.
  auto r = cdp::http::HttpRequest("127.0.0.1", ps.control_port(), "GET", "/v1/volumes");
  REQUIRE(r.ok());
  auto j = boost::json::parse(r->body);
  CHECK(j.at("volumes").as_array().at(0).at("spool_durable_seq").to_number<uint64_t>() == 0);
  REQUIRE(ch->Send(Batch(id, 1, 2)).ok());
  CHECK(Expect<cdp::proto::Ack>(*ch).durable_seq == 2);
}

TEST_CASE("a compromised host's higher generation, refused by the master target, stalls that volume at the PS: "
          "shown in the status, spool kept, every point at the MT kept",
          "[server][security][generation]") {
  cdp::testing::ScratchDir dir;
  auto mt_env = cdp::NewPosixEnv();
  cdp::mt::MasterTargetOptions mo;
  mo.env = mt_env.get();
  mo.clock = cdp::SystemClock::Get();
  mo.data_dir = dir.path();
  mo.tenants = {{"acme", kSecret}};
  mo.listen = {"127.0.0.1", 0};
  mo.control = cdp::HostPort{};  // off
  mo.nbd = cdp::HostPort{};
  mo.point_interval_us = 0;
  cdp::mt::MasterTarget mt(mo);
  REQUIRE(mt.Start().ok());
  // The history at the MT: db1, generation 1, records 1..3 with a point.
  {
    auto ch = cdp::Connect("127.0.0.1", mt.port(), 5s);
    REQUIRE(ch.ok());
    REQUIRE(cdp::ClientHandshake(**ch, cdp::proto::Role::kProcessServer, "acme", "ps-0", kSecret, 5s).ok());
    REQUIRE((*ch)->Send(Vol("db1")).ok());
    uint32_t id = Expect<cdp::proto::VolumeOpenReply>(**ch).volume_id;
    auto b = Batch(id, 1, 2);
    Record flush;
    flush.seq = 3;
    flush.kind = RecordKind::kFlush;
    b.records.push_back(flush);
    REQUIRE((*ch)->Send(b).ok());
    REQUIRE(Expect<cdp::proto::Ack>(**ch).durable_seq == 3);
  }
  auto vol = mt.FindVolume("acme", "db1");
  REQUIRE(vol != nullptr);
  const auto points = vol->points().List();
  REQUIRE(points.size() == 1);
  cdp::Bytes image(64 << 20);
  REQUIRE(vol->ReadAt(points[0].seq, 0, image.size(), image.data()).ok());

  // A PS with no spool for db1; the compromised agent opens it under generation 2.
  auto env = cdp::NewMemEnv();
  auto o = Options(env.get());
  o.mt.port = mt.port();
  cdp::ps::ProcessServer ps(o);
  REQUIRE(ps.Start().ok());
  auto agent = AgentConnect(ps.agent_port());
  REQUIRE(agent->Send(Vol("db1", 2)).ok());
  uint32_t id = Expect<cdp::proto::VolumeOpenReply>(*agent).volume_id;
  REQUIRE(agent->Send(Batch(id, 1, 5)).ok());
  CHECK(Expect<cdp::proto::Ack>(*agent).durable_seq == 5);
  auto db1 = [&] {
    auto r = cdp::http::HttpRequest("127.0.0.1", ps.control_port(), "GET", "/v1/volumes");
    REQUIRE(r.ok());
    return boost::json::parse(r->body).at("volumes").as_array().at(0).as_object();
  };
  REQUIRE(cdp::testing::WaitUntil([&] { return !db1().at("stalled").as_string().empty(); }, 30s, 20ms));
  const std::string why(db1().at("stalled").as_string());
  INFO(why);
  CHECK(why.find("generation 2 > 1: re-protect is an operator command") != std::string::npos);
  // The link keeps trying (with backoff) and keeps refusing; nothing is released or applied.
  std::this_thread::sleep_for(500ms);
  CHECK(db1().at("backlog_records").to_number<uint64_t>() == 5);
  CHECK(db1().at("mt_acked_seq").to_number<uint64_t>() == 0);
  CHECK(vol->identity().generation == 1);
  CHECK(vol->applied_seq() == 3);
  REQUIRE(vol->points().List().size() == 1);
  cdp::Bytes now(64 << 20);
  REQUIRE(vol->ReadAt(points[0].seq, 0, now.size(), now.data()).ok());
  CHECK(now == image);
}

TEST_CASE("a volume failed over at the master target fences its agent at the PS, nothing more is spooled or applied, "
          "the undo lets it in again",
          "[server][failover]") {
  cdp::testing::ScratchDir dir;
  auto mt_env = cdp::NewPosixEnv();
  cdp::mt::MasterTargetOptions mo;
  mo.env = mt_env.get();
  mo.clock = cdp::SystemClock::Get();
  mo.data_dir = dir.path();
  mo.tenants = {{"acme", kSecret}};
  mo.listen = {"127.0.0.1", 0};
  mo.control = cdp::HostPort{};  // off
  mo.nbd = {"127.0.0.1", 0};     // a failover serves its export there
  mo.point_interval_us = 0;
  cdp::mt::MasterTarget mt(mo);
  REQUIRE(mt.Start().ok());
  auto env = cdp::NewMemEnv();
  auto o = Options(env.get());
  o.mt.port = mt.port();
  cdp::ps::ProcessServer ps(o);
  REQUIRE(ps.Start().ok());
  auto db1 = [&] {
    auto r = cdp::http::HttpRequest("127.0.0.1", ps.control_port(), "GET", "/v1/volumes");
    REQUIRE(r.ok());
    return boost::json::parse(r->body).at("volumes").as_array().at(0).as_object();
  };

  auto agent = AgentConnect(ps.agent_port());
  REQUIRE(agent->Send(Vol("db1")).ok());
  const uint32_t id = Expect<cdp::proto::VolumeOpenReply>(*agent).volume_id;
  REQUIRE(agent->Send(Batch(id, 1, 3)).ok());
  CHECK(Expect<cdp::proto::Ack>(*agent).durable_seq == 3);
  std::shared_ptr<cdp::mt::ReplicaVolume> vol;
  REQUIRE(cdp::testing::WaitUntil([&] { return (vol = mt.FindVolume("acme", "db1")) && vol->applied_seq() == 3; },
                                  30s, 20ms));
  REQUIRE(mt.Failover("acme", "db1", 3, 0).ok());

  // Spooled before the PS learns of the fence; the MT refuses to apply it.
  REQUIRE(agent->Send(Batch(id, 4, 2)).ok());
  CHECK(Expect<cdp::proto::Ack>(*agent).durable_seq == 5);
  REQUIRE(cdp::testing::WaitUntil([&] { return !db1().at("fenced").as_string().empty(); }, 30s, 20ms));
  CHECK(std::string(db1().at("fenced").as_string()).rfind("failed over: volume db1 failed over", 0) == 0);
  // The PS tells the agent unasked, within its session's receive timeout
  // (issue 38 F1: an agent with nothing to send never learnt it otherwise).
  auto notice = Expect<cdp::proto::Nack>(*agent);
  CHECK(cdp::proto::IsFailedOverNack(notice));
  CHECK(notice.volume_id == id);
  // From then on the agent's batches and opens are refused with the MT's text.
  REQUIRE(agent->Send(Batch(id, 6, 1)).ok());
  auto n = Expect<cdp::proto::Nack>(*agent);
  CHECK(cdp::proto::IsFailedOverNack(n));
  auto agent2 = AgentConnect(ps.agent_port());
  REQUIRE(agent2->Send(Vol("db1")).ok());
  n = Expect<cdp::proto::Nack>(*agent2);
  CHECK(cdp::proto::IsFailedOverNack(n));
  CHECK(db1().at("backlog_records").to_number<uint64_t>() == 2);  // 4 and 5, not 6
  CHECK(vol->applied_seq() == 3);

  // Undo: the MT closes the link's session, the PS reopens and ships 4..5,
  // the fence lifts, and the PS closes the agents' sessions that met it.
  REQUIRE(mt.UndoFailover("acme", "db1").ok());
  REQUIRE(cdp::testing::WaitUntil([&] { return vol->applied_seq() == 5; }, 30s, 20ms));
  REQUIRE(cdp::testing::WaitUntil([&] { return db1().at("fenced").as_string().empty(); }, 30s, 20ms));
  for (cdp::FrameChannel* c : {agent.get(), agent2.get()}) {
    auto r = c->Receive(10s);
    REQUIRE_FALSE(r.ok());
    CHECK_FALSE(r.status().IsBusy());  // closed, not a timeout
  }
  auto agent3 = AgentConnect(ps.agent_port());
  REQUIRE(agent3->Send(Vol("db1")).ok());
  auto reply = Expect<cdp::proto::VolumeOpenReply>(*agent3);
  CHECK(reply.durable_seq == 5);
  REQUIRE(agent3->Send(Batch(reply.volume_id, 6, 1)).ok());
  CHECK(Expect<cdp::proto::Ack>(*agent3).durable_seq == 6);
  REQUIRE(cdp::testing::WaitUntil([&] { return vol->applied_seq() == 6; }, 30s, 20ms));
}

// ---- failback relay and re-protect (agent_session.h 6. and "Re-protect") ----

namespace {

cdp::mt::MasterTargetOptions MtOptions(const std::string& dir, cdp::Env* env) {
  cdp::mt::MasterTargetOptions mo;
  mo.env = env;
  mo.clock = cdp::SystemClock::Get();
  mo.data_dir = dir;
  mo.tenants = {{"acme", kSecret}};
  mo.listen = {"127.0.0.1", 0};
  mo.control = cdp::HostPort{};  // off
  mo.nbd = {"127.0.0.1", 0};     // a failover serves its export there
  mo.point_interval_us = 0;
  return mo;
}

cdp::Bytes Fill(uint8_t v, size_t n = 4096) { return cdp::Bytes(n, v); }

Record Rec(uint64_t seq, RecordKind kind, uint64_t offset, uint32_t length, uint8_t fill = 0x5A) {
  Record r;
  r.seq = seq;
  r.kind = kind;
  r.offset = offset;
  r.length = length;
  r.timestamp_us = 1'700'000'000'000'000 + seq;
  if (kind == RecordKind::kData) r.data = Fill(fill, length);
  return r;
}

// Sends `req` until the PS answers it with another status than kFailed (the
// link to the MT may be between two connections: kFailed at once).
template <typename Answer, typename Request>
Answer CallUntilAnswered(cdp::FrameChannel& ch, Request req) {
  Answer out;
  REQUIRE(cdp::testing::WaitUntil([&] {
    REQUIRE(ch.Send(req).ok());
    out = Expect<Answer>(ch);
    REQUIRE(out.request_id == req.request_id);
    return out.status != cdp::proto::FailbackStatus::kFailed;
  }, 30s, 20ms));
  return out;
}

// A master target that authenticates the PS and never answers anything
// after that (failback requests stay outstanding); Stop() drops its connections.
class SilentMt {
 public:
  SilentMt() {
    cdp::Listener::Options lo;
    lo.name = "silent-mt";
    lo.tcp = {"127.0.0.1", 0};
    lo.mode = cdp::Listener::Mode::kThreadPerConnection;
    listener_ = std::make_unique<cdp::Listener>(lo, cdp::ServeFrames([this](cdp::FrameChannel& ch) { Serve(ch); }));
    REQUIRE(listener_->Start().ok());
  }
  ~SilentMt() { Stop(); }
  void Stop() {
    stop_ = true;
    listener_->Stop();
  }
  uint16_t port() const { return listener_->tcp_port(); }
  int requests() const { return requests_.load(); }

 private:
  void Serve(cdp::FrameChannel& ch) {
    auto who = cdp::ServerHandshake(
        ch, [](const std::string&) -> std::optional<std::string> { return std::string(kSecret); }, 5s);
    if (!who.ok()) return;
    while (!stop_.load()) {
      auto m = ch.Receive(50ms);
      if (!m.ok()) {
        if (m.status().IsBusy() && !ch.broken()) continue;
        return;
      }
      if (std::holds_alternative<cdp::proto::FailbackPlanRequest>(*m)) ++requests_;
    }
  }
  std::unique_ptr<cdp::Listener> listener_;
  std::atomic<bool> stop_{false};
  std::atomic<int> requests_{0};
};

}  // namespace

TEST_CASE("failback relay: plan and pull through a real PS and a real MT, the plan gains the blocks of the records "
          "the PS spooled and never delivered, pull answers travel with the volume's codec",
          "[server][failback]") {
  using cdp::proto::BlockExtent;
  using cdp::proto::FailbackStatus;
  cdp::testing::ScratchDir dir;
  auto mt_env = cdp::NewPosixEnv();
  cdp::mt::MasterTarget mt(MtOptions(dir.path(), mt_env.get()));
  REQUIRE(mt.Start().ok());
  auto env = cdp::NewMemEnv();
  auto o = Options(env.get());
  o.mt.port = mt.port();
  o.codec = cdp::proto::Codec::kLz4;
  cdp::ps::ProcessServer ps(o);
  REQUIRE(ps.Start().ok());

  auto agent = AgentConnect(ps.agent_port());
  REQUIRE(agent->Send(Vol("db1")).ok());
  const uint32_t id = Expect<cdp::proto::VolumeOpenReply>(*agent).volume_id;
  REQUIRE(agent->Send(Batch(id, 1, 3)).ok());  // blocks 1, 2, 3
  CHECK(Expect<cdp::proto::Ack>(*agent).durable_seq == 3);
  std::shared_ptr<cdp::mt::ReplicaVolume> vol;
  REQUIRE(cdp::testing::WaitUntil([&] { return (vol = mt.FindVolume("acme", "db1")) && vol->applied_seq() == 3; },
                                  30s, 20ms));
  REQUIRE(mt.Failover("acme", "db1", 3, 0).ok());

  // Spooled by the PS, refused by the MT (fenced): never delivered.
  cdp::proto::WriteBatch late;
  late.volume_id = id;
  late.records = {Rec(4, RecordKind::kData, 10 * 4096 + 100, 8192),  // blocks 10..12 (unaligned)
                  Rec(5, RecordKind::kTrim, 20 * 4096, 3 * 4096),    // blocks 20..22
                  Rec(6, RecordKind::kFlush, 0, 0),
                  Rec(7, RecordKind::kZero, 5 * 4096, 4096)};        // block 5
  REQUIRE(agent->Send(late).ok());
  CHECK(Expect<cdp::proto::Ack>(*agent).durable_seq == 7);
  auto db1 = [&] {
    auto r = cdp::http::HttpRequest("127.0.0.1", ps.control_port(), "GET", "/v1/volumes");
    REQUIRE(r.ok());
    return boost::json::parse(r->body).at("volumes").as_array().at(0).as_object();
  };
  REQUIRE(cdp::testing::WaitUntil([&] { return !db1().at("fenced").as_string().empty(); }, 30s, 20ms));
  CHECK(db1().at("backlog_records").to_number<uint64_t>() == 4);
  CHECK(db1().at("mt_acked_seq").to_number<uint64_t>() == 3);

  // The provider writes blocks 0, 11 and 40 on the promoted export.
  auto dev = mt.PromotedDevice("acme", "db1");
  REQUIRE(dev != nullptr);
  REQUIRE(dev->Write(0, Fill(0xAA), false).ok());
  REQUIRE(dev->Write(11 * 4096, Fill(0x11), false).ok());
  REQUIRE(dev->Write(40 * 4096, Fill(0x40), false).ok());
  REQUIRE(dev->Flush().ok());

  // Not failing back yet: the MT's answer passes through.
  auto fb = AgentConnect(ps.agent_port());  // a connection with no volume open
  auto not_yet = CallUntilAnswered<cdp::proto::FailbackPlan>(*fb, cdp::proto::FailbackPlanRequest{1, "db1", 0});
  CHECK(not_yet.status == FailbackStatus::kNotFailingBack);
  CHECK(not_yet.extents.empty());
  REQUIRE(mt.StartFailback("acme", "db1").ok());

  // The whole plan: the MT's {0}, {11}, {40} and the spool's {5}, {10..12}, {20..22}.
  auto plan = CallUntilAnswered<cdp::proto::FailbackPlan>(*fb, cdp::proto::FailbackPlanRequest{7, "db1", 0});
  REQUIRE(plan.status == FailbackStatus::kOk);
  CHECK(plan.request_id == 7);
  CHECK(plan.extents == std::vector<BlockExtent>{{0, 1}, {5, 1}, {10, 3}, {20, 3}, {40, 1}});
  CHECK(plan.next_block == 0);
  // A page from block 11: both sides cut at it.
  plan = CallUntilAnswered<cdp::proto::FailbackPlan>(*fb, cdp::proto::FailbackPlanRequest{8, "db1", 11});
  REQUIRE(plan.status == FailbackStatus::kOk);
  CHECK(plan.extents == std::vector<BlockExtent>{{11, 2}, {20, 3}, {40, 1}});
  CHECK(plan.next_block == 0);
  // Another tenant's volume of that name: the MT does not know it, the PS adds nothing.
  auto other = AgentConnect(ps.agent_port(), "beta", "beta-secret-beta-secret-beta");
  REQUIRE(other->Send(cdp::proto::FailbackPlanRequest{9, "db1", 0}).ok());
  auto foreign = Expect<cdp::proto::FailbackPlan>(*other);
  CHECK(foreign.request_id == 9);
  CHECK(foreign.status != FailbackStatus::kOk);
  CHECK(foreign.extents.empty());

  // Pull: block 0 differs (0xAA at the provider), block 5 differs (the agent
  // has data, the provider zeros), block 11 is equal and does not travel.
  const cdp::Bytes agent5 = Fill(0x55), provider11 = Fill(0x11);
  cdp::proto::PullRequest pr{10, "db1", {{0, 1}, {5, 1}, {11, 1}},
                             {cdp::kZeroDigest, cdp::LeafDigest(agent5.data(), agent5.size()),
                              cdp::LeafDigest(provider11.data(), provider11.size())}};
  auto pull = CallUntilAnswered<cdp::proto::PullResponse>(*fb, pr);
  REQUIRE(pull.status == FailbackStatus::kOk);
  CHECK(pull.request_id == 10);
  CHECK(pull.codec == cdp::proto::Codec::kLz4);  // re-compressed with the PS's codec for the volume
  REQUIRE(pull.records.size() == 2);
  CHECK(pull.records[0].offset == 0);
  CHECK(pull.records[0].kind == RecordKind::kData);
  CHECK(pull.records[0].data == Fill(0xAA));
  CHECK(pull.records[1].offset == 5 * 4096);
  CHECK(pull.records[1].kind == RecordKind::kZero);
  // The relay neither shipped nor released the fenced spool's records.
  CHECK(db1().at("backlog_records").to_number<uint64_t>() == 4);
  CHECK(vol->applied_seq() == 3);
}

TEST_CASE("failback relay: the MT unreachable, over the cap or its connection lost, the agent gets kFailed (never a "
          "Nack) and its connection goes on",
          "[server][failback]") {
  using cdp::proto::FailbackStatus;
  auto env = cdp::NewMemEnv();
  {
    // No master target at all.
    cdp::ps::ProcessServer ps(Options(env.get()));
    REQUIRE(ps.Start().ok());
    auto ch = AgentConnect(ps.agent_port());
    REQUIRE(ch->Send(cdp::proto::FailbackPlanRequest{3, "db1", 0}).ok());
    auto p = Expect<cdp::proto::FailbackPlan>(*ch);
    CHECK(p.request_id == 3);
    CHECK(p.status == FailbackStatus::kFailed);
    CHECK(p.extents.empty());
    REQUIRE(ch->Send(cdp::proto::PullRequest{4, "db1", {{0, 1}}, {cdp::kZeroDigest}}).ok());
    auto r = Expect<cdp::proto::PullResponse>(*ch);
    CHECK(r.request_id == 4);
    CHECK(r.status == FailbackStatus::kFailed);
    CHECK(r.records.empty());
    // The connection is still served.
    REQUIRE(ch->Send(Vol("db1")).ok());
    CHECK(Expect<cdp::proto::VolumeOpenReply>(*ch).durable_seq == 0);
  }
  // A master target that never answers: 8 requests (kMaxFailbackInFlight)
  // wait, the 9th is refused at once; losing the connection fails the 8.
  SilentMt silent;
  auto o = Options(env.get());
  o.mt.port = silent.port();
  cdp::ps::ProcessServer ps(o);
  REQUIRE(ps.Start().ok());
  auto ch = AgentConnect(ps.agent_port());
  uint64_t first = 100;
  REQUIRE(cdp::testing::WaitUntil([&] {  // until the link is up: the first one that is not refused at once
    REQUIRE(ch->Send(cdp::proto::FailbackPlanRequest{first, "db1", 0}).ok());
    auto m = ch->Receive(200ms);
    if (m.ok()) {
      REQUIRE(std::get<cdp::proto::FailbackPlan>(*m).status == FailbackStatus::kFailed);
      ++first;
      return false;
    }
    return silent.requests() == 1;
  }, 30s, 0ms));
  for (uint64_t i = 1; i < 8; ++i) REQUIRE(ch->Send(cdp::proto::FailbackPlanRequest{first + i, "db1", 0}).ok());
  REQUIRE(cdp::testing::WaitUntil([&] { return silent.requests() == 8; }, 30s, 10ms));
  REQUIRE(ch->Send(cdp::proto::FailbackPlanRequest{first + 8, "db1", 0}).ok());
  auto over = Expect<cdp::proto::FailbackPlan>(*ch);
  CHECK(over.request_id == first + 8);
  CHECK(over.status == FailbackStatus::kFailed);
  silent.Stop();
  std::set<uint64_t> failed;
  for (int i = 0; i < 8; ++i) {
    auto p = Expect<cdp::proto::FailbackPlan>(*ch);
    CHECK(p.status == FailbackStatus::kFailed);
    failed.insert(p.request_id);
  }
  std::set<uint64_t> want;
  for (uint64_t i = 0; i < 8; ++i) want.insert(first + i);
  CHECK(failed == want);
  CHECK(silent.requests() == 8);
}

namespace {

// A real master target in a scratch directory that can go away (Stop) and
// come back on the same port with the same data (Start).
struct RestartableMt {
  cdp::testing::ScratchDir dir;
  std::unique_ptr<cdp::Env> env = cdp::NewPosixEnv();
  std::optional<cdp::mt::MasterTarget> mt;
  uint16_t port = 0;

  RestartableMt() { Start(); }
  void Start() {
    auto mo = MtOptions(dir.path(), env.get());
    mo.listen.port = port;
    mt.emplace(mo);
    REQUIRE(mt->Start().ok());
    port = mt->port();
  }
  void Stop() { mt.reset(); }
  cdp::mt::MasterTarget* operator->() { return &*mt; }
  // Waits until the MT applied exactly `seq` of acme/db1; that volume.
  std::shared_ptr<cdp::mt::ReplicaVolume> WaitApplied(uint64_t seq) {
    std::shared_ptr<cdp::mt::ReplicaVolume> vol;
    const bool applied =
        cdp::testing::WaitUntil([&] { return (vol = mt->FindVolume("acme", "db1")) && vol->applied_seq() == seq; },
                                30s, 20ms);
    INFO("applied " << (vol ? vol->applied_seq() : 0) << ", waiting for " << seq);
    REQUIRE(applied);
    return vol;
  }
};

}  // namespace

TEST_CASE("re-protect of a protecting volume: the next generation, armed by the operator, waits until the spool "
          "delivered everything, then retires it and ships once the MT allows it",
          "[server][generation]") {
  // Regression: a re-protect through a PS was refused for ever ("wrong
  // generation: spool has 1, agent sent 2") unless the MT fenced the spool:
  // `cdpctl reprotect` of a protecting volume stopped its replication.
  RestartableMt mt;
  auto env = cdp::NewMemEnv();
  auto o = Options(env.get());
  o.mt.port = mt.port;
  cdp::ps::ProcessServer ps(o);
  REQUIRE(ps.Start().ok());
  auto agent = AgentConnect(ps.agent_port());
  REQUIRE(agent->Send(Vol("db1")).ok());
  const uint32_t id = Expect<cdp::proto::VolumeOpenReply>(*agent).volume_id;
  REQUIRE(agent->Send(Batch(id, 1, 3)).ok());
  CHECK(Expect<cdp::proto::Ack>(*agent).durable_seq == 3);
  mt.WaitApplied(3);
  // The MT goes away: 4..5 are spooled and not delivered.
  mt.Stop();
  REQUIRE(agent->Send(Batch(id, 4, 2)).ok());
  CHECK(Expect<cdp::proto::Ack>(*agent).durable_seq == 5);
  auto open_gen = [&](uint64_t gen) {
    auto c = AgentConnect(ps.agent_port());
    REQUIRE(c->Send(Vol("db1", gen)).ok());
    return c;
  };
  auto refused = [&](uint64_t gen, const std::string& message) {
    auto c = open_gen(gen);
    auto n = Expect<cdp::proto::Nack>(*c);
    CHECK(n.reason == cdp::proto::NackReason::kWrongGeneration);
    CHECK(n.message == message);
  };
  // The agent's word alone changes nothing.
  refused(2, "wrong generation: spool has 1, agent sent 2; a re-protect is an operator command (cdpctl reprotect)");
  CHECK(ps.ArmReprotect("acme", "nope").status().code() == cdp::Code::kNotFound);
  auto arm = ps.ArmReprotect("", "db1");
  REQUIRE(arm.ok());
  CHECK(arm->tenant == "acme");
  CHECK(arm->generation == 2);
  CHECK(arm->undelivered_records == 2);
  refused(3, "wrong generation: spool has 1, agent sent 3; a re-protect is an operator command (cdpctl reprotect)");
  refused(2,
          "wrong generation: spool has 1, agent sent 2; generation 1 still has records to deliver to the master "
          "target, the new one is taken once they are");
  // The MT is back (same data, same port): 4..5 are delivered, then generation 2 is taken.
  mt.Start();
  std::shared_ptr<cdp::mt::ReplicaVolume> vol = mt.WaitApplied(5);
  std::unique_ptr<cdp::FrameChannel> agent2;
  cdp::proto::VolumeOpenReply reply;
  REQUIRE(cdp::testing::WaitUntil(
      [&] {
        auto c = open_gen(2);
        auto m = c->Receive(10s);
        if (!m.ok() || !std::holds_alternative<cdp::proto::VolumeOpenReply>(*m)) return false;
        reply = std::get<cdp::proto::VolumeOpenReply>(*m);
        agent2 = std::move(c);
        return true;
      },
      30s, 20ms));
  CHECK(reply.durable_seq == 0);
  auto names = env->ListDir("/ps/spool/acme");
  REQUIRE(names.ok());
  REQUIRE(names->size() == 2);
  CHECK((*names)[1].rfind("db1.gen1.retired-", 0) == 0);
  // Spooled now, applied once the operator allows generation 2 at the MT.
  REQUIRE(agent2->Send(Batch(reply.volume_id, 1, 2)).ok());
  CHECK(Expect<cdp::proto::Ack>(*agent2).durable_seq == 2);
  CHECK(vol->identity().generation == 1);
  REQUIRE(vol->ArmReprotect().value() == 2);
  REQUIRE(cdp::testing::WaitUntil([&] { return vol->applied_seq() == 7; }, 30s, 20ms));
  CHECK(vol->identity().generation == 2);
}

namespace {

// A process server on `env` (a disk of its own) shipping to the MT at `mt_port`.
std::unique_ptr<cdp::ps::ProcessServer> StartPs(cdp::Env* env, uint16_t mt_port) {
  auto o = Options(env);
  o.mt.port = mt_port;
  auto ps = std::make_unique<cdp::ps::ProcessServer>(o);
  REQUIRE(ps->Start().ok());
  return ps;
}

// Opens `name` at generation `gen` with the agent's acknowledged sequence
// `acked` until the PS answers with a VolumeOpenReply (30 s at most).
std::pair<std::unique_ptr<cdp::FrameChannel>, cdp::proto::VolumeOpenReply> OpenWhenAnswered(
    uint16_t port, const std::string& name, uint64_t gen, uint64_t acked) {
  std::unique_ptr<cdp::FrameChannel> ch;
  cdp::proto::VolumeOpenReply reply;
  const bool answered = cdp::testing::WaitUntil(
      [&] {
        auto c = AgentConnect(port);
        auto vo = Vol(name, gen);
        vo.acked_seq = acked;
        if (!c->Send(vo).ok()) return false;
        auto m = c->Receive(10s);
        if (!m.ok() || !std::holds_alternative<cdp::proto::VolumeOpenReply>(*m)) return false;
        reply = std::get<cdp::proto::VolumeOpenReply>(*m);
        ch = std::move(c);
        return true;
      },
      30s, 20ms);
  REQUIRE(answered);
  return {std::move(ch), reply};
}

// Replicates 1..5 of acme/db1 through a PS on `disk` to `mt`; then a site
// outage: both go down, the PS comes back on `new_disk` (its spool lost), the
// MT stays down. The new PS.
std::unique_ptr<cdp::ps::ProcessServer> OutageLosingTheSpool(RestartableMt& mt, cdp::Env* disk, cdp::Env* new_disk) {
  auto ps = StartPs(disk, mt.port);
  {
    auto agent = AgentConnect(ps->agent_port());
    REQUIRE(agent->Send(Vol("db1")).ok());
    const uint32_t id = Expect<cdp::proto::VolumeOpenReply>(*agent).volume_id;
    REQUIRE(agent->Send(Batch(id, 1, 5)).ok());
    CHECK(Expect<cdp::proto::Ack>(*agent).durable_seq == 5);
  }
  mt.WaitApplied(5);
  ps.reset();
  mt.Stop();
  return StartPs(new_disk, mt.port);
}

// The operator re-protects acme/db1 (PS, then MT) while the PS has nothing
// it can still deliver: generation 2 is taken at once, its records 1..2 are
// applied after what the MT held.
void ReprotectWithNothingUndelivered(cdp::ps::ProcessServer& ps, cdp::mt::ReplicaVolume& vol) {
  const uint64_t before = vol.applied_seq();
  auto arm = ps.ArmReprotect("acme", "db1");
  REQUIRE(arm.ok());
  CHECK(arm->undelivered_records == 0);
  REQUIRE(vol.ArmReprotect().value() == 2);
  auto [agent, reply] = OpenWhenAnswered(ps.agent_port(), "db1", 2, 0);
  CHECK(reply.durable_seq == 0);
  REQUIRE(agent->Send(Batch(reply.volume_id, 1, 2)).ok());
  CHECK(Expect<cdp::proto::Ack>(*agent).durable_seq == 2);
  REQUIRE(cdp::testing::WaitUntil([&] { return vol.applied_seq() == before + 2; }, 30s, 20ms));
  CHECK(vol.identity().generation == 2);
}

// After OutageLosingTheSpool: the agent, with no acknowledged sequence to
// send, is answered 0 and numbers `n` new writes 1..n; then the MT returns.
// The PS.
std::unique_ptr<cdp::ps::ProcessServer> NewWritesBeforeTheMtReturns(RestartableMt& mt, cdp::Env* disk,
                                                                    cdp::Env* new_disk, uint64_t n) {
  auto ps = OutageLosingTheSpool(mt, disk, new_disk);
  auto [agent, reply] = OpenWhenAnswered(ps->agent_port(), "db1", 1, 0);
  REQUIRE(reply.durable_seq == 0);
  REQUIRE(agent->Send(Batch(reply.volume_id, 1, n)).ok());
  CHECK(Expect<cdp::proto::Ack>(*agent).durable_seq == n);
  mt.Start();
  return ps;
}

// The first copy of the PS's only volume, as /v1/volumes shows it.
boost::json::object FirstCopy(cdp::ps::ProcessServer& ps) {
  auto r = cdp::http::HttpRequest("127.0.0.1", ps.control_port(), "GET", "/v1/volumes");
  REQUIRE(r.ok());
  return boost::json::parse(r->body).at("volumes").at(0).at("copies").at(0).as_object();
}

// Waits (30 s at most) until that copy's `stalled` contains `text`.
bool FirstCopyStalledWith(cdp::ps::ProcessServer& ps, const std::string& text) {
  return cdp::testing::WaitUntil(
      [&] { return std::string(FirstCopy(ps).at("stalled").as_string()).find(text) != std::string::npos; }, 30s,
      20ms);
}

// Restarts the PS on `disk`: its first copy is refused again (the refusal
// was kept), and the MT still stands at `applied`.
void RestartStillRefused(std::unique_ptr<cdp::ps::ProcessServer>& ps, cdp::Env* disk, RestartableMt& mt,
                         cdp::mt::ReplicaVolume& vol, uint64_t applied) {
  ps.reset();
  ps = StartPs(disk, mt.port);
  REQUIRE(FirstCopyStalledWith(*ps, "records spooled since may reuse its sequence numbers"));
  CHECK(vol.applied_seq() == applied);
}

}  // namespace

TEST_CASE("a spool that lost records it had acknowledged answers the agent once the master target said where the "
          "volume stands",
          "[server][history]") {
  // Regression: after a site outage in which the process server's spool was
  // lost, the agent came back before the master target; the PS answered its
  // open with 0 and the agent numbered its next writes from 1, numbers the MT
  // had already applied to other writes. The link stalled for ever ("master
  // target claims sequence 150 beyond the spool's last 92"), and once the
  // spool had passed the MT, the MT would have skipped them.
  RestartableMt mt;
  auto env = cdp::NewMemEnv();
  auto env2 = cdp::NewMemEnv();  // the PS's new disk (outlives the PS that uses it)
  auto ps = OutageLosingTheSpool(mt, env.get(), env2.get());
  {
    auto c = AgentConnect(ps->agent_port());
    auto vo = Vol("db1");
    vo.acked_seq = 5;
    REQUIRE(c->Send(vo).ok());
    auto n = Expect<cdp::proto::Nack>(*c);
    CHECK(n.reason == cdp::proto::NackReason::kBusy);
    CHECK(n.message.rfind("the process server holds volume db1 up to seq 0 but acknowledged up to 5 (its spool lost "
                          "records); it answers once every master target has said where the volume stands, so that "
                          "no sequence is used twice: master target 127.0.0.1:" + std::to_string(mt.port) + ": ",
                          0) == 0);
  }
  mt.Start();
  SECTION("the MT is back: the agent resumes after what it applied, and its next writes are applied") {
    auto [agent, reply] = OpenWhenAnswered(ps->agent_port(), "db1", 1, 5);
    CHECK(reply.durable_seq == 5);
    REQUIRE(agent->Send(Batch(reply.volume_id, 6, 2)).ok());
    CHECK(Expect<cdp::proto::Ack>(*agent).durable_seq == 7);
    mt.WaitApplied(7);
  }
  SECTION("the MT is back with the volume failed over: the agent's open gets the fence, not the wait") {
    REQUIRE(mt->Failover("acme", "db1", 5, 0).ok());
    cdp::proto::Nack n;
    REQUIRE(cdp::testing::WaitUntil(
        [&] {
          auto c = AgentConnect(ps->agent_port());
          auto vo = Vol("db1");
          vo.acked_seq = 5;
          if (!c->Send(vo).ok()) return false;
          n = Expect<cdp::proto::Nack>(*c);
          return n.reason != cdp::proto::NackReason::kBusy;
        },
        30s, 20ms));
    CHECK(cdp::proto::IsFailedOverNack(n));
    CHECK(n.message.rfind("failed over: volume db1 failed over", 0) == 0);
  }
}

TEST_CASE("a master target beyond the spool's records stays refused once the spool passes it, until a re-protect",
          "[server][history]") {
  // Regression: an agent that sent no acknowledged sequence (its first
  // acknowledgement was lost with the spool) numbered new writes 1..3, which
  // the MT (at 5) had applied to other writes. The link refused to resume,
  // but once the spool passed 5 it resumed after 5: the new 1..5 were
  // skipped, silently.
  RestartableMt mt;
  auto env = cdp::NewMemEnv();
  auto env2 = cdp::NewMemEnv();  // the PS's new disk (outlives the PS that uses it)
  auto ps = NewWritesBeforeTheMtReturns(mt, env.get(), env2.get(), 3);
  REQUIRE(FirstCopyStalledWith(*ps, "master target claims sequence 5 beyond the spool's last 3"));
  // The spool passes 5; the next open is refused all the same.
  {
    auto [agent, reply] = OpenWhenAnswered(ps->agent_port(), "db1", 1, 0);
    REQUIRE(reply.durable_seq == 3);
    REQUIRE(agent->Send(Batch(reply.volume_id, 4, 4)).ok());
    CHECK(Expect<cdp::proto::Ack>(*agent).durable_seq == 7);
  }
  REQUIRE(FirstCopyStalledWith(*ps, "records spooled since may reuse its sequence numbers"));
  CHECK(FirstCopy(*ps).at("undeliverable").as_bool());
  std::shared_ptr<cdp::mt::ReplicaVolume> vol = mt.WaitApplied(5);
  SECTION("a restart of the PS keeps refusing (beyond.meta): it would resume after 5 and skip the new 1..5") {
    RestartStillRefused(ps, env2.get(), mt, *vol, 5);
    CHECK(FirstCopy(*ps).at("undeliverable").as_bool());
  }
  // A re-protect gets the volume going: the next generation compares everything.
  ReprotectWithNothingUndelivered(*ps, *vol);
}

TEST_CASE("a new spool that numbered records before its master target answered is refused, even when the master "
          "target stands below the spool's last record",
          "[server][history]") {
  // Regression: the spool was lost while the MT (at 5) was down; the agent,
  // with no acknowledged sequence to send, was answered 0 and numbered new
  // writes 1..7. When the MT came back the link resumed after 5: the new
  // records 1..5 were never applied, silently.
  RestartableMt mt;
  auto env = cdp::NewMemEnv();
  auto env2 = cdp::NewMemEnv();
  auto ps = NewWritesBeforeTheMtReturns(mt, env.get(), env2.get(), 7);
  REQUIRE(FirstCopyStalledWith(*ps, "master target stands at seq 5, but this spool numbered records 1..7 before "
                                    "that master target answered"));
  CHECK(FirstCopy(*ps).at("undeliverable").as_bool());
  std::shared_ptr<cdp::mt::ReplicaVolume> vol = mt.WaitApplied(5);
  // Still refused after a restart of the PS.
  RestartStillRefused(ps, env2.get(), mt, *vol, 5);
  ReprotectWithNothingUndelivered(*ps, *vol);
}

TEST_CASE("a new volume's spool is anchored by its master target's first answer: records numbered while the MT "
          "was down are delivered",
          "[server][history]") {
  // The other side of the rule above: a volume new to both, protected while
  // its MT is down, is not refused when the MT answers 0.
  RestartableMt mt;
  mt.Stop();
  auto env = cdp::NewMemEnv();
  auto ps = StartPs(env.get(), mt.port);
  auto [agent, reply] = OpenWhenAnswered(ps->agent_port(), "db1", 1, 0);
  REQUIRE(reply.durable_seq == 0);
  REQUIRE(agent->Send(Batch(reply.volume_id, 1, 4)).ok());
  CHECK(Expect<cdp::proto::Ack>(*agent).durable_seq == 4);
  CHECK(env->Exists("/ps/spool/acme/db1/anchor.meta"));
  mt.Start();
  mt.WaitApplied(4);
  CHECK_FALSE(env->Exists("/ps/spool/acme/db1/anchor.meta"));
}

TEST_CASE("a spool record that fails its check stalls the copy as undeliverable, and a re-protect, or a restart of "
          "the PS, gets the volume going again",
          "[server][generation]") {
  // Regression: the PS waited for the damaged generation to deliver every
  // record before it took the armed next one, which it never could: a
  // re-protect of a volume with a damaged spool record wedged it.
  RestartableMt mt;
  auto env = cdp::NewMemEnv();
  auto ps = StartPs(env.get(), mt.port);
  auto agent = AgentConnect(ps->agent_port());
  REQUIRE(agent->Send(Vol("db1")).ok());
  const uint32_t id = Expect<cdp::proto::VolumeOpenReply>(*agent).volume_id;
  REQUIRE(agent->Send(Batch(id, 1, 3)).ok());
  CHECK(Expect<cdp::proto::Ack>(*agent).durable_seq == 3);
  mt.WaitApplied(3);
  // The MT goes away; 20 MiB are spooled in one group, too large to be kept
  // in memory, so the link reads them back from the file.
  mt.Stop();
  REQUIRE(agent->Send(Batch(id, 4, 20, 1 << 20)).ok());
  CHECK(Expect<cdp::proto::Ack>(*agent).durable_seq == 23);
  // One byte of record 19's data rots on the PS's disk.
  auto names = env->ListDir("/ps/spool/acme/db1");
  REQUIRE(names.ok());
  std::string seg;
  for (const auto& n : *names)  // the last segment (names sort by first sequence)
    if (n.size() > 4 && n.compare(n.size() - 4, 4, cdp::ps::kSpoolSegmentSuffix) == 0)
      seg = std::max(seg, "/ps/spool/acme/db1/" + n);
  REQUIRE(!seg.empty());
  {
    auto f = env->Open(seg, {});
    REQUIRE(f.ok());
    auto size = (*f)->Size();
    REQUIRE(size.ok());
    const uint64_t at = *size - (5u << 20);
    uint8_t b = 0;
    REQUIRE((*f)->Read(at, 1, &b).ok());
    b ^= 0x20;
    REQUIRE((*f)->Write(at, cdp::ByteSpan(&b, 1)).ok());
  }
  mt.Start();
  auto stalled = [&] {
    auto r = cdp::http::HttpRequest("127.0.0.1", ps->control_port(), "GET", "/v1/volumes");
    REQUIRE(r.ok());
    return std::string(boost::json::parse(r->body).at("volumes").as_array().at(0).at("stalled").as_string());
  };
  REQUIRE(cdp::testing::WaitUntil([&] { return stalled().find("failed its check") != std::string::npos; }, 30s,
                                  20ms));
  std::shared_ptr<cdp::mt::ReplicaVolume> vol = mt.WaitApplied(18);
  {
    auto r = cdp::http::HttpRequest("127.0.0.1", ps->control_port(), "GET", "/v1/volumes");
    REQUIRE(r.ok());
    const auto copy = boost::json::parse(r->body).at("volumes").at(0).at("copies").at(0);
    CHECK(copy.at("undeliverable").as_bool());
    CHECK(!copy.at("lost").as_bool());
  }
  SECTION("the operator re-protects: nothing more can be delivered, so the next generation is taken at once") {
    ReprotectWithNothingUndelivered(*ps, *vol);
  }
  SECTION("or the PS restarts: recovery drops the bad record and every later one, the agent resumes after 18") {
    agent.reset();
    ps.reset();
    ps = StartPs(env.get(), mt.port);
    auto [agent2, reply] = OpenWhenAnswered(ps->agent_port(), "db1", 1, 23);
    CHECK(reply.durable_seq == 18);
    REQUIRE(agent2->Send(Batch(reply.volume_id, 19, 2)).ok());
    CHECK(Expect<cdp::proto::Ack>(*agent2).durable_seq == 20);
    REQUIRE(cdp::testing::WaitUntil([&] { return vol->applied_seq() == 20; }, 30s, 20ms));
    CHECK(stalled().empty());
  }
}

TEST_CASE("re-protect: a higher generation is refused while the spool is not fenced, once the MT fences it the old "
          "spool is retired (renamed, kept), the new generation ships after ArmReprotect, a restart skips the "
          "retired directory",
          "[server][failback][generation]") {
  cdp::testing::ScratchDir dir;
  auto mt_env = cdp::NewPosixEnv();
  cdp::mt::MasterTarget mt(MtOptions(dir.path(), mt_env.get()));
  REQUIRE(mt.Start().ok());
  auto env = cdp::NewMemEnv();
  auto o = Options(env.get());
  o.mt.port = mt.port();
  std::optional<cdp::ps::ProcessServer> ps;
  ps.emplace(o);
  REQUIRE(ps->Start().ok());
  auto volumes = [&] {
    auto r = cdp::http::HttpRequest("127.0.0.1", ps->control_port(), "GET", "/v1/volumes");
    REQUIRE(r.ok());
    return boost::json::parse(r->body).at("volumes").as_array();
  };

  auto agent = AgentConnect(ps->agent_port());
  REQUIRE(agent->Send(Vol("db1")).ok());
  const uint32_t id = Expect<cdp::proto::VolumeOpenReply>(*agent).volume_id;
  REQUIRE(agent->Send(Batch(id, 1, 3)).ok());
  CHECK(Expect<cdp::proto::Ack>(*agent).durable_seq == 3);
  std::shared_ptr<cdp::mt::ReplicaVolume> vol;
  REQUIRE(cdp::testing::WaitUntil([&] { return (vol = mt.FindVolume("acme", "db1")) && vol->applied_seq() == 3; },
                                  30s, 20ms));
  // Not fenced, not armed by the operator: a higher generation is refused
  // though everything was delivered, a lower one too.
  for (uint64_t gen : {2, 0}) {
    auto c = AgentConnect(ps->agent_port());
    REQUIRE(c->Send(Vol("db1", gen)).ok());
    auto n = Expect<cdp::proto::Nack>(*c);
    CHECK(n.reason == cdp::proto::NackReason::kWrongGeneration);
    CHECK(n.message.rfind("wrong generation: spool has 1", 0) == 0);
  }

  // Failover; 4..5 spooled and never delivered; failback to the end.
  REQUIRE(mt.Failover("acme", "db1", 3, 0).ok());
  REQUIRE(agent->Send(Batch(id, 4, 2)).ok());
  CHECK(Expect<cdp::proto::Ack>(*agent).durable_seq == 5);
  REQUIRE(cdp::testing::WaitUntil(
      [&] { return !volumes().at(0).as_object().at("fenced").as_string().empty(); }, 30s, 20ms));
  REQUIRE(mt.StartFailback("acme", "db1").ok());
  REQUIRE(mt.QuiesceFailback("acme", "db1").ok());
  auto fin = mt.FinishFailback("acme", "db1");
  REQUIRE(fin.ok());
  const uint64_t base = vol->applied_seq();
  // A lower generation stays refused while fenced.
  {
    auto c = AgentConnect(ps->agent_port());
    REQUIRE(c->Send(Vol("db1", 0)).ok());
    CHECK(Expect<cdp::proto::Nack>(*c).reason == cdp::proto::NackReason::kWrongGeneration);
  }

  // Generation 2: the fenced spool is retired, a new one starts from 0.
  auto agent2 = AgentConnect(ps->agent_port());
  REQUIRE(agent2->Send(Vol("db1", 2)).ok());
  auto reply = Expect<cdp::proto::VolumeOpenReply>(*agent2);
  CHECK(reply.durable_seq == 0);
  auto names = env->ListDir("/ps/spool/acme");
  REQUIRE(names.ok());
  REQUIRE(names->size() == 2);
  CHECK((*names)[0] == "db1");
  const std::string retired = (*names)[1];
  CHECK(retired.rfind("db1.gen1.retired-", 0) == 0);
  // The retired spool holds everything it held: 4..5 never delivered.
  {
    cdp::ps::SpoolOptions so;
    so.env = env.get();
    so.clock = cdp::SystemClock::Get();
    so.dir = "/ps/spool/acme/" + retired;
    auto sp = cdp::ps::Spool::Open(so);
    REQUIRE(sp.ok());
    CHECK((*sp)->durable_seq() == 5);
    auto recs = (*sp)->Read(4, 1 << 20);
    REQUIRE(recs.ok());
    REQUIRE(recs->size() == 2);
    CHECK((*recs)[0].seq == 4);
    CHECK((*recs)[1].data == Batch(id, 5, 1).records[0].data);
    auto meta = cdp::ReadWholeFile(env.get(), so.dir + "/volume.meta");
    REQUIRE(meta.ok());
    CHECK(cdp::ps::DecodeVolumeMeta(*meta)->generation == 1);
  }
  // The old generation's connection is still fenced.
  REQUIRE(agent->Send(Batch(id, 6, 1)).ok());
  CHECK(cdp::proto::IsFailedOverNack(Expect<cdp::proto::Nack>(*agent)));

  // The new generation's records are spooled, and reach the MT once re-protect is armed there.
  REQUIRE(agent2->Send(Batch(reply.volume_id, 1, 2)).ok());
  CHECK(Expect<cdp::proto::Ack>(*agent2).durable_seq == 2);
  CHECK(vol->identity().generation == 1);
  REQUIRE(vol->ArmReprotect().value() == 2);
  REQUIRE(cdp::testing::WaitUntil([&] { return vol->applied_seq() == base + 2; }, 30s, 20ms));
  CHECK(vol->identity().generation == 2);
  cdp::Bytes b(4096);
  REQUIRE(vol->ReadAt(vol->applied_seq(), 2 * 4096, 4096, b.data()).ok());
  CHECK(b == Batch(id, 2, 1).records[0].data);
  REQUIRE(cdp::testing::WaitUntil(
      [&] { return volumes().at(0).as_object().at("mt_acked_seq").to_number<uint64_t>() == 2; }, 30s, 20ms));

  // A restart finds the generation 2 spool only; the retired one stays on disk.
  agent.reset();
  agent2.reset();
  ps.reset();
  ps.emplace(o);
  REQUIRE(ps->Start().ok());
  auto vs = volumes();
  REQUIRE(vs.size() == 1);
  CHECK(vs.at(0).as_object().at("volume").as_string() == "db1");
  CHECK(env->Exists("/ps/spool/acme/" + retired + "/volume.meta"));
  auto agent3 = AgentConnect(ps->agent_port());
  REQUIRE(agent3->Send(Vol("db1", 2)).ok());
  CHECK(Expect<cdp::proto::VolumeOpenReply>(*agent3).durable_seq == 2);
  // A volume name with the retired mark is not an agent's to use.
  REQUIRE(agent3->Send(Vol(retired, 1)).ok());
  CHECK(Expect<cdp::proto::Nack>(*agent3).reason == cdp::proto::NackReason::kBadRecord);
}

TEST_CASE("failback relay: a plan page the spool's blocks make longer than kMaxExtents is cut there and goes on "
          "at next_block",
          "[server][failback]") {
  using cdp::proto::BlockExtent;
  using cdp::proto::FailbackStatus;
  cdp::testing::ScratchDir dir;
  auto mt_env = cdp::NewPosixEnv();
  cdp::mt::MasterTarget mt(MtOptions(dir.path(), mt_env.get()));
  REQUIRE(mt.Start().ok());
  auto mem = cdp::NewMemEnv();
  cdp::FaultEnv env(mem.get());  // counts the spool's reads
  auto o = Options(&env);
  o.mt.port = mt.port();
  cdp::ps::ProcessServer ps(o);
  REQUIRE(ps.Start().ok());
  auto open = Vol("db1");
  open.size = uint64_t(1) << 30;
  auto agent = AgentConnect(ps.agent_port());
  REQUIRE(agent->Send(open).ok());
  const uint32_t id = Expect<cdp::proto::VolumeOpenReply>(*agent).volume_id;
  REQUIRE(agent->Send(Batch(id, 1, 3)).ok());
  CHECK(Expect<cdp::proto::Ack>(*agent).durable_seq == 3);
  std::shared_ptr<cdp::mt::ReplicaVolume> vol;
  REQUIRE(cdp::testing::WaitUntil([&] { return (vol = mt.FindVolume("acme", "db1")) && vol->applied_seq() == 3; },
                                  30s, 20ms));
  REQUIRE(mt.Failover("acme", "db1", 3, 0).ok());
  // kMaxExtents + 1 trims, every other block (2b): as many separate extents.
  const uint64_t n = cdp::proto::kMaxExtents + 1;
  cdp::proto::WriteBatch trims;
  trims.volume_id = id;
  for (uint64_t b = 0; b < n; ++b) trims.records.push_back(Rec(4 + b, RecordKind::kTrim, b * 2 * 4096, 512));
  REQUIRE(agent->Send(trims).ok());
  CHECK(Expect<cdp::proto::Ack>(*agent).durable_seq == 3 + n);
  REQUIRE(mt.StartFailback("acme", "db1").ok());

  auto fb = AgentConnect(ps.agent_port());
  auto plan = CallUntilAnswered<cdp::proto::FailbackPlan>(*fb, cdp::proto::FailbackPlanRequest{1, "db1", 0});
  REQUIRE(plan.status == FailbackStatus::kOk);
  REQUIRE(plan.extents.size() == cdp::proto::kMaxExtents);
  CHECK(plan.extents.front() == BlockExtent{0, 1});
  CHECK(plan.extents.back() == BlockExtent{2 * (n - 2), 1});
  CHECK(plan.next_block == 2 * (n - 1));
  // The next page is cut from the same read of the spool (it did not change).
  const uint64_t reads = env.CallCount(cdp::FaultEnv::Op::kRead);
  plan = CallUntilAnswered<cdp::proto::FailbackPlan>(*fb, cdp::proto::FailbackPlanRequest{2, "db1", plan.next_block});
  REQUIRE(plan.status == FailbackStatus::kOk);
  CHECK(plan.extents == std::vector<BlockExtent>{{2 * (n - 1), 1}});
  CHECK(plan.next_block == 0);
  CHECK(env.CallCount(cdp::FaultEnv::Op::kRead) == reads);
}

// A kill -9 of the switch after the rename and before the new spool exists:
// the restart ignores the retired directory and the next open creates the
// new generation's spool. (Before the rename, the old spool is simply there.)
TEST_CASE("re-protect crash safety: a restart between the rename and the new spool ignores the retired directory",
          "[server][generation]") {
  auto env = cdp::NewMemEnv();
  {
    cdp::ps::ProcessServer ps(Options(env.get()));
    REQUIRE(ps.Start().ok());
    auto agent = AgentConnect(ps.agent_port());
    REQUIRE(agent->Send(Vol("db1")).ok());
    const uint32_t id = Expect<cdp::proto::VolumeOpenReply>(*agent).volume_id;
    REQUIRE(agent->Send(Batch(id, 1, 3)).ok());
    CHECK(Expect<cdp::proto::Ack>(*agent).durable_seq == 3);
  }
  // What the switch leaves at that point.
  REQUIRE(env->Rename("/ps/spool/acme/db1", "/ps/spool/acme/db1.gen1.retired-1700000000").ok());
  cdp::ps::ProcessServer ps(Options(env.get()));
  REQUIRE(ps.Start().ok());
  auto r = cdp::http::HttpRequest("127.0.0.1", ps.control_port(), "GET", "/v1/volumes");
  REQUIRE(r.ok());
  CHECK(boost::json::parse(r->body).at("volumes").as_array().empty());
  auto agent = AgentConnect(ps.agent_port());
  REQUIRE(agent->Send(Vol("db1", 2)).ok());
  CHECK(Expect<cdp::proto::VolumeOpenReply>(*agent).durable_seq == 0);
  auto names = env->ListDir("/ps/spool/acme");
  REQUIRE(names.ok());
  CHECK(*names == std::vector<std::string>{"db1", "db1.gen1.retired-1700000000"});
  CHECK(env->Exists("/ps/spool/acme/db1.gen1.retired-1700000000/volume.meta"));
}

// SPDX-License-Identifier: Apache-2.0
// The one replication receiver (common/wire/replication_receiver.h) with a
// sink of the test's, over loopback TCP: group commit, handles, caps on
// requests in flight, answers from other threads, fences and admission.
#include <catch2/catch.hpp>

#include <boost/asio/ip/tcp.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/base/clock.h"
#include "common/wire/channel.h"
#include "common/wire/replication_receiver.h"

namespace cdp::repl {
namespace {

namespace asio = boost::asio;
using std::chrono::milliseconds;
using tcp = asio::ip::tcp;

constexpr char kTenant[] = "acme";
constexpr char kSecret[] = "s3cret-s3cret-s3cret";

// What the test's volume saw and how it answers.
struct Shared {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<std::vector<uint64_t>, int>> appends;  // sequences, batches
  std::vector<uint64_t> append_wire;                           // each Append's wire_bytes
  std::string fence;
  bool hold_first_append = false;  // the first Append waits for release
  bool released = false;
  std::vector<Reply> held_replies;  // Digests answers the test gives later

  template <typename Pred>
  bool WaitFor(Pred pred) {
    std::unique_lock<std::mutex> l(mu);
    return cv.wait_for(l, std::chrono::seconds(10), pred);
  }
};

class TestVolume : public ReceiverVolume {
 public:
  explicit TestVolume(Shared& s) : s_(s) {}
  const std::string& key() const override { return key_; }
  std::string Fence() override {
    std::lock_guard<std::mutex> l(s_.mu);
    return s_.fence;
  }
  Verdict Append(std::vector<proto::Record> records, int batches, uint64_t wire_bytes) override {
    std::unique_lock<std::mutex> l(s_.mu);
    std::vector<uint64_t> seqs;
    for (const auto& r : records) seqs.push_back(r.seq);
    s_.appends.emplace_back(seqs, batches);
    s_.append_wire.push_back(wire_bytes);
    s_.cv.notify_all();
    if (s_.appends.size() == 1 && s_.hold_first_append) s_.cv.wait(l, [&] { return s_.released; });
    return Verdict::Accept(seqs.back());
  }
  void Digests(const proto::HashRequest&, Reply reply) override {
    std::lock_guard<std::mutex> l(s_.mu);
    s_.held_replies.push_back(std::move(reply));
    s_.cv.notify_all();
  }

 private:
  Shared& s_;
  const std::string key_ = "acme/vol";
};

class TestSink : public ReceiverSink {
 public:
  explicit TestSink(Shared& s) : s_(s) {}
  Opened Open(const proto::VolumeOpen&) override {
    auto v = std::make_shared<TestVolume>(s_);
    if (std::string f = v->Fence(); !f.empty()) return {v, Verdict::Refuse(proto::NackReason::kWrongGeneration, f)};
    return {v, Verdict::Accept(0)};
  }
  void Call(proto::Message request, Reply reply) override { reply(FailedAnswer(request)); }

 private:
  Shared& s_;
};

// A receiver serving one loopback connection on a thread of its own.
struct Fixture {
  Shared shared;
  metrics::Gauge queued;
  metrics::Counter grouped, nacks;
  ReceiveStages stages;
  std::atomic<bool> stopping{false};
  std::unique_ptr<ReplicationReceiver> receiver;
  std::unique_ptr<FrameChannel> client, server;
  std::thread serving;
  std::atomic<bool> served{false};

  explicit Fixture(ReceiverOptions o = {}) {
    o.secret = [](const std::string& t) -> std::optional<std::string> {
      if (t == kTenant) return std::string(kSecret);
      return std::nullopt;
    };
    if (!o.admit) o.admit = [](const std::string&, const PeerIdentity&) { return std::string(); };
    o.make_sink = [this](const Session&) { return std::make_unique<TestSink>(shared); };
    o.clock = SystemClock::Get();
    o.stopping = &stopping;
    o.queued_bytes = &queued;
    o.batches_grouped = &grouped;
    o.nacks = &nacks;
    o.stages = &stages;
    receiver = std::make_unique<ReplicationReceiver>(std::move(o));
    asio::io_context ctx;
    tcp::acceptor acceptor(ctx, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    auto accepted = std::async(std::launch::async, [&] {
      tcp::socket s(ctx);
      acceptor.accept(s);
      return FrameChannel::Adopt(std::move(s));
    });
    auto c = Connect("127.0.0.1", acceptor.local_endpoint().port(), milliseconds(5000));
    REQUIRE(c.ok());
    client = std::move(*c);
    auto s = accepted.get();
    REQUIRE(s.ok());
    server = std::move(*s);
    serving = std::thread([this] {
      receiver->Serve(*server);
      served = true;
      server->Close();  // as the listener does when Serve returns
    });
  }
  ~Fixture() {
    stopping = true;
    client->Close();
    serving.join();
  }

  Status Handshake(proto::Role role = proto::Role::kProcessServer) {
    return ClientHandshake(*client, role, kTenant, "test-peer", kSecret, milliseconds(5000));
  }
  template <typename M>
  M Next() {
    auto m = client->Receive(milliseconds(10000));
    REQUIRE(m.ok());
    INFO("message type " << int(proto::TypeOf(*m)));
    REQUIRE(std::holds_alternative<M>(*m));
    return std::get<M>(std::move(*m));
  }
  static proto::VolumeOpen OpenMessage() {
    proto::VolumeOpen o;
    o.name = "vol";
    o.size = 1 << 20;
    o.block_size = 4096;
    return o;
  }
  uint32_t Open() {
    REQUIRE(client->Send(OpenMessage()).ok());
    return Next<proto::VolumeOpenReply>().volume_id;
  }
};

proto::WriteBatch Batch(uint32_t handle, uint64_t first, size_t n) {
  proto::WriteBatch wb;
  wb.volume_id = handle;
  for (size_t i = 0; i < n; ++i)
    wb.records.push_back({first + i, 0, 4096, proto::RecordKind::kData, 1, Bytes(4096, uint8_t(first + i))});
  return wb;
}

TEST_CASE("receiver: batches already received that continue the volume's sequence are stored as one group, each "
          "answered in order",
          "[receiver]") {
  Fixture f;
  f.shared.hold_first_append = true;
  REQUIRE(f.Handshake().ok());
  const uint32_t h = f.Open();
  CHECK(h == 1);
  uint64_t wire[4] = {};  // each frame's size as sent
  REQUIRE(f.client->Send(Batch(h, 1, 2), &wire[0]).ok());
  REQUIRE(f.shared.WaitFor([&] { return f.shared.appends.size() == 1; }));
  // While the first is being stored, three more arrive.
  REQUIRE(f.client->Send(Batch(h, 3, 1), &wire[1]).ok());
  REQUIRE(f.client->Send(Batch(h, 4, 2), &wire[2]).ok());
  REQUIRE(f.client->Send(Batch(h, 6, 1), &wire[3]).ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (f.queued.Value() < 4 * 4096 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(milliseconds(1));
  REQUIRE(f.queued.Value() >= 4 * 4096);
  {
    std::lock_guard<std::mutex> l(f.shared.mu);
    f.shared.released = true;
  }
  f.shared.cv.notify_all();
  std::vector<uint64_t> acks;
  for (int i = 0; i < 4; ++i) {
    auto a = f.Next<proto::Ack>();
    CHECK(a.volume_id == h);
    acks.push_back(a.durable_seq);
  }
  CHECK(acks == std::vector<uint64_t>{2, 6, 6, 6});
  std::lock_guard<std::mutex> l(f.shared.mu);
  REQUIRE(f.shared.appends.size() == 2);
  CHECK(f.shared.appends[0] == std::make_pair(std::vector<uint64_t>{1, 2}, 1));
  CHECK(f.shared.appends[1] == std::make_pair(std::vector<uint64_t>{3, 4, 5, 6}, 3));
  // Each group is told the wire bytes of its frames (the volume's share of the link).
  CHECK(wire[0] > 0);
  CHECK(f.shared.append_wire == std::vector<uint64_t>{wire[0], wire[1] + wire[2] + wire[3]});
  CHECK(f.grouped.Value() == 2);
  CHECK(f.queued.Value() == 0);
  // The stage costs: two group commits; the open and four batches received.
  CHECK(f.stages.groups.load() == 2);
  CHECK(f.stages.inbox.messages.load() == 5);
  // Three batches waited in the queue while the first was held: until the
  // queue held all four (>= 1 ms of the polling above, or it would not have
  // seen them), and the held apply lasted at least as long.
  CHECK(f.stages.inbox.queue_us.load() > 0);
  CHECK(f.stages.apply_us.load() > 0);
}

TEST_CASE("receiver: hash requests over the cap are answered kFailed at once, a held answer given on another thread "
          "arrives, and an unopened handle is refused",
          "[receiver]") {
  ReceiverOptions o;
  o.hashes_per_volume = 2;
  Fixture f(o);
  REQUIRE(f.Handshake().ok());
  const uint32_t h = f.Open();
  for (uint64_t id = 1; id <= 3; ++id) {
    proto::HashRequest r;
    r.volume_id = h;
    r.request_id = id;
    r.region_size = 4096;
    r.count = 1;
    REQUIRE(f.client->Send(r).ok());
  }
  auto over = f.Next<proto::HashResponse>();
  CHECK(over.request_id == 3);
  CHECK(over.status == proto::HashStatus::kFailed);
  REQUIRE(f.shared.WaitFor([&] { return f.shared.held_replies.size() == 2; }));
  std::thread([&] {
    proto::HashResponse ok;
    ok.volume_id = h;
    ok.request_id = 1;
    ok.region_size = 4096;
    ok.hashes = {proto::Hash128{1, 2}};
    ok.seq = 7;
    f.shared.held_replies[0](ok);
  }).join();
  auto answered = f.Next<proto::HashResponse>();
  CHECK(answered.request_id == 1);
  CHECK(answered.status == proto::HashStatus::kOk);
  CHECK(answered.seq == 7);
  // The slot it held is free again: a fourth request reaches the volume.
  proto::HashRequest fourth;
  fourth.volume_id = h;
  fourth.request_id = 4;
  fourth.region_size = 4096;
  fourth.count = 1;
  REQUIRE(f.client->Send(fourth).ok());
  REQUIRE(f.shared.WaitFor([&] { return f.shared.held_replies.size() == 3; }));

  REQUIRE(f.client->Send(Batch(9, 1, 1)).ok());
  auto nack = f.Next<proto::Nack>();
  CHECK(nack.volume_id == 9);
  CHECK(nack.reason == proto::NackReason::kUnknownVolume);
  CHECK(nack.message == "volume not open on this connection");
  CHECK(f.nacks.Value() == 1);
  // A failback request goes to the sink's Call; a heartbeat is echoed.
  REQUIRE(f.client->Send(proto::FailbackPlanRequest{11, "vol", 0}).ok());
  auto plan = f.Next<proto::FailbackPlan>();
  CHECK(plan.request_id == 11);
  CHECK(plan.status == proto::FailbackStatus::kFailed);
  REQUIRE(f.client->Send(proto::Heartbeat{123, 0}).ok());
  CHECK(f.Next<proto::Heartbeat>().echo_us == 123);
}

TEST_CASE("receiver: a fence that comes up on an open volume is told at once, and when a fence the session met "
          "lifts the session closes",
          "[receiver]") {
  Fixture f;
  REQUIRE(f.Handshake().ok());
  const uint32_t h = f.Open();
  {
    std::lock_guard<std::mutex> l(f.shared.mu);
    f.shared.fence = "failed over: volume vol was failed over at the master target";
  }
  auto told = f.Next<proto::Nack>();
  CHECK(told.volume_id == h);
  CHECK(told.reason == proto::NackReason::kWrongGeneration);
  CHECK(proto::IsFailedOverNack(told));
  // Refused again at a new open: still one session.
  REQUIRE(f.client->Send(Fixture::OpenMessage()).ok());
  CHECK(f.Next<proto::Nack>().volume_id == 0);
  CHECK_FALSE(f.served.load());
  {
    std::lock_guard<std::mutex> l(f.shared.mu);
    f.shared.fence.clear();
  }
  auto end = f.client->Receive(milliseconds(10000));
  REQUIRE_FALSE(end.ok());
  CHECK(end.status().code() == Code::kUnavailable);
}

TEST_CASE("receiver: a peer the daemon does not admit gets Nack kPermissionDenied with the reason and is closed",
          "[receiver]") {
  ReceiverOptions o;
  o.admit = [](const std::string&, const PeerIdentity& p) {
    return p.role == proto::Role::kAgent ? std::string("agents connect through a process server") : std::string();
  };
  Fixture f(o);
  REQUIRE(f.Handshake(proto::Role::kAgent).ok());
  auto nack = f.Next<proto::Nack>();
  CHECK(nack.reason == proto::NackReason::kPermissionDenied);
  CHECK(nack.message == "agents connect through a process server");
  auto end = f.client->Receive(milliseconds(10000));
  REQUIRE_FALSE(end.ok());
  CHECK(end.status().code() == Code::kUnavailable);
  CHECK(f.nacks.Value() == 1);
}

}  // namespace
}  // namespace cdp::repl

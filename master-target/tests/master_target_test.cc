// SPDX-License-Identifier: Apache-2.0
// The master target daemon core on loopback: the process-server protocol
// (handshake, VolumeOpen, WriteBatch acks/nacks, hashes, heartbeats), tenant
// isolation, the control API, and point-in-time exports read by real NBD
// clients ([e2e]: qemu-img, nbdinfo, nbdcopy, qemu-io).
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <algorithm>

#include <boost/json.hpp>
#include <chrono>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "common/env/fault_env.h"
#include "common/http/http_client.h"
#include "common/tests/gated_env.h"
#include "common/tests/test_util.h"
#include "common/wire/block_digest.h"
#include "common/wire/channel.h"
#include "common/wire/hash.h"
#include "master-target/export.h"
#include "master-target/master_target.h"
#include "master-target/tests/mt_test_util.h"

using namespace cdp;
using namespace cdp::mt;
using namespace cdp::mt::testing;
using cdp::testing::HaveProgram;
using cdp::testing::RunCommand;
namespace json = boost::json;

namespace {

constexpr auto kTimeout = std::chrono::milliseconds(10000);

struct Daemon {
  explicit Daemon(const std::string& dir, uint64_t globex_quota = 0, size_t max_volumes = 256,
                  const std::function<void(MasterTargetOptions&)>& tweak = {})
      : env(NewPosixEnv()) {
    MasterTargetOptions o;
    o.env = env.get();
    o.clock = SystemClock::Get();
    o.data_dir = dir;
    o.tenants = {{"acme", "s3cret-acme"}, {"globex", "s3cret-globex"}};
    if (globex_quota) o.tenant_quota_bytes["globex"] = globex_quota;
    o.max_volumes_per_tenant = max_volumes;
    o.listen = {"127.0.0.1", 0};
    o.control.port = 0;
    o.nbd.port = 0;
    o.point_interval_us = 0;
    o.segment_bytes = 1 << 20;
    if (tweak) tweak(o);
    mt = std::make_unique<MasterTarget>(o);
    Status s = mt->Start();
    INFO(s.ToString());
    REQUIRE(s.ok());
  }
  std::unique_ptr<Env> env;
  std::unique_ptr<MasterTarget> mt;
};

std::unique_ptr<FrameChannel> Client(uint16_t port, const std::string& tenant, const std::string& secret) {
  auto ch = Connect("127.0.0.1", port, kTimeout);
  REQUIRE(ch.ok());
  Status s = ClientHandshake(**ch, proto::Role::kProcessServer, tenant, "ps-test", secret, kTimeout);
  INFO(s.ToString());
  REQUIRE(s.ok());
  return std::move(*ch);
}

proto::Message Call(FrameChannel& ch, const proto::Message& m) {
  REQUIRE(ch.Send(m).ok());
  auto r = ch.Receive(kTimeout);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  return std::move(*r);
}

proto::VolumeOpen OpenMsg(const std::string& name, uint64_t size, uint64_t gen = 1) {
  proto::VolumeOpen v;
  v.name = name;
  v.size = size;
  v.block_size = 4096;
  v.uuid[0] = 7;
  v.generation = gen;
  return v;
}

uint32_t OpenVolume(FrameChannel& ch, const proto::VolumeOpen& v, uint64_t expect_durable) {
  auto m = Call(ch, v);
  auto* r = std::get_if<proto::VolumeOpenReply>(&m);
  REQUIRE(r != nullptr);
  REQUIRE(r->durable_seq == expect_durable);
  return r->volume_id;
}

proto::WriteBatch Batch(uint32_t vid, std::vector<proto::Record> recs) {
  proto::WriteBatch b;
  b.volume_id = vid;
  b.records = std::move(recs);
  return b;
}

json::value Http(uint16_t port, const std::string& method, const std::string& target, const std::string& body,
                 int expect_status) {
  auto r = http::HttpRequest("127.0.0.1", port, method, target, body, kTimeout);
  REQUIRE(r.ok());
  INFO(method << " " << target << " -> " << r->status << " " << r->body);
  REQUIRE(r->status == expect_status);
  return json::parse(r->body);
}

Bytes ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("process-server protocol: open, apply, ack, nack, hashes, heartbeat, resume", "[server]") {
  TempDir dir;
  Daemon d(dir.path());
  const uint64_t size = 1 << 20;
  Reference ref(size);
  auto ch = Client(d.mt->port(), "acme", "s3cret-acme");
  uint32_t vid = OpenVolume(*ch, OpenMsg("db1", size), 0);

  std::mt19937_64 rng(4);
  auto data = [&](size_t n) {
    Bytes b(n);
    for (auto& x : b) x = uint8_t(rng());
    return b;
  };
  std::vector<proto::Record> b1{DataRecord(1, 0, data(8192)), DataRecord(2, 65536, data(4096)), FlushRecord(3),
                                TagRecord(4, "before-upgrade")};
  ref.Apply(b1);
  auto m = Call(*ch, Batch(vid, b1));
  auto* ack = std::get_if<proto::Ack>(&m);
  REQUIRE(ack != nullptr);
  REQUIRE(ack->volume_id == vid);
  REQUIRE(ack->durable_seq == 4);

  // A gap names the expected sequence; nothing applied.
  m = Call(*ch, Batch(vid, {DataRecord(6, 0, data(512))}));
  auto* nack = std::get_if<proto::Nack>(&m);
  REQUIRE(nack != nullptr);
  REQUIRE(nack->reason == proto::NackReason::kGap);
  REQUIRE(nack->expected_seq == 5);
  // A record past the end: kBadRecord; the connection stays usable.
  m = Call(*ch, Batch(vid, {DataRecord(5, 0, data(512)), DataRecord(6, size - 512, data(1024))}));
  nack = std::get_if<proto::Nack>(&m);
  REQUIRE(nack != nullptr);
  REQUIRE(nack->reason == proto::NackReason::kBadRecord);
  // Unknown volume id.
  m = Call(*ch, Batch(vid + 10, {DataRecord(5, 0, data(512))}));
  nack = std::get_if<proto::Nack>(&m);
  REQUIRE(nack != nullptr);
  REQUIRE(nack->reason == proto::NackReason::kUnknownVolume);
  // Duplicates are acked.
  m = Call(*ch, Batch(vid, b1));
  ack = std::get_if<proto::Ack>(&m);
  REQUIRE((ack != nullptr && ack->durable_seq == 4));
  std::vector<proto::Record> b2{DataRecord(5, 4096, data(4096)), ZeroRecord(6, 65536, 4096), FlushRecord(7)};
  ref.Apply(b2);
  m = Call(*ch, Batch(vid, b2));
  ack = std::get_if<proto::Ack>(&m);
  REQUIRE((ack != nullptr && ack->durable_seq == 7));

  proto::HashRequest hr;
  hr.volume_id = vid;
  hr.request_id = 99;
  hr.region_size = 256 * 1024;
  hr.first_region = 0;
  hr.count = 4;
  m = Call(*ch, hr);
  auto* hs = std::get_if<proto::HashResponse>(&m);
  REQUIRE(hs != nullptr);
  REQUIRE(hs->request_id == 99);
  REQUIRE(hs->hashes.size() == 4);
  for (int i = 0; i < 4; ++i) REQUIRE(hs->hashes[i] == DigestOf(ref.image().data() + i * 256 * 1024, 256 * 1024));
  REQUIRE(hs->seq == 7);
  // A range past the end is answered kFailed, not nacked (a nack would stop
  // the volume's stream at the process server).
  hr.request_id = 100;
  hr.first_region = 1000;
  m = Call(*ch, hr);
  hs = std::get_if<proto::HashResponse>(&m);
  REQUIRE(hs != nullptr);
  REQUIRE(hs->request_id == 100);
  REQUIRE(hs->status == proto::HashStatus::kFailed);
  // Not applied yet: behind, with what is.
  hr.request_id = 101;
  hr.first_region = 0;
  hr.min_seq = 8;
  m = Call(*ch, hr);
  hs = std::get_if<proto::HashResponse>(&m);
  REQUIRE(hs != nullptr);
  REQUIRE(hs->status == proto::HashStatus::kBehind);
  REQUIRE(hs->seq == 7);
  REQUIRE(hs->hashes.empty());

  m = Call(*ch, proto::Heartbeat{12345, 0});
  auto* hb = std::get_if<proto::Heartbeat>(&m);
  REQUIRE((hb != nullptr && hb->echo_us == 12345));

  // A wrong generation is refused; a reconnect resumes at the durable sequence.
  m = Call(*ch, OpenMsg("db1", size, 0));
  nack = std::get_if<proto::Nack>(&m);
  REQUIRE((nack != nullptr && nack->reason == proto::NackReason::kWrongGeneration));
  ch.reset();
  auto ch2 = Client(d.mt->port(), "acme", "s3cret-acme");
  OpenVolume(*ch2, OpenMsg("db1", size), 7);

  // The replica file holds the reference image.
  REQUIRE(ReadFile(VolumeDir(dir.path(), "acme", "db1") + "/replica.img") == ref.image());
}

TEST_CASE("group commit: batches received while one applies are applied together, each answered in order",
          "[server][group]") {
  TempDir dir;
  auto posix = NewPosixEnv();
  cdp::testing::GatedEnv gate(posix.get());
  Daemon d(dir.path(), 0, 256, [&](MasterTargetOptions& o) { o.env = &gate; });
  auto queued = d.mt->registry().GetGauge("cdp_mt_received_queued_bytes", "");
  auto grouped = d.mt->registry().GetCounter("cdp_mt_batches_grouped_total", "");
  const uint64_t size = 1 << 20;
  Reference ref(size);
  auto ch = Client(d.mt->port(), "acme", "s3cret-acme");
  uint32_t vid = OpenVolume(*ch, OpenMsg("db1", size), 0);
  std::mt19937_64 rng(11);
  auto data = [&](size_t n) {
    Bytes b(n);
    for (auto& x : b) x = uint8_t(rng());
    return b;
  };
  // Batch 1 holds its first sync at the gate; 2 and 3 arrive meanwhile.
  auto send = [&](const std::vector<proto::Record>& recs) { REQUIRE(ch->Send(Batch(vid, recs)).ok()); };
  auto held = [&] {
    REQUIRE(gate.WaitUntilSyncBlocked(kTimeout));
  };
  auto wait_queued = [&](int64_t bytes) {
    const auto deadline = std::chrono::steady_clock::now() + kTimeout;
    while (queued->Value() < bytes) {
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };
  auto reply = [&] {
    auto r = ch->Receive(kTimeout);
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    return std::move(*r);
  };
  auto acked = [&](uint64_t seq) {
    auto m = reply();
    auto* ack = std::get_if<proto::Ack>(&m);
    REQUIRE(ack != nullptr);
    CHECK(ack->durable_seq == seq);
  };

  std::vector<proto::Record> b1{DataRecord(1, 0, data(4096)), DataRecord(2, 8192, data(4096))};
  std::vector<proto::Record> b2{DataRecord(3, 4096, data(8192))};
  std::vector<proto::Record> b3{DataRecord(4, 65536, data(4096)), FlushRecord(5)};
  gate.Close();
  send(b1);
  held();
  send(b2);
  send(b3);
  wait_queued(8192 + 4096);
  gate.Open();
  for (const auto* b : {&b1, &b2, &b3}) ref.Apply(*b);
  acked(2);
  acked(5);  // the group: 2 and 3 under one journal sync, one replica sync, one commit
  acked(5);
  CHECK(grouped->Value() == 1);
  CHECK(queued->Value() == 0);
  CHECK(ReadFile(VolumeDir(dir.path(), "acme", "db1") + "/replica.img") == ref.image());

  // A bad record in a later batch refuses the whole group: nothing of it is applied.
  std::vector<proto::Record> b4{DataRecord(6, 0, data(4096))};
  gate.Close();
  send(b4);
  held();
  send({DataRecord(7, 4096, data(4096))});
  send({DataRecord(8, size - 512, data(1024))});  // past the end
  wait_queued(4096 + 1024);
  gate.Open();
  ref.Apply(b4);
  acked(6);
  for (int i = 0; i < 2; ++i) {
    auto m = reply();
    auto* nack = std::get_if<proto::Nack>(&m);
    REQUIRE(nack != nullptr);
    CHECK(nack->reason == proto::NackReason::kBadRecord);
  }
  CHECK(grouped->Value() == 2);
  CHECK(ReadFile(VolumeDir(dir.path(), "acme", "db1") + "/replica.img") == ref.image());
  // The stream goes on from the first refused sequence.
  std::vector<proto::Record> b5{DataRecord(7, 4096, data(4096))};
  ref.Apply(b5);
  send(b5);
  acked(7);
  CHECK(ReadFile(VolumeDir(dir.path(), "acme", "db1") + "/replica.img") == ref.image());
}

TEST_CASE("tenants are isolated: secrets, directories, volumes", "[server][tenant]") {
  TempDir dir;
  Daemon d(dir.path());
  // A wrong secret and an unknown tenant are refused alike.
  for (auto [t, s] : std::vector<std::pair<std::string, std::string>>{{"acme", "s3cret-globex"}, {"nobody", "x"}}) {
    auto ch = Connect("127.0.0.1", d.mt->port(), kTimeout);
    REQUIRE(ch.ok());
    Status st = ClientHandshake(**ch, proto::Role::kProcessServer, t, "ps", s, kTimeout);
    REQUIRE(st.code() == Code::kPermissionDenied);
  }
  auto a = Client(d.mt->port(), "acme", "s3cret-acme");
  auto g = Client(d.mt->port(), "globex", "s3cret-globex");
  uint32_t va = OpenVolume(*a, OpenMsg("shared-name", 1 << 20), 0);
  REQUIRE(std::holds_alternative<proto::Ack>(Call(*a, Batch(va, {DataRecord(1, 0, Bytes(4096, 0xaa))}))));
  // The same name at another tenant is another volume, starting empty.
  uint32_t vg = OpenVolume(*g, OpenMsg("shared-name", 1 << 20), 0);
  proto::HashRequest hr;
  hr.volume_id = vg;
  hr.region_size = 4096;
  hr.count = 1;
  auto m = Call(*g, hr);
  auto* hs = std::get_if<proto::HashResponse>(&m);
  REQUIRE(hs != nullptr);
  REQUIRE(hs->hashes[0] == kZeroDigest);  // reads as zeros: the flag
  // A volume id of one connection means nothing on another.
  m = Call(*g, Batch(va + 5, {DataRecord(1, 0, Bytes(512, 1))}));
  REQUIRE(std::holds_alternative<proto::Nack>(m));
  REQUIRE(d.mt->FindVolume("acme", "shared-name") != d.mt->FindVolume("globex", "shared-name"));
  REQUIRE(VolumeDir(dir.path(), "acme", "../globex") == "");
  REQUIRE(VolumeDir(dir.path(), "..", "x") == "");
}

TEST_CASE("volume_retention: one volume keeps its own duration, the others the daemon's", "[server][retention]") {
  TempDir dir;
  Daemon d(dir.path(), 0, 256, [](MasterTargetOptions& o) {
    o.retention.max_age_us = 3'600'000'000ull;
    o.volume_max_age_us["acme/long"] = 30 * 86'400'000'000ull;
  });
  auto a = Client(d.mt->port(), "acme", "s3cret-acme");
  OpenVolume(*a, OpenMsg("long", 1 << 20), 0);
  OpenVolume(*a, OpenMsg("short", 1 << 20), 0);
  auto g = Client(d.mt->port(), "globex", "s3cret-globex");
  OpenVolume(*g, OpenMsg("long", 1 << 20), 0);
  CHECK(d.mt->FindVolume("acme", "long")->points().policy().max_age_us == 30 * 86'400'000'000ull);
  CHECK(d.mt->FindVolume("acme", "short")->points().policy().max_age_us == 3'600'000'000ull);
  CHECK(d.mt->FindVolume("globex", "long")->points().policy().max_age_us == 3'600'000'000ull);
}

TEST_CASE("tenant quota: volume creation refused, writes pushed back when journals fill it", "[server][tenant]") {
  TempDir dir;
  Daemon d(dir.path(), (1 << 20) + (600 << 10));
  auto g = Client(d.mt->port(), "globex", "s3cret-globex");
  uint32_t v = OpenVolume(*g, OpenMsg("small", 1 << 20), 0);
  auto m = Call(*g, OpenMsg("second", 1 << 20));
  auto* nack = std::get_if<proto::Nack>(&m);
  REQUIRE((nack != nullptr && nack->reason == proto::NackReason::kPermissionDenied));
  // Two overwrites of 512 KiB put 512 KiB of old data in the journal; the next
  // overwrite passes the quota, so the one after it is pushed back.
  uint64_t seq = 0;
  int acked = 0;
  proto::NackReason last = proto::NackReason::kInternal;
  for (int i = 0; i < 6; ++i) {
    m = Call(*g, Batch(v, {DataRecord(seq + 1, 0, RandomBytes(512 << 10, uint64_t(i + 1)))}));
    if (std::holds_alternative<proto::Ack>(m)) {
      ++seq;
      ++acked;
    } else {
      last = std::get<proto::Nack>(m).reason;
      REQUIRE(std::get<proto::Nack>(m).expected_seq == seq + 1);
      break;
    }
  }
  REQUIRE(acked == 3);
  REQUIRE(last == proto::NackReason::kBusy);
  // Another tenant is not affected.
  auto a = Client(d.mt->port(), "acme", "s3cret-acme");
  uint32_t va = OpenVolume(*a, OpenMsg("big", 4 << 20), 0);
  REQUIRE(std::holds_alternative<proto::Ack>(Call(*a, Batch(va, {DataRecord(1, 0, Bytes(4096, 1))}))));
}

TEST_CASE("tenant volume limit: the volume past it is refused with a clear nack, other tenants unaffected",
          "[server][tenant][security]") {
  TempDir dir;
  Daemon d(dir.path(), 0, 2);
  auto g = Client(d.mt->port(), "globex", "s3cret-globex");
  OpenVolume(*g, OpenMsg("v1", 1 << 20), 0);
  OpenVolume(*g, OpenMsg("v2", 1 << 20), 0);
  auto m = Call(*g, OpenMsg("v3", 1 << 20));
  auto* nack = std::get_if<proto::Nack>(&m);
  REQUIRE(nack != nullptr);
  CHECK(nack->reason == proto::NackReason::kPermissionDenied);
  CHECK(nack->message == "tenant volume limit reached: 2 volumes (max_volumes_per_tenant)");
  // Reopening an existing volume is not creating one.
  OpenVolume(*g, OpenMsg("v1", 1 << 20), 0);
  auto a = Client(d.mt->port(), "acme", "s3cret-acme");
  OpenVolume(*a, OpenMsg("v1", 1 << 20), 0);
}

namespace {

// A daemon with one volume of `size` bytes written by batches; points at every flush.
struct Populated {
  explicit Populated(uint64_t size, int batches) : d(dir.path()), gen(size, 21) {
    ch = Client(d.mt->port(), "acme", "s3cret-acme");
    vid = OpenVolume(*ch, OpenMsg("vm1", size), 0);
    for (auto& b : gen.Batches(batches, 10)) {
      auto m = Call(*ch, Batch(vid, b));
      REQUIRE(std::holds_alternative<proto::Ack>(m));
    }
  }
  TempDir dir;
  Daemon d;
  StreamGen gen;
  std::unique_ptr<FrameChannel> ch;
  uint32_t vid = 0;
};

}  // namespace

TEST_CASE("control API: volumes, points, export, rollback, hashes", "[server][control]") {
  Populated p(1 << 20, 30);
  const uint16_t cport = p.d.mt->control_port();
  auto vols = Http(cport, "GET", "/v1/volumes", "", 200);
  REQUIRE(vols.at("volumes").as_array().size() == 1);
  REQUIRE(vols.at("volumes").at(0).at("applied_seq").to_number<uint64_t>() == p.gen.last_seq());
  auto pts = Http(cport, "GET", "/v1/points?volume=vm1&tenant=acme", "", 200);
  const auto& arr = pts.at("points").as_array();
  REQUIRE(arr.size() == p.gen.points().size());
  REQUIRE(arr.size() >= 2);
  Http(cport, "GET", "/v1/points?volume=nope", "", 404);
  Http(cport, "GET", "/v1/points?volume=../x", "", 400);

  auto hashes = Http(cport, "GET", "/v1/hashes?volume=vm1&region_size=262144", "", 200);
  REQUIRE(hashes.at("hashes").as_array().size() == 4);

  // An export pins its point: rollback is refused while it is open.
  const auto& mid = arr[arr.size() / 2];
  std::string body = "{\"volume\":\"vm1\",\"point\":" + std::to_string(mid.at("id").as_int64()) + "}";
  auto ex = Http(cport, "POST", "/v1/export", body, 200);
  std::string name(ex.at("export").as_string());
  REQUIRE(ex.at("seq").to_number<uint64_t>() == mid.at("seq").to_number<uint64_t>());
  Http(cport, "POST", "/v1/rollback", body, 409);
  Http(cport, "GET", "/v1/exports", "", 200);
  Http(cport, "POST", "/v1/unexport", json::serialize(json::object{{"export", name}}), 200);
  Http(cport, "POST", "/v1/unexport", json::serialize(json::object{{"export", name}}), 404);

  // Discarding the history after the point: inside the history lock (24 h
  // by default), refused, and nothing done.
  std::string discard = body;
  discard.insert(discard.size() - 1, ",\"discard_history\":true");
  Http(cport, "POST", "/v1/rollback", discard, 409);
  auto rb = Http(cport, "POST", "/v1/rollback", body, 200);
  REQUIRE(std::string(rb.at("state").as_string()) == "failed-over");
  // Every point is still listed, the later ones as rolled back.
  auto after = Http(cport, "GET", "/v1/points?volume=vm1", "", 200).at("points").as_array();
  REQUIRE(after.size() == arr.size() + 1);  // and the rollback's own tag
  for (size_t i = 0; i < arr.size(); ++i) {
    REQUIRE(after[i].at("id") == arr[i].at("id"));
    REQUIRE(after[i].at("rolled_back").as_bool() == (arr[i].at("seq").to_number<uint64_t>() > mid.at("seq").to_number<uint64_t>()));
  }
  REQUIRE(rb.at("rolled_back_points").to_number<uint64_t>() == arr.size() - arr.size() / 2 - 1);
  uint64_t seq = mid.at("seq").to_number<uint64_t>();
  REQUIRE(ReadFile(VolumeDir(p.dir.path(), "acme", "vm1") + "/replica.img") == p.gen.ImageAt(seq));
  // Replication of a failed-over volume is refused until re-protected.
  auto m = Call(*p.ch, Batch(p.vid, {DataRecord(p.gen.last_seq() + 1, 0, Bytes(512, 1))}));
  auto* nack = std::get_if<proto::Nack>(&m);
  REQUIRE((nack != nullptr && nack->reason == proto::NackReason::kWrongGeneration));
  Http(cport, "POST", "/v1/rollback", "{\"volume\":\"vm1\",\"point\":999999}", 404);
  auto metrics = http::HttpRequest("127.0.0.1", cport, "GET", "/metrics", "", kTimeout);
  REQUIRE(metrics.ok());
  REQUIRE(metrics->body.find("cdp_mt_applied_bytes_total{tenant=\"acme\",volume=\"vm1\"}") != std::string::npos);
  REQUIRE(metrics->body.find("process_cpu_seconds_total") != std::string::npos);
}

TEST_CASE("restart: volumes reopen with their points and durable sequence", "[server]") {
  TempDir dir;
  StreamGen gen(1 << 20, 5);
  auto batches = gen.Batches(10, 6);
  {
    Daemon d(dir.path());
    auto ch = Client(d.mt->port(), "acme", "s3cret-acme");
    uint32_t vid = OpenVolume(*ch, OpenMsg("vm1", 1 << 20), 0);
    for (auto& b : batches) REQUIRE(std::holds_alternative<proto::Ack>(Call(*ch, Batch(vid, b))));
  }
  Daemon d(dir.path());
  auto v = d.mt->FindVolume("acme", "vm1");
  REQUIRE(v != nullptr);
  REQUIRE(v->applied_seq() == gen.last_seq());
  REQUIRE(v->points().List().size() == gen.points().size());
  auto ch = Client(d.mt->port(), "acme", "s3cret-acme");
  OpenVolume(*ch, OpenMsg("vm1", 1 << 20), gen.last_seq());
}

namespace {

void RequireProgram(const std::string& p) {
  INFO(p << " is not installed (Debian: qemu-utils / libnbd-bin)");
  REQUIRE(HaveProgram(p));
}

std::string StartExport(uint16_t cport, uint64_t seq, bool writable, std::string* url, uint16_t nbd_port) {
  std::string body = "{\"volume\":\"vm1\",\"tenant\":\"acme\",\"seq\":" + std::to_string(seq) +
                     ",\"writable\":" + (writable ? "true" : "false") + "}";
  auto ex = Http(cport, "POST", "/v1/export", body, 200);
  std::string name(ex.at("export").as_string());
  REQUIRE(ex.at("port").to_number<uint16_t>() == nbd_port);
  *url = "nbd://127.0.0.1:" + std::to_string(nbd_port) + "/" + name;
  return name;
}

}  // namespace

TEST_CASE("exports: a tenant at max_exports_per_tenant is refused naming the cap, another tenant's export still "
          "serves, and an unexport makes room",
          "[server][security]") {
  RequireProgram("nbdinfo");
  TempDir dir;
  Daemon d(dir.path(), 0, 256, [](MasterTargetOptions& o) { o.max_exports_per_tenant = 2; });
  for (const char* tenant : {"acme", "globex"}) {
    auto ch = Client(d.mt->port(), tenant, std::string("s3cret-") + tenant);
    uint32_t vid = OpenVolume(*ch, OpenMsg("vm1", 1 << 20), 0);
    REQUIRE(std::holds_alternative<proto::Ack>(
        Call(*ch, Batch(vid, {DataRecord(1, 0, Bytes(4096, 7)), FlushRecord(2)}))));
  }
  auto a1 = d.mt->StartExport("acme", "vm1", 2, false);
  auto a2 = d.mt->StartExport("acme", "vm1", 2, true);
  REQUIRE(a1.ok());
  REQUIRE(a2.ok());
  auto a3 = d.mt->StartExport("acme", "vm1", 2, false);
  REQUIRE_FALSE(a3.ok());
  CHECK(a3.status().code() == Code::kBusy);
  CHECK(a3.status().message() ==
        "tenant 'acme' already has 2 exports, the cap max_exports_per_tenant; remove one (cdpctl unexport) first");
  // Over the control API the refusal is a 503 with the same words.
  auto refused = http::HttpRequest("127.0.0.1", d.mt->control_port(), "POST", "/v1/export",
                                   R"({"tenant":"acme","volume":"vm1","seq":2})", kTimeout);
  REQUIRE(refused.ok());
  INFO(refused->body);
  CHECK(refused->body.find("the cap max_exports_per_tenant") != std::string::npos);
  CHECK(refused->status >= 400);

  // globex is not counted against acme: its export starts and serves.
  auto g = d.mt->StartExport("globex", "vm1", 2, false);
  REQUIRE(g.ok());
  auto info = RunCommand({"nbdinfo", "--size", "nbd://127.0.0.1:" + std::to_string(d.mt->nbd_port()) + "/" + *g}, 30000);
  INFO(info.output);
  CHECK(info.exit_code == 0);
  CHECK(info.output == std::to_string(1 << 20) + "\n");

  // One of acme's removed: acme may export again.
  REQUIRE(d.mt->StopExport(*a1).ok());
  CHECK(d.mt->StartExport("acme", "vm1", 2, false).ok());
}

using cdp::testing::MapEntry;

TEST_CASE("block status of a point-in-time export: the point's holes, not today's replica's, and nbdcopy copies only "
          "its data",
          "[server][e2e][block-status]") {
  RequireProgram("nbdinfo");
  RequireProgram("nbdcopy");
  TempDir dir;
  Daemon d(dir.path());
  const uint64_t size = 64 << 20;
  auto ch = Client(d.mt->port(), "acme", "s3cret-acme");
  uint32_t vid = OpenVolume(*ch, OpenMsg("vm1", size), 0);
  // Before the point: 1 MiB at 3 MiB, 1 MiB at 40 MiB, 4 KiB at 63 MiB.
  std::vector<proto::Record> before;
  uint64_t seq = 0;
  for (uint64_t base : {3ull << 20, 40ull << 20}) {
    for (uint64_t off = base; off < base + (1 << 20); off += 256 << 10) {
      ++seq;
      before.push_back(DataRecord(seq, off, Bytes(256 << 10, uint8_t(0x30 + seq))));
    }
  }
  before.push_back(DataRecord(++seq, 63ull << 20, Bytes(4096, 0x77)));
  before.push_back(FlushRecord(++seq));
  const uint64_t point = seq;
  REQUIRE(std::holds_alternative<proto::Ack>(Call(*ch, Batch(vid, before))));
  // After it: new data in a hole of the point, and the point's extent at
  // 3 MiB trimmed away in today's replica.
  std::vector<proto::Record> after{DataRecord(seq + 1, 20ull << 20, Bytes(1 << 20, 0x55)),
                                   ZeroRecord(seq + 2, 3ull << 20, 1 << 20, true), FlushRecord(seq + 3)};
  REQUIRE(std::holds_alternative<proto::Ack>(Call(*ch, Batch(vid, after))));

  auto name = d.mt->StartExport("acme", "vm1", point, false);
  REQUIRE(name.ok());
  const std::string url = "nbd://127.0.0.1:" + std::to_string(d.mt->nbd_port()) + "/" + *name;
  Bytes image(size);
  REQUIRE(d.mt->FindVolume("acme", "vm1")->ReadAt(point, 0, size, image.data()).ok());

  std::string map_text;
  const std::vector<MapEntry> map = cdp::testing::NbdMap(url, &map_text);
  INFO(map_text);
  REQUIRE(!map.empty());
  uint64_t pos = 0, data = 0;
  for (const MapEntry& e : map) {
    INFO("extent " << e.offset << " +" << e.length << " type " << e.type);
    CHECK(e.offset == pos);
    pos = e.offset + e.length;
    if (e.type & 2) {  // zero: the point's bytes there are zeros
      CHECK(std::all_of(image.begin() + long(e.offset), image.begin() + long(pos), [](uint8_t b) { return b == 0; }));
    } else {
      data += e.length;
    }
  }
  CHECK(pos == size);
  // The point's data (2 MiB + 4 KiB) and the range an undo record covers
  // (20 MiB: zeros at the point, but held in the journal) are data; the
  // 3 MiB extent, trimmed in today's replica, is data at the point.
  const uint64_t want = (3ull << 20) + 4096;
  CHECK(data >= want);
  CHECK(data <= want + (1 << 20));
  bool three_is_data = false;
  for (const MapEntry& e : map) {
    if (e.offset <= (3ull << 20) && e.offset + e.length >= (4ull << 20)) three_is_data = (e.type & 2) == 0;
  }
  CHECK(three_is_data);

  // nbdcopy skips the holes: the copy equals the point, and its file holds
  // about the data only.
  const std::string out = dir.path() + "/restored.img";
  auto cp = RunCommand({"nbdcopy", url, out}, 60000);
  INFO(cp.output);
  REQUIRE(cp.exit_code == 0);
  REQUIRE(ReadFile(out) == image);
  struct stat st {};
  REQUIRE(::stat(out.c_str(), &st) == 0);
  INFO("allocated " << uint64_t(st.st_blocks) * 512);
  CHECK(uint64_t(st.st_blocks) * 512 <= want + (2 << 20));
}

TEST_CASE("qemu-img convert and nbdcopy of a point-in-time export equal the reference, while replication goes on",
          "[server][e2e]") {
  RequireProgram("qemu-img");
  RequireProgram("nbdcopy");
  RequireProgram("nbdinfo");
  const uint64_t size = 4 << 20;
  Populated p(size, 40);
  const auto& points = p.gen.points();
  REQUIRE(points.size() >= 3);
  const uint64_t seq = points[points.size() / 2].seq;
  std::string url;
  StartExport(p.d.mt->control_port(), seq, false, &url, p.d.mt->nbd_port());

  // New writes keep arriving after the export started.
  for (auto& b : p.gen.Batches(20, 10)) REQUIRE(std::holds_alternative<proto::Ack>(Call(*p.ch, Batch(p.vid, b))));

  auto r = RunCommand({"nbdinfo", "--size", url}, 30000);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  REQUIRE(std::stoull(r.output) == size);
  r = RunCommand({"nbdinfo", "--json", url}, 30000);
  REQUIRE(r.exit_code == 0);
  REQUIRE(r.output.find("\"is_read_only\": true") != std::string::npos);

  std::string out1 = p.dir.path() + "/convert.raw", out2 = p.dir.path() + "/copy.raw";
  r = RunCommand({"qemu-img", "convert", "-f", "raw", "-O", "raw", url, out1}, 60000);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  REQUIRE(ReadFile(out1) == p.gen.ImageAt(seq));
  r = RunCommand({"nbdcopy", url, out2}, 60000);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  REQUIRE(ReadFile(out2) == p.gen.ImageAt(seq));
  // And the replica itself is at the newest sequence.
  REQUIRE(ReadFile(VolumeDir(p.dir.path(), "acme", "vm1") + "/replica.img") == p.gen.image());
}

TEST_CASE("writable export: qemu-io writes land in the overlay, never in the replica", "[server][e2e]") {
  RequireProgram("qemu-io");
  const uint64_t size = 1 << 20;
  Populated p(size, 10);
  const uint64_t seq = p.gen.last_seq();
  std::string url;
  std::string name = StartExport(p.d.mt->control_port(), seq, true, &url, p.d.mt->nbd_port());
  const Bytes before = ReadFile(VolumeDir(p.dir.path(), "acme", "vm1") + "/replica.img");
  auto r = RunCommand({"qemu-io", "-f", "raw", "-c", "write -P 0x5a 1000 5000", "-c", "read -P 0x5a 1000 5000",
                       "-c", "flush", url},
                      30000);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  REQUIRE(r.output.find("Pattern verification failed") == std::string::npos);
  // Bytes around the write keep the point's content (copy-on-write of partial blocks).
  std::string out = p.dir.path() + "/rw.raw";
  r = RunCommand({"qemu-img", "convert", "-f", "raw", "-O", "raw", url, out}, 60000);
  REQUIRE(r.exit_code == 0);
  Bytes expect = p.gen.ImageAt(seq);
  std::fill(expect.begin() + 1000, expect.begin() + 6000, 0x5a);
  REQUIRE(ReadFile(out) == expect);
  REQUIRE(ReadFile(VolumeDir(p.dir.path(), "acme", "vm1") + "/replica.img") == before);
  Http(p.d.mt->control_port(), "POST", "/v1/unexport", json::serialize(json::object{{"export", name}}), 200);
}

TEST_CASE("no peer message destroys history: a higher generation, another size or uuid drop no point, the "
          "operator's reprotect keeps every point exportable",
          "[server][security][generation]") {
  TempDir dir;
  Daemon d(dir.path());
  const uint64_t size = 1 << 20;
  Reference ref(size);
  auto ch = Client(d.mt->port(), "acme", "s3cret-acme");
  uint32_t vid = OpenVolume(*ch, OpenMsg("db1", size), 0);
  std::vector<proto::Record> b1{DataRecord(1, 0, Bytes(8192, 0x11)), FlushRecord(2), TagRecord(3, "t1")};
  std::vector<proto::Record> b2{DataRecord(4, 0, Bytes(8192, 0x22)), DataRecord(5, 65536, Bytes(4096, 0x33)),
                                FlushRecord(6)};
  for (auto* b : {&b1, &b2}) {
    ref.Apply(*b);
    auto m = Call(*ch, Batch(vid, *b));
    REQUIRE(std::holds_alternative<proto::Ack>(m));
  }
  auto vol = d.mt->FindVolume("acme", "db1");
  REQUIRE(vol != nullptr);
  const auto points = vol->points().List();
  REQUIRE(points.size() >= 2);

  // What a compromised host would send, each on a fresh authenticated session.
  struct Attack {
    const char* what;
    proto::VolumeOpen open;
    proto::NackReason reason;
  };
  proto::VolumeOpen other_uuid = OpenMsg("db1", size);
  other_uuid.uuid[0] = 8;
  for (const Attack& a : {Attack{"generation + 1", OpenMsg("db1", size, 2), proto::NackReason::kPermissionDenied},
                          Attack{"generation 2^64-1", OpenMsg("db1", size, ~uint64_t(0)),
                                 proto::NackReason::kPermissionDenied},
                          Attack{"another size", OpenMsg("db1", size * 2), proto::NackReason::kWrongGeneration},
                          Attack{"another uuid", other_uuid, proto::NackReason::kWrongGeneration}}) {
    INFO(a.what);
    auto attacker = Client(d.mt->port(), "acme", "s3cret-acme");
    auto m = Call(*attacker, a.open);
    auto* nack = std::get_if<proto::Nack>(&m);
    REQUIRE(nack != nullptr);
    CHECK(nack->reason == a.reason);
    INFO(nack->message);
    CHECK((nack->message.find("re-protect is an operator command (cdpctl reprotect") != std::string::npos ||
           nack->message.find("the replica and its recovery points are kept") != std::string::npos));
  }
  // Every point is still listed and reads as the source did at it; an export
  // of the oldest one (the device the NBD server serves) is byte-equal.
  auto export_oldest = [&] {
    auto dev = PointInTimeDevice::Open(vol, points.front().seq, d.env.get(), "");
    REQUIRE(dev.ok());
    Bytes img(size);
    REQUIRE((*dev)->Read(0, uint32_t(size), img.data()).ok());
    return img;
  };
  REQUIRE(vol->points().List().size() == points.size());
  CHECK(vol->identity().generation == 1);
  for (const auto& p : points) {
    Bytes img(size);
    REQUIRE(vol->ReadAt(p.seq, 0, size, img.data()).ok());
    CHECK(img == ref.ImageAt(p.seq));
  }
  CHECK(export_oldest() == ref.ImageAt(points.front().seq));
  // The operator re-protects: generation 2 is accepted, its record 1 follows
  // history sequence 6, and the old points stay exportable.
  json::value r = Http(d.mt->control_port(), "POST", "/v1/reprotect", R"({"tenant":"acme","volume":"db1"})", 200);
  CHECK(r.at("generation").as_int64() == 2);
  auto ps2 = Client(d.mt->port(), "acme", "s3cret-acme");
  uint32_t vid2 = OpenVolume(*ps2, OpenMsg("db1", size, 2), 0);
  auto m = Call(*ps2, Batch(vid2, {DataRecord(1, 0, Bytes(4096, 0x44)), FlushRecord(2)}));
  auto* ack = std::get_if<proto::Ack>(&m);
  REQUIRE(ack != nullptr);
  CHECK(ack->durable_seq == 2);
  CHECK(vol->fence().seq_base() == 6);
  CHECK(vol->applied_seq() == 8);
  CHECK(vol->points().List().size() >= points.size());
  for (const auto& p : points) {
    Bytes img(size);
    REQUIRE(vol->ReadAt(p.seq, 0, size, img.data()).ok());
    CHECK(img == ref.ImageAt(p.seq));
  }
  CHECK(export_oldest() == ref.ImageAt(points.front().seq));
  // The old generation's session is told, not applied.
  auto old = Call(*ch, Batch(vid, {DataRecord(7, 0, Bytes(4096, 0x55))}));
  auto* stale = std::get_if<proto::Nack>(&old);
  REQUIRE(stale != nullptr);
  CHECK(stale->reason == proto::NackReason::kWrongGeneration);
  json::value st = Http(d.mt->control_port(), "GET", "/v1/volumes", "", 200);
  const auto& v0 = st.at("volumes").as_array().at(0).as_object();
  CHECK(v0.at("applied_seq").as_int64() == 2);
  CHECK(v0.at("history_seq").as_int64() == 8);
}

TEST_CASE("work caps: an absurd trim, a trim far past the end and a batch over the work cap get a Nack, the master "
          "target keeps serving",
          "[server][security]") {
  TempDir dir;
  Daemon d(dir.path());
  const uint64_t size = 8ull << 30;  // sparse
  auto ch = Client(d.mt->port(), "acme", "s3cret-acme");
  uint32_t vid = OpenVolume(*ch, OpenMsg("big", size), 0);
  auto trim = [](uint64_t seq, uint64_t offset, uint32_t length) {
    proto::Record r;
    r.seq = seq;
    r.offset = offset;
    r.length = length;
    r.kind = proto::RecordKind::kTrim;
    return r;
  };
  auto refused = [&](std::vector<proto::Record> recs, const std::string& text) {
    auto m = Call(*ch, Batch(vid, std::move(recs)));
    auto* n = std::get_if<proto::Nack>(&m);
    REQUIRE(n != nullptr);
    CHECK(n->reason == proto::NackReason::kBadRecord);
    INFO(n->message);
    CHECK(n->message.find(text) != std::string::npos);
  };
  refused({trim(1, 1ull << 40, 1u << 20)}, "range past the end of the volume");
  refused({trim(1, 0, 0xffffffffu)}, "batch asks 4294967295 bytes of work");
  refused({trim(1, 0, 64u << 20)}, "absurd length");  // a record is at most 32 MiB
  std::vector<proto::Record> many;
  for (uint64_t i = 0; i < 9; ++i) many.push_back(trim(i + 1, i * (32u << 20), 32u << 20));  // 288 MiB of work
  refused(many, "bytes of work, over the cap of 268435456 (max_batch_work)");
  // Nothing was applied, and the volume goes on.
  auto m = Call(*ch, Batch(vid, {DataRecord(1, 0, Bytes(4096, 1)), trim(2, 1 << 20, 32u << 20)}));
  auto* ack = std::get_if<proto::Ack>(&m);
  REQUIRE(ack != nullptr);
  CHECK(ack->durable_seq == 2);
}

TEST_CASE("work caps: a batch of trims over the configured max_batch_work gets a Nack naming the cap, a batch "
          "within it applies",
          "[server][security][workcap]") {
  TempDir dir;
  Daemon d(dir.path(), 0, 256, [](MasterTargetOptions& o) { o.max_batch_work = 64ull << 20; });
  auto ch = Client(d.mt->port(), "acme", "s3cret-acme");
  uint32_t vid = OpenVolume(*ch, OpenMsg("big", 1ull << 30), 0);
  auto trims = [](uint64_t first_seq, int n) {
    std::vector<proto::Record> v;
    for (int i = 0; i < n; ++i) {
      proto::Record r;
      r.seq = first_seq + uint64_t(i);
      r.offset = uint64_t(i) * (32u << 20);
      r.length = 32u << 20;
      r.kind = proto::RecordKind::kTrim;
      v.push_back(r);
    }
    return v;
  };
  auto m = Call(*ch, Batch(vid, trims(1, 3)));  // 96 MiB of undo reads
  auto* n = std::get_if<proto::Nack>(&m);
  REQUIRE(n != nullptr);
  CHECK(n->reason == proto::NackReason::kBadRecord);
  CHECK(n->message == "batch asks 100663296 bytes of work, over the cap of 67108864 (max_batch_work)");
  CHECK(d.mt->FindVolume("acme", "big")->applied_seq() == 0);
  m = Call(*ch, Batch(vid, trims(1, 2)));
  auto* ack = std::get_if<proto::Ack>(&m);
  REQUIRE(ack != nullptr);
  CHECK(ack->durable_seq == 2);
}

TEST_CASE("tenant journal cap: a tenant whose undo journal reached max_journal_bytes_per_tenant gets busy, its "
          "points are kept and other tenants go on",
          "[server][security][tenant]") {
  TempDir dir;
  Daemon d(dir.path(), 0, 256, [](MasterTargetOptions& o) { o.max_journal_bytes_per_tenant = 256 << 10; });
  const uint64_t size = 1 << 20;
  auto ch = Client(d.mt->port(), "acme", "s3cret-acme");
  uint32_t vid = OpenVolume(*ch, OpenMsg("db1", size), 0);
  // Each overwrite of 128 KiB journals the 128 KiB it replaces (random
  // bytes: the journal cannot compress them).
  uint64_t seq = 0;
  auto overwrite = [&](uint8_t fill) {
    return Batch(vid, {DataRecord(seq + 1, 0, RandomBytes(128 << 10, fill)), FlushRecord(seq + 2)});
  };
  for (uint8_t fill : {0x11, 0x22, 0x33}) {
    auto m = Call(*ch, overwrite(fill));
    REQUIRE(std::holds_alternative<proto::Ack>(m));
    seq += 2;
  }
  auto vol = d.mt->FindVolume("acme", "db1");
  REQUIRE(vol->GetStatus().journal_bytes >= (256u << 10));
  const size_t points = vol->points().List().size();
  auto m = Call(*ch, overwrite(0x44));
  auto* n = std::get_if<proto::Nack>(&m);
  REQUIRE(n != nullptr);
  CHECK(n->reason == proto::NackReason::kBusy);
  CHECK(n->expected_seq == seq + 1);
  INFO(n->message);
  CHECK(n->message.find("tenant journal cap reached") != std::string::npos);
  CHECK(n->message.find("(max_journal_bytes_per_tenant); retry after retention") != std::string::npos);
  // Inside the history lock (24 h by default) retention cannot free it: the
  // volume says so, as for its own byte budget.
  CHECK(ShownState(vol->GetStatus()) == "LOCKED: journal full inside the history lock");
  CHECK(vol->GetStatus().stall->cause == StallCause::kHistoryLock);
  CHECK(vol->applied_seq() == seq);
  CHECK(vol->points().List().size() == points);
  // A duplicate is still acknowledged, and another tenant is not held by acme's journal.
  m = Call(*ch, Batch(vid, {FlushRecord(seq)}));
  REQUIRE(std::holds_alternative<proto::Ack>(m));
  auto other = Client(d.mt->port(), "globex", "s3cret-globex");
  uint32_t gvid = OpenVolume(*other, OpenMsg("db1", size), 0);
  m = Call(*other, Batch(gvid, {DataRecord(1, 0, Bytes(4096, 0x55))}));
  REQUIRE(std::holds_alternative<proto::Ack>(m));
}

TEST_CASE("failover fences a process server's stream of that volume only, and its undo closes the session, which reopens it",
          "[server][failover]") {
  TempDir tmp;
  Daemon d(tmp.path());
  auto ch = Client(d.mt->port(), "acme", "s3cret-acme");
  const uint32_t a = OpenVolume(*ch, OpenMsg("a", 1 << 20), 0);
  const uint32_t b = OpenVolume(*ch, OpenMsg("b", 1 << 20), 0);
  auto m = Call(*ch, Batch(a, {DataRecord(1, 0, Bytes(4096, 1)), TagRecord(2, "t")}));
  REQUIRE(std::get_if<proto::Ack>(&m) != nullptr);
  auto f = d.mt->Failover("acme", "a", 2, 0);
  REQUIRE(f.ok());
  CHECK(f->changed);
  CHECK(f->export_name == "acme/a@failover");

  // The old primary's batch: refused as failed over, nothing applied.
  m = Call(*ch, Batch(a, {DataRecord(3, 0, Bytes(4096, 3))}));
  auto* n = std::get_if<proto::Nack>(&m);
  REQUIRE(n != nullptr);
  CHECK(proto::IsFailedOverNack(*n));
  CHECK(d.mt->FindVolume("acme", "a")->applied_seq() == 2);
  // Another volume of the same session goes on.
  m = Call(*ch, Batch(b, {DataRecord(1, 0, Bytes(4096, 9))}));
  REQUIRE(std::get_if<proto::Ack>(&m) != nullptr);
  // A new session's open is refused the same way.
  auto ch2 = Client(d.mt->port(), "acme", "s3cret-acme");
  m = Call(*ch2, OpenMsg("a", 1 << 20));
  n = std::get_if<proto::Nack>(&m);
  REQUIRE(n != nullptr);
  CHECK(n->reason == proto::NackReason::kWrongGeneration);
  CHECK(proto::IsFailedOverNack(*n));

  // Undo: both sessions that met the fence are closed by the master target
  // (the peer then reopens at once), and the volume is taken again.
  auto u = d.mt->UndoFailover("acme", "a");
  REQUIRE(u.ok());
  CHECK(*u);
  for (FrameChannel* c : {ch.get(), ch2.get()}) {
    auto r = c->Receive(kTimeout);
    REQUIRE_FALSE(r.ok());
    CHECK_FALSE(r.status().IsBusy());  // closed, not a timeout
  }
  auto ch3 = Client(d.mt->port(), "acme", "s3cret-acme");
  const uint32_t a3 = OpenVolume(*ch3, OpenMsg("a", 1 << 20), 2);
  m = Call(*ch3, Batch(a3, {DataRecord(3, 0, Bytes(4096, 3))}));
  auto* ack = std::get_if<proto::Ack>(&m);
  REQUIRE(ack != nullptr);
  CHECK(ack->durable_seq == 3);
  CHECK(d.mt->UndoFailover("acme", "a").value() == false);
}

namespace {

// The value of the series `name{labels}` in Prometheus text (labels exactly
// as rendered: sorted by name); nullopt when absent.
std::optional<double> MetricValue(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, series.size() + 1, series + " ") == 0) return std::stod(line.substr(series.size() + 1));
  }
  return std::nullopt;
}

}  // namespace

TEST_CASE("apply stalled by ENOSPC: the state names the cause, the metric says it, and apply resumes with nothing lost",
          "[server][fault][stall]") {
  TempDir dir;
  auto posix = NewPosixEnv();
  FaultEnv fault(posix.get());
  Daemon d(dir.path(), 0, 256, [&](MasterTargetOptions& o) { o.env = &fault; });
  const uint16_t cport = d.mt->control_port();
  const uint64_t size = 1 << 20;
  auto ch = Client(d.mt->port(), "acme", "s3cret-acme");
  const uint32_t vid = OpenVolume(*ch, OpenMsg("vm1", size), 0);
  Reference ref(size);
  std::mt19937_64 rng(17);
  auto batch = [&](uint64_t first_seq) {
    std::vector<proto::Record> b;
    for (uint64_t i = 0; i < 4; ++i) {
      Bytes data(8192);
      for (auto& x : data) x = uint8_t(rng());
      b.push_back(DataRecord(first_seq + i, (rng() % (size / 4096 - 2)) * 4096, std::move(data)));
    }
    b.push_back(FlushRecord(first_seq + 4));
    return b;
  };
  auto expect_ack = [&](const std::vector<proto::Record>& b) {
    auto m = Call(*ch, Batch(vid, b));
    auto* ack = std::get_if<proto::Ack>(&m);
    REQUIRE(ack != nullptr);
    REQUIRE(ack->durable_seq == b.back().seq);
  };
  const std::string stalled_series = R"(cdp_mt_apply_stalled{cause="no_space",tenant="acme",volume="vm1"})";
  const std::string io_series = R"(cdp_mt_apply_stalled{cause="io_error",tenant="acme",volume="vm1"})";
  auto metrics = [&] {
    auto r = http::HttpRequest("127.0.0.1", cport, "GET", "/metrics", "", kTimeout);
    REQUIRE(r.ok());
    return r->body;
  };
  auto volume = [&] { return Http(cport, "GET", "/v1/volumes", "", 200).at("volumes").at(0).as_object(); };

  for (uint64_t seq = 1; seq <= 10; seq += 5) {
    auto b = batch(seq);
    ref.Apply(b);
    expect_ack(b);
  }
  REQUIRE(std::string(volume().at("state").as_string()) == "protecting");
  REQUIRE(volume().at("stall").is_null());
  REQUIRE(MetricValue(metrics(), stalled_series) == 0.0);

  // The disk is full: every journal append fails with ENOSPC.
  fault.InjectError(FaultEnv::Op::kAppend, ENOSPC, 0, /*sticky=*/true);
  auto held = batch(11);
  for (int attempt = 1; attempt <= 2; ++attempt) {  // the process server resends after a pause
    auto m = Call(*ch, Batch(vid, held));
    auto* nack = std::get_if<proto::Nack>(&m);
    REQUIRE(nack != nullptr);
    REQUIRE(nack->reason == proto::NackReason::kInternal);
    auto v = volume();
    CHECK(std::string(v.at("state").as_string()) == "stalled: no space");
    REQUIRE(v.at("stall").is_object());
    CHECK(std::string(v.at("stall").at("cause").as_string()) == "no space");
    CHECK(v.at("stall").at("failures").to_number<uint64_t>() == uint64_t(attempt));
    CHECK(v.at("applied_seq").to_number<uint64_t>() == 10);
    auto st = Http(cport, "GET", "/status", "", 200);
    CHECK(std::string(st.at("volumes").at(0).at("state").as_string()) == "stalled: no space");
    const std::string text = metrics();
    CHECK(MetricValue(text, stalled_series) == 1.0);
    CHECK(MetricValue(text, io_series) == 0.0);
  }

  // Space is back: the resent batch applies, the stall clears.
  fault.ClearErrors();
  ref.Apply(held);
  expect_ack(held);
  auto after = batch(16);
  ref.Apply(after);
  expect_ack(after);
  auto v = volume();
  CHECK(std::string(v.at("state").as_string()) == "protecting");
  CHECK(v.at("stall").is_null());
  CHECK(v.at("applied_seq").to_number<uint64_t>() == 20);
  CHECK(MetricValue(metrics(), stalled_series) == 0.0);
  // Nothing lost: the replica is the reference image, and every point reads back as its image.
  REQUIRE(ReadFile(VolumeDir(dir.path(), "acme", "vm1") + "/replica.img") == ref.image());
  auto vol = d.mt->FindVolume("acme", "vm1");
  REQUIRE(vol != nullptr);
  auto points = vol->points().List();
  REQUIRE(points.size() == 4);
  for (const auto& p : points) {
    Bytes img(size);
    REQUIRE(vol->ReadAt(p.seq, 0, size, img.data()).ok());
    CHECK(img == ref.ImageAt(p.seq));
  }

  // Another failure (EIO on the replica's write) is named as such. The undo
  // of the partial batch fails too (its writes get EIO): the volume tries it
  // again at the next batch, and works again once it succeeds.
  fault.InjectError(FaultEnv::Op::kWrite, EIO, 0, /*sticky=*/true);
  auto failing = batch(21);
  for (int attempt = 1; attempt <= 2; ++attempt) {
    auto m = Call(*ch, Batch(vid, failing));
    REQUIRE(std::get_if<proto::Nack>(&m) != nullptr);
    CHECK(std::string(volume().at("state").as_string()) == "stalled: I/O error");
    CHECK(MetricValue(metrics(), io_series) == 1.0);
    CHECK(MetricValue(metrics(), stalled_series) == 0.0);
  }
  fault.ClearErrors();
  ref.Apply(failing);
  expect_ack(failing);
  CHECK(std::string(volume().at("state").as_string()) == "protecting");
  CHECK(MetricValue(metrics(), io_series) == 0.0);
  REQUIRE(ReadFile(VolumeDir(dir.path(), "acme", "vm1") + "/replica.img") == ref.image());
}

TEST_CASE("regression: the undo of a batch that failed on a full disk punches holes instead of writing zeros",
          "[server][fault][stall]") {
  // Zeros written back by the undo would need new blocks on the full disk and
  // fail in turn (seen on a real full ext4: the volume stayed broken).
  TempDir dir;
  auto posix = NewPosixEnv();
  FaultEnv fault(posix.get());
  Daemon d(dir.path(), 0, 256, [&](MasterTargetOptions& o) { o.env = &fault; });
  const uint64_t size = 1 << 20;
  auto ch = Client(d.mt->port(), "acme", "s3cret-acme");
  const uint32_t vid = OpenVolume(*ch, OpenMsg("vm1", size), 0);
  // Onto holes: the journal saves zeros. The replica write fails with
  // ENOSPC, as does every later write; punching holes still works.
  fault.InjectError(FaultEnv::Op::kWrite, ENOSPC, 0, /*sticky=*/true);
  std::vector<proto::Record> b{DataRecord(1, 65536, Bytes(8192, 7)), DataRecord(2, 262144, Bytes(4096, 9)),
                               FlushRecord(3)};
  auto m = Call(*ch, Batch(vid, b));
  REQUIRE(std::get_if<proto::Nack>(&m) != nullptr);
  // The undo succeeded in place: nothing to heal, the volume answers a VolumeOpen.
  auto ch2 = Client(d.mt->port(), "acme", "s3cret-acme");
  OpenVolume(*ch2, OpenMsg("vm1", size), 0);
  fault.ClearErrors();
  m = Call(*ch, Batch(vid, b));
  auto* ack = std::get_if<proto::Ack>(&m);
  REQUIRE((ack != nullptr && ack->durable_seq == 3));
  Reference ref(size);
  ref.Apply(b);
  REQUIRE(ReadFile(VolumeDir(dir.path(), "acme", "vm1") + "/replica.img") == ref.image());
}

namespace {

Bytes Block(uint8_t v) { return Bytes(4096, v); }

proto::Hash128 DigestOfBlock(const Bytes& b) { return LeafDigest(b.data(), b.size()); }

}  // namespace

TEST_CASE("failback: the plan is the journal after the point plus the provider's writes, a pull answers exactly the "
          "blocks that differ, finish makes the replica the promoted image as new history, then reprotect",
          "[server][failover][failback]") {
  TempDir tmp;
  std::optional<Daemon> d;
  d.emplace(tmp.path());
  auto ch = Client(d->mt->port(), "acme", "s3cret-acme");
  const uint32_t a = OpenVolume(*ch, OpenMsg("a", 1 << 20), 0);
  // Blocks 0 and 1 hold 1; the tag "t" at 3 is the failover point; block 5
  // is written after it (the journal's branch).
  auto m = Call(*ch, Batch(a, {DataRecord(1, 0, Block(1)), DataRecord(2, 4096, Block(1)), TagRecord(3, "t"),
                               DataRecord(4, 5 * 4096, Block(5))}));
  REQUIRE(std::get_if<proto::Ack>(&m) != nullptr);

  // Not failing back yet: both requests say so.
  m = Call(*ch, proto::FailbackPlanRequest{1, "a", 0});
  REQUIRE(std::get<proto::FailbackPlan>(m).status == proto::FailbackStatus::kNotFailingBack);
  REQUIRE(d->mt->StartFailback("acme", "a").status().code() == Code::kInvalidArgument);

  REQUIRE(d->mt->Failover("acme", "a", 3, 0).ok());
  {
    // The session tells the PS at once that the volume it has open is fenced
    // (issue 38 F1), once, unasked.
    auto n = ch->Receive(kTimeout);
    REQUIRE(n.ok());
    auto* nack = std::get_if<proto::Nack>(&*n);
    REQUIRE(nack != nullptr);
    CHECK(nack->volume_id == a);
    CHECK(proto::IsFailedOverNack(*nack));
  }
  auto dev = d->mt->PromotedDevice("acme", "a");
  REQUIRE(dev != nullptr);
  // The provider writes blocks 0 and 7.
  REQUIRE(dev->Write(0, Block(0xAA), false).ok());
  REQUIRE(dev->Write(7 * 4096, Block(0x77), false).ok());
  REQUIRE(dev->Flush().ok());
  // A trim at the provider punches a hole in the overlay (no zeros written):
  // 256 KiB written, then trimmed, leaves the file's allocation as it was.
  const std::string cow = tmp.path() + "/tenants/acme/volumes/a/failover.cow";
  auto allocated = [&] {
    struct stat st {};
    REQUIRE(::stat(cow.c_str(), &st) == 0);
    return uint64_t(st.st_blocks) * 512;
  };
  const uint64_t before_trim = allocated();
  REQUIRE(dev->Write(128 * 4096, Bytes(256 << 10, 0x5A), false).ok());
  REQUIRE(dev->Flush().ok());
  CHECK(allocated() >= before_trim + (256 << 10));
  REQUIRE(dev->Trim(128 * 4096, 256 << 10, false).ok());
  REQUIRE(dev->Flush().ok());
  CHECK(allocated() == before_trim);
  Bytes trimmed(256 << 10);
  REQUIRE(dev->Read(128 * 4096, uint32_t(trimmed.size()), trimmed.data()).ok());
  CHECK(trimmed == Bytes(256 << 10, 0));

  auto st = d->mt->StartFailback("acme", "a");
  REQUIRE(st.ok());
  CHECK(*st);
  CHECK(d->mt->StartFailback("acme", "a").value() == false);
  CHECK(d->mt->FindVolume("acme", "a")->fence().state() == VolumeState::kFailingBack);
  // Undo is refused now: failback committed the failover.
  CHECK(d->mt->UndoFailover("acme", "a").status().code() == Code::kAlreadyExists);

  m = Call(*ch, proto::FailbackPlanRequest{2, "a", 0});
  auto& plan = std::get<proto::FailbackPlan>(m);
  REQUIRE(plan.status == proto::FailbackStatus::kOk);
  CHECK(plan.request_id == 2);
  CHECK(plan.extents == std::vector<proto::BlockExtent>{{0, 1}, {5, 1}, {7, 1}, {128, 64}});
  CHECK(plan.next_block == 0);
  m = Call(*ch, proto::FailbackPlanRequest{3, "a", 6});
  CHECK(std::get<proto::FailbackPlan>(m).extents == std::vector<proto::BlockExtent>{{7, 1}, {128, 64}});
  // Another tenant's volume of that name does not exist for this one.
  auto other = Client(d->mt->port(), "globex", "s3cret-globex");
  m = Call(*other, proto::FailbackPlanRequest{4, "a", 0});
  CHECK(std::get<proto::FailbackPlan>(m).status == proto::FailbackStatus::kNotFailingBack);

  // The original site: blocks 0, 1 as at the point, 5 as shipped, 9 written
  // and never shipped. Blocks 1 is equal and must not travel.
  proto::PullRequest pr{5, "a", {{0, 2}, {5, 1}, {7, 1}, {9, 1}},
                        {DigestOfBlock(Block(1)), DigestOfBlock(Block(1)), DigestOfBlock(Block(5)), kZeroDigest,
                         DigestOfBlock(Block(9))}};
  m = Call(*ch, pr);
  auto& resp = std::get<proto::PullResponse>(m);
  REQUIRE(resp.status == proto::FailbackStatus::kOk);
  REQUIRE(resp.records.size() == 4);
  CHECK(resp.records[0].offset == 0);
  CHECK(resp.records[0].kind == proto::RecordKind::kData);
  CHECK(resp.records[0].data == Block(0xAA));
  CHECK(resp.records[1].offset == 5 * 4096);
  CHECK(resp.records[1].kind == proto::RecordKind::kZero);  // block 5 was empty at the point
  CHECK(resp.records[2].offset == 7 * 4096);
  CHECK(resp.records[2].data == Block(0x77));
  CHECK(resp.records[3].offset == 9 * 4096);
  CHECK(resp.records[3].kind == proto::RecordKind::kZero);
  // A pull past the end is answered kFailed, not a crash or a nack.
  m = Call(*ch, proto::PullRequest{6, "a", {{255, 2}}, {kZeroDigest, kZeroDigest}});
  CHECK(std::get<proto::PullResponse>(m).status == proto::FailbackStatus::kFailed);

  // Finish before the quiesce is refused; the quiesce refuses provider writes,
  // and survives a restart.
  CHECK(d->mt->FinishFailback("acme", "a").status().code() == Code::kInvalidArgument);
  REQUIRE(d->mt->QuiesceFailback("acme", "a").value() == true);
  CHECK(dev->Write(3 * 4096, Block(3), false).code() == Code::kPermissionDenied);
  dev.reset();
  ch.reset();
  other.reset();
  d.reset();
  d.emplace(tmp.path());
  CHECK(d->mt->FindVolume("acme", "a")->fence().state() == VolumeState::kFailingBack);
  dev = d->mt->PromotedDevice("acme", "a");
  REQUIRE(dev != nullptr);
  CHECK(dev->Write(3 * 4096, Block(3), false).code() == Code::kPermissionDenied);
  Bytes promoted(1 << 20);
  REQUIRE(dev->Read(0, uint32_t(promoted.size()), promoted.data()).ok());
  dev.reset();

  auto fin = d->mt->FinishFailback("acme", "a");
  REQUIRE(fin.ok());
  CHECK(fin->changed);
  CHECK(fin->blocks == 3 + 64);
  auto v = d->mt->FindVolume("acme", "a");
  CHECK(v->fence().state() == VolumeState::kFailedBack);
  CHECK(d->mt->PromotedDevice("acme", "a") == nullptr);
  Bytes replica(1 << 20);
  REQUIRE(v->ReadAt(v->applied_seq(), 0, replica.size(), replica.data()).ok());
  CHECK(replica == promoted);
  // History kept: the point "t" still reads as before the failover, and the
  // end of the failback is a tag point.
  Bytes at_t(4096);
  REQUIRE(v->ReadAt(3, 0, 4096, at_t.data()).ok());
  CHECK(at_t == Block(1));
  auto pts = v->points().List();
  REQUIRE(pts.size() == 2);
  CHECK(pts[1].name == "failback");
  CHECK(pts[1].seq == fin->seq);
  CHECK(d->mt->FinishFailback("acme", "a").value().changed == false);

  // The old generation stays fenced; reprotect lets generation 2 in, from 0.
  ch = Client(d->mt->port(), "acme", "s3cret-acme");
  m = Call(*ch, OpenMsg("a", 1 << 20, 1));
  REQUIRE(std::get_if<proto::Nack>(&m) != nullptr);
  CHECK(proto::IsFailedOverNack(std::get<proto::Nack>(m)));
  REQUIRE(v->ArmReprotect().value() == 2);
  const uint32_t a2 = OpenVolume(*ch, OpenMsg("a", 1 << 20, 2), 0);
  m = Call(*ch, Batch(a2, {DataRecord(1, 0, Block(0xBB))}));
  REQUIRE(std::get_if<proto::Ack>(&m) != nullptr);
  CHECK(v->fence().state() == VolumeState::kReplicating);
}

TEST_CASE("one master target per data_dir: a second one is refused while the first runs, and starts once it stopped",
          "[server]") {
  TempDir dir;
  Daemon first(dir.path());
  auto env = NewPosixEnv();
  MasterTargetOptions o;
  o.env = env.get();
  o.clock = SystemClock::Get();
  o.data_dir = dir.path();
  o.tenants = {{"acme", "s3cret-acme"}};
  o.listen = {"127.0.0.1", 0};
  o.control.port = 0;
  o.nbd.port = 0;
  {
    MasterTarget second(o);
    const Status s = second.Start();
    CHECK(s.code() == Code::kBusy);
    CHECK(s.message().find("LOCK is locked by another holder") != std::string::npos);
  }
  first.mt->Stop();
  MasterTarget third(o);
  CHECK(third.Start().ok());
}

// Issue 38 F7: a volume the MT could not open (there: another MT held its
// Ceph lock) left /status showing no volumes and no word of why.
TEST_CASE("a volume the master target cannot open is shown refused in /status and a metric, until it opens",
          "[server]") {
  TempDir dir;
  StreamGen gen(1 << 20, 5);
  auto batches = gen.Batches(4, 6);
  {
    Daemon d(dir.path());
    auto ch = Client(d.mt->port(), "acme", "s3cret-acme");
    uint32_t vid = OpenVolume(*ch, OpenMsg("vm1", 1 << 20), 0);
    for (auto& b : batches) REQUIRE(std::holds_alternative<proto::Ack>(Call(*ch, Batch(vid, b))));
  }
  const std::string index = dir.path() + "/tenants/acme/volumes/vm1/index.db";
  const Bytes good = ReadFile(index);
  REQUIRE(good.size() > 100);
  {
    std::ofstream f(index, std::ios::binary | std::ios::trunc);
    f << std::string(4096, 'x');  // not a database
  }
  {
    Daemon d(dir.path());
    CHECK(d.mt->FindVolume("acme", "vm1") == nullptr);
    auto st = Http(d.mt->control_port(), "GET", "/status", "", 200);
    REQUIRE(st.at("volumes").as_array().empty());
    const auto& refused = st.at("refused").as_array();
    REQUIRE(refused.size() == 1);
    CHECK(refused[0].at("tenant").as_string() == "acme");
    CHECK(refused[0].at("volume").as_string() == "vm1");
    CHECK(refused[0].at("cause").as_string() == "error");
    CHECK(!refused[0].at("why").as_string().empty());
    const std::string metrics = d.mt->registry().RenderPrometheus();
    INFO(metrics);
    CHECK(metrics.find("cdp_mt_volume_refused{cause=\"error\",tenant=\"acme\",volume=\"vm1\"} 1") !=
          std::string::npos);
  }
  {
    std::ofstream f(index, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(good.data()), std::streamsize(good.size()));
  }
  Daemon d(dir.path());
  REQUIRE(d.mt->FindVolume("acme", "vm1") != nullptr);
  auto st = Http(d.mt->control_port(), "GET", "/status", "", 200);
  CHECK(st.at("refused").as_array().empty());
  CHECK(st.at("volumes").as_array().size() == 1);
}

TEST_CASE("control API: /v1/groups lists a group's points complete when every member volume holds the marker, "
          "partial when an older one lacks it",
          "[server][control][groups]") {
  TempDir tmp;
  Daemon d(tmp.path());
  auto ch = Client(d.mt->port(), "acme", "s3cret-acme");
  const uint32_t a = OpenVolume(*ch, OpenMsg("a", 1 << 20), 0);
  const uint32_t b = OpenVolume(*ch, OpenMsg("b", 1 << 20), 0);
  // Rounds 10 and 30 reach both volumes, round 20 only a (b's hold lapsed),
  // round 40 only a so far (b's records still on their way).
  auto m = Call(*ch, Batch(a, {DataRecord(1, 0, Bytes(4096, 1)), TagRecord(2, "group.app.10.2"),
                               TagRecord(3, "group.app.20.2"), TagRecord(4, "group.app.30.2.tag.nightly"),
                               TagRecord(5, "group.app.40.2"), TagRecord(6, "group.app.x.2")}));
  REQUIRE(std::holds_alternative<proto::Ack>(m));
  m = Call(*ch, Batch(b, {TagRecord(1, "group.app.10.2"), DataRecord(2, 0, Bytes(4096, 2)),
                          TagRecord(3, "group.app.30.2.tag.nightly"), TagRecord(4, "group.other.7.1")}));
  REQUIRE(std::holds_alternative<proto::Ack>(m));
  // A tenant of its own with a group of the same name.
  auto other = Client(d.mt->port(), "globex", "s3cret-globex");
  const uint32_t g = OpenVolume(*other, OpenMsg("a", 1 << 20), 0);
  m = Call(*other, Batch(g, {TagRecord(1, "group.app.10.1")}));
  REQUIRE(std::holds_alternative<proto::Ack>(m));

  const uint16_t cport = d.mt->control_port();
  auto gs = Http(cport, "GET", "/v1/groups?tenant=acme", "", 200).at("groups").as_array();
  REQUIRE(gs.size() == 2);  // app and other, in name order
  const json::object& app = gs[0].as_object();
  CHECK(app.at("name") == "app");
  const json::array& pts = app.at("points").as_array();
  REQUIRE(pts.size() == 2);
  CHECK(pts[0].at("round") == 10);
  CHECK(pts[0].at("seqs") == json::object{{"a", 2}, {"b", 1}});
  CHECK(pts[0].at("consistency") == "crash");
  CHECK_FALSE(pts[0].as_object().contains("tag"));
  // Round 30 was a tag (`cdpctl tag --group`): application-consistent.
  CHECK(pts[1].at("marker") == "group.app.30.2.tag.nightly");
  CHECK(pts[1].at("tag") == "nightly");
  CHECK(pts[1].at("consistency") == "application");
  CHECK(pts[1].at("seqs") == json::object{{"a", 4}, {"b", 3}});
  const json::array& partial = app.at("partial").as_array();
  REQUIRE(partial.size() == 1);  // 20; 40 is newer than the last complete point: still on its way
  CHECK(partial[0].at("round") == 20);
  CHECK(partial[0].at("seqs") == json::object{{"a", 3}});
  CHECK(gs[1].at("name") == "other");
  CHECK(gs[1].at("points").as_array().size() == 1);
  // One group asked; every tenant the admin sees; a bad parameter.
  auto one = Http(cport, "GET", "/v1/groups?group=other", "", 200).at("groups").as_array();
  REQUIRE(one.size() == 1);
  CHECK(one[0].at("tenant") == "acme");
  CHECK(Http(cport, "GET", "/v1/groups", "", 200).at("groups").as_array().size() == 3);
  Http(cport, "GET", "/v1/groups?group=../x", "", 400);
}

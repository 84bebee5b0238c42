// SPDX-License-Identifier: Apache-2.0
// End to end through the real master target (cdp_mt, in-process) over
// loopback TCP: an agent client streams writes into the process server, which
// spools and ships them; the master target and then the process server are
// restarted mid-stream. At the end the replica must equal the source image,
// every record must have been applied exactly once (the MT's applied-records
// counters summed over its incarnations equal the number of records), and the
// spool must have released everything.
#include <catch2/catch.hpp>

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include <atomic>
#include <chrono>
#include <thread>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/json.hpp>

#include "common/crypto/pki.h"
#include "common/daemon/metrics.h"
#include "common/net/tls_stream.h"
#include "common/tests/test_util.h"
#include "common/wire/block_digest.h"
#include "common/wire/channel.h"
#include "common/wire/hash.h"
#include "master-target/master_target.h"
#include "process-server/process_server.h"

using namespace std::chrono_literals;
using cdp::proto::Record;
using cdp::proto::RecordKind;

namespace {

using cdp::testing::FreePort;
using cdp::testing::WaitUntil;

constexpr const char* kSecret = "e2e-secret-0123456789-abcdefgh";
constexpr uint64_t kVolSize = 8 << 20;
constexpr uint32_t kBlock = 4096;

using TempDir = cdp::testing::ScratchDir;

Record MakeRecord(uint64_t seq) {
  Record r;
  r.seq = seq;
  uint64_t h = seq * 0x9E3779B97F4A7C15ull;
  r.offset = ((h >> 17) % (kVolSize / kBlock)) * kBlock;
  r.length = kBlock;
  r.kind = RecordKind::kData;
  r.timestamp_us = 1'800'000'000'000'000 + seq;
  r.data.resize(kBlock);
  if (seq % 7 != 0) {  // every 7th write is all zeros
    for (uint32_t i = 0; i < kBlock; ++i) r.data[i] = uint8_t((seq * 31 + i / 16) & 0xff);
  }
  return r;
}

cdp::mt::MasterTargetOptions MtOptions(const std::string& dir, int port) {
  cdp::mt::MasterTargetOptions o;
  o.env = cdp::DefaultEnv();
  o.clock = cdp::SystemClock::Get();
  o.data_dir = dir;
  o.tenants = {{"acme", kSecret}};
  o.listen = {"127.0.0.1", uint16_t(port)};
  o.control = {};  // off
  o.nbd = {};      // off
  return o;
}

cdp::ps::ProcessServerOptions PsOptions(const std::string& dir, uint16_t mt_port, uint16_t listen_port) {
  cdp::ps::ProcessServerOptions o;
  o.env = cdp::DefaultEnv();
  o.clock = cdp::SystemClock::Get();
  o.listen = {"127.0.0.1", listen_port};
  o.control = {};  // off
  o.mt = {"127.0.0.1", mt_port};
  o.tenants = {{"acme", kSecret}};
  o.spool_dir = dir;
  o.segment_bytes = 256 << 10;  // many segments, so release is exercised
  o.codec = cdp::proto::Codec::kZstd;
  o.level = 1;
  o.mt_link.frame_bytes = 64 << 10;     // many frames in flight
  o.mt_link.max_inflight = 4;
  o.mt_link.backoff_min_ms = 20;
  o.mt_link.backoff_max_ms = 300;
  o.mt_open_wait_ms = 300;
  return o;
}

uint64_t AppliedRecords(cdp::mt::MasterTarget& mt, const std::string& volume = "db1") {
  auto c = mt.registry().GetCounter("cdp_mt_applied_records_total", "Records applied",
                                    {{"tenant", "acme"}, {"volume", volume}});
  return c->Value();
}

// An agent that streams records 1..total and resumes across reconnects.
struct AgentClient {
  std::atomic<uint16_t> port{0};
  std::atomic<uint64_t> acked{0};
  std::atomic<bool> stop{false};
  uint64_t total = 0;
  std::string volume = "db1";
  std::atomic<uint64_t> reconnects{0};
  std::atomic<uint64_t> busy{0};
  std::atomic<uint64_t> unexpected_nacks{0};
  cdp::StreamWrapper wrap;  // TLS when set

  void Run() {
    while (!stop.load() && acked.load() < total) {
      auto ch = cdp::Connect("127.0.0.1", port.load(), 2s, {}, wrap);
      if (!ch.ok()) {
        std::this_thread::sleep_for(20ms);
        continue;
      }
      if (!cdp::ClientHandshake(**ch, cdp::proto::Role::kAgent, "acme", "agent-e2e", kSecret, 5s).ok()) continue;
      cdp::proto::VolumeOpen open;
      open.name = volume;
      open.size = kVolSize;
      open.block_size = kBlock;
      open.generation = 1;
      if (!(*ch)->Send(open).ok()) continue;
      auto m = (*ch)->Receive(10s);
      if (!m.ok() || !std::holds_alternative<cdp::proto::VolumeOpenReply>(*m)) continue;
      auto reply = std::get<cdp::proto::VolumeOpenReply>(*m);
      if (reply.durable_seq > acked.load()) acked.store(reply.durable_seq);
      uint64_t next = reply.durable_seq + 1;
      reconnects.fetch_add(1);
      while (!stop.load() && acked.load() < total) {
        cdp::proto::WriteBatch b;
        b.volume_id = reply.volume_id;
        for (uint64_t s = next; s < next + 8 && s <= total; ++s) b.records.push_back(MakeRecord(s));
        if (!(*ch)->Send(b).ok()) break;
        auto r = (*ch)->Receive(10s);
        if (!r.ok()) break;
        if (auto* a = std::get_if<cdp::proto::Ack>(&*r)) {
          acked.store(a->durable_seq);
          next = a->durable_seq + 1;
        } else if (auto* n = std::get_if<cdp::proto::Nack>(&*r)) {
          if (n->reason == cdp::proto::NackReason::kBusy) {
            busy.fetch_add(1);
            std::this_thread::sleep_for(10ms);  // the agent's back-off
          } else if (n->reason == cdp::proto::NackReason::kGap) {
            next = n->expected_seq;
          } else {
            // Catch assertions are not thread-safe: count it, the test thread checks.
            unexpected_nacks.fetch_add(1);
            break;
          }
        }
      }
    }
  }
};

}  // namespace

TEST_CASE("e2e: master target and process server restarts mid-stream, no gap, no duplicate apply",
          "[e2e][resume]") {
  TempDir mt_dir, ps_dir;
  const uint64_t kTotal = 3000;

  auto mt = std::make_unique<cdp::mt::MasterTarget>(MtOptions(mt_dir.path(), 0));
  REQUIRE(mt->Start().ok());
  const int mt_port = mt->port();
  auto ps = std::make_unique<cdp::ps::ProcessServer>(PsOptions(ps_dir.path(), uint16_t(mt_port), 0));
  REQUIRE(ps->Start().ok());
  const uint16_t ps_port = ps->agent_port();

  AgentClient agent;
  agent.total = kTotal;
  agent.port.store(ps_port);
  std::thread agent_thread([&] { agent.Run(); });

  uint64_t applied_records = 0;
  // 1. The master target goes away and comes back while the agent keeps writing.
  REQUIRE(WaitUntil([&] { return agent.acked.load() >= kTotal / 4; }, 60s));
  mt->Stop();
  applied_records += AppliedRecords(*mt);
  mt.reset();
  REQUIRE(WaitUntil([&] { return agent.acked.load() >= kTotal / 2; }, 60s));  // the spool absorbs it
  mt = std::make_unique<cdp::mt::MasterTarget>(MtOptions(mt_dir.path(), mt_port));
  REQUIRE(mt->Start().ok());

  // 2. The process server restarts (the agent reconnects to the same port).
  REQUIRE(WaitUntil([&] { return agent.acked.load() >= 3 * kTotal / 4; }, 60s));
  ps->Stop();
  ps.reset();
  ps = std::make_unique<cdp::ps::ProcessServer>(PsOptions(ps_dir.path(), uint16_t(mt_port), ps_port));
  REQUIRE(ps->Start().ok());

  REQUIRE(WaitUntil([&] { return agent.acked.load() >= kTotal; }, 120s));
  agent.stop.store(true);
  agent_thread.join();
  CHECK(agent.reconnects.load() >= 2);
  CHECK(agent.unexpected_nacks.load() == 0);

  std::shared_ptr<cdp::mt::ReplicaVolume> vol;
  REQUIRE(WaitUntil([&] {
    vol = mt->FindVolume("acme", "db1");
    return vol && vol->applied_seq() == kTotal;
  }, 120s));
  REQUIRE(WaitUntil([&] { return ps->MtAckedSeq("acme", "db1").ok() && *ps->MtAckedSeq("acme", "db1") == kTotal; },
                  60s));

  // No duplicate apply: every record applied exactly once over both MT lives.
  applied_records += AppliedRecords(*mt);
  CHECK(applied_records == kTotal);

  // No gap, right order: the replica equals the source image.
  cdp::Bytes expect(kVolSize, 0);
  for (uint64_t s = 1; s <= kTotal; ++s) {
    Record r = MakeRecord(s);
    std::copy(r.data.begin(), r.data.end(), expect.begin() + long(r.offset));
  }
  cdp::Bytes got(kVolSize);
  REQUIRE(vol->ReadAt(kTotal, 0, kVolSize, got.data()).ok());
  CHECK(got == expect);

  // Resync hashes: the agent's HashRequest goes through the PS to the MT and back.
  {
    auto ch = cdp::Connect("127.0.0.1", ps->agent_port(), 5s);
    REQUIRE(ch.ok());
    REQUIRE(cdp::ClientHandshake(**ch, cdp::proto::Role::kAgent, "acme", "agent-hash", kSecret, 5s).ok());
    cdp::proto::VolumeOpen open;
    open.name = "db1";
    open.size = kVolSize;
    open.block_size = kBlock;
    open.generation = 1;
    REQUIRE((*ch)->Send(open).ok());
    auto m = (*ch)->Receive(10s);
    REQUIRE(m.ok());
    auto reply = std::get<cdp::proto::VolumeOpenReply>(*m);
    CHECK(reply.durable_seq == kTotal);
    cdp::proto::HashRequest hr;
    hr.volume_id = reply.volume_id;
    hr.request_id = 77;
    hr.region_size = 1 << 20;
    hr.first_region = 0;
    hr.count = uint32_t(kVolSize >> 20);
    REQUIRE((*ch)->Send(hr).ok());
    auto h = (*ch)->Receive(30s);
    REQUIRE(h.ok());
    REQUIRE(std::holds_alternative<cdp::proto::HashResponse>(*h));
    auto resp = std::get<cdp::proto::HashResponse>(*h);
    CHECK(resp.volume_id == reply.volume_id);
    CHECK(resp.request_id == 77);
    REQUIRE(resp.hashes.size() == hr.count);
    for (uint32_t i = 0; i < hr.count; ++i)
      CHECK(resp.hashes[i] == cdp::DigestOf(expect.data() + (uint64_t(i) << 20), 1 << 20));
  }

  // The spool released everything the MT acknowledged.
  auto volume_field = [&](const char* key) {
    auto vols = ps->VolumesJson();
    return vols.at("volumes").as_array().at(0).at(key);
  };
  CHECK(WaitUntil([&] { return volume_field("backlog_records").to_number<uint64_t>() == 0; }, 30s));
  CHECK(WaitUntil([&] { return volume_field("spool_segments").to_number<uint64_t>() == 1; }, 30s));
  CHECK(volume_field("stalled").as_string() == "");
}

TEST_CASE("e2e: two copies, MT B down then back and a PS restart: the spool holds what B lacks, A never waits, both "
          "get every record exactly once",
          "[e2e][copies]") {
  TempDir a_dir, b_dir, ps_dir;
  const uint64_t kTotal = 3000;
  auto a = std::make_unique<cdp::mt::MasterTarget>(MtOptions(a_dir.path(), 0));
  REQUIRE(a->Start().ok());
  auto b = std::make_unique<cdp::mt::MasterTarget>(MtOptions(b_dir.path(), 0));
  REQUIRE(b->Start().ok());
  const uint16_t b_port = uint16_t(b->port());
  auto options = [&](uint16_t listen) {
    auto o = PsOptions(ps_dir.path(), uint16_t(a->port()), listen);
    o.more_mts = {{"127.0.0.1", b_port}};
    o.copies = 2;
    return o;
  };
  auto ps = std::make_unique<cdp::ps::ProcessServer>(options(0));
  REQUIRE(ps->Start().ok());
  const uint16_t ps_port = ps->agent_port();
  auto copies = [&] {
    auto c = ps->Copies("acme", "db1");
    return c.ok() ? *c : std::vector<cdp::ps::CopyStatus>{};
  };

  AgentClient agent;
  agent.total = kTotal;
  agent.port.store(ps_port);
  std::thread agent_thread([&] { agent.Run(); });

  // 1. Both copies ship; then B goes away while the agent keeps writing.
  REQUIRE(WaitUntil([&] { return agent.acked.load() >= kTotal / 4; }, 60s));
  REQUIRE(WaitUntil([&] { auto c = copies(); return c.size() == 2 && c[1].acked_seq > 0; }, 60s));
  b->Stop();
  uint64_t b_applied = AppliedRecords(*b);
  b.reset();
  REQUIRE(WaitUntil([&] { return agent.acked.load() >= kTotal / 2; }, 60s));
  // A keeps up with everything spooled; B's cursor stands still and the
  // spool holds everything above it.
  const uint64_t spooled = agent.acked.load();
  REQUIRE(WaitUntil([&] { auto c = copies(); return c.size() == 2 && c[0].acked_seq >= spooled; }, 60s));
  {
    auto c = copies();
    CHECK(c[0].mt == "127.0.0.1:" + std::to_string(a->port()));
    CHECK(c[1].mt == "127.0.0.1:" + std::to_string(b_port));
    CHECK(c[1].acked_seq < spooled);
    CHECK(c[1].lag_records > 0);
    auto vols = ps->VolumesJson();
    const auto& v = vols.at("volumes").as_array().at(0);
    CHECK(v.at("backlog_records").to_number<uint64_t>() >= spooled - c[1].acked_seq);
    CHECK(v.at("copies").as_array().size() == 2);
  }

  // 2. The PS restarts (gracefully: Stop persists the cursors) while B is still down.
  ps->Stop();
  ps.reset();
  ps = std::make_unique<cdp::ps::ProcessServer>(options(ps_port));
  REQUIRE(ps->Start().ok());
  {
    auto c = copies();
    REQUIRE(c.size() == 2);
    CHECK(c[0].acked_seq >= spooled);  // reloaded from copies.meta before A answered
  }
  REQUIRE(WaitUntil([&] { return agent.acked.load() >= 3 * kTotal / 4; }, 60s));

  // 3. B comes back on its port; everything reaches both.
  b = std::make_unique<cdp::mt::MasterTarget>(MtOptions(b_dir.path(), b_port));
  REQUIRE(b->Start().ok());
  REQUIRE(WaitUntil([&] { return agent.acked.load() >= kTotal; }, 120s));
  agent.stop.store(true);
  agent_thread.join();
  CHECK(agent.unexpected_nacks.load() == 0);
  std::shared_ptr<cdp::mt::ReplicaVolume> va, vb;
  REQUIRE(WaitUntil([&] {
    va = a->FindVolume("acme", "db1");
    vb = b->FindVolume("acme", "db1");
    return va && vb && va->applied_seq() == kTotal && vb->applied_seq() == kTotal;
  }, 120s));
  // Exactly once at each MT (B over both its lives).
  CHECK(AppliedRecords(*a) == kTotal);
  b_applied += AppliedRecords(*b);
  CHECK(b_applied == kTotal);
  cdp::Bytes expect(kVolSize, 0);
  for (uint64_t s = 1; s <= kTotal; ++s) {
    Record r = MakeRecord(s);
    std::copy(r.data.begin(), r.data.end(), expect.begin() + long(r.offset));
  }
  cdp::Bytes got(kVolSize);
  REQUIRE(va->ReadAt(kTotal, 0, kVolSize, got.data()).ok());
  CHECK(got == expect);
  REQUIRE(vb->ReadAt(kTotal, 0, kVolSize, got.data()).ok());
  CHECK(got == expect);
  // Both cursors at the end, the spool released.
  REQUIRE(WaitUntil([&] {
    auto c = copies();
    return c.size() == 2 && c[0].acked_seq == kTotal && c[1].acked_seq == kTotal && c[1].lag_records == 0;
  }, 60s));
  auto vols = ps->VolumesJson();
  CHECK(vols.at("volumes").as_array().at(0).at("backlog_records").to_number<uint64_t>() == 0);
  CHECK(vols.at("volumes").as_array().at(0).at("stalled").as_string() == "");
}

namespace {

cdp::Subprocess StartDaemon(const std::string& config) {
  cdp::SpawnOptions o;
  o.argv = {CDP_PS_BINARY, "--config", config};
  o.die_with_parent = true;
  auto p = cdp::Subprocess::Spawn(o);
  REQUIRE(p.ok());
  return std::move(*p);
}

}  // namespace

TEST_CASE("e2e: kill -9 of the cdp-process-server daemon mid-stream loses no acknowledged write",
          "[e2e][resume]") {
  TempDir mt_dir, ps_dir, pki_dir;
  const uint64_t kTotal = 3000;
  // Every link over TLS, with certificates made here.
  const std::string pki = pki_dir.path() + "/pki";
  REQUIRE(cdp::pki::InitCa(pki, {}).ok());
  auto issue = [&](cdp::pki::CertRole role, const std::string& tenant, const std::string& stem) {
    cdp::pki::IssueOptions io;
    io.identity = cdp::pki::Identity{role, tenant, stem + "-e2e"};
    REQUIRE(cdp::pki::Issue(pki, io, pki + "/" + stem + ".key", pki + "/" + stem + ".crt").ok());
  };
  issue(cdp::pki::CertRole::kMasterTarget, "", "mt");
  issue(cdp::pki::CertRole::kProcessServer, "acme", "ps");
  issue(cdp::pki::CertRole::kAgent, "acme", "agent");
  auto mt_options = MtOptions(mt_dir.path(), 0);
  mt_options.tls = cdp::TlsSettings{true, pki + "/ca.crt", pki + "/mt.crt", pki + "/mt.key", ""};
  cdp::mt::MasterTarget mt(mt_options);
  REQUIRE(mt.Start().ok());
  auto agent_tls = cdp::TlsCredentials::Load(cdp::TlsFiles{pki + "/ca.crt", pki + "/agent.crt", pki + "/agent.key", ""});
  REQUIRE(agent_tls.ok());
  uint16_t ps_port = FreePort();
  std::string config = ps_dir.path() + "/ps.conf";
  {
    std::ofstream c(config);
    c << "listen = 127.0.0.1:" << ps_port << "\n"
      << "control = 127.0.0.1:0\n"
      << "mt = 127.0.0.1:" << mt.port() << "\n"
      << "tenant = acme:" << kSecret << "\n"
      << "spool_dir = " << ps_dir.path() << "/spool\n"
      << "segment_size = 1MiB\n"
      << "frame_size = 64KiB\n"
      << "codec = lz4\n"
      << "tls_ca = " << pki << "/ca.crt\ntls_cert = " << pki << "/ps.crt\ntls_key = " << pki << "/ps.key\n"
      << "\n[log]\nlevel = warn\n";
  }
  cdp::Subprocess ps = StartDaemon(config);

  AgentClient agent;
  agent.wrap = cdp::TlsWrapper(agent_tls->get(), cdp::TlsSide::kClient, 5s);
  agent.total = kTotal;
  agent.port.store(ps_port);
  std::thread agent_thread([&] { agent.Run(); });
  for (uint64_t mark : {kTotal / 3, 2 * kTotal / 3}) {
    REQUIRE(WaitUntil([&] { return agent.acked.load() >= mark; }, 120s));
    uint64_t acked_before_kill = agent.acked.load();
    int st = ps.Stop(SIGKILL, 0s);
    CHECK(WIFSIGNALED(st));
    ps = StartDaemon(config);
    // Whatever was acknowledged before the kill is still there after it.
    REQUIRE(WaitUntil([&] { return agent.acked.load() > acked_before_kill; }, 120s));
  }
  REQUIRE(WaitUntil([&] { return agent.acked.load() >= kTotal; }, 120s));
  agent.stop.store(true);
  agent_thread.join();
  CHECK(agent.unexpected_nacks.load() == 0);

  std::shared_ptr<cdp::mt::ReplicaVolume> vol;
  bool done = WaitUntil([&] {
    vol = mt.FindVolume("acme", "db1");
    return vol && vol->applied_seq() == kTotal;
  }, 120s);
  int st = ps.Stop(SIGTERM, 60s);
  REQUIRE(done);
  CHECK(WIFEXITED(st));
  CHECK(AppliedRecords(mt) == kTotal);
  cdp::Bytes expect(kVolSize, 0);
  for (uint64_t s = 1; s <= kTotal; ++s) {
    Record r = MakeRecord(s);
    std::copy(r.data.begin(), r.data.end(), expect.begin() + long(r.offset));
  }
  cdp::Bytes got(kVolSize);
  REQUIRE(vol->ReadAt(kTotal, 0, kVolSize, got.data()).ok());
  CHECK(got == expect);
}

TEST_CASE("e2e: several volumes over parallel connections, compression pool, throttle and quota back-pressure",
          "[e2e][quota]") {
  TempDir mt_dir, ps_dir;
  const uint64_t kTotal = 600;
  cdp::mt::MasterTarget mt(MtOptions(mt_dir.path(), 0));
  REQUIRE(mt.Start().ok());
  auto o = PsOptions(ps_dir.path(), uint16_t(mt.port()), 0);
  o.connections = 2;
  o.compress_threads = 4;
  o.quota_bytes = 256 << 10;          // ~60 records: the agents outrun the shipping
  o.throttle.default_mbps = 8;        // 1 MB/s for all volumes together: slower than the agents even under ASan
  o.volume_codecs["acme/vol-b"] = {cdp::proto::Codec::kLz4, 0};
  o.volume_codecs["acme/vol-c"] = {cdp::proto::Codec::kNone, 0};
  cdp::ps::ProcessServer ps(o);
  REQUIRE(ps.Start().ok());

  std::vector<std::unique_ptr<AgentClient>> agents;
  std::vector<std::thread> threads;
  for (const char* name : {"vol-a", "vol-b", "vol-c"}) {
    auto a = std::make_unique<AgentClient>();
    a->total = kTotal;
    a->volume = name;
    a->port.store(ps.agent_port());
    agents.push_back(std::move(a));
  }
  for (auto& a : agents) threads.emplace_back([p = a.get()] { p->Run(); });
  bool all_acked = WaitUntil([&] {
    for (auto& a : agents)
      if (a->acked.load() < kTotal) return false;
    return true;
  }, 180s);
  for (auto& a : agents) a->stop.store(true);
  for (auto& t : threads) t.join();
  for (auto& a : agents) INFO(a->volume << " acked " << a->acked.load() << " busy " << a->busy.load());
  INFO(boost::json::serialize(ps.VolumesJson()));
  REQUIRE(all_acked);

  uint64_t busy = 0;
  for (auto& a : agents) {
    busy += a->busy.load();
    CHECK(a->unexpected_nacks.load() == 0);
  }
  CHECK(busy > 0);  // back-pressure happened, and the spools took data again after draining

  cdp::Bytes expect(kVolSize, 0);
  for (uint64_t s = 1; s <= kTotal; ++s) {
    Record r = MakeRecord(s);
    std::copy(r.data.begin(), r.data.end(), expect.begin() + long(r.offset));
  }
  for (const char* name : {"vol-a", "vol-b", "vol-c"}) {
    std::shared_ptr<cdp::mt::ReplicaVolume> vol;
    REQUIRE(WaitUntil([&] {
      vol = mt.FindVolume("acme", name);
      return vol && vol->applied_seq() == kTotal;
    }, 120s));
    CHECK(AppliedRecords(mt, name) == kTotal);
    cdp::Bytes got(kVolSize);
    REQUIRE(vol->ReadAt(kTotal, 0, kVolSize, got.data()).ok());
    CHECK(got == expect);
  }
  auto vols = ps.VolumesJson().at("volumes").as_array();
  REQUIRE(vols.size() == 3);
  for (auto& v : vols) {
    CHECK(v.at("busy_nacks").to_number<uint64_t>() > 0);
    CHECK(v.at("frames_out").to_number<uint64_t>() > 0);
  }
  CHECK(ps.throttle().state().reserved_bytes > 0);
  CHECK(ps.throttle().state().waited_micros > 0);
}

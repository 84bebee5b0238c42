// SPDX-License-Identifier: Apache-2.0
// Failback at the original site (agent/failback.h, agent/site_state.h): a
// pass against a test peer that answers the failback messages from a known
// provider image, the site state file, the tap's write fence, and the
// agent's steps through re-protect.
#include "agent/failback.h"

#include <catch2/catch.hpp>
#include <random>

#include "agent/agent.h"
#include "agent/site_state.h"
#include "agent/tests/test_peer.h"
#include "common/tests/test_util.h"
#include "common/wire/block_digest.h"

using cdp::Bytes;
using cdp::Code;
using namespace cdp::agent;
using cdp::agent::testing::TestPeer;
using cdp::testing::WaitUntil;

namespace {

constexpr uint64_t kBlock = 4096;
constexpr uint64_t kSize = 4u << 20;  // 1024 blocks

Bytes Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  Bytes b(n);
  for (auto& x : b) x = uint8_t(rng());
  return b;
}

void Put(Bytes& img, uint64_t block, const Bytes& data) { std::copy(data.begin(), data.end(), img.begin() + long(block * kBlock)); }
Bytes Block(const Bytes& img, uint64_t block) {
  return Bytes(img.begin() + long(block * kBlock), img.begin() + long((block + 1) * kBlock));
}

std::shared_ptr<CaptureDevice> Device(cdp::Env* env, const Bytes& content) {
  REQUIRE(env->CreateDirs("/d").ok());
  cdp::OpenOptions oo;
  oo.create = true;
  oo.truncate = true;
  auto f = std::move(*env->Open("/d/vol.img", oo));
  REQUIRE(f->Write(0, content).ok());
  REQUIRE(f->Sync().ok());
  CaptureDevice::Options o;
  o.volume = "vol";
  o.env = env;
  o.clock = cdp::SystemClock::Get();
  o.backing_path = "/d/vol.img";
  o.bitmap_path = "/d/vol.bitmap";
  auto d = CaptureDevice::Open(o);
  REQUIRE(d.ok());
  // Replicated before the failover: the initial sync is done (a new bitmap
  // flags every region for a compare).
  for (uint64_t r = 0; r < (*d)->bitmap().region_count(); ++r) (*d)->bitmap().ResyncDone(r, 0);
  return *d;
}

std::unique_ptr<BranchStore> Branch(cdp::Env* env) {
  BranchStore::Options bo;
  bo.env = env;
  bo.prefix = "/d/vol.branch-g1";
  bo.volume_size = kSize;
  auto b = BranchStore::Open(bo);
  REQUIRE(b.ok());
  return std::move(*b);
}

// The request path of a fenced volume's link to the process server (here the
// test peer): a ReplicationSender with no stream open, its CallAsync.
struct Link {
  cdp::repl::ReplicationSender sender;
  explicit Link(const TestPeer& peer) : sender(Options(peer)) {
    sender.Start();
    REQUIRE(WaitUntil([&] { return sender.connected(); }));
  }
  static cdp::repl::SenderOptions Options(const TestPeer& peer) {
    cdp::repl::SenderOptions o;
    o.link.peer.port = peer.port();
    o.link.tenant = "t1";
    o.link.secret = "s3cret";
    o.link.client_id = "failback-test";
    return o;
  }
  FailbackOptions Opts() {
    FailbackOptions o;
    o.call = [this](cdp::proto::Message m, cdp::repl::ReplicationSender::CallCallback done,
                    std::shared_ptr<cdp::repl::CallBytes> bytes) {
      sender.CallAsync(std::move(m), std::move(done), std::move(bytes));
    };
    o.max_requests = 3;
    return o;
  }
};

Bytes ReadSource(CaptureDevice& d) {
  Bytes b(kSize);
  REQUIRE(d.ReadBacking(0, b.size(), b.data()).ok());
  return b;
}

}  // namespace

TEST_CASE("failback pass: pulls exactly the blocks that differ in the union of the provider's plan and the "
          "original site's unshipped writes, saving each overwritten block to the branch first",
          "[failback]") {
  auto env = cdp::NewMemEnv();
  const Bytes point = Random(kSize, 1);  // the image at the failover point, also the source's base
  auto dev = Device(env.get(), point);
  // The original site wrote block 300 (never shipped) and block 400 with what
  // the provider has there too (equal: must not travel).
  Bytes provider = point;
  Put(provider, 10, Bytes(kBlock, 0xA1));
  Put(provider, 11, Bytes(kBlock, 0xA2));
  Put(provider, 700, Bytes(kBlock, 0));           // zeroed at the provider
  Put(provider, 400, Bytes(kBlock, 0x44));
  REQUIRE(dev->Write(300 * kBlock, Bytes(kBlock, 0x33), false).ok());
  REQUIRE(dev->Write(400 * kBlock, Bytes(kBlock, 0x44), false).ok());
  const Bytes before = ReadSource(*dev);
  // Block 50 is in the plan but equal on both sides. Pages of two extents.
  TestPeer peer("t1", "s3cret", kSize);
  peer.SetFailback("vol", provider, {{10, 2}, {50, 1}, {700, 1}}, 2);
  auto branch = Branch(env.get());
  Link link(peer);

  auto r = RunFailbackPass(*dev, *branch, link.Opts());
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  CHECK(r->plan_blocks == 4);
  CHECK(r->local_blocks == 2);
  CHECK(r->compared_blocks == 6);
  CHECK(r->pulled_blocks == 4);  // 10, 11, 300, 700
  CHECK(r->pulled_bytes == 4 * kBlock);
  CHECK(r->saved_blocks == 4);
  CHECK(r->requests == 3);  // two plan pages, one pull
  CHECK(r->wire_bytes_in > 0);       // the plan pages and the four blocks, as framed (compressed)
  CHECK(r->wire_bytes_out > 6 * 16);  // the six digests and the frames around them
  CHECK(peer.pulled_blocks() == 4);
  CHECK(peer.digests_received() == 6);
  CHECK(ReadSource(*dev) == provider);
  // The branch holds what the original site had there, and nothing else.
  CHECK(branch->saved_blocks() == 4);
  for (uint64_t b : {10, 11, 300, 700}) {
    INFO("block " << b);
    REQUIRE(branch->Contains(b));
    Bytes saved(kBlock);
    REQUIRE(branch->ReadSaved(b * kBlock, kBlock, saved.data()).ok());
    CHECK(saved == Block(before, b));
  }
  CHECK_FALSE(branch->Contains(50));
  CHECK_FALSE(branch->Contains(400));
  // The failback's writes are not captured: the queue holds the two writes only.
  CHECK(dev->queue().Stats().records == 2);

  // A second pass is idempotent: compared again, nothing pulled or saved.
  auto again = RunFailbackPass(*dev, *branch, link.Opts());
  REQUIRE(again.ok());
  CHECK(again->wire_bytes_in < r->wire_bytes_in);  // nothing pulled: the same plan, an empty pull answer
  CHECK(again->compared_blocks == 6);
  CHECK(again->pulled_blocks == 0);
  CHECK(again->saved_blocks == 0);
  CHECK(branch->saved_blocks() == 4);
  CHECK(ReadSource(*dev) == provider);
}

TEST_CASE("failback pass: an answer naming a block not asked for fails the pass and nothing of it is applied",
          "[failback]") {
  auto env = cdp::NewMemEnv();
  const Bytes point = Random(kSize, 2);
  auto dev = Device(env.get(), point);
  Bytes provider = point;
  Put(provider, 5, Bytes(kBlock, 0x55));
  TestPeer peer("t1", "s3cret", kSize);
  peer.SetFailback("vol", provider, {{5, 1}}, 16);
  peer.CorruptNextPull();
  auto branch = Branch(env.get());
  Link link(peer);
  auto r = RunFailbackPass(*dev, *branch, link.Opts());
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kCorruption);
  CHECK(r.status().message() == "failback pull: a block that was not asked for");
  CHECK(ReadSource(*dev) == point);
  CHECK(branch->saved_blocks() == 0);
  // The next pass (an honest answer) finishes the job.
  auto ok = RunFailbackPass(*dev, *branch, link.Opts());
  REQUIRE(ok.ok());
  CHECK(ok->pulled_blocks == 1);
  CHECK(ReadSource(*dev) == provider);
}

TEST_CASE("failback pass: refused when the master target is not failing back the volume", "[failback]") {
  auto env = cdp::NewMemEnv();
  auto dev = Device(env.get(), Bytes(kSize, 0));
  TestPeer peer("t1", "s3cret", kSize);
  auto branch = Branch(env.get());
  Link link(peer);
  auto r = RunFailbackPass(*dev, *branch, link.Opts());
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kInvalidArgument);
  CHECK(r.status().message() == "vol is not failing back at the master target (cdpctl failback starts it)");
}

TEST_CASE("site state: missing means generation 1 protecting, saved states load back, bad files are corruption",
          "[failback]") {
  auto env = cdp::NewMemEnv();
  REQUIRE(env->CreateDirs("/s").ok());
  auto s = LoadSiteState(env.get(), "/s/v.site");
  REQUIRE(s.ok());
  CHECK(*s == SiteState{1, SitePhase::kProtecting});
  for (SiteState want : {SiteState{1, SitePhase::kFailingBack}, SiteState{1, SitePhase::kFailedBack},
                         SiteState{2, SitePhase::kProtecting}}) {
    REQUIRE(SaveSiteState(env.get(), "/s/v.site", want).ok());
    auto got = LoadSiteState(env.get(), "/s/v.site");
    REQUIRE(got.ok());
    CHECK(*got == want);
  }
  for (std::string bad : {"", "opencdp-site 2\ngeneration 1\nphase protecting\n",
                          "opencdp-site 1\ngeneration 0\nphase protecting\n",
                          "opencdp-site 1\ngeneration 1\nphase gone\n",
                          "opencdp-site 1\ngeneration 1\nphase protecting\nx"}) {
    INFO(bad);
    REQUIRE(cdp::WriteFileAtomic(env.get(), "/s/v.site", Bytes(bad.begin(), bad.end())).ok());
    auto got = LoadSiteState(env.get(), "/s/v.site");
    REQUIRE_FALSE(got.ok());
    CHECK(got.status().code() == Code::kCorruption);
  }
}

TEST_CASE("agent failback steps: begin fences the tap, a pass pulls, end, then reprotect opens the next generation "
          "with nothing to resync, the state survives a restart",
          "[failback][agent]") {
  cdp::testing::ScratchDir dir;
  auto env = cdp::NewMemEnv();
  const Bytes point = Random(kSize, 3);
  REQUIRE(env->CreateDirs("/v").ok());
  {
    cdp::OpenOptions oo;
    oo.create = true;
    auto f = std::move(*env->Open("/v/a.img", oo));
    REQUIRE(f->Write(0, point).ok());
  }
  TestPeer peer("t1", "s3cret", kSize);
  peer.SetImage(point, "a");
  Bytes provider = point;
  Put(provider, 7, Bytes(kBlock, 0x77));
  AgentOptions ao;
  ao.env = env.get();
  ao.clock = cdp::SystemClock::Get();
  ao.nbd.tcp = {};
  ao.nbd.unix_path = dir.Join("nbd.sock");
  ao.bitmap_dir = "/v/bm";
  ao.control.port = 0;
  ao.sender.link.peer.port = peer.port();
  ao.sender.link.tenant = "t1";
  ao.sender.link.secret = "s3cret";
  ao.sender.link.client_id = "test-agent";
  ao.sender.link.backoff_min_ms = 10;
  ao.sender.link.backoff_max_ms = 50;
  ao.sender.checkpoint_interval_ms = 20;
  ao.volumes.push_back({"a", "/v/a.img", ""});
  {
    Agent agent(ao);
    REQUIRE(agent.Start().ok());
    REQUIRE(WaitUntil([&] { return peer.last_generation() == 1; }));
    CHECK(agent.Site("a")->phase == SitePhase::kProtecting);
    CHECK(agent.FailbackPass("a").status().code() == Code::kInvalidArgument);
    CHECK(agent.Reprotect("a", 3).status().code() == Code::kInvalidArgument);

    // The MT failed the volume over: generation 1 is fenced from now on.
    peer.FenceBelow(2);
    peer.SetFailback("a", provider, {{7, 1}}, 8);
    auto b = agent.BeginFailback("a");
    REQUIRE(b.ok());
    CHECK(b->phase == SitePhase::kFailingBack);
    auto w = agent.device(0)->Write(0, Bytes(kBlock, 1), false);
    CHECK(w.code() == Code::kPermissionDenied);
    CHECK(w.message() == "a is failing back: writes are refused until cdpctl reprotect");
    auto p = agent.FailbackPass("a");
    INFO(p.status().ToString());
    REQUIRE(p.ok());
    CHECK(p->pulled_blocks == 1);
    REQUIRE(agent.EndFailback("a").ok());
    CHECK(agent.EndFailback("a")->phase == SitePhase::kFailedBack);
    agent.Stop();
  }
  // Restarted: still failed back, the tap still fenced, the branch served.
  Agent agent(ao);
  REQUIRE(agent.Start().ok());
  CHECK(agent.Site("a")->phase == SitePhase::kFailedBack);
  CHECK(agent.device(0)->Write(0, Bytes(kBlock, 1), false).code() == Code::kPermissionDenied);
  auto r = agent.Reprotect("a", 2);
  REQUIRE(r.ok());
  CHECK(*r == SiteState{2, SitePhase::kProtecting});
  CHECK(agent.Reprotect("a", 2).ok());  // again: a no-op
  // Generation 2 opens, the queue and bitmap are empty: nothing is resent.
  REQUIRE(WaitUntil([&] { return peer.last_generation() == 2 && agent.sender(0)->Stats().link.connected; }));
  CHECK(agent.device(0)->bitmap().ResyncCount() == 0);
  REQUIRE(agent.device(0)->Write(8 * kBlock, Bytes(kBlock, 8), false).ok());
  REQUIRE(WaitUntil([&] { return Block(peer.Image("a"), 8) == Bytes(kBlock, 8); }));
  CHECK(*LoadSiteState(env.get(), "/v/bm/a.site") == SiteState{2, SitePhase::kProtecting});
  agent.Stop();
}

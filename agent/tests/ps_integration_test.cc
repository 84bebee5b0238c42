// SPDX-License-Identifier: Apache-2.0
// The agent against the real process server library (cdp_ps), with no master
// target behind it: every captured record becomes durable in the spool and is
// acknowledged; hash requests cannot be answered (resync pauses, shipping goes
// on); the agent's memory stays within its budget meanwhile. (A full spool's
// kBusy needs a master target to drain it again: that is the e2e suite's.)
#include <catch2/catch.hpp>
#include <boost/json.hpp>
#include <chrono>
#include <random>
#include <thread>

#include "agent/sender.h"
#include "common/crypto/seal.h"
#include "common/tests/test_util.h"
#include "process-server/process_server.h"

using namespace std::chrono_literals;
using cdp::agent::CaptureDevice;
using cdp::agent::CaptureMode;
using cdp::agent::Sender;
using cdp::agent::SenderOptions;

namespace {

using cdp::testing::WaitUntil;

constexpr uint64_t kMiB = 1u << 20;

uint64_t SpoolDurable(cdp::ps::ProcessServer& ps) {
  auto vols = ps.VolumesJson();
  for (auto& v : vols.at("volumes").as_array()) {
    if (v.at("volume").as_string() == "vol") return v.at("spool_durable_seq").to_number<uint64_t>();
  }
  return 0;
}

}  // namespace

TEST_CASE("every captured record becomes durable in the real process server's spool", "[agent][ps]") {
  auto env = cdp::NewMemEnv();
  cdp::SystemClock* clock = cdp::SystemClock::Get();
  const uint64_t size = 16 * kMiB;
  REQUIRE(env->CreateDirs("/d").ok());
  {
    cdp::OpenOptions oo;
    oo.create = true;
    auto f = std::move(*env->Open("/d/vol.img", oo));
    REQUIRE(f->Truncate(size).ok());
  }
  cdp::ps::ProcessServerOptions po;
  po.env = env.get();
  po.clock = clock;
  po.listen = {"127.0.0.1", 0};
  po.control = {};  // off
  po.mt = {"127.0.0.1", 1};  // nothing listens there: no master target
  po.tenants = {{"t1", "s3cret"}};
  po.spool_dir = "/ps/spool";
  po.mt_open_wait_ms = 50;
  po.mt_link.backoff_min_ms = 50;
  cdp::ps::ProcessServer ps(po);
  REQUIRE(ps.Start().ok());

  CaptureDevice::Options o;
  o.volume = "vol";
  o.env = env.get();
  o.clock = clock;
  o.backing_path = "/d/vol.img";
  o.bitmap_path = "/d/vol.bitmap";
  o.budget = 2 * kMiB;
  auto dev = std::move(*CaptureDevice::Open(o));
  SenderOptions so;
  so.link.peer.port = ps.agent_port();
  so.link.tenant = "t1";
  so.link.secret = "s3cret";
  so.link.client_id = "agent-test";
  so.link.frame_bytes = 256 * 1024;
  so.link.backoff_min_ms = 10;
  so.link.busy_hold_ms = 20;
  so.resync.retry_min_ms = 100;
  so.checkpoint_interval_ms = 20;
  Sender sender(dev.get(), so);
  sender.Start();
  REQUIRE(WaitUntil([&] { return sender.Stats().link.connected; }));

  std::mt19937 rng(1);
  std::vector<uint8_t> data(64 * 1024);
  for (auto& b : data) b = uint8_t(rng());
  uint64_t peak = 0;
  for (int i = 0; i < 400; ++i) {
    uint64_t off = (rng() % (size / 65536)) * 65536;
    REQUIRE(dev->Write(off, data, false).ok());
    if (i % 50 == 49) REQUIRE(dev->Flush().ok());
    peak = std::max(peak, dev->queue().Stats().memory_bytes);
  }
  REQUIRE(peak <= o.budget);
  // Everything queued is acknowledged, and the spool holds exactly that much.
  REQUIRE(WaitUntil([&] {
    auto st = dev->queue().Stats();
    return st.records == 0 && sender.Stats().acked_seq == st.next_seq - 1;
  }));
  uint64_t last = dev->queue().next_seq() - 1;
  REQUIRE(last > 0);
  REQUIRE(SpoolDurable(ps) == last);
  // No master target: the hash requests of the initial sync were refused and
  // the session stayed up.
  REQUIRE(dev->bitmap().ResyncCount() > 0);
  REQUIRE(sender.Stats().link.connects == 1);
  sender.Stop();
  ps.Stop();
}

TEST_CASE("regression: an encrypted volume's batch of whole-record trims stays within the process server's work cap",
          "[agent][ps][sealed]") {
  // Nine trims of kMaxRecordLength: the queue cuts the batch at 8 (256 MiB,
  // the cap, by lengths); sealed, each also carries 128 KiB of MACs, and a
  // batch over the cap is refused (kBadRecord) and the stream stalls.
  auto env = cdp::NewMemEnv();
  cdp::SystemClock* clock = cdp::SystemClock::Get();
  const uint64_t size = 9 * uint64_t(cdp::proto::kMaxRecordLength);
  REQUIRE(env->CreateDirs("/d").ok());
  {
    cdp::OpenOptions oo;
    oo.create = true;
    auto f = std::move(*env->Open("/d/vol.img", oo));
    REQUIRE(f->Truncate(size).ok());
  }
  cdp::ps::ProcessServerOptions po;
  po.env = env.get();
  po.clock = clock;
  po.listen = {"127.0.0.1", 0};
  po.control = {};
  po.mt = {"127.0.0.1", 1};  // no master target
  po.tenants = {{"t1", "s3cret"}};
  po.spool_dir = "/ps/spool";
  po.mt_open_wait_ms = 50;
  po.mt_link.backoff_min_ms = 50;
  cdp::ps::ProcessServer ps(po);
  REQUIRE(ps.Start().ok());

  cdp::seal::TenantKey key;
  key.bytes.fill(3);
  CaptureDevice::Options o;
  o.volume = "vol";
  o.env = env.get();
  o.clock = clock;
  o.backing_path = "/d/vol.img";
  o.bitmap_path = "/d/vol.bitmap";
  o.sealer = *cdp::seal::BlockSealer::Create(*cdp::seal::DeriveVolumeKeys(key, "vol"));
  auto dev = std::move(*CaptureDevice::Open(o));
  SenderOptions so;
  so.link.peer.port = ps.agent_port();
  so.link.tenant = "t1";
  so.link.secret = "s3cret";
  so.link.client_id = "agent-test";
  so.link.backoff_min_ms = 10;
  so.resync.retry_min_ms = 100;
  so.checkpoint_interval_ms = 20;
  Sender sender(dev.get(), so);
  sender.Start();
  REQUIRE(WaitUntil([&] { return sender.Stats().link.connected; }, 10s));
  for (uint64_t i = 0; i < 9; ++i) {
    REQUIRE(dev->Trim(i * cdp::proto::kMaxRecordLength, cdp::proto::kMaxRecordLength, false).ok());
  }
  REQUIRE(dev->Flush().ok());
  // Every record acknowledged and durable in the spool (numbers may be
  // renumbered at the first resume: read them once the queue is empty).
  REQUIRE(WaitUntil([&] {
    auto st = dev->queue().Stats();
    return st.records == 0 && st.next_seq > 9 && SpoolDurable(ps) == st.next_seq - 1;
  }, 20s));
  CHECK(sender.Stats().acked_seq == dev->queue().Stats().next_seq - 1);
  CHECK(sender.Stats().link.last_error.find("work") == std::string::npos);
  sender.Stop();
  ps.Stop();
}

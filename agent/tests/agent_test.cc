// SPDX-License-Identifier: Apache-2.0
// The whole agent: real NBD clients (nbdinfo, qemu-io, nbdcopy) against the
// tap with a test peer behind it ([e2e]); tags across volumes with the freeze
// hook; the device's own range checks.
#include "agent/agent.h"

#include <catch2/catch.hpp>
#include <boost/asio.hpp>
#include <boost/json.hpp>
#include <chrono>
#include <fstream>
#include <random>
#include <thread>

#include "agent/tests/test_peer.h"
#include "common/http/http_client.h"
#include "common/tests/test_util.h"

using namespace std::chrono_literals;
using cdp::agent::Agent;
using cdp::agent::AgentOptions;
using cdp::agent::CaptureMode;
using cdp::agent::testing::TestPeer;
using cdp::testing::RunCommand;
using cdp::testing::ScratchDir;

namespace {

using cdp::testing::WaitUntil;

constexpr uint64_t kMiB = 1u << 20;

void MakeFile(cdp::Env* env, const std::string& path, uint64_t size) {
  REQUIRE(env->CreateDirs(cdp::DirName(path)).ok());
  cdp::OpenOptions oo;
  oo.create = true;
  oo.truncate = true;
  auto f = std::move(*env->Open(path, oo));
  REQUIRE(f->Truncate(size).ok());
  REQUIRE(f->Sync().ok());
}

AgentOptions BaseOptions(cdp::Env* env, const std::string& dir, uint16_t ps_port) {
  AgentOptions ao;
  ao.env = env;
  ao.clock = cdp::SystemClock::Get();
  ao.nbd.tcp = {};
  ao.nbd.unix_path = dir + "/nbd.sock";
  ao.bitmap_dir = dir + "/bm";
  ao.control.port = 0;
  ao.sender.link.peer.port = ps_port;
  ao.sender.link.tenant = "t1";
  ao.sender.link.secret = "s3cret";
  ao.sender.link.client_id = "test-agent";
  ao.sender.link.backoff_min_ms = 10;
  ao.sender.checkpoint_interval_ms = 50;
  return ao;
}

bool Drained(Agent& a, size_t i, TestPeer& peer, const std::string& vol) {
  auto* d = a.device(i);
  auto st = d->queue().Stats();
  return st.records == 0 && st.mode == CaptureMode::kData && d->bitmap().ResyncCount() == 0 &&
         peer.durable(vol) == st.next_seq - 1;
}

}  // namespace

TEST_CASE("real NBD clients write through the tap and the replica follows", "[e2e][nbd]") {
  for (const char* prog : {"nbdinfo", "qemu-io", "nbdcopy", "cmp"}) {
    if (!cdp::testing::HaveProgram(prog)) FAIL(std::string("missing client program: ") + prog);
  }
  ScratchDir dir;
  const uint64_t size = 64 * kMiB;
  auto env = cdp::NewPosixEnv();
  MakeFile(env.get(), dir.Join("vol.img"), size);
  TestPeer peer("t1", "s3cret", size);
  AgentOptions ao = BaseOptions(env.get(), dir.path(), peer.port());
  ao.volumes.push_back({"vol", dir.Join("vol.img"), "vol"});
  ao.budget = 16 * kMiB;
  Agent agent(ao);
  REQUIRE(agent.Start().ok());
  REQUIRE(WaitUntil([&] { return Drained(agent, 0, peer, "vol"); }));
  const std::string uri = "nbd+unix:///vol?socket=" + dir.Join("nbd.sock");

  auto info = RunCommand({"nbdinfo", "--list", "nbd+unix:///?socket=" + dir.Join("nbd.sock")}, 30000);
  INFO(info.output);
  REQUIRE(info.exit_code == 0);
  REQUIRE(info.output.find("vol") != std::string::npos);
  REQUIRE(info.output.find("67108864") != std::string::npos);

  auto io = RunCommand({"qemu-io", "-f", "raw", uri, "-c", "write -P 0xab 0 1M", "-c", "write -P 0x5c 5M 64k", "-c",
                        "write -z 2M 128k", "-c", "flush", "-c", "read -P 0xab 0 1M", "-c", "read -P 0x5c 5M 64k",
                        "-c", "read -P 0 2M 128k"},
                       60000);
  INFO(io.output);
  REQUIRE(io.exit_code == 0);
  REQUIRE(io.output.find("fail") == std::string::npos);
  REQUIRE(io.output.find("read 1048576/1048576") != std::string::npos);

  {
    std::mt19937 rng(5);
    std::ofstream out(dir.Join("src.bin"), std::ios::binary);
    std::vector<char> buf(kMiB);
    for (uint64_t i = 0; i < size / kMiB; ++i) {
      for (auto& c : buf) c = char(rng());
      out.write(buf.data(), long(buf.size()));
    }
  }
  auto in = RunCommand({"nbdcopy", dir.Join("src.bin"), uri}, 120000);
  INFO(in.output);
  REQUIRE(in.exit_code == 0);
  auto back = RunCommand({"nbdcopy", uri, dir.Join("out.bin")}, 120000);
  INFO(back.output);
  REQUIRE(back.exit_code == 0);
  REQUIRE(RunCommand({"cmp", dir.Join("src.bin"), dir.Join("out.bin")}).exit_code == 0);

  // Everything captured reaches the replica, in order.
  REQUIRE(WaitUntil([&] { return Drained(agent, 0, peer, "vol"); }, 120s));
  auto src = cdp::ReadWholeFile(env.get(), dir.Join("vol.img"));
  REQUIRE(src.ok());
  REQUIRE(peer.Image("vol") == *src);
  REQUIRE(agent.device(0)->queue().Stats().captured_bytes >= size + kMiB);

  // Control API: status and a tag.
  auto st = cdp::http::HttpRequest("127.0.0.1", agent.control_port(), "GET", "/status");
  REQUIRE(st.ok());
  REQUIRE(st->status == 200);
  auto js = boost::json::parse(st->body);
  REQUIRE(js.at("volumes").as_array().at(0).at("name").as_string() == "vol");
  auto tag = cdp::http::HttpRequest("127.0.0.1", agent.control_port(), "POST", "/v1/tag", R"({"name":"after-copy"})");
  REQUIRE(tag.ok());
  INFO(tag->body);
  REQUIRE(tag->status == 200);
  REQUIRE(WaitUntil([&] { return peer.tags("vol").size() == 1; }));
  REQUIRE(peer.tags("vol")[0].first == "after-copy");
  auto bad = cdp::http::HttpRequest("127.0.0.1", agent.control_port(), "POST", "/v1/tag", R"({"name":"../x"})");
  REQUIRE(bad.ok());
  REQUIRE(bad->status == 400);
  auto metrics = cdp::http::HttpRequest("127.0.0.1", agent.control_port(), "GET", "/metrics");
  REQUIRE(metrics.ok());
  REQUIRE(metrics->body.find("cdp_agent_captured_bytes_total{volume=\"vol\"}") != std::string::npos);

  // A client speaking garbage is dropped; the tap keeps serving the others.
  {
    boost::asio::io_context ctx;
    boost::asio::local::stream_protocol::socket s(ctx);
    s.connect(boost::asio::local::stream_protocol::endpoint(dir.Join("nbd.sock")));
    std::string junk(4096, '\xff');
    boost::system::error_code ec;
    boost::asio::write(s, boost::asio::buffer(junk), ec);
    char buf[4096];
    size_t total = 0;
    for (;;) {  // the server must close the connection (bounded by its handshake timeout)
      size_t n = s.read_some(boost::asio::buffer(buf), ec);
      if (ec) break;
      total += n;
      REQUIRE(total < (1u << 20));
    }
  }
  auto again = RunCommand({"qemu-io", "-f", "raw", uri, "-c", "read 0 4k"}, 30000);
  INFO(again.output);
  REQUIRE(again.exit_code == 0);
  agent.Stop();
}

TEST_CASE("a tag lands in every volume at one point, around the freeze hook", "[agent][tag]") {
  ScratchDir dir;
  auto env = cdp::NewMemEnv();
  const uint64_t size = 8 * kMiB;
  MakeFile(env.get(), "/v/a.img", size);
  MakeFile(env.get(), "/v/b.img", size);
  TestPeer peer("t1", "s3cret", size);
  AgentOptions ao = BaseOptions(env.get(), dir.path(), peer.port());
  ao.bitmap_dir = "/v/bm";
  ao.volumes.push_back({"a", "/v/a.img", ""});
  ao.volumes.push_back({"b", "/v/b.img", ""});
  ao.freeze_command = "touch " + dir.Join("frozen");
  ao.thaw_command = "touch " + dir.Join("thawed");
  ao.freeze_timeout_ms = 5000;
  Agent agent(ao);
  REQUIRE(agent.Start().ok());
  REQUIRE(WaitUntil([&] { return Drained(agent, 0, peer, "a") && Drained(agent, 1, peer, "b"); }));

  cdp::Bytes data(4096, 7);
  REQUIRE(agent.device(0)->Write(0, data, false).ok());
  REQUIRE(agent.device(1)->Write(4096, data, false).ok());
  auto t = agent.Tag("nightly");
  REQUIRE(t.ok());
  REQUIRE(t->seqs.size() == 2);
  REQUIRE(RunCommand({"test", "-f", dir.Join("frozen")}).exit_code == 0);
  REQUIRE(RunCommand({"test", "-f", dir.Join("thawed")}).exit_code == 0);
  REQUIRE(WaitUntil([&] { return peer.tags("a").size() == 1 && peer.tags("b").size() == 1; }));
  REQUIRE(peer.tags("a")[0] == std::make_pair(std::string("nightly"), t->seqs[0].second));
  REQUIRE(peer.tags("b")[0] == std::make_pair(std::string("nightly"), t->seqs[1].second));
  REQUIRE(agent.Tag("bad/name").status().code() == cdp::Code::kInvalidArgument);
  agent.Stop();
}

TEST_CASE("the volumes share ps_connections links, a volume with its own frame size has its own", "[agent][links]") {
  ScratchDir dir;
  auto env = cdp::NewMemEnv();
  const uint64_t size = 4 * kMiB;
  TestPeer peer("t1", "s3cret", size);
  AgentOptions ao = BaseOptions(env.get(), dir.path(), peer.port());
  ao.bitmap_dir = "/v/bm";
  ao.ps_connections = 2;
  constexpr int kVolumes = 7;
  for (int i = 0; i < kVolumes; ++i) {
    const std::string name = "v" + std::to_string(i);
    MakeFile(env.get(), "/v/" + name + ".img", size);
    ao.volumes.push_back({name, "/v/" + name + ".img", ""});
  }
  ao.volumes.back().frame_bytes = 64 * 1024;  // its own link
  Agent agent(ao);
  REQUIRE(agent.Start().ok());
  auto all_drained = [&] {
    for (int i = 0; i < kVolumes; ++i)
      if (!Drained(agent, size_t(i), peer, "v" + std::to_string(i))) return false;
    return true;
  };
  REQUIRE(WaitUntil(all_drained));
  for (int i = 0; i < kVolumes; ++i) {
    cdp::Bytes data(64 * 1024, uint8_t(i + 1));
    REQUIRE(agent.device(size_t(i))->Write(uint64_t(i) * 128 * 1024, data, false).ok());
    REQUIRE(agent.device(size_t(i))->Write(size - data.size(), data, true).ok());
  }
  REQUIRE(WaitUntil(all_drained));
  for (int i = 0; i < kVolumes; ++i) {
    const std::string name = "v" + std::to_string(i);
    auto src = cdp::ReadWholeFile(env.get(), "/v/" + name + ".img");
    REQUIRE(src.ok());
    INFO(name);
    REQUIRE(peer.Image(name) == *src);
  }
  // Two shared connections for six volumes, one for the volume with its own frame size.
  CHECK(peer.listener_stats().accepted == 3);
  CHECK(peer.listener_stats().live == 3);
  agent.Stop();
}

TEST_CASE("a failed or hung freeze hook aborts the tag and always thaws", "[agent][tag]") {
  ScratchDir dir;
  auto env = cdp::NewMemEnv();
  MakeFile(env.get(), "/v/a.img", 4 * kMiB);
  AgentOptions ao = BaseOptions(env.get(), dir.path(), 1);
  ao.sender_enabled = false;
  ao.bitmap_dir = "/v/bm";
  ao.volumes.push_back({"a", "/v/a.img", ""});
  ao.thaw_command = "touch " + dir.Join("thawed");
  ao.freeze_timeout_ms = 300;
  SECTION("failing freeze") { ao.freeze_command = "exit 3"; }
  SECTION("hung freeze") { ao.freeze_command = "sleep 30"; }
  Agent agent(ao);
  REQUIRE(agent.Start().ok());
  auto start = std::chrono::steady_clock::now();
  auto t = agent.Tag("x");
  REQUIRE(t.status().code() == cdp::Code::kAborted);
  REQUIRE(std::chrono::steady_clock::now() - start < 10s);
  REQUIRE(RunCommand({"test", "-f", dir.Join("thawed")}).exit_code == 0);
  agent.Stop();
}

TEST_CASE("a tag is refused while a volume cannot promise a consistent point", "[agent][tag]") {
  ScratchDir dir;
  auto env = cdp::NewMemEnv();
  MakeFile(env.get(), "/v/a.img", 4 * kMiB);
  AgentOptions ao = BaseOptions(env.get(), dir.path(), 1);
  ao.sender_enabled = false;  // the initial sync never runs: every region awaits a resync
  ao.bitmap_dir = "/v/bm";
  ao.volumes.push_back({"a", "/v/a.img", ""});
  Agent agent(ao);
  REQUIRE(agent.Start().ok());
  REQUIRE(agent.Tag("x").status().code() == cdp::Code::kBusy);
  // No recovery point is recorded either.
  REQUIRE(agent.device(0)->Flush().ok());
  REQUIRE(agent.device(0)->queue().Stats().flushes_suppressed == 1);
  agent.Stop();
}

TEST_CASE("the tap rejects out-of-range requests without side effects", "[agent][device]") {
  ScratchDir dir;
  auto env = cdp::NewMemEnv();
  MakeFile(env.get(), "/v/a.img", 4 * kMiB);
  cdp::agent::CaptureDevice::Options o;
  o.volume = "a";
  o.env = env.get();
  o.clock = cdp::SystemClock::Get();
  o.backing_path = "/v/a.img";
  o.bitmap_path = "/v/a.bitmap";
  auto dev = std::move(*cdp::agent::CaptureDevice::Open(o));
  cdp::Bytes data(4096, 1);
  REQUIRE(dev->Write(4 * kMiB - 2048, data, false).code() == cdp::Code::kOutOfRange);
  REQUIRE(dev->Write(UINT64_MAX - 100, data, false).code() == cdp::Code::kOutOfRange);
  REQUIRE(dev->WriteZeroes(4 * kMiB, 1, false, true).code() == cdp::Code::kOutOfRange);
  REQUIRE(dev->Trim(UINT64_MAX, 2, false).code() == cdp::Code::kOutOfRange);
  uint8_t buf[16];
  REQUIRE(dev->Read(4 * kMiB - 8, 16, buf).code() == cdp::Code::kOutOfRange);
  REQUIRE(dev->queue().Stats().captured_ops == 0);
  o.volume = "../evil";
  REQUIRE(cdp::agent::CaptureDevice::Open(o).status().code() == cdp::Code::kInvalidArgument);
  // Trim and zero-writes read back as zeros and are captured as such.
  REQUIRE(dev->Write(0, data, false).ok());
  REQUIRE(dev->Trim(0, 2048, false).ok());
  REQUIRE(dev->WriteZeroes(2048, 1024, false, false).ok());
  REQUIRE(dev->Read(0, 16, buf).ok());
  REQUIRE(buf[0] == 0);
  REQUIRE(dev->queue().Stats().captured_ops == 3);
}

// SPDX-License-Identifier: Apache-2.0
// End-to-end replication: real daemons, real NBD clients, cdpctl.
//   invariant 3 (replica == source after catch-up), 2 and 4 (every tag point
//   reproduces the source at that point, by export and by rollback), 1 and 6
//   (kill -9 of each daemon mid-stream loses nothing, duplicates nothing);
//   crash-consistent points for a writer that never flushes (issue #43).
#include <catch2/catch.hpp>

#include <fstream>

#include <atomic>
#include <boost/json.hpp>
#include <chrono>
#include <cstring>
#include <thread>

#include "common/nbd/nbd_client.h"
#include "e2e/harness.h"

namespace {

using cdp::e2e::Cluster;
using cdp::e2e::ClusterOptions;
using cdp::e2e::GetJson;
using cdp::e2e::RandomWrites;
using cdp::e2e::Sha256File;
using cdp::e2e::WaitFor;
using cdp::e2e::Which;
using cdp::testing::HaveProgram;
namespace json = boost::json;

void RequireClients() {
  for (const char* p : {"qemu-io", "nbdcopy", "sha256sum"}) {
    INFO("missing program " << p << " (scripts/install-deps.sh installs it)");
    REQUIRE(HaveProgram(p));
  }
}

uint64_t MtApplied(Cluster& c) {
  auto s = c.StatusOf(Which::kMasterTarget);
  if (!s) return 0;
  for (const auto& v : s->at("volumes").as_array()) {
    if (v.as_object().at("volume").as_string() == c.options().volume) return json::value_to<uint64_t>(v.at("applied_seq"));
  }
  return 0;
}

}  // namespace

TEST_CASE("random writes through qemu-io and nbdcopy reach the replica byte for byte", "[e2e][replication]") {
  RequireClients();
  Cluster c;
  INFO(c.why());
  REQUIRE(c.Start());
  std::string w = RandomWrites(c.nbd_uri(), c.options().volume_size, 1, 4, 40, 4 << 20, c.dir());
  INFO(w);
  REQUIRE(w.empty());
  bool drained = c.WaitDrained();
  INFO(c.why());
  REQUIRE(drained);
  const std::string src = Sha256File(c.source_path());
  REQUIRE(src.size() == 64);
  REQUIRE(Sha256File(c.replica_path()) == src);
  // The writes really went somewhere: the source is no longer all zeroes.
  cdp::testing::ScratchDir zero;
  REQUIRE(cdp::e2e::MakeSparseFile(zero.Join("z"), c.options().volume_size));
  REQUIRE(Sha256File(zero.Join("z")) != src);

  // cdpctl status names the volume in all three daemons and exits 0.
  auto st = c.Cdpctl({"status"});
  INFO(st.output);
  REQUIRE(st.exit_code == 0);
  REQUIRE(st.output.find("unreachable") == std::string::npos);
  auto js = c.CdpctlJson({"status"});
  REQUIRE(js.has_value());
  REQUIRE(js->at("agent").at("volumes").as_array().size() == 1);
  REQUIRE(js->at("master_target").at("volumes").at(0).at("applied_seq") ==
          js->at("agent").at("volumes").at(0).at("acked_seq"));

  // cdpctl verify: identical after catch-up; a byte rotted behind the master
  // target's back in region 5 is found, and only its 4 KiB block is listed.
  auto same = c.Cdpctl({"verify", c.options().volume});
  INFO(same.output);
  REQUIRE(same.exit_code == 0);
  REQUIRE(same.output.find("identical") != std::string::npos);
  {
    std::fstream replica(c.replica_path(), std::ios::in | std::ios::out | std::ios::binary);
    REQUIRE(replica.good());
    replica.seekg(std::streamoff(5) << 20);
    char b = 0;
    replica.read(&b, 1);
    b = char(b ^ 0x40);
    replica.seekp(std::streamoff(5) << 20);
    replica.write(&b, 1);
    REQUIRE(replica.good());
  }
  auto differ = c.CdpctlJson({"verify", c.options().volume});
  REQUIRE_FALSE(differ.has_value());  // exit code 1: regions differ
  auto text = c.Cdpctl({"verify", c.options().volume});
  INFO(text.output);
  REQUIRE(text.exit_code == 1);
  REQUIRE(text.output.find(c.options().volume + " 5242880 4096\n") != std::string::npos);
  REQUIRE(text.output.find("1 difference(s)") != std::string::npos);
}

TEST_CASE("every tag point exports, and rolls back to, the source as it was at the tag", "[e2e][points]") {
  RequireClients();
  Cluster c;
  INFO(c.why());
  REQUIRE(c.Start());
  const int kTags = 3;
  std::vector<std::string> copies, tags;
  for (int i = 0; i < kTags; ++i) {
    std::string w = RandomWrites(c.nbd_uri(), c.options().volume_size, 100 + i, 2, 30, i == 0 ? (2 << 20) : 0, c.dir());
    INFO(w);
    REQUIRE(w.empty());
    // The writer is paused (qemu-io and nbdcopy have exited, every write
    // acknowledged): the source file is the image at this point.
    std::string copy = c.Path("copy-" + std::to_string(i) + ".img");
    REQUIRE(cdp::e2e::CopyFile(c.source_path(), copy));
    std::string tag = "t" + std::to_string(i);
    auto t = c.Cdpctl({"tag", tag});
    INFO(t.output);
    REQUIRE(t.exit_code == 0);
    copies.push_back(copy);
    tags.push_back(tag);
  }
  // Writes after the last tag, which no tag point may contain.
  std::string w = RandomWrites(c.nbd_uri(), c.options().volume_size, 200, 2, 30, 0, c.dir());
  INFO(w);
  REQUIRE(w.empty());
  bool drained = c.WaitDrained();
  INFO(c.why());
  REQUIRE(drained);
  REQUIRE(Sha256File(c.replica_path()) == Sha256File(c.source_path()));

  auto pts = c.Cdpctl({"points", c.options().volume});
  INFO(pts.output);
  REQUIRE(pts.exit_code == 0);
  std::vector<int64_t> ids;
  for (int i = 0; i < kTags; ++i) {
    int64_t id = c.TagPointId(tags[i]);
    INFO(c.why());
    REQUIRE(id >= 0);
    ids.push_back(id);
    std::string out = c.Path("export-" + std::to_string(i) + ".img");
    bool copied = c.CopyExport(std::to_string(id), out);
    INFO(c.why());
    REQUIRE(copied);
    INFO("tag " << tags[i]);
    REQUIRE(Sha256File(out) == Sha256File(copies[i]));
    ::unlink(out.c_str());
  }
  // The tag points differ from each other (the test would be vacuous otherwise).
  REQUIRE(Sha256File(copies[0]) != Sha256File(copies[1]));
  REQUIRE(Sha256File(copies[1]) != Sha256File(copies[2]));

  // Fail over: roll the replica back to the middle tag.
  auto rb = c.Cdpctl({"rollback", c.options().volume, "--to", std::to_string(ids[1])});
  INFO(rb.output);
  REQUIRE(rb.exit_code == 0);
  REQUIRE(Sha256File(c.replica_path()) == Sha256File(copies[1]));
}

TEST_CASE("kill -9 of each daemon mid-stream, restart: replica still equals source", "[e2e][crash]") {
  RequireClients();
  Cluster c;
  INFO(c.why());
  REQUIRE(c.Start());
  const uint64_t size = c.options().volume_size;

  // Master target and process server die while a writer is running; the
  // application never notices (the agent queues and resends).
  uint32_t seed = 300;
  for (Which w : {Which::kMasterTarget, Which::kProcessServer}) {
    INFO("killing " << cdp::e2e::Name(w));
    const uint64_t before = c.AgentU64("captured_ops");
    std::string err;
    std::atomic<bool> done{false};
    std::thread writer([&] {
      err = RandomWrites(c.nbd_uri(), size, seed++, 6, 30, 2 << 20, c.dir());
      done = true;
    });
    // Mid-stream: the agent has captured new writes (and, for the MT, the MT
    // has applied something) before the kill.
    bool started = WaitFor(
        [&] { return c.AgentU64("captured_ops") > before + 20 && (w != Which::kMasterTarget || MtApplied(c) > 0); },
        std::chrono::seconds(60));
    const bool writer_running = !done;
    const uint64_t lag = c.AgentU64("next_seq") - 1 - MtApplied(c);
    bool killed = started && c.Kill9(w);
    bool restarted = killed && c.Restart(w);
    writer.join();
    // How "mid" the kill was, for the log of a failing run.
    WARN(cdp::e2e::Name(w) << " killed with the writer " << (writer_running ? "running" : "finished") << ", "
                           << lag << " records not yet applied at the MT");
    INFO(c.why());
    REQUIRE(started);
    REQUIRE(killed);
    REQUIRE(restarted);
    INFO(err);
    REQUIRE(err.empty());
  }

  // The agent dies under its writer: the writer's connection breaks (its
  // failure is expected); the restarted agent resyncs the dirty regions.
  {
    const uint64_t before = c.AgentU64("captured_ops");
    std::thread writer([&] { (void)RandomWrites(c.nbd_uri(), size, 400, 6, 30, 2 << 20, c.dir()); });
    bool started = WaitFor([&] { return c.AgentU64("captured_ops") > before + 20; }, std::chrono::seconds(60));
    bool killed = started && c.Kill9(Which::kAgent);
    writer.join();
    bool restarted = killed && c.Restart(Which::kAgent);
    INFO(c.why());
    REQUIRE(started);
    REQUIRE(killed);
    REQUIRE(restarted);
  }
  // The pipeline still carries new writes after all three crashes.
  std::string w = RandomWrites(c.nbd_uri(), size, 500, 2, 30, 1 << 20, c.dir());
  INFO(w);
  REQUIRE(w.empty());
  bool drained = c.WaitDrained(std::chrono::seconds(120));
  INFO(c.why());
  REQUIRE(drained);
  REQUIRE(Sha256File(c.replica_path()) == Sha256File(c.source_path()));
}

namespace {

// The writer without flushes: write i puts the 4 KiB block i * 37 % kBlocks
// (kBlocks a power of two: every block, then again) holding i in each of its
// 512 eight-byte words. Its own journal is the formula.
constexpr uint64_t kBlocks = 256;
uint64_t BlockOf(uint64_t i) { return i * 37 % kBlocks; }
void FillBlock(uint64_t i, uint8_t* b) {
  for (size_t w = 0; w < 4096; w += 8) std::memcpy(b + w, &i, 8);
}

}  // namespace

TEST_CASE("a writer that never flushes gets a crash-consistent point every point_interval, each the source as of "
          "its sequence",
          "[e2e][points]") {
  Cluster c;  // point_interval 1s, TLS
  INFO(c.why());
  REQUIRE(c.Start());
  auto uri = cdp::ParseNbdUri(c.nbd_uri());
  REQUIRE(uri.ok());
  cdp::NbdClientOptions no;
  no.max_inflight = 1;  // each write completes before the next is sent: its order is the stream's
  auto client = cdp::NbdClient::Connect(*uri, no);
  REQUIRE(client.ok());
  // Writes 1.. for 4.5 s of the host's clock, 20 per 10 ms at most (the
  // writer's pace, not a synchronisation), and not one flush.
  const auto start = std::chrono::steady_clock::now();
  uint64_t n = 0;
  cdp::Bytes buf(4096);
  while (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(4500)) {
    ++n;
    FillBlock(n, buf.data());
    cdp::Status s = (*client)->Write(BlockOf(n) * 4096, cdp::ByteSpan(buf.data(), buf.size()));
    if (s.ok()) s = (*client)->Drain();
    INFO(s.ToString());
    REQUIRE(s.ok());
    if (n % 20 == 0) std::this_thread::sleep_until(start + std::chrono::milliseconds(n / 2));
  }
  bool drained = c.WaitDrained();
  INFO(c.why());
  REQUIRE(drained);

  auto pts = c.CdpctlJson({"points", c.options().volume});
  REQUIRE(pts.has_value());
  INFO(boost::json::serialize(*pts));
  struct Point {
    int64_t id;
    uint64_t seq;
  };
  std::vector<Point> crash;
  for (const auto& v : pts->at("points").as_array()) {
    const auto& o = v.as_object();
    if (o.at("kind").as_string() == "crash-consistent")
      crash.push_back({boost::json::value_to<int64_t>(o.at("id")), boost::json::value_to<uint64_t>(o.at("seq"))});
  }
  // One a second of the 4.5 s at least (the first write makes one).
  REQUIRE(crash.size() >= 4);
  uint64_t last_counter = 0, last_seq = 0;
  for (const Point& p : crash) {
    INFO("point " << p.id << " at sequence " << p.seq);
    const std::string out = c.Path("point.img");
    bool copied = c.CopyExport(std::to_string(p.id), out);
    INFO(c.why());
    REQUIRE(copied);
    std::ifstream in(out, std::ios::binary);
    std::vector<uint8_t> img(kBlocks * 4096);
    REQUIRE(in.read(reinterpret_cast<char*>(img.data()), std::streamsize(img.size())));
    // The newest write in the image, then: the image is writes 1..m exactly
    // (each block the last write of it up to m, or zeros).
    uint64_t m = 0;
    for (uint64_t b = 0; b < kBlocks; ++b) {
      uint64_t x = 0;
      std::memcpy(&x, img.data() + b * 4096, 8);
      m = std::max(m, x);
    }
    REQUIRE(m > 0);
    REQUIRE(m <= n);
    std::vector<uint8_t> want(kBlocks * 4096, 0);
    for (uint64_t i = m > kBlocks ? m - kBlocks + 1 : 1; i <= m; ++i) FillBlock(i, want.data() + BlockOf(i) * 4096);
    REQUIRE(img == want);
    // One record per write and nothing else in the stream: the points are
    // as far apart in sequence as in the writer's journal.
    if (last_seq != 0) REQUIRE(p.seq - last_seq == m - last_counter);
    REQUIRE(m > last_counter);
    last_counter = m;
    last_seq = p.seq;
    ::unlink(out.c_str());
  }
}

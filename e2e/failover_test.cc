// SPDX-License-Identifier: Apache-2.0
// End-to-end failover (issue 14, first slice): real daemons over TLS, cdpctl,
// real NBD clients.
//   - the promoted point is a persistent read-write export: written with
//     nbdcopy, the master target killed with SIGKILL and restarted, served
//     again with the written bytes; the replica is never touched;
//   - issue test 4: the fenced old primary, reconnecting, gets "failed over"
//     and nothing of it is applied;
//   - issue test 5: failover --undo before a commit: replication resumes and
//     the replica equals the source byte for byte.
#include <catch2/catch.hpp>

#include <boost/json.hpp>
#include <fstream>

#include "common/base/coding.h"
#include "e2e/harness.h"

namespace {

using cdp::e2e::Cluster;
using cdp::e2e::RandomWrites;
using cdp::e2e::Sha256File;
using cdp::e2e::WaitFor;
using cdp::e2e::Which;
using cdp::testing::HaveProgram;
using cdp::testing::RunCommand;
namespace json = boost::json;
using namespace std::chrono_literals;

void RequireClients() {
  for (const char* p : {"qemu-io", "nbdcopy", "sha256sum"}) {
    INFO("missing program " << p << " (scripts/install-deps.sh installs it)");
    REQUIRE(HaveProgram(p));
  }
}

// The test volume's object in a daemon's /status ("volume" at the MT and the
// PS, "name" at the agent); null when not answered.
std::optional<json::object> VolumeStatus(Cluster& c, Which w) {
  auto s = c.StatusOf(w);
  if (!s) return std::nullopt;
  const char* key = w == Which::kAgent ? "name" : "volume";
  for (const auto& v : s->at("volumes").as_array()) {
    if (v.as_object().at(key).as_string() == c.options().volume) return v.as_object();
  }
  return std::nullopt;
}

std::string Text(const json::object& o, const char* key) {
  const json::value* v = o.if_contains(key);
  return v && v->is_string() ? std::string(v->as_string()) : "";
}

uint64_t MtApplied(Cluster& c) {
  auto v = VolumeStatus(c, Which::kMasterTarget);
  return v ? json::value_to<uint64_t>(v->at("applied_seq")) : 0;
}

// Overwrites `len` bytes at `off` of a file with `fill`.
void Patch(const std::string& path, uint64_t off, uint64_t len, char fill) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f.good());
  f.seekp(std::streamoff(off));
  std::string b(len, fill);
  f.write(b.data(), std::streamsize(len));
  REQUIRE(f.good());
}

}  // namespace

TEST_CASE("failover: the promoted point is a read-write export that survives kill -9 of the master target",
          "[e2e][failover]") {
  RequireClients();
  Cluster c;
  INFO(c.why());
  REQUIRE(c.Start());
  const std::string vol = c.options().volume;
  std::string w = RandomWrites(c.nbd_uri(), c.options().volume_size, 11, 2, 30, 2 << 20, c.dir());
  INFO(w);
  REQUIRE(w.empty());
  const std::string at_tag = c.Path("at-tag.img");
  REQUIRE(cdp::e2e::CopyFile(c.source_path(), at_tag));
  REQUIRE(c.Cdpctl({"tag", "t1"}).exit_code == 0);
  w = RandomWrites(c.nbd_uri(), c.options().volume_size, 12, 2, 30, 0, c.dir());
  INFO(w);
  REQUIRE(w.empty());
  bool drained = c.WaitDrained();
  INFO(c.why());
  REQUIRE(drained);
  const std::string replica_sha = Sha256File(c.replica_path());
  REQUIRE(replica_sha == Sha256File(c.source_path()));
  REQUIRE(replica_sha != Sha256File(at_tag));
  const int64_t point = c.TagPointId("t1");
  REQUIRE(point > 0);

  // --test: today's throw-away copy-on-write export; nothing changes for replication.
  auto t = c.Cdpctl({"failover", vol, "--to", "t1", "--test"});
  INFO(t.output);
  REQUIRE(t.exit_code == 0);
  const std::string test_name = "acme/" + vol + "@";
  CHECK(t.output.find("nbds://") == 0);
  CHECK(t.output.find("writable overlay discarded at unexport") != std::string::npos);
  auto tv = VolumeStatus(c, Which::kMasterTarget);
  REQUIRE(tv);
  CHECK(Text(*tv, "state") == "protecting");
  const size_t at = t.output.find(test_name);
  REQUIRE(at != std::string::npos);
  const std::string test_export = t.output.substr(at, t.output.find(' ', at) - at);
  REQUIRE(test_export.size() > 3);
  CHECK(test_export.compare(test_export.size() - 3, 3, "-rw") == 0);
  auto ux = c.Cdpctl({"unexport", test_export});
  INFO(ux.output);
  REQUIRE(ux.exit_code == 0);

  // Fail over to the tag, by name.
  auto f = c.Cdpctl({"failover", vol, "--to", "t1"});
  INFO(f.output);
  REQUIRE(f.exit_code == 0);
  CHECK(f.output.find("volume " + vol + " failed over to point " + std::to_string(point) + " (sequence ") == 0);
  CHECK(f.output.find("/acme/" + vol + "@failover (persistent; survives a restart of the master target)") !=
        std::string::npos);
  // Idempotent; a conflicting point is a clear error.
  auto again = c.Cdpctl({"failover", vol, "--to", std::to_string(point)});
  INFO(again.output);
  REQUIRE(again.exit_code == 0);
  CHECK(again.output.find("is already failed over to point " + std::to_string(point)) != std::string::npos);
  CHECK(again.output.find("nothing changed") != std::string::npos);
  auto other = c.Cdpctl({"failover", vol, "--to", "seq:1"});
  INFO(other.output);
  REQUIRE(other.exit_code == 1);
  CHECK(other.output.find("is already failed over at sequence") != std::string::npos);
  auto mv = VolumeStatus(c, Which::kMasterTarget);
  REQUIRE(mv);
  CHECK(Text(*mv, "state") == "failed-over");
  REQUIRE(mv->at("failover").is_object());
  CHECK(json::value_to<int64_t>(mv->at("failover").at("point")) == point);
  CHECK(mv->at("failover").at("committed").as_bool() == false);
  CHECK(mv->at("failover").at("served").as_bool() == true);

  // The export reads as the source did at the tag.
  const std::string uri = c.mt_export_uri("acme/" + vol + "@failover");
  const std::string read1 = c.Path("read1.img");
  auto cp = RunCommand({"nbdcopy", uri, read1}, 120000);
  INFO(cp.output);
  REQUIRE(cp.exit_code == 0);
  REQUIRE(Sha256File(read1) == Sha256File(at_tag));

  // The recovered workload writes at the provider (a real NBD client), flushes.
  const std::string provider = c.Path("provider.img");
  REQUIRE(cdp::e2e::CopyFile(at_tag, provider));
  Patch(provider, 0, 4096, 'P');
  Patch(provider, (5 << 20) + 100, 70000, 'Q');
  Patch(provider, c.options().volume_size - 8192, 8192, 'R');
  cp = RunCommand({"nbdcopy", "--flush", provider, uri}, 120000);
  INFO(cp.output);
  REQUIRE(cp.exit_code == 0);

  // kill -9 of the master target, and a restart: the export is served again
  // with every flushed byte; the replica never saw any of it.
  REQUIRE(c.Kill9(Which::kMasterTarget));
  REQUIRE(c.Restart(Which::kMasterTarget));
  bool served = WaitFor(
      [&] {
        auto v = VolumeStatus(c, Which::kMasterTarget);
        return v && v->at("failover").is_object() && v->at("failover").at("served").as_bool();
      },
      60s);
  INFO(c.Logs());
  REQUIRE(served);
  const std::string read2 = c.Path("read2.img");
  cp = RunCommand({"nbdcopy", uri, read2}, 120000);
  INFO(cp.output);
  REQUIRE(cp.exit_code == 0);
  CHECK(Sha256File(read2) == Sha256File(provider));
  CHECK(Sha256File(c.replica_path()) == replica_sha);
  auto st = c.Cdpctl({"status"});
  INFO(st.output);
  CHECK(st.output.find("failed-over") != std::string::npos);
  CHECK(st.output.find("failed over to point " + std::to_string(point)) != std::string::npos);

  // The point is pinned by the failover: unexport of its export is refused.
  auto un = c.Cdpctl({"unexport", "acme/" + vol + "@failover"});
  CHECK(un.exit_code == 1);
  CHECK(un.output.find("failover " + vol + " --undo removes it") != std::string::npos);

  // Commit: final; undo is refused with a clear error; commit again is a no-op.
  auto cm = c.Cdpctl({"failover", vol, "--commit"});
  INFO(cm.output);
  REQUIRE(cm.exit_code == 0);
  CHECK(cm.output.find(") committed; undo is refused from now on") != std::string::npos);
  cm = c.Cdpctl({"failover", vol, "--commit"});
  REQUIRE(cm.exit_code == 0);
  CHECK(cm.output.find("was committed already") != std::string::npos);
  auto undo = c.Cdpctl({"failover", vol, "--undo"});
  INFO(undo.output);
  REQUIRE(undo.exit_code == 1);
  CHECK(undo.output.find("is committed; undo is refused") != std::string::npos);
}

namespace {

// Writes (RandomWrites `seed`, two passes of `count`, `flush_every`), the
// tag t1, a drain, and a failover of the volume to t1.
void FailOverAfterWrites(Cluster& c, uint32_t seed, int count, uint64_t flush_every) {
  std::string w = RandomWrites(c.nbd_uri(), c.options().volume_size, seed, 2, count, flush_every, c.dir());
  INFO(w);
  REQUIRE(w.empty());
  REQUIRE(c.Cdpctl({"tag", "t1"}).exit_code == 0);
  bool drained = c.WaitDrained();
  INFO(c.why());
  REQUIRE(drained);
  auto f = c.Cdpctl({"failover", c.options().volume, "--to", "t1"});
  INFO(f.output);
  REQUIRE(f.exit_code == 0);
}

}  // namespace

TEST_CASE("failover fences the old primary, and undo before a commit resumes replication to a byte-identical replica",
          "[e2e][failover]") {
  RequireClients();
  Cluster c;
  INFO(c.why());
  REQUIRE(c.Start());
  const std::string vol = c.options().volume;
  FailOverAfterWrites(c, 21, 30, 2 << 20);
  const uint64_t applied = MtApplied(c);
  REQUIRE(applied > 0);
  const std::string replica_sha = Sha256File(c.replica_path());

  // The old primary keeps writing: its stream is refused as failed over.
  std::string w = RandomWrites(c.nbd_uri(), c.options().volume_size, 22, 2, 30, 1 << 20, c.dir());
  INFO(w);
  REQUIRE(w.empty());
  auto fenced = [&] {
    auto a = VolumeStatus(c, Which::kAgent);
    return a && Text(*a, "fenced").rfind("failed over: volume " + vol + " failed over at the master target", 0) == 0;
  };
  bool got = WaitFor(fenced, 60s);
  INFO(c.Logs());
  REQUIRE(got);
  auto pv = VolumeStatus(c, Which::kProcessServer);
  REQUIRE(pv);
  CHECK(Text(*pv, "fenced").rfind("failed over", 0) == 0);
  CHECK(MtApplied(c) == applied);
  CHECK(Sha256File(c.replica_path()) == replica_sha);
  auto st = c.Cdpctl({"status"});
  INFO(st.output);
  CHECK(st.output.find("FENCED: failed over") != std::string::npos);

  // Issue test 4: the old primary reconnects (restarted): still refused,
  // nothing applied, and it says so in /status.
  REQUIRE(c.Kill9(Which::kAgent));
  REQUIRE(c.Restart(Which::kAgent));
  got = WaitFor(fenced, 60s);
  INFO(c.Logs());
  REQUIRE(got);
  w = RandomWrites(c.nbd_uri(), c.options().volume_size, 23, 1, 20, 0, c.dir());
  INFO(w);
  REQUIRE(w.empty());
  // The refusal of the restarted agent's writes is seen before we look again.
  got = WaitFor([&] { return fenced() && c.AgentU64("queue_records") > 0; }, 60s);
  REQUIRE(got);
  CHECK(MtApplied(c) == applied);
  CHECK(Sha256File(c.replica_path()) == replica_sha);

  // Issue test 5: undo before a commit. Replication resumes as it was, and the
  // replica equals the source byte for byte.
  auto undo = c.Cdpctl({"failover", vol, "--undo"});
  INFO(undo.output);
  REQUIRE(undo.exit_code == 0);
  CHECK(undo.output.find("volume " + vol + ": failover undone; protecting again from sequence") == 0);
  auto again = c.Cdpctl({"failover", vol, "--undo"});
  REQUIRE(again.exit_code == 0);
  CHECK(again.output == "volume " + vol + " is protecting; nothing to undo\n");
  bool drained = c.WaitDrained(std::chrono::seconds(120));
  INFO(c.why());
  REQUIRE(drained);
  CHECK(Sha256File(c.replica_path()) == Sha256File(c.source_path()));
  CHECK(MtApplied(c) > applied);
  auto mv = VolumeStatus(c, Which::kMasterTarget);
  REQUIRE(mv);
  CHECK(Text(*mv, "state") == "protecting");
  CHECK(mv->at("failover").is_null());
  auto a = VolumeStatus(c, Which::kAgent);
  REQUIRE(a);
  CHECK(Text(*a, "fenced").empty());
}

// Issue 38 F1: after a failover, the original site's PS restarts (and its
// agent with an empty queue). The PS answered the agent's open in the
// instant before it recorded the MT's fence, and the agent never showed
// FENCED. Twenty rounds; every one must end with the agent fenced.
TEST_CASE("failover: twenty restarts of the old site's process server and agent each end with the agent FENCED",
          "[e2e][failover]") {
  RequireClients();
  Cluster c;
  INFO(c.why());
  REQUIRE(c.Start());
  const std::string vol = c.options().volume;
  FailOverAfterWrites(c, 31, 20, 1 << 20);
  const std::string prefix = "failed over: volume " + vol + " failed over at the master target";
  auto fenced = [&] {
    auto a = VolumeStatus(c, Which::kAgent);
    return a && Text(*a, "fenced").rfind(prefix, 0) == 0;
  };
  REQUIRE(WaitFor(fenced, 60s));
  // Issue 38 F2: the PS's cursor reaches copies.meta within a second of the
  // last acknowledgement; from then on a restart shows the true backlog (0)
  // although the MT, fencing the volume, never answers its open again.
  auto ps_u64 = [&](const char* key) -> int64_t {
    auto v = VolumeStatus(c, Which::kProcessServer);
    return v ? int64_t(json::value_to<uint64_t>(v->at(key))) : -1;
  };
  const std::string copies = c.Path("ps/spool/" + c.options().tenant + "/" + vol + "/copies.meta");
  auto persisted = [&]() -> int64_t {
    std::ifstream f(copies, std::ios::binary);
    std::string b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    // docs/formats/spool.md: magic, version, count, then per copy name_len,
    // name, acked; a crc. One copy here.
    const auto* d = reinterpret_cast<const uint8_t*>(b.data());
    if (b.size() < 28 || cdp::DecodeFixed32(d + 8) != 1) return -1;
    const size_t name_len = cdp::DecodeFixed32(d + 12);
    if (b.size() != 16 + name_len + 8 + 4) return -1;
    return int64_t(cdp::DecodeFixed64(d + 16 + name_len));
  };
  REQUIRE(WaitFor([&] { return ps_u64("backlog_records") == 0 && persisted() == ps_u64("mt_acked_seq"); }, 30s));
  REQUIRE(persisted() > 0);
  int rounds_fenced = 0;
  for (int round = 0; round < 20; ++round) {
    INFO("round " << round);
    REQUIRE(c.Kill9(Which::kProcessServer));
    REQUIRE(c.Kill9(Which::kAgent));
    REQUIRE(c.Restart(Which::kProcessServer));
    REQUIRE(c.Restart(Which::kAgent));
    bool got = WaitFor(fenced, 30s);
    if (!got) {
      INFO(c.Logs());
      CHECK(got);
      break;
    }
    CHECK(c.AgentU64("queue_records") == 0);  // nothing queued: only the open can tell it
    CHECK(ps_u64("backlog_records") == 0);     // the true backlog after a restart
    ++rounds_fenced;
  }
  CHECK(rounds_fenced == 20);
  auto st = c.Cdpctl({"status"});
  INFO(st.output);
  CHECK(st.output.find("FENCED: failed over") != std::string::npos);
}

// SPDX-License-Identifier: Apache-2.0
// End-to-end resync: the agent is killed with kill -9 in the middle of a
// full resync and resumes where it was; the replica ends equal to the source.
#include <catch2/catch.hpp>

#include <algorithm>

#include <boost/json.hpp>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>

#include "e2e/harness.h"

namespace {

using cdp::e2e::Cluster;
using cdp::e2e::ClusterOptions;
using cdp::e2e::Sha256File;
using cdp::e2e::WaitFor;
using cdp::e2e::Which;

}  // namespace

TEST_CASE("kill -9 of the agent during a resync: it resumes from its cursor and the replica equals the source",
          "[e2e][resync][crash]") {
  const uint64_t size = 256ull << 20;
  ClusterOptions o;
  o.volume_size = size;
  // Slow enough to be killed in the middle.
  o.agent_extra_config = "resync_max_rate = 32MiB\n";
  Cluster c(o);
  INFO(c.why());
  REQUIRE(c.Start());
  // Behind the agent's back: the source gets new content and the bitmap goes,
  // so the agent must compare everything when it starts again.
  REQUIRE(c.Kill9(Which::kAgent));
  {
    std::mt19937_64 rng(77);
    std::ofstream f(c.source_path(), std::ios::binary | std::ios::in | std::ios::out);
    std::vector<uint64_t> buf((1u << 20) / 8);
    for (uint64_t off = 0; off < size; off += 1u << 20) {
      for (auto& x : buf) x = rng();
      f.write(reinterpret_cast<const char*>(buf.data()), std::streamsize(buf.size() * 8));
    }
    REQUIRE(f.good());
  }
  REQUIRE(std::filesystem::remove(c.Path("agent/" + o.volume + ".bitmap")));
  REQUIRE(c.Restart(Which::kAgent));
  REQUIRE(WaitFor([&] { return c.AgentU64("resync_total_bytes") == size; }, std::chrono::seconds(30)));
  // A third done, then kill -9.
  REQUIRE(WaitFor([&] { return c.AgentU64("resync_done_bytes") >= size / 3; }, std::chrono::seconds(60)));
  REQUIRE(c.Kill9(Which::kAgent));
  REQUIRE(c.Restart(Which::kAgent));
  // The restarted agent compares only what was not finished and cleared before the kill.
  uint64_t total = 0;
  REQUIRE(WaitFor([&] { return (total = c.AgentU64("resync_total_bytes")) > 0 || c.AgentU64("resync_remaining") == 0; },
                  std::chrono::seconds(30)));
  INFO("bytes compared after the restart: " << total << " of " << size);
  CHECK(total < size);
  bool drained = c.WaitDrained(std::chrono::seconds(120));
  INFO(c.why());
  REQUIRE(drained);
  REQUIRE(Sha256File(c.replica_path()) == Sha256File(c.source_path()));
}

namespace {

// The volume `name` in a daemon's volume list (`key` holds the name), or nullopt.
std::optional<boost::json::object> VolumeIn(const std::optional<boost::json::value>& status, const char* key,
                                            const std::string& name) {
  if (!status) return std::nullopt;
  for (const auto& v : status->at("volumes").as_array()) {
    if (v.as_object().at(key).as_string() == name) return v.as_object();
  }
  return std::nullopt;
}

// Random writes through the cluster's NBD export (cdp::e2e::RandomWrites with
// this seed, rounds, writes per round and nbdcopy bytes); they succeed.
void Write(Cluster& c, uint32_t seed, int rounds, int writes, uint64_t nbdcopy_bytes) {
  const std::string w =
      cdp::e2e::RandomWrites(c.nbd_uri(), c.options().volume_size, seed, rounds, writes, nbdcopy_bytes, c.dir());
  INFO(w);
  REQUIRE(w.empty());
}

// Waits (30 s at most) until the string `field` of volume `name` in daemon
// `w`'s status (the volume named by `key`) contains one of `texts`; its last
// value.
std::string WaitFieldContains(Cluster& c, Which w, const char* key, const std::string& name, const char* field,
                              const std::vector<std::string>& texts) {
  std::string value;
  const bool found = WaitFor(
      [&] {
        std::optional<boost::json::object> v = VolumeIn(c.StatusOf(w), key, name);
        if (v) value = std::string(v->at(field).as_string());
        return std::any_of(texts.begin(), texts.end(),
                           [&](const std::string& t) { return value.find(t) != std::string::npos; });
      },
      std::chrono::seconds(30));
  INFO(field << ": " << value);
  REQUIRE(found);
  return value;
}

// Waits (30 s at most) until `cdpctl status` prints `text` (the error shows
// once the daemon met it, which may take a round of reconnecting).
void WaitStatusShows(Cluster& c, const std::string& text) {
  std::string out;
  const bool shown = WaitFor(
      [&] {
        out = c.Cdpctl({"status"}).output;
        return out.find(text) != std::string::npos;
      },
      std::chrono::seconds(30));
  INFO(out);
  REQUIRE(shown);
}

// Writes (RandomWrites, `seed`) while the MT is down, and waits until the
// PS acknowledged every record and the agent's bitmap cleared their
// regions: a backlog held only in the PS's spool.
void BacklogAtPs(Cluster& c, uint32_t seed) {
  REQUIRE(c.Kill9(Which::kMasterTarget));
  Write(c, seed, 4, 40, 1 << 20);
  REQUIRE(WaitFor([&] { return c.AgentU64("acked_seq") + 1 == c.AgentU64("next_seq") && c.AgentU64("dirty_regions") == 0; },
                  std::chrono::seconds(60)));
}

// Waits until the cluster drained, then: replica == source.
void DrainedEqual(Cluster& c) {
  const bool drained = c.WaitDrained();
  INFO(c.why());
  REQUIRE(drained);
  CHECK(Sha256File(c.replica_path()) == Sha256File(c.source_path()));
}

// A site outage: everything stops (the agent cleanly, the MT and the PS
// with kill -9), and the process server's spool is lost.
void SiteOutageLosingTheSpool(Cluster& c) {
  REQUIRE(c.Stop(Which::kAgent));
  REQUIRE(c.Kill9(Which::kMasterTarget));
  REQUIRE(c.Kill9(Which::kProcessServer));
  std::filesystem::remove_all(c.Path("ps/spool/" + c.options().tenant));
}

// cdpctl reprotect VOLUME succeeds.
void Reprotect(Cluster& c) {
  auto rp = c.Cdpctl({"reprotect", c.options().volume});
  INFO(rp.output);
  REQUIRE(rp.exit_code == 0);
}

}  // namespace

TEST_CASE("upstream: an agent re-pointed from the PS to the MT is refused until re-protected, the backlog at the "
          "PS is applied first, and the replica ends equal to the source",
          "[e2e][resync]") {
  // Regression: the MT took the re-pointed agent's stream, whose sequence
  // numbers followed what the MT had applied; the records still in the PS's
  // spool were never applied (or skipped as duplicates once the PS came
  // back), the cluster looked drained and the replica differed from the source.
  Cluster c;
  INFO(c.why());
  REQUIRE(c.Start());
  const std::string vol = c.options().volume;
  auto mt_volume = [&](const char* key) -> std::string {
    std::optional<boost::json::object> v = VolumeIn(c.StatusOf(Which::kMasterTarget), "volume", vol);
    return !v ? std::string() : boost::json::serialize(v->at(key));
  };
  CHECK(mt_volume("upstream") == "\"process server 'local-ps'\"");
  // A backlog at the process server: the MT is down while the application
  // writes, and the PS acknowledges every record (durable in its spool).
  BacklogAtPs(c, 21);
  REQUIRE(c.Stop(Which::kAgent));
  REQUIRE(c.Kill9(Which::kProcessServer));
  // The operator points the agent straight at the MT: refused, with the way out.
  REQUIRE(c.SetDirectAgent(true));
  REQUIRE(c.Restart(Which::kMasterTarget));
  REQUIRE(c.Restart(Which::kAgent));
  const std::string last_error = WaitFieldContains(c, Which::kAgent, "name", vol, "last_error",
                                                   {"replicates through process server 'local-ps' in generation 1"});
  CHECK(last_error.find("cdpctl reprotect " + vol) != std::string::npos);
  // The application keeps writing meanwhile.
  Write(c, 22, 1, 10, 256 << 10);
  // The old PS comes back: its backlog is the volume's history, and applied.
  REQUIRE(c.Restart(Which::kProcessServer));
  REQUIRE(WaitFor(
      [&] {
        std::optional<boost::json::object> v = VolumeIn(c.StatusOf(Which::kProcessServer), "volume", vol);
        return v && boost::json::value_to<uint64_t>(v->at("backlog_records")) == 0 &&
               v->at("mt_acked_seq") == v->at("spool_durable_seq");
      },
      std::chrono::seconds(60)));
  // The move is a re-protect: the agent compares every region with the replica.
  Reprotect(c);
  DrainedEqual(c);
  CHECK(mt_volume("upstream") == "\"agent 'e2e-agent'\"");
  CHECK(mt_volume("generation") == "2");
}

TEST_CASE("history: a process server that lost its spool while the agent was down is detected at the "
          "agent's next start, and every region is compared",
          "[e2e][resync][crash]") {
  Cluster c;
  INFO(c.why());
  REQUIRE(c.Start());
  const std::string vol = c.options().volume;
  // A backlog at the process server, acknowledged to the agent, its regions
  // cleared from the agent's bitmap.
  BacklogAtPs(c, 31);
  // The agent stops (a reboot); meanwhile the process server loses its spool.
  REQUIRE(c.Stop(Which::kAgent));
  REQUIRE(c.Kill9(Which::kProcessServer));
  std::filesystem::remove_all(c.Path("ps/spool/" + c.options().tenant));
  REQUIRE(c.Restart(Which::kMasterTarget));
  // Issue 38 F8: the agent starts before the process server answers. Its
  // queue is empty and everything it sent was acknowledged, yet the far side
  // lost records: until the PS answers, the volume is unconfirmed, never
  // drained (it was shown drained, RPO 0, while the replica lacked them).
  REQUIRE(c.Restart(Which::kAgent));
  std::optional<boost::json::object> a = VolumeIn(c.StatusOf(Which::kAgent), "name", vol);
  REQUIRE(a);
  CHECK(a->at("confirmed") == false);
  CHECK(boost::json::value_to<uint64_t>(a->at("queue_records")) == 0);
  CHECK_FALSE(c.WaitDrained(std::chrono::seconds(2)));
  WaitStatusShows(c, "UNCONFIRMED: the process server has not answered since the agent started");
  REQUIRE(c.Restart(Which::kProcessServer));
  DrainedEqual(c);
  CHECK(c.AgentU64("history_lost") == 1);
  a = VolumeIn(c.StatusOf(Which::kAgent), "name", vol);
  REQUIRE(a);
  CHECK(a->at("confirmed") == true);
  CHECK(c.Cdpctl({"status"}).output.find("UNCONFIRMED") == std::string::npos);
}

TEST_CASE("history: a master target that lost its replica stalls the PS with resync needed, and a re-protect "
          "seeds it again equal to the source",
          "[e2e][resync][crash]") {
  Cluster c;
  INFO(c.why());
  REQUIRE(c.Start());
  const std::string vol = c.options().volume;
  Write(c, 41, 3, 40, 1 << 20);
  REQUIRE(c.WaitDrained());
  // The provider's disk is replaced: the volume's replica, journal and index are gone.
  REQUIRE(c.Kill9(Which::kMasterTarget));
  REQUIRE(std::filesystem::remove_all(c.Path("mt/tenants/" + c.options().tenant + "/volumes/" + vol)) > 0);
  REQUIRE(c.Restart(Which::kMasterTarget));
  // New writes after the loss; the PS cannot serve the new replica from its spool.
  Write(c, 42, 1, 10, 256 << 10);
  const std::string stalled = WaitFieldContains(c, Which::kProcessServer, "volume", vol, "stalled", {"resync needed"});
  // cdpctl status shows the stall under the PS's volume.
  WaitStatusShows(c, "    STALLED: " + stalled + "\n");
  // Seeding it again is a re-protect: the agent compares every region.
  Reprotect(c);
  DrainedEqual(c);
}

TEST_CASE("reprotect of a protecting volume through the PS: the next generation compares every region and "
          "replication goes on",
          "[e2e][resync]") {
  // Regression: the PS refused the agent's next generation for ever unless
  // the MT fenced the volume, so this re-protect stopped replication.
  Cluster c;
  INFO(c.why());
  REQUIRE(c.Start());
  const std::string vol = c.options().volume;
  Write(c, 51, 2, 30, 1 << 20);
  Reprotect(c);
  Write(c, 52, 2, 30, 1 << 20);
  DrainedEqual(c);
  std::optional<boost::json::object> mv = VolumeIn(c.StatusOf(Which::kMasterTarget), "volume", vol);
  REQUIRE(mv);
  CHECK(boost::json::value_to<uint64_t>(mv->at("generation")) == 2);
  CHECK(mv->at("upstream").as_string() == "process server 'local-ps'");
}

TEST_CASE("history: a process server that lost its spool while the agent and the master target were down: "
          "new writes before the MT returns still reach the replica",
          "[e2e][resync][crash]") {
  Cluster c;
  INFO(c.why());
  REQUIRE(c.Start());
  Write(c, 51, 3, 40, 1 << 20);
  REQUIRE(c.WaitDrained());
  SiteOutageLosingTheSpool(c);
  // The agent and the PS come back first; the application writes. The PS
  // answers the agent's open only once the MT has said where the volume
  // stands (regression: it answered 0, the agent numbered these writes with
  // numbers the MT had applied, and replication stopped for good: "master
  // target claims sequence 150 beyond the spool's last 92").
  REQUIRE(c.Restart(Which::kProcessServer));
  REQUIRE(c.Restart(Which::kAgent));
  Write(c, 52, 2, 40, 1 << 20);
  WaitFieldContains(c, Which::kAgent, "name", c.options().volume, "last_error", {"its spool lost records"});
  // cdpctl status says why the volume does not ship.
  WaitStatusShows(c, "    LAST ERROR: ");
  WaitStatusShows(c, "its spool lost records");
  REQUIRE(c.Restart(Which::kMasterTarget));
  DrainedEqual(c);
}

TEST_CASE("history: a site outage that lost the process server's spool and the agent's bitmap: writes numbered "
          "before the MT returns are refused, never skipped, and a re-protect makes the replica equal",
          "[e2e][resync][crash]") {
  // Regression: with nothing acknowledged to tell the PS (its bitmap was
  // lost too), the agent was answered 0 and numbered its new writes from 1,
  // past the MT's position; when the MT returned the PS resumed after that
  // position and the writes under those numbers were never applied.
  Cluster c;
  INFO(c.why());
  REQUIRE(c.Start());
  const std::string vol = c.options().volume;
  Write(c, 61, 1, 5, 0);
  REQUIRE(c.WaitDrained());
  const uint64_t mt_at = c.AgentU64("acked_seq");
  SiteOutageLosingTheSpool(c);
  REQUIRE(std::filesystem::remove(c.Path("agent/" + vol + ".bitmap")));  // lost too
  REQUIRE(c.Restart(Which::kProcessServer));
  REQUIRE(c.Restart(Which::kAgent));
  // More writes than the MT holds, all spooled, before the MT comes back.
  Write(c, 62, 3, 40, 1 << 20);
  REQUIRE(WaitFor([&] { return c.AgentU64("acked_seq") + 1 == c.AgentU64("next_seq"); }, std::chrono::seconds(60)));
  const uint64_t spooled = c.AgentU64("acked_seq");
  INFO("the MT holds up to " << mt_at << ", the new spool up to " << spooled);
  REQUIRE(spooled > mt_at);
  REQUIRE(c.Restart(Which::kMasterTarget));
  // The PS's first refusal names both positions; it retries about every
  // 100 ms, and from the second refusal on shows the one it keeps. Under
  // load the first may be gone before it is sampled: either is the stall.
  (void)WaitFieldContains(c, Which::kProcessServer, "volume", vol, "stalled",
                          {"master target stands at seq " + std::to_string(mt_at) +
                               ", but this spool numbered records 1.." + std::to_string(spooled),
                           "master target holds sequence numbers this spool may have given to other records"});
  // cdpctl status shows the stall. The PS retries the copy every ~100 ms, and
  // from the second refusal on its text is the refusal it keeps ("holds
  // sequence numbers this spool may have given..."), so the status may show
  // either (a status over HTTPS takes longer than one retry).
  WaitStatusShows(c, "    STALLED: master target ");
  WaitStatusShows(c, "refused until");
  Reprotect(c);
  DrainedEqual(c);
}

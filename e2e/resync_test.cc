// End-to-end resync: the agent is killed with kill -9 in the middle of a
// full resync and resumes where it was; the replica ends equal to the source.
#include <catch2/catch.hpp>

#include <boost/json.hpp>
#include <filesystem>
#include <fstream>
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

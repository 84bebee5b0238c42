// SPDX-License-Identifier: Apache-2.0
// The history lock and the rollback that keeps what it rewinds, on the real
// daemons with TLS and tokens (issue #37, DESIGN.md invariants 9 and 10):
//   1. a flood of writes through the agent (10x retention.max_bytes) drops no
//      point younger than the lock: the MT stops applying and says LOCKED in
//      /status, cdpctl status and cdp_mt_apply_stalled{cause="history_lock"};
//      a larger budget (the admin's config) resumes it, and the replica ends
//      equal to the source with every point still listed;
//   2. a tenant token's rollback keeps every later point listed and
//      exportable, byte for byte as the source was at its tag; discarding
//      that history is 403 for the tenant and 409 for the admin inside the lock;
//   3. ransomware detection: compressible churn at a steady rate, then random
//      data at 5x the rate: the agent's anomaly reaches the MT within 10 s
//      of the switch, the suspect-clean point exports byte for byte as the
//      source was before the switch, is held, and only the admin acknowledges it.
#include <catch2/catch.hpp>

#include <boost/json.hpp>
#include <chrono>
#include <set>
#include <thread>

#include "common/http/http_client.h"
#include "e2e/harness.h"

namespace {

using cdp::e2e::Cluster;
using cdp::e2e::ClusterOptions;
using cdp::e2e::WaitFor;
using cdp::e2e::Which;
namespace json = boost::json;
using namespace std::chrono_literals;

struct Answer {
  int status = 0;
  std::string body;
};

Answer Call(const Cluster& c, const std::string& method, const std::string& target, const std::string& token,
            const std::string& body = "") {
  cdp::http::ClientOptions co = cdp::e2e::ControlClient(token);
  auto r = cdp::http::HttpRequest("127.0.0.1", c.mt_control(), method, target, body, 20s, co);
  INFO(method << " " << target);
  REQUIRE(r.ok());
  return Answer{r->status, r->body};
}

void RequireClients() {
  for (const char* p : {"qemu-io", "nbdcopy", "sha256sum"}) {
    INFO("missing program " << p << " (scripts/install-deps.sh installs it)");
    REQUIRE(cdp::testing::HaveProgram(p));
  }
}

std::string MtState(const Cluster& c) {
  auto s = c.StatusOf(Which::kMasterTarget);
  if (!s) return "";
  for (const auto& v : s->at("volumes").as_array()) {
    if (v.as_object().at("volume").as_string() == c.options().volume) return std::string(v.at("state").as_string());
  }
  return "";
}

// The ids of the volume's points, and those on a rolled-back branch.
struct Points {
  std::set<int64_t> ids, rolled_back;
};
Points ListPoints(const Cluster& c, const std::string& token) {
  Answer a = Call(c, "GET", "/v1/points?volume=" + c.options().volume, token);
  REQUIRE(a.status == 200);
  Points p;
  const json::value body = json::parse(a.body);
  for (const auto& v : body.at("points").as_array()) {
    const int64_t id = json::value_to<int64_t>(v.at("id"));
    p.ids.insert(id);
    if (v.at("rolled_back").as_bool()) p.rolled_back.insert(id);
  }
  return p;
}

}  // namespace

TEST_CASE("history lock: a flood of writes through the agent drops no point inside the lock, LOCKED, then resumed",
          "[e2e][lock]") {
  RequireClients();
  ClusterOptions o;
  o.volume_size = 16ull << 20;
  o.point_interval = "0s";  // a point at every flush: many points before the budget is reached
  const std::string kLocked = "[retention]\nmax_bytes = 16MiB\nlock = 1h\ncheck_interval = 1s\n";
  o.mt_extra_config = kLocked;
  Cluster c(o);
  INFO(c.why());
  REQUIRE(c.Start());
  const std::string admin = c.token(Which::kMasterTarget);

  // 10x max_bytes through the tap (40 rounds of a 4 MiB nbdcopy plus
  // scattered writes, each ending in a flush), watching the points as it goes.
  std::set<int64_t> seen;
  for (int round = 0; round < 40; ++round) {
    std::string w = cdp::e2e::RandomWrites(c.nbd_uri(), o.volume_size, 370 + round, 1, 10, 4ull << 20, c.dir());
    INFO(w);
    REQUIRE(w.empty());
    for (int64_t id : ListPoints(c, admin).ids) seen.insert(id);
  }
  const bool locked = WaitFor([&] { return MtState(c) == "LOCKED: journal full inside the history lock"; }, 120s, 200ms);
  INFO("MT state: " << MtState(c) << "\n" << c.Logs());
  REQUIRE(locked);
  auto st = c.Cdpctl({"status"});
  INFO(st.output);
  CHECK(st.output.find("LOCKED: journal full inside the history lock") != std::string::npos);
  CHECK(st.output.find("APPLY STALLED (history lock)") != std::string::npos);
  {
    auto m = Call(c, "GET", "/metrics", admin);
    const std::string series = "cdp_mt_apply_stalled{cause=\"history_lock\",tenant=\"" + o.tenant + "\",volume=\"" +
                               o.volume + "\"} 1";
    CHECK(m.body.find(series) != std::string::npos);
  }
  // Retention has run many times meanwhile: every point ever listed is still there.
  Points now = ListPoints(c, admin);
  for (int64_t id : now.ids) seen.insert(id);
  REQUIRE(seen.size() >= 3);
  for (int64_t id : seen) {
    INFO("point " << id);
    CHECK(now.ids.count(id) == 1);
  }

  // The admin raises the budget (config, restart): apply resumes and catches up.
  REQUIRE(c.Stop(Which::kMasterTarget));
  REQUIRE(c.SetMtExtraConfig("[retention]\nmax_bytes = 4GiB\nlock = 1h\ncheck_interval = 1s\n"));
  REQUIRE(c.Restart(Which::kMasterTarget));
  const bool drained = c.WaitDrained(180s);
  INFO(c.why() << "\n" << c.Logs());
  REQUIRE(drained);
  CHECK(MtState(c) == "protecting");
  CHECK(cdp::e2e::Sha256File(c.replica_path()) == cdp::e2e::Sha256File(c.source_path()));
  now = ListPoints(c, admin);
  for (int64_t id : seen) {
    INFO("point " << id);
    CHECK(now.ids.count(id) == 1);
  }
  c.StopAll();
}

TEST_CASE("history lock: a tenant token's rollback keeps every later point, discarding is the admin's, never inside "
          "the lock",
          "[e2e][lock][points]") {
  RequireClients();
  Cluster c;
  INFO(c.why());
  REQUIRE(c.Start());
  const std::string admin = c.token(Which::kMasterTarget);
  auto issued = c.CdpctlJson({"--tenant", c.options().tenant, "token", "issue"});
  INFO(c.why());
  REQUIRE(issued.has_value());
  const std::string tenant(issued->at("token").as_string());

  const int kTags = 3;
  std::vector<std::string> copies;
  std::vector<int64_t> ids;
  for (int i = 0; i < kTags; ++i) {
    std::string w = cdp::e2e::RandomWrites(c.nbd_uri(), c.options().volume_size, 3700 + i, 2, 30, 1 << 20, c.dir());
    INFO(w);
    REQUIRE(w.empty());
    copies.push_back(c.Path("copy-" + std::to_string(i) + ".img"));
    REQUIRE(cdp::e2e::CopyFile(c.source_path(), copies.back()));
    const std::string tag = "lock" + std::to_string(i);
    auto t = c.Cdpctl({"tag", tag});
    INFO(t.output);
    REQUIRE(t.exit_code == 0);
    REQUIRE(c.WaitDrained());
    ids.push_back(c.TagPointId(tag));
    REQUIRE(ids.back() >= 0);
  }
  REQUIRE(cdp::e2e::Sha256File(copies[0]) != cdp::e2e::Sha256File(copies[2]));
  const Points before = ListPoints(c, tenant);
  const std::string body = R"({"volume":")" + c.options().volume + R"(","point":)" + std::to_string(ids[0]);

  // Discarding: never the tenant's (403), never inside the lock (409); nothing done.
  CHECK(Call(c, "POST", "/v1/rollback", tenant, body + R"(,"discard_history":true})").status == 403);
  CHECK(Call(c, "POST", "/v1/rollback", admin, body + R"(,"discard_history":true})").status == 409);
  CHECK(MtState(c) == "protecting");
  CHECK(ListPoints(c, tenant).ids == before.ids);

  // The tenant's rollback: 200, the replica is the first tag's image, and
  // every later point is still there, marked, and exports as it was.
  Answer rb = Call(c, "POST", "/v1/rollback", tenant, body + "}");
  INFO(rb.body);
  REQUIRE(rb.status == 200);
  CHECK(cdp::e2e::Sha256File(c.replica_path()) == cdp::e2e::Sha256File(copies[0]));
  const Points after = ListPoints(c, tenant);
  for (int64_t id : before.ids) {
    INFO("point " << id);
    CHECK(after.ids.count(id) == 1);
    CHECK(after.rolled_back.count(id) == (id > ids[0] ? 1u : 0u));
  }
  for (int i = 0; i < kTags; ++i) {
    const std::string out = c.Path("export-" + std::to_string(i) + ".img");
    const bool copied = c.CopyExport(std::to_string(ids[i]), out);
    INFO(c.why());
    REQUIRE(copied);
    INFO("tag " << i);
    CHECK(cdp::e2e::Sha256File(out) == cdp::e2e::Sha256File(copies[i]));
  }
  auto pts = c.Cdpctl({"points", c.options().volume});
  INFO(pts.output);
  CHECK(pts.output.find("lock2 [rolled back]") != std::string::npos);
  c.StopAll();
}

TEST_CASE("ransomware detection: a switch from compressible churn to random data at 5x the rate keeps the image "
          "before it as suspect-clean",
          "[e2e][lock][anomaly]") {
  RequireClients();
  ClusterOptions o;
  // A shorter learning period than the default 30 s keeps the test short.
  o.agent_extra_config = "[anomaly]\nlearning_windows = 8\n";
  Cluster c(o);
  INFO(c.why());
  REQUIRE(c.Start());
  const std::string admin = c.token(Which::kMasterTarget);
  auto churn = [&](double mb_s, double compressibility, int seconds, int seed) {
    auto r = cdp::testing::RunCommand({CDP_LOADGEN_BIN, "churn", "--target", c.nbd_uri(), "--rate",
                                       std::to_string(mb_s), "--duration", std::to_string(seconds), "--pattern",
                                       "random", "--compressibility", std::to_string(compressibility), "--seed",
                                       std::to_string(seed), "--flush-every", "1MiB"},
                                      (seconds + 60) * 1000);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
  };
  // The usual: 2 MB/s of 75%-compressible data for 16 s (learned), nothing fires.
  churn(2, 0.75, 16, 1);
  CHECK(c.AgentU64("anomalies") == 0);
  // The writer is paused: the source is the image before the switch. The
  // attack starts once two detection windows have closed since (the last
  // ones of the usual writes stay apart from the attack's).
  const std::string before = c.Path("before-switch.img");
  REQUIRE(cdp::e2e::CopyFile(c.source_path(), before));
  const uint64_t windows = c.AgentU64("anomaly_windows");
  REQUIRE(WaitFor([&] { return c.AgentU64("anomaly_windows") >= windows + 2; }, 10s, 50ms));
  // The attack: random data at 10 MB/s. The anomaly reaches the agent's
  // status and the MT within 10 s of the switch.
  const auto start = std::chrono::steady_clock::now();
  std::thread attack([&] { churn(10, 0.0, 12, 2); });
  const bool seen = WaitFor([&] { return c.AgentU64("anomalies") >= 1; }, 10s, 100ms);
  const double delay = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  attack.join();
  INFO("detection delay " << delay << " s\n" << c.Logs());
  REQUIRE(seen);
  CHECK(delay <= 10.0);
  WARN("detection delay: " << delay << " s");
  REQUIRE(c.WaitDrained());
  Answer a = Call(c, "GET", "/v1/anomalies?volume=" + o.volume, admin);
  REQUIRE(a.status == 200);
  const json::value body = json::parse(a.body);
  const auto& list = body.at("anomalies").as_array();
  REQUIRE(list.size() == 1);
  const int64_t id = json::value_to<int64_t>(list[0].at("id"));
  const int64_t point = json::value_to<int64_t>(list[0].at("point"));
  CHECK(list[0].at("held").as_bool());
  CHECK(std::string(list[0].at("message").as_string()).find("incompressible") != std::string::npos);
  auto st = c.Cdpctl({"status"});
  INFO(st.output);
  CHECK(st.output.find("ANOMALY: possible ransomware") != std::string::npos);
  {
    auto m = Call(c, "GET", "/metrics", admin);
    CHECK(m.body.find("cdp_mt_anomalies_open{tenant=\"" + o.tenant + "\",volume=\"" + o.volume + "\"} 1") !=
          std::string::npos);
  }
  // The suspect-clean point is the source as it was before the switch.
  const std::string out = c.Path("suspect-clean.img");
  const bool copied = c.CopyExport(std::to_string(point), out);
  INFO(c.why());
  REQUIRE(copied);
  CHECK(cdp::e2e::Sha256File(out) == cdp::e2e::Sha256File(before));
  // Only the admin acknowledges it.
  auto issued = c.CdpctlJson({"--tenant", o.tenant, "token", "issue"});
  REQUIRE(issued.has_value());
  const std::string tenant(issued->at("token").as_string());
  const std::string ack = R"({"volume":")" + o.volume + R"(","id":)" + std::to_string(id) + "}";
  CHECK(Call(c, "GET", "/v1/anomalies?volume=" + o.volume, tenant).status == 200);
  CHECK(Call(c, "POST", "/v1/anomalies/ack", tenant, ack).status == 403);
  auto acked = c.Cdpctl({"anomalies", o.volume, "--ack", std::to_string(id)});
  INFO(acked.output);
  CHECK(acked.exit_code == 0);
  auto shown = c.Cdpctl({"anomalies", o.volume});
  INFO(shown.output);
  CHECK(shown.output.find("acknowledged") != std::string::npos);
  c.StopAll();
}

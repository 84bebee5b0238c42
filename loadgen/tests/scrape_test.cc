// SPDX-License-Identifier: Apache-2.0
#include <catch2/catch.hpp>

#include <atomic>

#include "common/daemon/metrics.h"
#include "common/env/env.h"
#include "common/http/http_server.h"
#include "loadgen/profile.h"
#include "loadgen/scrape.h"
#include "loadgen/tests/test_util.h"

using namespace cdp;
using namespace cdp::loadgen;

TEST_CASE("Prometheus text: series summed per name, labels with braces and quotes", "[scrape]") {
  metrics::Registry reg;
  reg.GetCounter("cdp_agent_captured_bytes_total", "Bytes", {{"volume", "db}1"}})->Inc(100);
  reg.GetCounter("cdp_agent_captured_bytes_total", "Bytes", {{"volume", "we\"ird"}})->Inc(23);
  reg.GetGauge("cdp_agent_mode", "Mode")->Set(-2);
  reg.GetHistogram("lat_seconds", "Latency", {0.1, 1})->Observe(0.5);
  auto m = ParsePrometheusText(reg.RenderPrometheus());
  REQUIRE(m.ok());
  CHECK(m->at("cdp_agent_captured_bytes_total") == 123);
  CHECK(m->at("cdp_agent_mode") == -2);
  CHECK(m->at("lat_seconds_count") == 1);
  CHECK(m->at("lat_seconds_sum") == 0.5);
  auto t = ParsePrometheusText("# HELP x y\nx 1.5e3 1700000000\nnan_one NaN\n");
  REQUIRE(t.ok());
  CHECK(t->at("x") == 1500);
  auto bad = ParsePrometheusText("ok 1\nbroken{a=\"1\" 2\n");
  CHECK(bad.status().code() == Code::kCorruption);
  CHECK(bad.status().message().rfind("metrics line 2:", 0) == 0);
  CHECK(ParsePrometheusText("x abc\n").status().code() == Code::kCorruption);
}

TEST_CASE("HTTP URL parsing", "[scrape]") {
  auto u = ParseHttpUrl("http://127.0.0.1:9100/metrics");
  REQUIRE(u.ok());
  CHECK(u->host == "127.0.0.1");
  CHECK(u->port == 9100);
  CHECK(u->target == "/metrics");
  u = ParseHttpUrl("http://h:1");
  REQUIRE(u.ok());
  CHECK(u->target == "/metrics");
  auto h = ParseHttpUrl("https://h/metrics");  // the daemons' control ports speak HTTPS
  REQUIRE(h.ok());
  CHECK(h->https);
  CHECK(h->port == 443);
  CHECK(h->host == "h");
  CHECK(ParseHttpUrl("ftp://h/metrics").status().code() == Code::kInvalidArgument);
  // https without the site CA to check the daemon against is refused before connecting.
  CHECK(Scrape(*h).status().code() == Code::kInvalidArgument);
  CHECK(ParseHttpUrl("http://h:x/").status().code() == Code::kInvalidArgument);
}

TEST_CASE("Profile from counter readings: increases, restart counts from zero", "[scrape]") {
  Profile p = ProfileFromReadings({{100, 1000}, {110, 5000}, {120, 5000}, {130, 300}});
  REQUIRE(p.samples.size() == 3);
  CHECK(p.samples[0].timestamp == 100);
  CHECK(p.samples[0].bytes == 4000);
  CHECK(p.samples[0].seconds == 10);
  CHECK(p.samples[1].bytes == 0);
  CHECK(p.samples[2].bytes == 300);
}

TEST_CASE("cdp-loadgen record polls a live /metrics into a profile plan can read", "[scrape][cli][e2e]") {
  metrics::Registry reg;
  std::atomic<int> scrapes{0};
  // Every scrape sees 4096 more bytes: each recorded interval holds exactly 4096.
  reg.AddComputed("cdp_agent_captured_bytes_total", "Bytes captured", metrics::Type::kCounter,
                  [&] { return double(4096 * ++scrapes); });
  http::ServerOptions so;
  so.registry = &reg;
  http::Server srv(so);
  REQUIRE(srv.Start().ok());
  cdp::testing::ScratchDir tmp;
  const std::string csv = tmp.path() + "/p.csv";
  auto r = RunShell(std::string(CDP_LOADGEN_BIN) + " record --url http://127.0.0.1:" + std::to_string(srv.port()) +
                        "/metrics --interval 100ms --samples 4 --out " + csv);
  REQUIRE(r.exit_code == 0);
  auto text = ReadWholeFile(DefaultEnv(), csv);
  REQUIRE(text.ok());
  auto p = ParseProfileCsv(std::string_view(reinterpret_cast<const char*>(text->data()), text->size()));
  REQUIRE(p.ok());
  REQUIRE(p->samples.size() == 4);
  // Scrapes start on a fixed 100 ms grid, so one that is slow (a loaded
  // machine, ASan) is followed by a quick one: each interval is what was
  // measured, > 0; together they span the grid's 400 ms less the first
  // scrape's own time.
  double total = 0;
  for (const auto& s : p->samples) {
    CHECK(s.bytes == 4096);
    CHECK(s.seconds > 0);
    total += s.seconds;
  }
  CHECK(total > 0.25);
  CHECK(scrapes.load() == 5);
  auto plan = RunShell(std::string(CDP_LOADGEN_BIN) + " plan --profile " + csv + " --rpo 1m --format json");
  CHECK(plan.exit_code == 0);
  CHECK(plan.output.find("\"total_bytes\":1.6384E4") != std::string::npos);
  auto missing = RunShell(std::string(CDP_LOADGEN_BIN) + " record --url http://127.0.0.1:" +
                              std::to_string(srv.port()) + "/metrics --metric nope_total --samples 1");
  CHECK(missing.exit_code == 1);
  CHECK(missing.output.find("nope_total not exported") != std::string::npos);
  srv.Stop();
}

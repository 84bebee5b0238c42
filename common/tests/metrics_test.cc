// SPDX-License-Identifier: Apache-2.0
#include "common/daemon/metrics.h"

#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/json.hpp>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/base/clock.h"
#include "common/env/env.h"
#include "common/http/http_client.h"
#include "common/http/http_server.h"
#include "common/tests/test_util.h"

namespace cdp {
namespace {

using metrics::Registry;

// The registry of the exact-format test.
void FillSmallRegistry(Registry& reg) {
  auto c = reg.GetCounter("cdp_acked_bytes_total", "Bytes acknowledged", {{"volume", "db1"}});
  c->Inc(4096);
  c->Inc();
  reg.GetCounter("cdp_acked_bytes_total", "Bytes acknowledged", {{"volume", "a\"b\\c\nd"}})->Inc(2);
  reg.GetGauge("cdp_backlog_bytes", "Backlog")->Set(-5);
  reg.GetDoubleGauge("cdp_ratio", "Compression ratio\nsecond line \\ done")->Set(2.5);
  auto h = reg.GetHistogram("cdp_lag_seconds", "Lag", {0.25, 1, 10}, {{"volume", "db1"}, {"tenant", "t1"}});
  for (double v : {0.25, 0.5, 0.5, 100.0}) h->Observe(v);
}

constexpr const char* kSmallRegistryText =
    "# HELP cdp_acked_bytes_total Bytes acknowledged\n"
    "# TYPE cdp_acked_bytes_total counter\n"
    "cdp_acked_bytes_total{volume=\"a\\\"b\\\\c\\nd\"} 2\n"
    "cdp_acked_bytes_total{volume=\"db1\"} 4097\n"
    "# HELP cdp_backlog_bytes Backlog\n"
    "# TYPE cdp_backlog_bytes gauge\n"
    "cdp_backlog_bytes -5\n"
    "# HELP cdp_lag_seconds Lag\n"
    "# TYPE cdp_lag_seconds histogram\n"
    "cdp_lag_seconds_bucket{tenant=\"t1\",volume=\"db1\",le=\"0.25\"} 1\n"
    "cdp_lag_seconds_bucket{tenant=\"t1\",volume=\"db1\",le=\"1\"} 3\n"
    "cdp_lag_seconds_bucket{tenant=\"t1\",volume=\"db1\",le=\"10\"} 3\n"
    "cdp_lag_seconds_bucket{tenant=\"t1\",volume=\"db1\",le=\"+Inf\"} 4\n"
    "cdp_lag_seconds_sum{tenant=\"t1\",volume=\"db1\"} 101.25\n"
    "cdp_lag_seconds_count{tenant=\"t1\",volume=\"db1\"} 4\n"
    "# HELP cdp_ratio Compression ratio\\nsecond line \\\\ done\n"
    "# TYPE cdp_ratio gauge\n"
    "cdp_ratio 2.5\n";

TEST_CASE("Prometheus text format is exact for a small registry", "[metrics]") {
  Registry reg;
  FillSmallRegistry(reg);
  CHECK(reg.RenderPrometheus() == kSmallRegistryText);
}

TEST_CASE("the same name and labels give the same series, misuse throws", "[metrics]") {
  Registry reg;
  auto a = reg.GetCounter("x_total", "x", {{"b", "2"}, {"a", "1"}});
  auto b = reg.GetCounter("x_total", "x", {{"a", "1"}, {"b", "2"}});
  CHECK(a == b);
  CHECK(reg.GetCounter("x_total", "x", {{"a", "1"}}) != a);
  CHECK_THROWS_AS(reg.GetGauge("x_total", "x"), std::logic_error);
  CHECK_THROWS_AS(reg.GetCounter("bad-name", "x"), std::logic_error);
  CHECK_THROWS_AS(reg.GetCounter("y", "x", {{"__a", "1"}}), std::logic_error);
  CHECK_THROWS_AS(reg.GetCounter("y", "x", {{"a", "1"}, {"a", "2"}}), std::logic_error);
  CHECK_THROWS_AS(reg.GetHistogram("h", "x", {1, 1}), std::logic_error);
  CHECK_THROWS_AS(reg.GetHistogram("h2", "x", {1}, {{"le", "1"}}), std::logic_error);
  reg.GetHistogram("h3", "x", {1, 2});
  CHECK_THROWS_AS(reg.GetHistogram("h3", "x", {1, 3}, {{"v", "a"}}), std::logic_error);
  // A gauge family may not mix integer and double series of the same labels.
  reg.GetGauge("g", "g");
  CHECK_THROWS_AS(reg.GetDoubleGauge("g", "g"), std::logic_error);
}

TEST_CASE("RemoveSeries stops exporting, the handle stays usable", "[metrics]") {
  Registry reg;
  auto c = reg.GetCounter("cdp_writes_total", "Writes", {{"volume", "db1"}});
  c->Inc(3);
  CHECK(reg.RemoveSeries("cdp_writes_total", {{"volume", "db1"}}));
  CHECK_FALSE(reg.RemoveSeries("cdp_writes_total", {{"volume", "db1"}}));
  c->Inc();
  CHECK(c->Value() == 4);
  CHECK(reg.RenderPrometheus().empty());
}

TEST_CASE("counter increments from many threads are all counted", "[metrics]") {
  Registry reg;
  auto c = reg.GetCounter("n_total", "n");
  auto h = reg.GetHistogram("lat", "l", {1, 2, 3});
  auto g = reg.GetDoubleGauge("d", "d");
  constexpr int kThreads = 4, kPer = 100000;
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&] {
      for (int i = 0; i < kPer; ++i) {
        c->Inc();
        h->Observe(double(i % 4));
        g->Add(0.5);
      }
    });
  }
  for (auto& t : ts) t.join();
  CHECK(c->Value() == uint64_t(kThreads) * kPer);
  auto s = h->Snapshot();
  CHECK(s.count == uint64_t(kThreads) * kPer);
  CHECK(s.counts == std::vector<uint64_t>{uint64_t(kThreads) * kPer / 2, uint64_t(kThreads) * kPer / 4,
                                          uint64_t(kThreads) * kPer / 4, 0});
  CHECK(g->Value() == 0.5 * kThreads * kPer);
}

TEST_CASE("histogram quantile estimation", "[metrics]") {
  metrics::Histogram h({0.25, 1, 10});
  CHECK(h.Quantile(0.5) == 0);  // empty
  for (double v : {0.25, 0.5, 0.5, 100.0}) h.Observe(v);
  CHECK(h.Quantile(0.5) == Approx(0.625));  // rank 2 in (0.25, 1], 1 of 2 in that bucket
  CHECK(h.Quantile(0.25) == Approx(0.25));
  CHECK(h.Quantile(0.99) == 10);  // in +Inf: the highest finite bound
  metrics::Histogram u(metrics::LinearBuckets(10, 10, 10));  // 10..100
  for (int i = 1; i <= 100; ++i) u.Observe(i);
  CHECK(u.Quantile(0.5) == Approx(50));
  CHECK(u.Quantile(0.99) == Approx(99));
  CHECK(metrics::ExponentialBuckets(1, 2, 4) == std::vector<double>{1, 2, 4, 8});
}

TEST_CASE("JSON rendering", "[metrics]") {
  Registry reg;
  FillSmallRegistry(reg);
  reg.AddComputed("cdp_nan", "not a number", metrics::Type::kGauge, [] { return std::nan(""); });
  boost::json::value v = boost::json::parse(boost::json::serialize(reg.RenderJson()));
  const auto& o = v.as_object();
  const auto& c = o.at("cdp_acked_bytes_total").as_object();
  CHECK(c.at("type").as_string() == "counter");
  CHECK(c.at("series").as_array().size() == 2);
  const auto& db1 = c.at("series").as_array()[1].as_object();
  CHECK(db1.at("labels").as_object().at("volume").as_string() == "db1");
  CHECK(db1.at("value").to_number<uint64_t>() == 4097);
  CHECK(o.at("cdp_backlog_bytes").at("series").as_array()[0].at("value").to_number<int64_t>() == -5);
  CHECK(o.at("cdp_ratio").at("series").as_array()[0].at("value").as_double() == 2.5);
  CHECK(o.at("cdp_nan").at("series").as_array()[0].at("value").is_null());
  const auto& h = o.at("cdp_lag_seconds").at("series").as_array()[0].as_object();
  CHECK(h.at("count").to_number<uint64_t>() == 4);
  CHECK(h.at("sum").as_double() == 101.25);
  CHECK(h.at("p50").as_double() == Approx(0.625));
  CHECK(h.at("p99").as_double() == 10);
  const auto& buckets = h.at("buckets").as_array();
  REQUIRE(buckets.size() == 4);
  CHECK(buckets[1].at("le").to_number<double>() == 1);
  CHECK(buckets[1].at("count").to_number<uint64_t>() == 3);
  CHECK(buckets[3].at("le").as_string() == "+Inf");
  CHECK(buckets[3].at("count").to_number<uint64_t>() == 4);
}

// Reads the value of an unlabelled series from Prometheus text.
double SampleValue(const std::string& text, const std::string& name) {
  size_t pos = text.find("\n" + name + " ");
  if (pos == std::string::npos) return -1;
  return std::strtod(text.c_str() + pos + name.size() + 2, nullptr);
}

TEST_CASE("process metrics report CPU, memory and fds", "[metrics]") {
  Registry reg;
  ManualClock clock(1'000'000, 1'700'000'000'000'000);
  metrics::RegisterProcessMetrics(reg, DefaultEnv(), &clock);
  // Burn a little CPU so that the counter is above zero.
  volatile uint64_t x = 0;
  double cpu = 0;
  for (int round = 0; round < 1000 && cpu <= 0; ++round) {
    for (int i = 0; i < 1000000; ++i) x = x + uint64_t(i);
    cpu = SampleValue(reg.RenderPrometheus(), "process_cpu_seconds_total");
  }
  std::string text = reg.RenderPrometheus();
  CHECK(text.find("# TYPE process_cpu_seconds_total counter\n") != std::string::npos);
  CHECK(SampleValue(text, "process_cpu_seconds_total") > 0);
  CHECK(SampleValue(text, "process_resident_memory_bytes") > 1 << 20);
  CHECK(SampleValue(text, "process_virtual_memory_bytes") >= SampleValue(text, "process_resident_memory_bytes"));
  CHECK(SampleValue(text, "process_open_fds") >= 3);
  CHECK(SampleValue(text, "process_start_time_seconds") == 1'700'000'000.0);
}

// ---------------------------------------------------------------- HTTP

struct TestServer {
  explicit TestServer(size_t max_body = 1 << 20) : server(Options(max_body)) {
    FillSmallRegistry(reg);
    server.Route("POST", "/v1/echo", [](const http::Request& r) {
      boost::json::object o;
      o["body"] = r.body;
      o["n"] = r.params.count("n") ? r.params.at("n") : "";
      o["content_type"] = r.content_type;
      return http::Response::Json(201, o);
    });
    server.Route("GET", "/v1/volumes/*", [](const http::Request& r) {
      return http::Response::Json(200, {{"rest", r.rest}, {"path", r.path}});
    });
    server.Route("GET", "/v1/volumes/special", [](const http::Request&) {
      return http::Response::Json(200, {{"exact", true}});
    });
    server.Route("GET", "/v1/throw", [](const http::Request&) -> http::Response {
      throw std::runtime_error("boom");
    });
    REQUIRE(server.Start().ok());
    REQUIRE(server.port() != 0);
  }
  http::ServerOptions Options(size_t max_body) {
    http::ServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.max_body_bytes = max_body;
    o.registry = &reg;
    o.status = [this] { return boost::json::value{{"state", "replicating"}, {"volumes", status_volumes}}; };
    return o;
  }
  Registry reg;
  int status_volumes = 3;
  http::Server server;
};

TEST_CASE("HTTP: Beast client gets /metrics, /status, routes, 404, 405, 413", "[http]") {
  TestServer t(1024);
  const uint16_t port = t.server.port();
  auto m = http::HttpRequest("127.0.0.1", port, "GET", "/metrics");
  REQUIRE(m.ok());
  CHECK(m->status == 200);
  CHECK(m->content_type == "text/plain; version=0.0.4; charset=utf-8");
  CHECK(m->body == kSmallRegistryText);

  auto mj = http::HttpRequest("127.0.0.1", port, "GET", "/metrics?format=json");
  REQUIRE(mj.ok());
  CHECK(mj->status == 200);
  CHECK(boost::json::parse(mj->body).at("cdp_backlog_bytes").at("type").as_string() == "gauge");

  auto s = http::HttpRequest("127.0.0.1", port, "GET", "/status");
  REQUIRE(s.ok());
  CHECK(s->status == 200);
  CHECK(s->content_type == "application/json");
  CHECK(boost::json::parse(s->body) == boost::json::value{{"state", "replicating"}, {"volumes", 3}});

  auto p = http::HttpRequest("127.0.0.1", port, "POST", "/v1/echo?n=a%20b&x", R"({"tag":"t1"})");
  REQUIRE(p.ok());
  CHECK(p->status == 201);
  auto pj = boost::json::parse(p->body);
  CHECK(pj.at("body").as_string() == R"({"tag":"t1"})");
  CHECK(pj.at("n").as_string() == "a b");
  CHECK(pj.at("content_type").as_string() == "application/json");

  auto pre = http::HttpRequest("127.0.0.1", port, "GET", "/v1/volumes/db1/points");
  REQUIRE(pre.ok());
  CHECK(pre->status == 200);
  CHECK(boost::json::parse(pre->body) == boost::json::value{{"rest", "db1/points"}, {"path", "/v1/volumes/db1/points"}});
  auto exact = http::HttpRequest("127.0.0.1", port, "GET", "/v1/volumes/special");
  REQUIRE(exact.ok());
  CHECK(boost::json::parse(exact->body) == boost::json::value{{"exact", true}});

  auto nf = http::HttpRequest("127.0.0.1", port, "GET", "/nope");
  REQUIRE(nf.ok());
  CHECK(nf->status == 404);
  CHECK(boost::json::parse(nf->body).at("error").as_string() == "no such path: /nope");

  auto na = http::HttpRequest("127.0.0.1", port, "GET", "/v1/echo");
  REQUIRE(na.ok());
  CHECK(na->status == 405);
  auto nm = http::HttpRequest("127.0.0.1", port, "POST", "/metrics", "x");
  REQUIRE(nm.ok());
  CHECK(nm->status == 405);

  auto boom = http::HttpRequest("127.0.0.1", port, "GET", "/v1/throw");
  REQUIRE(boom.ok());
  CHECK(boom->status == 500);
  CHECK(boost::json::parse(boom->body).at("error").as_string() == "boom");

  // The body limit is 1024 bytes: exactly 1024 passes, 1025 is refused.
  auto fits = http::HttpRequest("127.0.0.1", port, "POST", "/v1/echo", std::string(1024, 'a'));
  REQUIRE(fits.ok());
  CHECK(fits->status == 201);
  auto big = http::HttpRequest("127.0.0.1", port, "POST", "/v1/echo", std::string(1025, 'a'));
  REQUIRE(big.ok());
  CHECK(big->status == 413);
  auto huge = http::HttpRequest("127.0.0.1", port, "POST", "/v1/echo", std::string(4 << 20, 'a'));
  REQUIRE(huge.ok());
  CHECK(huge->status == 413);

  // The server still serves after refusing.
  auto again = http::HttpRequest("127.0.0.1", port, "GET", "/status");
  REQUIRE(again.ok());
  CHECK(again->status == 200);
}

TEST_CASE("HTTP: client errors are Status values", "[http]") {
  uint16_t port;
  {
    TestServer t;
    port = t.server.port();
    t.server.Stop();
    t.server.Stop();  // idempotent
  }
  auto r = http::HttpRequest("127.0.0.1", port, "GET", "/metrics", {}, std::chrono::milliseconds(2000));
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kUnavailable);
  CHECK(r.status().retryable());
  auto bad = http::HttpRequest("127.0.0.1", port, "FETCH", "/metrics");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == Code::kInvalidArgument);

  // A server that accepts and never answers: the timeout bounds the call.
  boost::asio::io_context ioc;
  boost::asio::ip::tcp::acceptor silent(ioc, {boost::asio::ip::make_address("127.0.0.1"), 0});
  auto start = std::chrono::steady_clock::now();
  auto t = http::HttpRequest("127.0.0.1", silent.local_endpoint().port(), "GET", "/", {},
                             std::chrono::milliseconds(300));
  auto took = std::chrono::steady_clock::now() - start;
  REQUIRE_FALSE(t.ok());
  CHECK(t.status().code() == Code::kUnavailable);
  CHECK(took < std::chrono::seconds(5));
}

TEST_CASE("HTTP: Stop closes open keep-alive connections", "[http]") {
  TestServer t;
  namespace net = boost::asio;
  net::io_context ioc;
  net::ip::tcp::socket sock(ioc);
  sock.connect({net::ip::make_address("127.0.0.1"), t.server.port()});
  std::string req = "GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  net::write(sock, net::buffer(req));
  // Read the first answer fully (it has a Content-Length), then the connection stays open.
  std::string got;
  std::array<char, 4096> buf;
  bool closed = false;
  auto read_until = [&](auto done) {
    std::function<void()> step = [&] {
      sock.async_read_some(net::buffer(buf), [&](boost::system::error_code ec, size_t n) {
        got.append(buf.data(), n);
        if (ec) {
          closed = true;
          return;
        }
        if (!done()) step();
      });
    };
    step();
    ioc.restart();
    ioc.run_for(std::chrono::seconds(10));
  };
  read_until([&] { return got.find("\"volumes\":3}") != std::string::npos; });
  REQUIRE(got.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  REQUIRE_FALSE(closed);
  t.server.Stop();
  read_until([&] { return false; });
  CHECK(closed);
}

TEST_CASE("HTTP: concurrent clients on a two-thread server all get answers", "[http]") {
  Registry reg;
  auto hits = reg.GetCounter("hits_total", "hits");
  http::ServerOptions o;
  o.threads = 2;
  o.registry = &reg;
  http::Server srv(o);
  srv.Route("POST", "/v1/hit", [&](const http::Request& r) {
    hits->Inc();
    return http::Response::Json(200, {{"echo", r.body}});
  });
  REQUIRE(srv.Start().ok());
  constexpr int kClients = 6, kEach = 40;
  std::atomic<int> good{0};
  std::vector<std::thread> ts;
  for (int c = 0; c < kClients; ++c) {
    ts.emplace_back([&, c] {
      for (int i = 0; i < kEach; ++i) {
        std::string body = std::to_string(c * 1000 + i);
        auto r = http::HttpRequest("127.0.0.1", srv.port(), "POST", "/v1/hit", body);
        if (r.ok() && r->status == 200 && boost::json::parse(r->body).at("echo").as_string() == body) ++good;
      }
    });
  }
  for (auto& t : ts) t.join();
  CHECK(good.load() == kClients * kEach);
  CHECK(hits->Value() == uint64_t(kClients) * kEach);
}

// Runs a shell command (curl -s: nothing on stderr), returns its output.
std::string Run(const std::string& cmd) { return cdp::testing::RunCommand({"sh", "-c", cmd}, 60000).output; }

TEST_CASE("HTTP: curl gets /metrics, /status, a POST route, 404 and 413, keep-alive reuses", "[http]") {
  // curl is in scripts/install-deps.sh; a machine without it fails here on purpose.
  REQUIRE(cdp::testing::HaveProgram("curl"));
  TestServer t;
  std::string base = "http://127.0.0.1:" + std::to_string(t.server.port());
  std::string curl = "curl -s --max-time 20 ";

  CHECK(Run(curl + base + "/metrics") == kSmallRegistryText);
  CHECK(Run(curl + "-o /dev/null -w '%{http_code} %{content_type}' " + base + "/metrics") ==
        "200 text/plain; version=0.0.4; charset=utf-8");
  CHECK(boost::json::parse(Run(curl + base + "/status")) ==
        boost::json::value{{"state", "replicating"}, {"volumes", 3}});
  std::string post = Run(curl + "-w ' %{http_code}' -X POST -H 'Content-Type: application/json' -d '{\"a\":1}' '" +
                         base + "/v1/echo?n=7'");
  CHECK(post == R"({"body":"{\"a\":1}","n":"7","content_type":"application/json"} 201)");
  CHECK(Run(curl + "-o /dev/null -w '%{http_code}' " + base + "/unknown") == "404");
  // 2 MiB against the 1 MiB limit.
  CHECK(Run("head -c 2097152 /dev/zero | " + curl + "-o /dev/null -w '%{http_code}' -X POST --data-binary @- " +
            base + "/v1/echo") == "413");
  // A small body with an explicit "Expect: 100-continue" is answered with 100, then served.
  CHECK(Run(curl + "-o /dev/null -w '%{http_code}' -H 'Expect: 100-continue' -H 'Content-Type: application/json' "
                   "-d '{}' " +
            base + "/v1/echo") == "201");
  // Two URLs in one curl run share one connection (keep-alive).
  CHECK(Run(curl + "-o /dev/null -o /dev/null -w '%{http_code} %{num_connects}\\n' " + base + "/status " + base +
            "/metrics") == "200 1\n200 0\n");
}

TEST_CASE("HTTP: a Host that is not an IP literal, localhost or allowed gets 403, a form post 415",
          "[http][security]") {
  TestServer t;
  const std::string port = std::to_string(t.server.port());
  std::string base = "http://127.0.0.1:" + port;
  std::string curl = "curl -s --max-time 20 -o /dev/null -w '%{http_code}' ";
  // DNS rebinding: a name that resolves to 127.0.0.1 still arrives as that name.
  CHECK(Run(curl + "-H 'Host: evil.example:" + port + "' " + base + "/status") == "403");
  CHECK(Run(curl + "-H 'Host: evil.example' -X POST -H 'Content-Type: application/json' -d '{}' " + base +
            "/v1/echo") == "403");
  CHECK(Run(curl + "-H 'Host: localhost:" + port + "' " + base + "/status") == "200");
  CHECK(Run(curl + "-H 'Host: [::1]:" + port + "' " + base + "/status") == "200");
  CHECK(Run(curl + base + "/status") == "200");
  // What a web page can post without asking: form, multipart, text/plain.
  CHECK(Run(curl + "-d 'volume=db1' " + base + "/v1/echo") == "415");
  CHECK(Run(curl + "-F 'volume=db1' " + base + "/v1/echo") == "415");
  CHECK(Run(curl + "-H 'Content-Type: text/plain' -d '{}' " + base + "/v1/echo") == "415");
  CHECK(Run(curl + "-H 'Content-Type: application/json; charset=utf-8' -d '{}' " + base + "/v1/echo") == "201");
}

}  // namespace
}  // namespace cdp

// SPDX-License-Identifier: Apache-2.0
// Online verify (issue #13): `cdpctl verify` against real daemons while a real
// NBD client keeps writing reports no difference that is not there, finds the
// one 4 KiB block rotted behind the master target's back, and --repair mends it.
#include <catch2/catch.hpp>

#include <atomic>
#include <boost/json.hpp>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "common/http/http_client.h"
#include "e2e/harness.h"
#include "common/nbd/nbd_client.h"

namespace {

using cdp::e2e::Cluster;
using cdp::e2e::ClusterOptions;
using cdp::e2e::Sha256File;
namespace json = boost::json;

struct VerifyRun {
  int exit_code = -1;
  std::string output;
  json::object result;  // the --json answer (empty when none)
};

VerifyRun Verify(Cluster& c, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"--json", "verify", c.options().volume};
  args.insert(args.end(), extra.begin(), extra.end());
  auto r = c.Cdpctl(args, 120000);
  VerifyRun v;
  v.exit_code = r.exit_code;
  v.output = r.output;
  // The JSON answer is the last line that is an object (warnings may precede it).
  std::istringstream in(r.output);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] != '{') continue;
    boost::system::error_code ec;
    json::value j = json::parse(line, ec);
    if (!ec && j.is_object()) v.result = j.as_object();
  }
  return v;
}

uint64_t U64(const json::object& o, const char* key) { return json::value_to<uint64_t>(o.at(key)); }

// Writes random data through the agent's tap until told to stop: 4..16 KiB
// writes, two in three into one hot 1 MiB region, about 8 MB/s, a flush now
// and then.
constexpr uint64_t kHotOffset = 8ull << 20;
constexpr uint64_t kHotLength = 1ull << 20;
class Churn {
 public:
  Churn(const std::string& uri, uint64_t size) : uri_(uri), size_(size) {}
  ~Churn() { Stop(); }
  void Start() {
    t_ = std::thread([this] { Run(); });
  }
  void Stop() {
    stop_ = true;
    if (t_.joinable()) t_.join();
  }
  uint64_t writes() const { return writes_.load(); }
  const std::string& error() const { return error_; }

 private:
  void Run() {
    auto uri = cdp::ParseNbdUri(uri_);
    if (!uri.ok()) {
      error_ = uri.status().ToString();
      return;
    }
    auto client = cdp::NbdClient::Connect(*uri);
    if (!client.ok()) {
      error_ = client.status().ToString();
      return;
    }
    std::mt19937_64 rng(13);
    cdp::Bytes buf(16 << 10);
    const auto start = std::chrono::steady_clock::now();
    uint64_t bytes = 0;
    while (!stop_) {
      const uint64_t len = 4096 * (1 + rng() % 4);
      // Two writes in three hit one hot region: windows there are often disturbed.
      const bool hot = writes_ % 3 != 0;
      const uint64_t span = hot ? kHotLength : size_;
      const uint64_t off = (hot ? kHotOffset : 0) + (rng() % ((span - len) / 4096)) * 4096;
      for (size_t i = 0; i < len; i += 8) {
        const uint64_t x = rng();
        std::memcpy(buf.data() + i, &x, 8);
      }
      cdp::Status s = (*client)->Write(off, cdp::ByteSpan(buf.data(), len));
      if (s.ok() && writes_ % 50 == 49) s = (*client)->Flush();
      if (!s.ok()) {
        error_ = s.ToString();
        return;
      }
      ++writes_;
      bytes += len;
      // Pacing (not synchronization): about 8 MB/s.
      std::this_thread::sleep_until(start + std::chrono::microseconds(bytes / 8));
    }
    cdp::Status s = (*client)->Close();
    if (!s.ok()) error_ = s.ToString();
  }

  std::string uri_;
  uint64_t size_;
  std::thread t_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> writes_{0};
  std::string error_;
};

}  // namespace

TEST_CASE("online verify under churn reports no false difference and repairs a rotted block", "[e2e][verify]") {
  ClusterOptions o;
  o.volume_size = 64ull << 20;
  Cluster c(o);
  INFO(c.why());
  REQUIRE(c.Start());

  // 20 verify runs while the writer runs: not one difference.
  Churn churn(c.nbd_uri(), o.volume_size);
  churn.Start();
  REQUIRE(cdp::e2e::WaitFor([&] { return churn.writes() > 100 || !churn.error().empty(); }, std::chrono::seconds(30)));
  uint64_t compared = 0, busy = 0;
  for (int run = 0; run < 20; ++run) {
    const uint64_t before = churn.writes();
    VerifyRun v = Verify(c);
    INFO("run " << run << ": " << v.output << "\n" << churn.error() << "\n" << c.Logs());
    // 3: nothing differs, but busy regions went uncompared.
    REQUIRE(v.exit_code == (U64(v.result, "busy") > 0 ? 3 : 0));
    REQUIRE(v.result.contains("differences"));
    REQUIRE(v.result.at("differences").as_array().size() == 0);
    REQUIRE(U64(v.result, "regions") == 64);
    REQUIRE(U64(v.result, "compared") + U64(v.result, "busy") == 64);
    // Not even a region-level difference: both sides described each region
    // at the same sequence (a race would show here before the 4 KiB descent
    // hid it).
    REQUIRE(U64(v.result, "descended") == 0);
    compared += U64(v.result, "compared");
    busy += U64(v.result, "busy");
    // The writer really ran during this verify.
    REQUIRE(churn.writes() > before);
  }
  churn.Stop();
  INFO(churn.error());
  REQUIRE(churn.error().empty());
  WARN("20 runs under churn: " << compared << " regions compared, " << busy << " busy, " << churn.writes()
                               << " writes");
  REQUIRE(compared >= 20 * 64 / 2);  // most regions were really compared

  // The writer has stopped: rot one byte of one block behind the master target.
  bool drained = c.WaitDrained();
  INFO(c.why());
  REQUIRE(drained);
  const uint64_t block = (37ull << 20) + 5 * 4096;
  {
    std::fstream replica(c.replica_path(), std::ios::in | std::ios::out | std::ios::binary);
    REQUIRE(replica.good());
    replica.seekg(std::streamoff(block + 1234));
    char b = 0;
    replica.read(&b, 1);
    b = char(b ^ 0x01);
    replica.seekp(std::streamoff(block + 1234));
    replica.write(&b, 1);
    replica.flush();
    REQUIRE(replica.good());
  }
  VerifyRun rot = Verify(c);
  INFO(rot.output);
  REQUIRE(rot.exit_code == 1);
  const auto& diffs = rot.result.at("differences").as_array();
  REQUIRE(diffs.size() == 1);
  CHECK(U64(diffs[0].as_object(), "offset") == block);
  CHECK(U64(diffs[0].as_object(), "length") == 4096);
  // The text form names the block: "volume OFFSET LENGTH".
  auto text = c.Cdpctl({"verify", o.volume});
  INFO(text.output);
  CHECK(text.exit_code == 1);
  CHECK(text.output.find(o.volume + " " + std::to_string(block) + " 4096\n") != std::string::npos);

  // --repair ships exactly that block again and checks it.
  auto fix = c.Cdpctl({"verify", o.volume, "--repair"});
  INFO(fix.output);
  REQUIRE(fix.exit_code == 0);
  REQUIRE(fix.output.find(o.volume + " " + std::to_string(block) + " 4096 repaired\n") != std::string::npos);
  VerifyRun after = Verify(c);
  INFO(after.output);
  REQUIRE(after.exit_code == 0);
  REQUIRE(after.result.at("differences").as_array().size() == 0);
  REQUIRE(U64(after.result, "compared") == 64);
  drained = c.WaitDrained();
  INFO(c.why());
  REQUIRE(drained);
  REQUIRE(Sha256File(c.replica_path()) == Sha256File(c.source_path()));
}

TEST_CASE("verify --repair: the agent refuses a repair range that is unaligned or outside the volume", "[e2e][verify]") {
  Cluster c;
  INFO(c.why());
  REQUIRE(c.Start());
  const std::string vol = c.options().volume;
  auto post = [&](const std::string& body) {
    cdp::http::ClientOptions co = cdp::e2e::ControlClient(c.token(cdp::e2e::Which::kAgent));
    auto r = cdp::http::HttpRequest("127.0.0.1", c.agent_control(), "POST", "/v1/repair", body,
                                    std::chrono::milliseconds(30000), co);
    return r.ok() ? std::to_string(r->status) : r.status().ToString();
  };
  const std::string size = std::to_string(c.options().volume_size);
  CHECK(post(R"({"volume": ")" + vol + R"(", "offset": 100, "length": 4096})") == "400");
  CHECK(post(R"({"volume": ")" + vol + R"(", "offset": 4096, "length": 100})") == "400");
  CHECK(post(R"({"volume": ")" + vol + R"(", "offset": )" + size + R"(, "length": 4096})") == "400");
  CHECK(post(R"({"volume": ")" + vol + R"(", "offset": 0, "length": 0})") == "400");
  CHECK(post(R"({"volume": "nope", "offset": 0, "length": 4096})") == "404");
  CHECK(post(R"({"volume": ")" + vol + R"(", "offset": 0, "length": 8192})") == "200");
}

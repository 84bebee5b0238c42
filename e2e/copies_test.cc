// SPDX-License-Identifier: Apache-2.0
// Copies to two sites (issue 16, tests 4 and 5): the process server ships the
// volume to two real master targets in parallel, each from its own cursor in
// the one spool (process-server/spooled_volume.h).
//   4. MT B down for a while: MT A keeps a lag under 2 s; after B returns both
//      replicas equal the source and a tag exports the same image from both,
//      at the same sequence.
//   5. kill -9 of the PS during two-copy shipping: nothing lost at either MT.
// MT A and MT B are the cluster's (e2e/harness.h, master_targets = 2): the
// harness names both to the PS (two `mt` keys, `copies = 2`).
#include <atomic>
#include <boost/json.hpp>
#include <catch2/catch.hpp>
#include <ctime>
#include <thread>

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

uint64_t U64(const json::value& v, const char* key) { return json::value_to<uint64_t>(v.at(key)); }

// MT B, the cluster's second master target, as these tests use it.
class SecondMt {
 public:
  explicit SecondMt(Cluster& c) : c_(c) {}

  std::string data_address() const { return "127.0.0.1:" + std::to_string(c_.mtb_data_port()); }
  bool Restart() { return c_.Restart(Which::kMasterTargetB); }
  bool Kill9() { return c_.Kill9(Which::kMasterTargetB); }
  // The volume's applied sequence at MT B (0 when not known yet).
  uint64_t Applied(const std::string& volume) const {
    auto s = c_.StatusOf(Which::kMasterTargetB);
    if (!s) return 0;
    for (const auto& v : s->at("volumes").as_array())
      if (v.as_object().at("volume").as_string() == volume) return U64(v, "applied_seq");
    return 0;
  }
  std::string replica_path() const { return c_.mtb_replica_path(); }
  // cdpctl --json against MT B; nullopt (why) on failure.
  std::optional<json::value> CdpctlJson(const std::vector<std::string>& args, std::string* why) {
    std::vector<std::string> argv = {CDP_CTL_BIN,
                                     "--json",
                                     "--mt",
                                     "127.0.0.1:" + std::to_string(c_.mtb_control()),
                                     "--mt-token-file",
                                     c_.token_path(Which::kMasterTargetB),
                                     "--tenant",
                                     c_.options().tenant,
                                     "--tls-ca",
                                     cdp::e2e::ControlClient("").tls_ca};
    argv.insert(argv.end(), args.begin(), args.end());
    auto r = cdp::testing::RunCommand(argv, 60000);
    boost::system::error_code ec;
    json::value v = json::parse(r.output, ec);
    if (r.exit_code != 0 || ec) {
      *why = "cdpctl at MT B: " + r.output;
      return std::nullopt;
    }
    return v;
  }
  // Exports `point` of the volume at MT B into `dest` with nbdcopy.
  bool CopyExport(const std::string& point, const std::string& dest, std::string* why) {
    auto e = CdpctlJson({"export", c_.options().volume + "@" + point}, why);
    if (!e) return false;
    const std::string name(e->at("export").as_string());
    const std::string uri = "nbds://127.0.0.1:" + std::to_string(c_.mtb_nbd_port()) + "/" + name +
                            "?tls-certificates=" + c_.nbd_client_dir();
    auto r = cdp::testing::RunCommand({"nbdcopy", uri, dest}, 120000);
    (void)CdpctlJson({"unexport", name}, why);
    if (r.exit_code != 0) *why = "nbdcopy " + uri + ": " + r.output;
    return r.exit_code == 0;
  }

 private:
  Cluster& c_;
};

// The recovery point named `tag` in a `cdpctl points --json` answer: {id, seq}; {-1, 0} if absent.
std::pair<int64_t, uint64_t> TagPoint(const json::value& points, const std::string& tag) {
  for (const auto& v : points.at("points").as_array()) {
    const json::object& o = v.as_object();
    const json::value* n = o.if_contains("name");
    if (n && n->is_string() && n->as_string() == tag) return {json::value_to<int64_t>(o.at("id")), U64(v, "seq")};
  }
  return {-1, 0};
}

// The PS's copies of the cluster's volume (/v1/volumes "copies"); empty if not answered.
json::array PsCopies(Cluster& c) {
  auto s = GetJson(c.ps_control(), "/v1/volumes", c.token(Which::kProcessServer));
  if (!s) return {};
  for (const auto& v : s->at("volumes").as_array())
    if (v.as_object().at("volume").as_string() == c.options().volume) return v.at("copies").as_array();
  return {};
}

ClusterOptions TwoCopies() {
  ClusterOptions o;
  o.master_targets = 2;
  return o;
}

// Both MTs have applied every record the agent captured, and the PS says
// so for both copies; *last gets what was seen.
bool BothDrained(Cluster& c, SecondMt& b, std::string* last) {
  bool a = c.WaitDrained(std::chrono::seconds(120));
  if (!a) {
    *last = c.why();
    return false;
  }
  const uint64_t seq = c.AgentU64("next_seq") - 1;
  return WaitFor(
      [&] {
        json::array copies = PsCopies(c);
        const uint64_t bb = b.Applied(c.options().volume);
        *last = "agent last seq " + std::to_string(seq) + ", MT B applied " + std::to_string(bb) + ", PS copies " +
                json::serialize(copies);
        return bb == seq && copies.size() == 2 && U64(copies[0], "acked_seq") == seq &&
               U64(copies[1], "acked_seq") == seq;
      },
      std::chrono::seconds(120), std::chrono::milliseconds(100));
}

}  // namespace

TEST_CASE(
    "two copies: MT B down for a while, MT A keeps its lag under 2 s, after B returns both replicas "
    "equal the source and a tag exports equally from both",
    "[e2e][copies]") {
  RequireClients();
  Cluster c(TwoCopies());
  INFO(c.why());
  REQUIRE(c.Start());
  SecondMt b(c);
  const uint64_t size = c.options().volume_size;

  // Writes, then a tag, with both MTs up.
  std::string w = RandomWrites(c.nbd_uri(), size, 41, 3, 30, 2 << 20, c.dir());
  INFO(w);
  REQUIRE(w.empty());
  const std::string at_tag = c.Path("at-tag.img");
  REQUIRE(cdp::e2e::CopyFile(c.source_path(), at_tag));
  auto t = c.Cdpctl({"tag", "before-b-down"});
  INFO(t.output);
  REQUIRE(t.exit_code == 0);
  std::string last;
  bool drained = BothDrained(c, b, &last);
  INFO(last);
  REQUIRE(drained);

  // MT B dies; a writer keeps going. MT A's copy never lags 2 s behind
  // while B's falls behind.
  REQUIRE(b.Kill9());
  std::atomic<bool> done{false};
  std::string err;
  std::thread writer([&] {
    err = RandomWrites(c.nbd_uri(), size, 42, 25, 30, 2 << 20, c.dir());
    done = true;
  });
  double worst_a = 0;
  uint64_t samples = 0, b_behind = 0;
  std::string seen;
  // The sampling loop ends with the writer (a condition, not a sleep).
  (void)WaitFor(
      [&] {
        json::array copies = PsCopies(c);
        if (copies.size() == 2) {
          worst_a = std::max(worst_a, copies[0].at("lag_seconds").to_number<double>());
          if (U64(copies[1], "lag_records") > 0) ++b_behind;
          ++samples;
          seen = json::serialize(copies);
        }
        return done.load();
      },
      std::chrono::seconds(240), std::chrono::milliseconds(100));
  writer.join();
  INFO(err);
  REQUIRE(err.empty());
  // MT A catches up with everything within 2 s of the last write's ack.
  const uint64_t captured = c.AgentU64("next_seq") - 1;
  bool a_caught_up = WaitFor(
      [&] {
        json::array copies = PsCopies(c);
        return copies.size() == 2 && U64(copies[0], "acked_seq") >= captured;
      },
      std::chrono::seconds(2), std::chrono::milliseconds(20));
  INFO("worst lag of MT A while B was down: " << worst_a << " s over " << samples << " samples; last " << seen);
  CHECK(samples > 0);
  CHECK(worst_a < 2.0);
  CHECK(a_caught_up);
  // B really fell behind, and the spool holds what B has not acknowledged.
  CHECK(b_behind > 0);
  json::array copies = PsCopies(c);
  REQUIRE(copies.size() == 2);
  CHECK(U64(copies[1], "acked_seq") < captured);
  CHECK(U64(copies[1], "lag_records") > 0);

  // cdpctl status shows each copy's lag.
  auto st = c.Cdpctl({"status"});
  INFO(st.output);
  CHECK(st.output.find("copy 0 ") != std::string::npos);
  CHECK(st.output.find("copy 1 " + b.data_address()) != std::string::npos);

  // B returns: both replicas end equal to the source.
  REQUIRE(b.Restart());
  drained = BothDrained(c, b, &last);
  INFO(last << "\n" << c.Logs());
  REQUIRE(drained);
  const std::string src = Sha256File(c.source_path());
  REQUIRE(src.size() == 64);
  CHECK(Sha256File(c.replica_path()) == src);
  CHECK(Sha256File(b.replica_path()) == src);

  // The tag is the same point at both sites: same sequence, same image.
  auto pa = c.CdpctlJson({"points", c.options().volume});
  std::string why;
  auto pb = b.CdpctlJson({"points", c.options().volume}, &why);
  INFO(c.why() << why);
  REQUIRE(pa.has_value());
  REQUIRE(pb.has_value());
  auto [ida, seqa] = TagPoint(*pa, "before-b-down");
  auto [idb, seqb] = TagPoint(*pb, "before-b-down");
  REQUIRE(ida >= 0);
  REQUIRE(idb >= 0);
  CHECK(seqa == seqb);
  CHECK(seqa > 0);
  const std::string ea = c.Path("export-a.img"), eb = c.Path("export-b.img");
  bool copied_a = c.CopyExport(std::to_string(ida), ea);
  INFO(c.why());
  REQUIRE(copied_a);
  bool copied_b = b.CopyExport(std::to_string(idb), eb, &why);
  INFO(why);
  REQUIRE(copied_b);
  const std::string tag_sum = Sha256File(at_tag);
  CHECK(Sha256File(ea) == tag_sum);
  CHECK(Sha256File(eb) == tag_sum);
  CHECK(tag_sum != src);  // writes after the tag: the export is not just the final image

  // Issue 38 F4: points carry the host's time, so B, which applied most of
  // them late, lists the same points as A: same ids, sequences, times.
  auto key = [](const json::value& p) {
    const json::object& o = p.as_object();
    return json::serialize(json::object{{"id", o.at("id")}, {"seq", o.at("seq")}, {"time_us", o.at("time_us")},
                                        {"kind", o.at("kind")}, {"name", o.at("name")}});
  };
  const json::array& la = pa->at("points").as_array();
  const json::array& lb = pb->at("points").as_array();
  REQUIRE(la.size() == lb.size());
  size_t later_at_b = 0;
  for (size_t i = 0; i < la.size(); ++i) {
    CHECK(key(la[i]) == key(lb[i]));
    if (lb[i].at("applied_us").to_number<uint64_t>() > la[i].at("applied_us").to_number<uint64_t>()) ++later_at_b;
  }
  CHECK(ida == idb);
  CHECK(later_at_b > 0);  // B applied them later, yet lists the host's times
  // VOLUME@TIME (the tag's own time, UTC to the microsecond) names the tag at both.
  uint64_t tag_us = 0;
  for (const auto& p : la)
    if (p.at("name") == "before-b-down") tag_us = p.at("time_us").to_number<uint64_t>();
  REQUIRE(tag_us > 0);
  std::time_t secs = std::time_t(tag_us / 1'000'000);
  char when[64];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", std::gmtime(&secs));
  char frac[16];
  std::snprintf(frac, sizeof frac, ".%06lluZ", static_cast<unsigned long long>(tag_us % 1'000'000));
  const std::string at = std::string(when) + frac;
  const std::string ta = c.Path("export-a-time.img"), tb = c.Path("export-b-time.img");
  copied_a = c.CopyExport(at, ta);
  INFO(c.why() << " at " << at);
  REQUIRE(copied_a);
  copied_b = b.CopyExport(at, tb, &why);
  INFO(why);
  REQUIRE(copied_b);
  CHECK(Sha256File(ta) == tag_sum);
  CHECK(Sha256File(tb) == tag_sum);
}

TEST_CASE("two copies: kill -9 of the process server during two-copy shipping loses no record at either MT",
          "[e2e][copies][crash]") {
  RequireClients();
  Cluster c(TwoCopies());
  INFO(c.why());
  REQUIRE(c.Start());
  SecondMt b(c);
  const uint64_t size = c.options().volume_size;

  for (uint32_t round = 0; round < 2; ++round) {
    INFO("round " << round);
    const uint64_t before = c.AgentU64("captured_ops");
    const uint64_t b_before = b.Applied(c.options().volume);
    std::string err;
    std::atomic<bool> done{false};
    std::thread writer([&] {
      err = RandomWrites(c.nbd_uri(), size, 500 + round, 6, 30, 2 << 20, c.dir());
      done = true;
    });
    // Mid-stream: new writes captured and both copies shipping (B applied
    // something new) before the kill.
    bool started =
        WaitFor([&] { return c.AgentU64("captured_ops") > before + 20 && b.Applied(c.options().volume) > b_before; },
                std::chrono::seconds(60));
    const bool writer_running = !done;
    bool killed = started && c.Kill9(Which::kProcessServer);
    bool restarted = killed && c.Restart(Which::kProcessServer);
    writer.join();
    WARN("PS killed with the writer " << (writer_running ? "running" : "finished"));
    INFO(c.why());
    REQUIRE(started);
    REQUIRE(killed);
    REQUIRE(restarted);
    INFO(err);
    REQUIRE(err.empty());
  }
  std::string w = RandomWrites(c.nbd_uri(), size, 600, 2, 30, 1 << 20, c.dir());
  INFO(w);
  REQUIRE(w.empty());
  std::string last;
  bool drained = BothDrained(c, b, &last);
  INFO(last << "\n" << c.Logs());
  REQUIRE(drained);
  const std::string src = Sha256File(c.source_path());
  REQUIRE(src.size() == 64);
  CHECK(Sha256File(c.replica_path()) == src);
  CHECK(Sha256File(b.replica_path()) == src);
  // Acknowledged sequences agree everywhere: the agent's last, both MTs'
  // applied, both copy cursors, and the spool holds nothing more.
  const uint64_t seq = c.AgentU64("next_seq") - 1;
  CHECK(c.AgentU64("acked_seq") == seq);
  CHECK(b.Applied(c.options().volume) == seq);
  auto vols = GetJson(c.ps_control(), "/v1/volumes", c.token(Which::kProcessServer));
  REQUIRE(vols.has_value());
  const json::value& v = vols->at("volumes").at(0);
  CHECK(U64(v, "mt_acked_seq") == seq);
  CHECK(U64(v, "spool_durable_seq") == seq);
  CHECK(U64(v, "backlog_records") == 0);
  CHECK(U64(v.at("copies").at(0), "acked_seq") == seq);
  CHECK(U64(v.at("copies").at(1), "acked_seq") == seq);
}

// SPDX-License-Identifier: Apache-2.0
#include <catch2/catch.hpp>

#include <boost/json.hpp>

#include "loadgen/data.h"
#include "loadgen/plan.h"
#include "loadgen/profile.h"

using namespace cdp;
using namespace cdp::loadgen;

namespace {

// Ten 60 s intervals; 120 MB written in the first, nothing after.
Profile Burst() {
  Profile p;
  for (int i = 0; i < 10; ++i) p.samples.push_back({60.0 * i, i == 0 ? 120e6 : 0.0, 60});
  return p;
}

}  // namespace

TEST_CASE("Profile CSV: header, two- and three-column forms, implied intervals", "[plan][profile]") {
  auto p = ParseProfileCsv("# recorded\ntimestamp,bytes\n100,10\n110,20\n130,30\n");
  REQUIRE(p.ok());
  REQUIRE(p->samples.size() == 3);
  CHECK(p->samples[0].seconds == 10);
  CHECK(p->samples[1].seconds == 20);
  CHECK(p->samples[2].seconds == 20);  // the last lasts as long as the one before
  CHECK(p->total_bytes() == 60);
  CHECK(p->total_seconds() == 50);
  auto q = ParseProfileCsv("timestamp,bytes,seconds\r\n5,1000,2.5\r\n7.5,0,2.5\r\n");
  REQUIRE(q.ok());
  CHECK(q->samples[0].seconds == 2.5);
  CHECK(q->samples[1].timestamp == 7.5);
  auto round = ParseProfileCsv(FormatProfileCsv(*q));
  REQUIRE(round.ok());
  CHECK(round->samples.size() == 2);
  CHECK(round->samples[0].bytes == 1000);
}

TEST_CASE("Profile CSV errors name the line", "[plan][profile]") {
  auto a = ParseProfileCsv("timestamp,bytes\n10,1\n5,1\n");
  CHECK(a.status().code() == Code::kInvalidArgument);
  CHECK(a.status().message() == "profile line 3: timestamps must increase");
  auto b = ParseProfileCsv("1,-5,1\n");
  CHECK(b.status().message() == "profile line 1: bad bytes '-5'");
  auto c = ParseProfileCsv("time,bytes\n1,1\n");
  CHECK(c.status().message() == "profile line 1: header must be 'timestamp,bytes' or 'timestamp,bytes,seconds[,...]'");
  CHECK(ParseProfileCsv("1,5\n").status().code() == Code::kInvalidArgument);  // one row, no interval
  CHECK(ParseProfileCsv("").status().code() == Code::kInvalidArgument);
  CHECK(ParseProfileCsv("1,5,0\n").status().message() == "profile line 1: bad seconds '0'");
}

// The optional columns (cdp-loadgen profile, loadgen/device_profile.h): unique bytes,
// lost events and a per-device breakdown; unique bytes may be unknown.
TEST_CASE("Profile CSV optional columns: unique bytes, lost events, devices", "[plan][profile]") {
  auto p = ParseProfileCsv(
      "# cdp-loadgen profile: source tracefs\n"
      "timestamp,bytes,seconds,unique_bytes,lost_events,bytes:sda,unique_bytes:sda,bytes:sdb,unique_bytes:sdb\n"
      "100,12288,10,8192,0,4096,4096,8192,4096\n"
      "110,0,10,0,3,0,0,0,0\n"
      "# lost events: 3\n");
  REQUIRE(p.ok());
  CHECK(p->devices == std::vector<std::string>{"sda", "sdb"});
  REQUIRE(p->samples.size() == 2);
  CHECK(p->samples[0].bytes == 12288);
  CHECK(p->samples[0].unique_bytes == 8192);
  CHECK(p->samples[0].device_bytes == std::vector<double>{4096, 8192});
  CHECK(p->samples[0].device_unique == std::vector<double>{4096, 4096});
  CHECK(p->samples[1].lost_events == 3);
  // /proc/diskstats: unique bytes not known.
  auto d = ParseProfileCsv("timestamp,bytes,seconds,unique_bytes,lost_events,bytes:sda,unique_bytes:sda\n1,512,1,,0,512,\n");
  REQUIRE(d.ok());
  CHECK(d->samples[0].unique_bytes == -1);
  CHECK(d->samples[0].device_unique == std::vector<double>{-1});
  CHECK(ParseProfileCsv("timestamp,bytes,seconds,unique_bytes\n1,5,1\n").status().message() ==
        "profile line 2: expected 4 columns, as the header");
  CHECK(ParseProfileCsv("timestamp,bytes,seconds,colour\n1,5,1,2\n").status().message() ==
        "profile line 1: unknown column 'colour'");
  CHECK(ParseProfileCsv("timestamp,bytes,seconds,lost_events\n1,5,1,\n").status().message() ==
        "profile line 2: bad value '' in column 4");
  // Plain churn profiles read as before: none of the optional columns.
  auto old = ParseProfileCsv("timestamp,bytes,seconds\n1,5,1\n");
  REQUIRE(old.ok());
  CHECK(old->samples[0].unique_bytes == -1);
  CHECK(old->devices.empty());
}

TEST_CASE("Churn statistics of a hand-computed profile", "[plan]") {
  Profile p;
  // Four 60 s intervals: 60 MB, 0, 0, 0 -> rates 1e6, 0, 0, 0 B/s.
  for (int i = 0; i < 4; ++i) p.samples.push_back({1000.0 + 60 * i, i == 0 ? 60e6 : 0.0, 60});
  ChurnStats s = ComputeStats(p);
  CHECK(s.total_bytes == 60e6);
  CHECK(s.duration_s == 240);
  CHECK(s.avg == 250000);
  CHECK(s.p50 == 0);      // half the time (120 of 240 s) at rate 0
  CHECK(s.p95 == 1e6);
  CHECK(s.p99 == 1e6);
  CHECK(s.max == 1e6);
  CHECK(s.peak_timestamp == 1000);
  CHECK(s.gb_per_day == Approx(21.6).epsilon(1e-12));  // 250000 x 86400 / 1e9
  CHECK(s.peak_hour_bytes == 900e6);  // 240 s profile: 60 MB x 3600 / 240
  CHECK(s.peak_hour_extrapolated);
  // One hour and more of profile: the busiest hour as recorded.
  for (int i = 4; i < 70; ++i) p.samples.push_back({1000.0 + 60 * i, i == 65 ? 30e6 : 0.0, 60});
  s = ComputeStats(p);
  CHECK(s.peak_hour_bytes == 60e6);
  CHECK_FALSE(s.peak_hour_extrapolated);
}

TEST_CASE("Weighted percentile and window maximum", "[plan]") {
  CHECK(WeightedPercentile({5, 1, 3}, {1, 1, 1}, 50) == 3);
  CHECK(WeightedPercentile({5, 1, 3}, {1, 1, 8}, 50) == 3);
  CHECK(WeightedPercentile({5, 1, 3}, {8, 1, 1}, 50) == 5);
  CHECK(WeightedPercentile({5, 1, 3}, {1, 1, 1}, 100) == 5);
  Profile p;
  for (int i = 0; i < 5; ++i) p.samples.push_back({10.0 * i, double(i + 1), 10});
  bool ex = true;
  CHECK(WindowMax(p, 20, &ex) == 9);  // 4 + 5
  CHECK_FALSE(ex);
  CHECK(WindowMax(p, 30, &ex) == 12);  // 3 + 4 + 5
  CHECK(WindowMax(p, 100, &ex) == 30);  // 15 bytes over 50 s, extrapolated to 100 s
  CHECK(ex);
}

TEST_CASE("Queue model lags at a given bandwidth", "[plan]") {
  Profile p = Burst();
  // B = 125000 B/s: Q_k = 120e6 - 7.5e6 k, lag_k = 960 - 60 k.
  auto lag = SimulateLag(p, 1.0, 125000);
  REQUIRE(lag.size() == 10);
  for (int k = 1; k <= 10; ++k) CHECK(lag[k - 1] == Approx(960.0 - 60 * k).epsilon(1e-12));
  // B = 250000 B/s: Q_k = 120e6 - 15e6 k, empty from k = 8.
  lag = SimulateLag(p, 1.0, 250000);
  CHECK(lag[0] == Approx(420));
  CHECK(lag[6] == Approx(60));
  CHECK(lag[7] == 0);
  CHECK(lag[9] == 0);
}

TEST_CASE("Required bandwidth for RPO targets met 100% and 90% of the time", "[plan]") {
  Profile p = Burst();
  // 100%: lag_1 = 120e6/B - 60 <= 900  ->  B = 120e6 / 960 = 125000 B/s (1 Mbit/s).
  CHECK(RequiredBandwidth(p, 1.0, 900, 100) == Approx(125000).epsilon(1e-9));
  // 90%: nine of ten intervals, so the second-largest lag: 120e6/B - 120 <= 900.
  CHECK(RequiredBandwidth(p, 1.0, 900, 90) == Approx(120e6 / 1020).epsilon(1e-9));
  // 95% of 600 s needs all ten intervals: the same as 100%.
  CHECK(RequiredBandwidth(p, 1.0, 900, 95) == Approx(125000).epsilon(1e-9));
  // Growth 50% and compression 2: 90 MB shipped.
  CHECK(RequiredBandwidth(p, 1.5 / 2, 900, 100) == Approx(90e6 / 960).epsilon(1e-9));
  CHECK(RequiredBandwidth(p, 1.5 / 2, 1800, 90) == Approx(90e6 / 1920).epsilon(1e-9));
  Profile idle;
  idle.samples.push_back({0, 0, 60});
  CHECK(RequiredBandwidth(idle, 1.0, 900, 100) == 0);
}

TEST_CASE("MakePlan: link RPO, PS cache, drain time, journal - Markdown and JSON", "[plan]") {
  Profile p = Burst();
  PlanOptions o;
  o.rpo_s = {900, 1800};
  o.link_bytes_per_s = 250000;  // 2 Mbit/s
  o.outage_hours = 0.1;         // 360 s window
  o.retention_s = 86400;
  auto r = MakePlan(p, o);
  REQUIRE(r.ok());
  CHECK(r->avg_shipped == 200000);
  REQUIRE(r->rows.size() == 2);
  CHECK(r->rows[0].bw_100 == Approx(125000).epsilon(1e-9));
  CHECK(r->rows[0].bw_90 == Approx(120e6 / 1020).epsilon(1e-9));
  CHECK(r->rows[1].bw_100 == Approx(120e6 / 1860).epsilon(1e-9));
  CHECK(r->link_lag_max == Approx(420));
  CHECK(r->link_lag_90 == Approx(360));  // nine smallest of 420,360,...,60,0,0,0
  CHECK(r->link_final_backlog == 0);
  CHECK_FALSE(r->link_below_average);
  CHECK(r->ps_cache_bytes == 120e6);
  CHECK_FALSE(r->ps_cache_extrapolated);
  CHECK(r->ps_drain_s == Approx(120e6 / 50000.0));  // spare 250000 - 200000 B/s
  CHECK(r->journal_bytes == Approx(120e6 * 86400 / 600));
  CHECK(r->journal_extrapolated);

  std::string md = RenderPlanMarkdown(*r);
  CHECK(md.find("| 15m | 1.00 Mbit/s | 0.94 Mbit/s | 1.00 Mbit/s |") != std::string::npos);
  CHECK(md.find("| worst (100%) | 7.0 min |") != std::string::npos);
  CHECK(md.find("| average | 0.20 MB/s |") != std::string::npos);
  auto j = RenderPlanJson(*r).as_object();
  CHECK(j.at("rpo").as_array()[0].as_object().at("bw_100_bps").to_number<double>() == Approx(1e6).epsilon(1e-9));
  CHECK(j.at("link").as_object().at("lag_max_s").to_number<double>() == Approx(420));
  CHECK(j.at("ps_cache").as_object().at("bytes").to_number<double>() == 120e6);

  // A 1 Mbit/s link is below the 1.6 Mbit/s average: flagged, backlog left.
  o.link_bytes_per_s = 125000;
  r = MakePlan(p, o);
  REQUIRE(r.ok());
  CHECK(r->link_below_average);
  CHECK(r->link_lag_max == Approx(900));
  CHECK(r->link_lag_90 == Approx(840));
  CHECK(r->link_final_backlog == Approx(45e6));
  CHECK(r->ps_drain_s == -1);
  CHECK(RenderPlanMarkdown(*r).find("backlog grows without bound") != std::string::npos);
}

TEST_CASE("MakePlan: the RPO curve against link utilisation, by hand, in Markdown and JSON", "[plan]") {
  Profile p = Burst();  // 200000 B/s on average
  PlanOptions o;
  o.curve = {0.5, 0.8};
  auto r = MakePlan(p, o);
  REQUIRE(r.ok());
  REQUIRE(r->curve.size() == 2);
  // u = 0.5: B = 400000 B/s, lag_k = (120e6 - 24e6 k) / 4e5 = 240, 180, 120, 60, then 0.
  CHECK(r->curve[0].link_bytes_per_s == Approx(400000));
  CHECK(r->curve[0].lag_p50 == 0);  // six of ten intervals have no lag
  CHECK(r->curve[0].lag_p99 == Approx(240));
  CHECK(r->curve[0].lag_max == Approx(240));
  // u = 0.8: B = 250000 B/s, lag_k = 480 - 60 k until 0: 420, 360, ..., 60, 0, 0, 0.
  CHECK(r->curve[1].link_bytes_per_s == Approx(250000));
  CHECK(r->curve[1].lag_p50 == Approx(120));  // the fifth smallest of 0, 0, 0, 60, 120, ...
  CHECK(r->curve[1].lag_p99 == Approx(420));
  CHECK(r->curve[1].lag_max == Approx(420));
  const std::string md = RenderPlanMarkdown(*r);
  CHECK(md.find("| 50% | 3.20 Mbit/s | 0.0 s | 4.0 min | 4.0 min |") != std::string::npos);
  CHECK(md.find("| 80% | 2.00 Mbit/s | 2.0 min | 7.0 min | 7.0 min |") != std::string::npos);
  auto j = RenderPlanJson(*r).as_object();
  const auto& c = j.at("rpo_curve").as_array();
  REQUIRE(c.size() == 2);
  CHECK(c[1].as_object().at("link_bps").to_number<double>() == Approx(2e6));
  CHECK(c[1].as_object().at("lag_p99_s").to_number<double>() == Approx(420));
  // An idle profile has no curve (no rate to be a share of).
  Profile idle;
  idle.samples.push_back({0, 0, 60});
  r = MakePlan(idle, o);
  REQUIRE(r.ok());
  CHECK(r->curve.empty());
}

TEST_CASE("MakePlan rejects bad options", "[plan]") {
  Profile p = Burst();
  PlanOptions o;
  o.compression = 0.5;
  CHECK(MakePlan(p, o).status().code() == Code::kInvalidArgument);
  o = PlanOptions();
  o.rpo_s.clear();
  CHECK(MakePlan(p, o).status().code() == Code::kInvalidArgument);
  o = PlanOptions();
  o.percentile = 0;
  CHECK(MakePlan(p, o).status().code() == Code::kInvalidArgument);
  o = PlanOptions();
  o.curve = {0.5, 1.5};
  CHECK(MakePlan(p, o).status().code() == Code::kInvalidArgument);
  o.curve = {0};
  CHECK(MakePlan(p, o).status().code() == Code::kInvalidArgument);
  CHECK(MakePlan(Profile(), PlanOptions()).status().code() == Code::kInvalidArgument);
}

TEST_CASE("Measured compression ratio: zeros compress, random data does not", "[plan]") {
  Bytes zeros(4 << 20, 0);
  auto z = MeasureCompressionRatio(zeros);
  REQUIRE(z.ok());
  CHECK(*z > 1000);
  loadgen::DataMix mix;
  mix.compressibility = 0;
  loadgen::DataGenerator gen(mix);
  auto r = MeasureCompressionRatio(gen.Generate(2 << 20));
  REQUIRE(r.ok());
  CHECK(*r == Approx(1.0).epsilon(0.01));
  CHECK(MeasureCompressionRatio(ByteSpan()).status().code() == Code::kInvalidArgument);
}

// A version-2 profile (cdp-loadgen profile): the coalesced stream is planned
// as well. Burst() again, where the 120 MB written in the first minute touched
// 60 MB of unique blocks: an RPO of 60 s needs B with 120e6 / B - 60 <= 60,
// B = 1 MB/s, for the raw stream, and 0.5 MB/s coalesced.
TEST_CASE("MakePlan: a device profile plans the raw and the coalesced stream, per device", "[plan]") {
  Profile p = Burst();
  p.devices = {"sda", "sdb"};
  for (auto& s : p.samples) {
    s.unique_bytes = s.bytes / 2;
    s.device_bytes = {s.bytes / 4, s.bytes * 3 / 4};
    s.device_unique = {s.bytes / 8, s.bytes * 3 / 8};
  }
  p.samples[3].lost_events = 7;
  PlanOptions o;
  o.rpo_s = {60};
  o.link_bytes_per_s = 1e6;
  auto r = MakePlan(p, o);
  REQUIRE(r.ok());
  REQUIRE(r->coalesced);
  CHECK(r->rows[0].bw_100 == Approx(1e6).epsilon(1e-6));
  CHECK(r->coalesced->rows[0].bw_100 == Approx(0.5e6).epsilon(1e-6));
  CHECK(r->coalesced->stats.total_bytes == 60e6);
  CHECK(r->link_lag_max == Approx(60).epsilon(1e-9));
  CHECK(r->coalesced->link_lag_max == Approx(0).margin(1e-9));  // 60 MB in 60 s on a 1 MB/s link
  REQUIRE(r->devices.size() == 2);
  CHECK(r->devices[0].name == "sda");
  CHECK(r->devices[0].bytes == 30e6);
  CHECK(r->devices[1].unique_bytes == 45e6);
  CHECK(r->devices[1].gb_per_day == Approx(90e6 / 600 * 86400 / 1e9));
  CHECK(r->lost_events == 7);
  const std::string md = RenderPlanMarkdown(*r);
  CHECK(md.find("## The coalesced stream") != std::string::npos);
  CHECK(md.find("| sdb | ") != std::string::npos);
  CHECK(md.find("**The profile lost 7 write events**") != std::string::npos);
  const auto j = RenderPlanJson(*r).as_object();
  CHECK(j.at("coalesced").as_object().at("rpo").as_array().size() == 1);
  CHECK(j.at("devices").as_array().size() == 2);
  // Unique bytes not known in one row (diskstats): no coalesced plan.
  p.samples[5].unique_bytes = -1;
  auto raw = MakePlan(p, o);
  REQUIRE(raw.ok());
  CHECK_FALSE(raw->coalesced);
}

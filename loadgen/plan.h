// SPDX-License-Identifier: Apache-2.0
// Plan: turn a churn profile into a WAN sizing report.
//
// Definitions (all checked by plan_test.cc against hand-computed profiles):
//   Interval i has W_i bytes written over d_i seconds; rate r_i = W_i / d_i.
//   Churn statistics (of the profile as recorded, before growth):
//     avg = sum W / sum d; p50/p95/p99 = duration-weighted nearest-rank
//     percentiles of r_i (the smallest r such that intervals with rate <= r
//     cover at least p% of the time); max = max r_i (peak, with its timestamp);
//     GB/day = avg x 86400 / 1e9; peak hour = the largest sum of W over
//     intervals starting within any 3600 s window.
//   Sizing uses W'_i = W_i x (1 + growth) and ships W'_i / c (c = compression ratio).
//   Queue model, interval by interval, from an empty queue:
//     Q_i = max(0, Q_{i-1} + W'_i / c - B d_i),  lag_i = Q_i / B  (seconds).
//   "RPO R met p% of the time" at bandwidth B: the duration-weighted p-th
//   percentile of lag_i is <= R (p = 100: every lag_i <= R).
//   Required bandwidth: the smallest B meeting it, by bisection (lag is
//   non-increasing in B) between 0 and max_i W'_i/(c d_i), to 1e-9 relative.
//   Achievable RPO at a link B: the lag percentiles at that B.
//   RPO curve: for each utilisation u in PlanOptions::curve, the link
//   B = avg shipped / u and the lag percentiles (p50, p99, max) there. The
//   model is a fluid queue: it sees only churn above the link within an
//   interval, not the link's RTT, batching or the pipeline's own limits, so
//   it is a floor that rpo_bench.sh measures against (docs/loadgen.md).
//   PS cache for an outage of H hours: the largest sum of W' over any H-hour
//   window (the spool keeps uncompressed records); if the profile is shorter
//   than H, total W' x H / duration (extrapolated; flagged).
//   Journal for a retention window T: the same over T (the undo journal keeps
//   the old data of every write, uncompressed).
//   Coalesced stream (a version-2 profile whose every row knows its unique
//   bytes, loadgen/device_profile.h): the same bandwidth rows, curve and link
//   lags with W_i = the interval's unique 4 KiB blocks x 4096, what a
//   catch-up ships when the agent's queue has fallen back to its bitmap or
//   metadata mode (each dirty block once per interval). The raw stream is
//   what data mode ships (every write, with its point in time); the two
//   bound the link between them. Per-device rows: each device's share.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/json/value.hpp>

#include "common/base/coding.h"
#include "common/base/result.h"
#include "loadgen/profile.h"

namespace cdp::loadgen {

struct ChurnStats {
  double total_bytes = 0;
  double duration_s = 0;
  double avg = 0, p50 = 0, p95 = 0, p99 = 0, max = 0;  // bytes per second
  double peak_timestamp = 0;                             // start of the max-rate interval
  double gb_per_day = 0;
  double peak_hour_bytes = 0;
  bool peak_hour_extrapolated = false;  // profile shorter than an hour: avg x 3600 s
};
ChurnStats ComputeStats(const Profile& p);

// Duration-weighted nearest-rank percentile (0 < pct <= 100) of `values`
// weighted by `weights` (same length, non-empty).
double WeightedPercentile(const std::vector<double>& values, const std::vector<double>& weights, double pct);

// lag_i of the queue model for shipped bytes `ship_i` = W'_i / c over d_i at
// bandwidth `bw` (bytes/s, > 0).
std::vector<double> SimulateLag(const Profile& p, double factor, double bw);
// The smallest bandwidth (bytes/s) for which the pct-th lag percentile is
// <= rpo_s; `factor` = (1 + growth) / c.
double RequiredBandwidth(const Profile& p, double factor, double rpo_s, double pct);
// Largest sum of W over intervals starting within any window of `window_s`
// seconds; extrapolated (total x window / duration, *extrapolated = true)
// when the profile is shorter than the window.
double WindowMax(const Profile& p, double window_s, bool* extrapolated);

struct PlanOptions {
  double compression = 1.0;                 // ratio >= 1 (raw / shipped)
  std::string compression_source = "given";  // shown in the report ("given" or how it was measured)
  std::vector<double> rpo_s = {900, 1800, 3600};
  std::optional<double> link_bytes_per_s;   // --link (converted from Mbit/s)
  double growth = 0.0;                      // 0.3 = plan for 30% more churn
  double percentile = 95;                   // an extra "met p% of the time" column
  double outage_hours = 4;
  double retention_s = 86400;
  // Utilisations (0 < u <= 1) of the RPO curve: link = average shipped / u.
  std::vector<double> curve = {0.5, 0.6, 0.7, 0.8, 0.9, 0.95};
};

// One point of the RPO curve: a link at utilisation `utilisation` of the
// average shipped rate, and the lag percentiles the queue model gives there.
struct CurveRow {
  double utilisation = 0;
  double link_bytes_per_s = 0;
  double lag_p50 = 0, lag_p99 = 0, lag_max = 0;  // seconds
};

struct RpoRow {
  double rpo_s = 0;
  double bw_100 = 0, bw_90 = 0, bw_pct = 0;  // bytes per second
};

struct DeviceRow {
  std::string name;
  double bytes = 0;
  double unique_bytes = -1;  // -1: not known
  double gb_per_day = 0;
};

struct PlanReport {
  ChurnStats stats;
  PlanOptions opts;
  double avg_shipped = 0;  // avg x (1+growth) / c, bytes/s: the floor of any link
  std::vector<RpoRow> rows;
  std::vector<CurveRow> curve;  // empty when the average shipped rate is 0
  // At the given link:
  bool have_link = false;
  double link_lag_max = 0, link_lag_90 = 0, link_lag_pct = 0, link_final_backlog = 0;
  bool link_below_average = false;
  double ps_cache_bytes = 0;
  bool ps_cache_extrapolated = false;
  double ps_drain_s = -1;  // time to drain the outage backlog at the link (-1: no link or never)
  double journal_bytes = 0;
  bool journal_extrapolated = false;
  // Version-2 profiles (loadgen/device_profile.h):
  std::shared_ptr<const PlanReport> coalesced;  // the plan of the coalesced stream; null when not known
  std::vector<DeviceRow> devices;
  double lost_events = 0;  // the profile's rows under-count by these write events
};

// Failure: kInvalidArgument (compression < 1, no RPO, percentile outside (0,100],
// growth < 0, a curve utilisation outside (0, 1], empty profile, zero total
// duration).
Result<PlanReport> MakePlan(const Profile& p, const PlanOptions& o);
std::string RenderPlanMarkdown(const PlanReport& r);
boost::json::value RenderPlanJson(const PlanReport& r);

// Compresses `data` in 1 MiB frames with zstd at `level` (what the process
// server does) and returns raw / compressed (>= 1 when compression helps).
Result<double> MeasureCompressionRatio(ByteSpan data, int level = 3);

// Human units used in reports: "12.35 MB/s", "98.8 Mbit/s", "3.2 GB", "15m".
std::string FormatMBps(double bytes_per_s);
std::string FormatMbit(double bytes_per_s);
std::string FormatBytes(double bytes);
std::string FormatSeconds(double s);

}  // namespace cdp::loadgen

// SPDX-License-Identifier: Apache-2.0
#include "loadgen/plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include <boost/json.hpp>

#include "common/wire/codec.h"

namespace cdp::loadgen {

double WeightedPercentile(const std::vector<double>& v, const std::vector<double>& w, double pct) {
  if (v.empty()) return 0;
  std::vector<size_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return v[a] < v[b]; });
  double total = std::accumulate(w.begin(), w.end(), 0.0);
  double need = total * pct / 100.0;
  double acc = 0;
  for (size_t i : idx) {
    acc += w[i];
    // A relative epsilon so that 90% of ten equal intervals is exactly nine.
    if (acc >= need * (1 - 1e-12)) return v[i];
  }
  return v[idx.back()];
}

ChurnStats ComputeStats(const Profile& p) {
  ChurnStats s;
  std::vector<double> rates, weights;
  for (const auto& x : p.samples) {
    s.total_bytes += x.bytes;
    s.duration_s += x.seconds;
    double r = x.bytes / x.seconds;
    rates.push_back(r);
    weights.push_back(x.seconds);
    if (r > s.max || rates.size() == 1) {
      s.max = r;
      s.peak_timestamp = x.timestamp;
    }
  }
  if (s.duration_s > 0) s.avg = s.total_bytes / s.duration_s;
  s.p50 = WeightedPercentile(rates, weights, 50);
  s.p95 = WeightedPercentile(rates, weights, 95);
  s.p99 = WeightedPercentile(rates, weights, 99);
  s.gb_per_day = s.avg * 86400 / 1e9;
  s.peak_hour_bytes = WindowMax(p, 3600, &s.peak_hour_extrapolated);
  return s;
}

std::vector<double> SimulateLag(const Profile& p, double factor, double bw) {
  std::vector<double> lag;
  lag.reserve(p.samples.size());
  double q = 0;
  for (const auto& x : p.samples) {
    q = std::max(0.0, q + x.bytes * factor - bw * x.seconds);
    lag.push_back(q / bw);
  }
  return lag;
}

namespace {

std::vector<double> Weights(const Profile& p) {
  std::vector<double> w;
  for (const auto& x : p.samples) w.push_back(x.seconds);
  return w;
}

}  // namespace

double RequiredBandwidth(const Profile& p, double factor, double rpo_s, double pct) {
  double hi = 0;
  for (const auto& x : p.samples) hi = std::max(hi, x.bytes * factor / x.seconds);
  if (hi == 0) return 0;
  const auto w = Weights(p);
  auto meets = [&](double bw) { return WeightedPercentile(SimulateLag(p, factor, bw), w, pct) <= rpo_s; };
  double lo = 0;  // lo never meets (infinite lag), hi always does (queue stays empty)
  for (int i = 0; i < 200 && hi - lo > hi * 1e-12; ++i) {
    double mid = (lo + hi) / 2;
    if (meets(mid)) hi = mid; else lo = mid;
  }
  return hi;
}

double WindowMax(const Profile& p, double window_s, bool* extrapolated) {
  *extrapolated = false;
  double dur = p.total_seconds();
  if (p.samples.empty() || dur <= 0 || !(window_s > 0)) return 0;
  if (window_s > dur) {
    *extrapolated = true;
    return p.total_bytes() * window_s / dur;
  }
  // Two pointers over interval starts: [i, j) start within [t_i, t_i + window).
  double best = 0, sum = 0;
  size_t j = 0;
  const auto& s = p.samples;
  for (size_t i = 0; i < s.size(); ++i) {
    if (j < i) { j = i; sum = 0; }
    while (j < s.size() && s[j].timestamp < s[i].timestamp + window_s) sum += s[j++].bytes;
    best = std::max(best, sum);
    if (j > i) sum -= s[i].bytes;
  }
  return best;
}

Result<PlanReport> MakePlan(const Profile& p, const PlanOptions& o) {
  if (p.samples.empty() || !(p.total_seconds() > 0)) return Status::InvalidArgument("empty profile");
  if (!(o.compression >= 1.0)) return Status::InvalidArgument("compression ratio must be >= 1");
  if (o.rpo_s.empty()) return Status::InvalidArgument("no RPO target");
  for (double r : o.rpo_s)
    if (!(r > 0)) return Status::InvalidArgument("RPO targets must be > 0");
  if (!(o.percentile > 0 && o.percentile <= 100)) return Status::InvalidArgument("percentile must be in (0, 100]");
  if (!(o.growth >= 0)) return Status::InvalidArgument("growth must be >= 0");
  if (!(o.outage_hours >= 0) || !(o.retention_s >= 0)) return Status::InvalidArgument("outage and retention must be >= 0");
  if (o.link_bytes_per_s && !(*o.link_bytes_per_s > 0)) return Status::InvalidArgument("link must be > 0");
  for (double u : o.curve)
    if (!(u > 0 && u <= 1)) return Status::InvalidArgument("curve utilisations must be in (0, 1]");
  PlanReport r;
  r.opts = o;
  r.stats = ComputeStats(p);
  const double g = 1 + o.growth, factor = g / o.compression;
  r.avg_shipped = r.stats.avg * factor;
  for (double rpo : o.rpo_s) {
    RpoRow row;
    row.rpo_s = rpo;
    row.bw_100 = RequiredBandwidth(p, factor, rpo, 100);
    row.bw_90 = RequiredBandwidth(p, factor, rpo, 90);
    row.bw_pct = RequiredBandwidth(p, factor, rpo, o.percentile);
    r.rows.push_back(row);
  }
  if (r.avg_shipped > 0) {
    const auto w = Weights(p);
    for (double u : o.curve) {
      CurveRow c;
      c.utilisation = u;
      c.link_bytes_per_s = r.avg_shipped / u;
      const auto lag = SimulateLag(p, factor, c.link_bytes_per_s);
      c.lag_p50 = WeightedPercentile(lag, w, 50);
      c.lag_p99 = WeightedPercentile(lag, w, 99);
      c.lag_max = *std::max_element(lag.begin(), lag.end());
      r.curve.push_back(c);
    }
  }
  if (o.link_bytes_per_s) {
    r.have_link = true;
    double bw = *o.link_bytes_per_s;
    auto lag = SimulateLag(p, factor, bw);
    auto w = Weights(p);
    r.link_lag_max = *std::max_element(lag.begin(), lag.end());
    r.link_lag_90 = WeightedPercentile(lag, w, 90);
    r.link_lag_pct = WeightedPercentile(lag, w, o.percentile);
    r.link_final_backlog = lag.back() * bw;
    r.link_below_average = bw < r.avg_shipped;
  }
  r.ps_cache_bytes = WindowMax(p, o.outage_hours * 3600, &r.ps_cache_extrapolated) * g;
  if (r.have_link && *o.link_bytes_per_s > r.avg_shipped)
    r.ps_drain_s = r.ps_cache_bytes / o.compression / (*o.link_bytes_per_s - r.avg_shipped);
  r.journal_bytes = WindowMax(p, o.retention_s, &r.journal_extrapolated) * g;
  bool all_unique = true;
  Profile q;
  for (const ProfileSample& s : p.samples) {
    r.lost_events += s.lost_events;
    all_unique = all_unique && s.unique_bytes >= 0;
    q.samples.emplace_back(s.timestamp, s.unique_bytes, s.seconds);
  }
  if (all_unique) {
    CDP_ASSIGN_OR_RETURN(PlanReport cr, MakePlan(q, o));
    r.coalesced = std::make_shared<const PlanReport>(std::move(cr));
  }
  for (size_t d = 0; d < p.devices.size(); ++d) {
    DeviceRow row;
    row.name = p.devices[d];
    bool known = true;
    double unique = 0;
    for (const ProfileSample& s : p.samples) {
      if (d < s.device_bytes.size()) row.bytes += s.device_bytes[d];
      const double u = d < s.device_unique.size() ? s.device_unique[d] : -1;
      known = known && u >= 0;
      unique += u;
    }
    row.unique_bytes = known ? unique : -1;
    row.gb_per_day = row.bytes / r.stats.duration_s * 86400 / 1e9;
    r.devices.push_back(row);
  }
  return r;
}

std::string FormatMBps(double b) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f MB/s", b / 1e6);
  return buf;
}
std::string FormatMbit(double b) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f Mbit/s", b * 8 / 1e6);
  return buf;
}
std::string FormatBytes(double b) {
  char buf[64];
  if (b >= 1e12) std::snprintf(buf, sizeof(buf), "%.2f TB", b / 1e12);
  else if (b >= 1e9) std::snprintf(buf, sizeof(buf), "%.2f GB", b / 1e9);
  else std::snprintf(buf, sizeof(buf), "%.2f MB", b / 1e6);
  return buf;
}
std::string FormatSeconds(double s) {
  char buf[64];
  if (s >= 3600) std::snprintf(buf, sizeof(buf), "%.2f h", s / 3600);
  else if (s >= 60) std::snprintf(buf, sizeof(buf), "%.1f min", s / 60);
  else std::snprintf(buf, sizeof(buf), "%.1f s", s);
  return buf;
}

namespace {

std::string Pct(double p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g%%", p);
  return buf;
}

std::string RpoName(double s) {
  char buf[32];
  if (std::fmod(s, 3600) == 0) std::snprintf(buf, sizeof(buf), "%gh", s / 3600);
  else if (std::fmod(s, 60) == 0) std::snprintf(buf, sizeof(buf), "%gm", s / 60);
  else std::snprintf(buf, sizeof(buf), "%gs", s);
  return buf;
}

}  // namespace

std::string RenderPlanMarkdown(const PlanReport& r) {
  const auto& s = r.stats;
  const auto& o = r.opts;
  std::string m;
  char buf[512];
  m += "# WAN sizing plan\n\n";
  std::snprintf(buf, sizeof(buf),
                "Profile: %zu s of churn (%s written). Compression ratio %.3f (%s), growth %g%%.\n\n",
                size_t(s.duration_s), FormatBytes(s.total_bytes).c_str(), o.compression, o.compression_source.c_str(),
                o.growth * 100);
  m += buf;
  m += "## Churn\n\n| statistic | value |\n|---|---:|\n";
  m += "| average | " + FormatMBps(s.avg) + " |\n";
  m += "| p50 | " + FormatMBps(s.p50) + " |\n";
  m += "| p95 | " + FormatMBps(s.p95) + " |\n";
  m += "| p99 | " + FormatMBps(s.p99) + " |\n";
  std::snprintf(buf, sizeof(buf), "| max (peak, interval at t=%.0f) | %s |\n", s.peak_timestamp, FormatMBps(s.max).c_str());
  m += buf;
  std::snprintf(buf, sizeof(buf), "| GB/day | %.2f |\n", s.gb_per_day);
  m += buf;
  m += std::string("| peak hour") + (s.peak_hour_extrapolated ? " (extrapolated from the average)" : "") + " | " +
       FormatBytes(s.peak_hour_bytes) + " |\n\n";
  m += "## Bandwidth for each RPO target\n\n";
  m += "Average shipped rate (the floor of any link): " + FormatMbit(r.avg_shipped) + ".\n\n";
  m += "| RPO | met 100% of the time | met 90% of the time | met " + Pct(o.percentile) + " of the time |\n";
  m += "|---|---:|---:|---:|\n";
  for (const auto& row : r.rows)
    m += "| " + RpoName(row.rpo_s) + " | " + FormatMbit(row.bw_100) + " | " + FormatMbit(row.bw_90) + " | " +
         FormatMbit(row.bw_pct) + " |\n";
  m += "\n";
  if (!r.curve.empty()) {
    m += "## RPO against link utilisation\n\n";
    m += "The link as a share of the average shipped rate, and the lag the queue model gives there (a floor: "
         "the model does not see the link's round trips or batching; docs/loadgen.md).\n\n";
    m += "| utilisation | link | lag p50 | lag p99 | worst lag |\n|---:|---:|---:|---:|---:|\n";
    for (const CurveRow& c : r.curve)
      m += "| " + Pct(c.utilisation * 100) + " | " + FormatMbit(c.link_bytes_per_s) + " | " + FormatSeconds(c.lag_p50) +
           " | " + FormatSeconds(c.lag_p99) + " | " + FormatSeconds(c.lag_max) + " |\n";
    m += "\n";
  }
  if (r.have_link) {
    m += "## RPO achievable on a " + FormatMbit(*o.link_bytes_per_s) + " link\n\n";
    m += "| lag | value |\n|---|---:|\n";
    m += "| worst (100%) | " + FormatSeconds(r.link_lag_max) + " |\n";
    m += "| 90% of the time | " + FormatSeconds(r.link_lag_90) + " |\n";
    m += "| " + Pct(o.percentile) + " of the time | " + FormatSeconds(r.link_lag_pct) + " |\n";
    m += "| backlog at the end of the profile | " + FormatBytes(r.link_final_backlog) + " |\n\n";
    if (r.link_below_average)
      m += "**The link is below the average shipped rate: the backlog grows without bound.**\n\n";
  }
  m += "## Capacity\n\n| item | size |\n|---|---:|\n";
  std::snprintf(buf, sizeof(buf), "| process-server cache for a %g h outage%s | %s |\n", o.outage_hours,
                r.ps_cache_extrapolated ? " (extrapolated from the average)" : "", FormatBytes(r.ps_cache_bytes).c_str());
  m += buf;
  if (r.ps_drain_s >= 0) m += "| time to drain it after the outage | " + FormatSeconds(r.ps_drain_s) + " |\n";
  std::snprintf(buf, sizeof(buf), "| master-target journal for %s retention%s | %s |\n", RpoName(o.retention_s).c_str(),
                r.journal_extrapolated ? " (extrapolated from the average)" : "", FormatBytes(r.journal_bytes).c_str());
  m += buf;
  if (!r.devices.empty()) {
    m += "\n## Devices\n\n| device | written | unique 4 KiB blocks | GB/day |\n|---|---:|---:|---:|\n";
    for (const DeviceRow& d : r.devices) {
      std::snprintf(buf, sizeof(buf), "| %s | %s | %s | %.2f |\n", d.name.c_str(), FormatBytes(d.bytes).c_str(),
                    d.unique_bytes >= 0 ? FormatBytes(d.unique_bytes).c_str() : "not known", d.gb_per_day);
      m += buf;
    }
  }
  if (r.lost_events > 0) {
    std::snprintf(buf, sizeof(buf),
                  "\n**The profile lost %.0f write events** (the kernel's ring buffer was full): every figure above "
                  "under-counts. Profile again with a larger --buffer-kb.\n",
                  r.lost_events);
    m += buf;
  }
  if (r.coalesced) {
    const PlanReport& c = *r.coalesced;
    m += "\n## The coalesced stream\n\n";
    m += "Each interval's unique 4 KiB blocks, shipped once: what a catch-up ships when the agent's queue has fallen "
         "back to its bitmap or metadata mode. The raw stream above is what data mode ships (every write, with its "
         "point in time).\n\n";
    std::snprintf(buf, sizeof(buf), "Unique blocks: %s of %s written (%.1f%%). Average shipped rate: %s.\n\n",
                  FormatBytes(c.stats.total_bytes).c_str(), FormatBytes(s.total_bytes).c_str(),
                  s.total_bytes > 0 ? 100 * c.stats.total_bytes / s.total_bytes : 0.0, FormatMbit(c.avg_shipped).c_str());
    m += buf;
    m += "| RPO | raw: met 100% | coalesced: met 100% | raw: met " + Pct(o.percentile) + " | coalesced: met " +
         Pct(o.percentile) + " |\n|---|---:|---:|---:|---:|\n";
    for (size_t i = 0; i < r.rows.size() && i < c.rows.size(); ++i)
      m += "| " + RpoName(r.rows[i].rpo_s) + " | " + FormatMbit(r.rows[i].bw_100) + " | " + FormatMbit(c.rows[i].bw_100) +
           " | " + FormatMbit(r.rows[i].bw_pct) + " | " + FormatMbit(c.rows[i].bw_pct) + " |\n";
    if (r.have_link && c.have_link) {
      m += "\nOn the " + FormatMbit(*o.link_bytes_per_s) + " link: worst lag " + FormatSeconds(r.link_lag_max) +
           " raw, " + FormatSeconds(c.link_lag_max) + " coalesced.\n";
    }
  }
  return m;
}

boost::json::value RenderPlanJson(const PlanReport& r) {
  namespace json = boost::json;
  const auto& s = r.stats;
  const auto& o = r.opts;
  json::object stats{{"total_bytes", s.total_bytes}, {"duration_s", s.duration_s}, {"avg_Bps", s.avg},
                     {"p50_Bps", s.p50}, {"p95_Bps", s.p95}, {"p99_Bps", s.p99}, {"max_Bps", s.max},
                     {"peak_timestamp", s.peak_timestamp}, {"gb_per_day", s.gb_per_day},
                     {"peak_hour_bytes", s.peak_hour_bytes}, {"peak_hour_extrapolated", s.peak_hour_extrapolated}};
  json::array rows;
  for (const auto& row : r.rows)
    rows.push_back(json::object{{"rpo_s", row.rpo_s}, {"bw_100_bps", row.bw_100 * 8}, {"bw_90_bps", row.bw_90 * 8},
                                {"bw_pct_bps", row.bw_pct * 8}});
  json::array curve;
  for (const CurveRow& c : r.curve)
    curve.push_back(json::object{{"utilisation", c.utilisation}, {"link_bps", c.link_bytes_per_s * 8},
                                 {"lag_p50_s", c.lag_p50}, {"lag_p99_s", c.lag_p99}, {"lag_max_s", c.lag_max}});
  json::object out{{"version", 1},
                   {"compression", o.compression},
                   {"compression_source", o.compression_source},
                   {"growth", o.growth},
                   {"percentile", o.percentile},
                   {"churn", stats},
                   {"avg_shipped_bps", r.avg_shipped * 8},
                   {"rpo", rows},
                   {"rpo_curve", curve},
                   {"ps_cache", json::object{{"outage_hours", o.outage_hours}, {"bytes", r.ps_cache_bytes},
                                             {"extrapolated", r.ps_cache_extrapolated},
                                             {"drain_s", r.ps_drain_s}}},
                   {"journal", json::object{{"retention_s", o.retention_s}, {"bytes", r.journal_bytes},
                                            {"extrapolated", r.journal_extrapolated}}}};
  if (r.coalesced) out["coalesced"] = RenderPlanJson(*r.coalesced);
  if (!r.devices.empty()) {
    json::array devs;
    for (const DeviceRow& d : r.devices)
      devs.push_back(json::object{{"name", d.name}, {"bytes", d.bytes}, {"unique_bytes", d.unique_bytes},
                                  {"gb_per_day", d.gb_per_day}});
    out["devices"] = devs;
  }
  out["lost_events"] = r.lost_events;
  if (r.have_link)
    out["link"] = json::object{{"bps", *o.link_bytes_per_s * 8},        {"lag_max_s", r.link_lag_max},
                               {"lag_90_s", r.link_lag_90},              {"lag_pct_s", r.link_lag_pct},
                               {"final_backlog_bytes", r.link_final_backlog},
                               {"below_average", r.link_below_average}};
  return out;
}

Result<double> MeasureCompressionRatio(ByteSpan data, int level) {
  auto codec = NewCodec(proto::Codec::kZstd, level);
  if (!codec) return Status::NotSupported("zstd codec unavailable");
  if (data.empty()) return Status::InvalidArgument("no data to measure compression on");
  constexpr size_t kFrame = 1 << 20;
  double out_bytes = 0;
  Bytes out;
  for (size_t off = 0; off < data.size(); off += kFrame) {
    out.clear();
    CDP_RETURN_IF_ERROR(codec->Compress(data.subspan(off, std::min(kFrame, data.size() - off)), &out));
    out_bytes += double(out.size());
  }
  return std::max(1.0, double(data.size()) / out_bytes);
}

}  // namespace cdp::loadgen

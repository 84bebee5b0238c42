// SPDX-License-Identifier: Apache-2.0
// Metrics: counters, gauges and histograms that a daemon exports as Prometheus
// text (GET /metrics) and JSON (GET /metrics?format=json) through
// common/http/http_server.h.
//
// There is no global registry: the daemon owns one Registry and passes it (or
// the metric pointers it hands out) to its components.
//
//   metrics::Registry reg;
//   auto acked = reg.GetCounter("cdp_ps_acked_bytes_total", "Bytes acknowledged to agents",
//                               {{"volume", "db1"}});
//   acked->Inc(4096);                         // hot path: one relaxed atomic add
//   std::string text = reg.RenderPrometheus();
//
// A metric family is a name + help + type; a series is one label set of a family.
// Get*() returns the same series for the same name and labels (label order does
// not matter). The returned shared_ptr stays valid after RemoveSeries(); the
// series is then no longer exported.
//
// Names must match [a-zA-Z_:][a-zA-Z0-9_:]*, label names [a-zA-Z_][a-zA-Z0-9_]*
// (not starting with "__", not "le" on histograms). Label values are any text
// (escaped on output). A bad name, or reusing a name with another type, is a
// programming error: Get*() throws std::logic_error (names are constants in code).
//
// Thread safety: Registry methods are thread-safe (a mutex guards the map);
// Counter/Gauge/DoubleGauge/Histogram updates are lock-free atomics and may run
// concurrently with rendering (a render sees each value at some instant; a
// histogram's buckets, sum and count are read one by one, not as one snapshot).
#pragma once

#include <atomic>
#include <boost/json/value.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cdp {
class Env;
class Clock;
}  // namespace cdp

namespace cdp::metrics {

// Label name -> value, e.g. {{"volume", "db1"}}.
using Labels = std::vector<std::pair<std::string, std::string>>;

enum class Type { kCounter, kGauge, kHistogram };

// Monotonic count.
class Counter {
 public:
  void Inc(uint64_t n = 1) { v_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t Value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

// Integer value that goes up and down (queue depth, backlog bytes, state).
class Gauge {
 public:
  void Set(int64_t v) { v_.store(v, std::memory_order_relaxed); }
  void Add(int64_t d) { v_.fetch_add(d, std::memory_order_relaxed); }
  int64_t Value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> v_{0};
};

// Floating-point gauge (ratios, seconds).
class DoubleGauge {
 public:
  void Set(double v) { v_.store(v, std::memory_order_relaxed); }
  void Add(double d) { v_.fetch_add(d, std::memory_order_relaxed); }
  double Value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> v_{0.0};
};

// A copy of a histogram's state. counts[i] is the number of observations in
// bucket i (NOT cumulative): bucket i holds v <= bounds[i] and > bounds[i-1];
// counts.back() (index bounds.size()) is the +Inf bucket.
struct HistogramSnapshot {
  std::vector<double> bounds;
  std::vector<uint64_t> counts;
  uint64_t count = 0;
  double sum = 0;
};

// Estimates the q-quantile (0 <= q <= 1) the way Prometheus' histogram_quantile
// does: find the bucket holding the rank q*count and interpolate linearly inside
// it (the first bucket's lower edge is 0 if its bound is positive). Returns 0 for an
// empty histogram; a rank in the +Inf bucket returns the highest finite bound.
double EstimateQuantile(const HistogramSnapshot& s, double q);

// Observations counted into fixed buckets (upper bounds, ascending, finite).
class Histogram {
 public:
  // `bounds` must be non-empty, finite and strictly ascending (else std::logic_error).
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);  // lock-free: a binary search plus three relaxed atomics; NaN is ignored
  HistogramSnapshot Snapshot() const;
  double Quantile(double q) const { return EstimateQuantile(Snapshot(), q); }
  const std::vector<double>& bounds() const { return bounds_; }

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // bounds_.size() + 1
  std::atomic<uint64_t> count_{0};
  std::atomic<double> sum_{0.0};
};

// Bucket helpers: {start, start*factor, ...} (count values), {start, start+width, ...}.
std::vector<double> ExponentialBuckets(double start, double factor, int count);
std::vector<double> LinearBuckets(double start, double width, int count);
// A default for latencies in seconds: 100us .. ~100s, factor 2.
std::vector<double> LatencyBuckets();

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  std::shared_ptr<Counter> GetCounter(std::string_view name, std::string_view help, Labels labels = {});
  std::shared_ptr<Gauge> GetGauge(std::string_view name, std::string_view help, Labels labels = {});
  std::shared_ptr<DoubleGauge> GetDoubleGauge(std::string_view name, std::string_view help, Labels labels = {});
  // All series of one histogram family must use the same bounds (else std::logic_error).
  std::shared_ptr<Histogram> GetHistogram(std::string_view name, std::string_view help, std::vector<double> bounds,
                                          Labels labels = {});
  // A series whose value is computed at render time by `fn` (called with the
  // registry's mutex held, so `fn` must not call back into the Registry).
  // `type` is kCounter or kGauge. Registering the same name+labels again replaces `fn`.
  void AddComputed(std::string_view name, std::string_view help, Type type, std::function<double()> fn,
                   Labels labels = {});

  // Stops exporting the series; returns whether it existed. Handles already
  // given out stay valid. A family with no series left is dropped.
  bool RemoveSeries(std::string_view name, const Labels& labels);

  // Prometheus text exposition format 0.0.4: families sorted by name, series
  // by labels, "# HELP" and "# TYPE" lines, histograms as _bucket{le=...}
  // (cumulative), _sum and _count. Ends with a newline.
  std::string RenderPrometheus() const;

  // {"<name>": {"type": "counter"|"gauge"|"histogram", "help": "...",
  //             "series": [{"labels": {...}, "value": N}  or, for histograms,
  //                        {"labels": {...}, "count": N, "sum": S, "p50": x, "p99": y,
  //                         "buckets": [{"le": bound, "count": cumulative}, ...]}]}}
  boost::json::value RenderJson() const;

 private:
  struct Family;
  struct Series;
  Family& FamilyFor(std::string_view name, std::string_view help, Type type);  // mu_ held
  // The series `labels` of the family `name` as the value in `slot` (made at
  // first use); std::logic_error when that series already is another kind.
  template <typename T>
  std::shared_ptr<T> Scalar(std::string_view name, std::string_view help, Labels labels, Type type,
                            std::shared_ptr<T> Series::*slot, const char* kind);
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<Family>, std::less<>> families_;
};

// Standard process metrics, computed at render time:
//   process_cpu_seconds_total        user+system CPU (getrusage)
//   process_resident_memory_bytes    from /proc/self/statm
//   process_virtual_memory_bytes     from /proc/self/statm
//   process_open_fds                 entries of /proc/self/fd
//   process_start_time_seconds       wall time of this call (clock->WallMicros)
// /proc is read through `env` (a POSIX Env in a daemon); a value that cannot be
// read renders as NaN. `env` and `clock` must outlive `registry`'s last render.
void RegisterProcessMetrics(Registry& registry, Env* env, const Clock* clock);

// This process's resident memory in bytes (/proc/self/statm through `env`);
// NaN when unreadable.
double ResidentMemoryBytes(Env* env);

}  // namespace cdp::metrics

// SPDX-License-Identifier: Apache-2.0
#include "common/daemon/metrics.h"

#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <boost/json.hpp>
#include <cmath>
#include <stdexcept>

#include "common/base/clock.h"
#include "common/env/env.h"

namespace cdp::metrics {

namespace {

bool ValidMetricName(std::string_view n) {
  if (n.empty()) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    char c = n[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

bool ValidLabelName(std::string_view n) {
  if (n.empty() || n.substr(0, 2) == "__") return false;
  for (size_t i = 0; i < n.size(); ++i) {
    char c = n[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

const char* TypeName(Type t) {
  switch (t) {
    case Type::kCounter:
      return "counter";
    case Type::kGauge:
      return "gauge";
    case Type::kHistogram:
      return "histogram";
  }
  return "untyped";
}

// Prometheus float rendering: shortest round-trip form, +Inf/-Inf/NaN.
std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);
}

// The exposition format's escapes: backslash and newline always, the double
// quote inside a label value (HELP text keeps it).
std::string Escape(std::string_view s, bool quote) {
  std::string out;
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quote) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

// {a="x",b="y"} with `extra` appended (the histogram's le), or "" when empty.
std::string LabelText(const Labels& labels, std::string_view extra_name = {}, std::string_view extra_value = {}) {
  if (labels.empty() && extra_name.empty()) return "";
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : labels) {
    if (!first) out += ',';
    first = false;
    out += k;
    out += "=\"";
    out += Escape(v, /*quote=*/true);
    out += '"';
  }
  if (!extra_name.empty()) {
    if (!first) out += ',';
    out += extra_name;
    out += "=\"";
    out += extra_value;
    out += '"';
  }
  out += '}';
  return out;
}

Labels Canonical(Labels labels, Type type) {
  std::sort(labels.begin(), labels.end());
  for (size_t i = 0; i < labels.size(); ++i) {
    if (!ValidLabelName(labels[i].first)) throw std::logic_error("metrics: bad label name '" + labels[i].first + "'");
    if (type == Type::kHistogram && labels[i].first == "le") throw std::logic_error("metrics: label 'le' is reserved");
    if (i > 0 && labels[i].first == labels[i - 1].first) {
      throw std::logic_error("metrics: label '" + labels[i].first + "' given twice");
    }
  }
  return labels;
}

}  // namespace

// ---------------------------------------------------------------- Histogram

double EstimateQuantile(const HistogramSnapshot& s, double q) {
  if (s.count == 0 || s.bounds.empty() || s.counts.size() != s.bounds.size() + 1) return 0;
  q = std::clamp(q, 0.0, 1.0);
  double rank = q * double(s.count);
  uint64_t cum = 0;
  for (size_t i = 0; i < s.bounds.size(); ++i) {
    uint64_t prev = cum;
    cum += s.counts[i];
    if (double(cum) >= rank && s.counts[i] > 0) {
      double lower = i == 0 ? (s.bounds[0] > 0 ? 0.0 : s.bounds[0]) : s.bounds[i - 1];
      double upper = s.bounds[i];
      return lower + (upper - lower) * (rank - double(prev)) / double(s.counts[i]);
    }
  }
  return s.bounds.back();
}

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)) {
  if (bounds_.empty()) throw std::logic_error("metrics: histogram needs at least one bucket bound");
  for (size_t i = 0; i < bounds_.size(); ++i) {
    if (!std::isfinite(bounds_[i]) || (i > 0 && !(bounds_[i] > bounds_[i - 1]))) {
      throw std::logic_error("metrics: histogram bounds must be finite and strictly ascending");
    }
  }
  counts_ = std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1);
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double v) {
  if (std::isnan(v)) return;  // would poison the sum and has no bucket
  size_t i = size_t(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());  // first bound >= v
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
}

HistogramSnapshot Histogram::Snapshot() const {
  HistogramSnapshot s;
  s.bounds = bounds_;
  s.counts.resize(bounds_.size() + 1);
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    s.counts[i] = counts_[i].load(std::memory_order_relaxed);
    total += s.counts[i];
  }
  // The buckets are the truth for quantiles; keep count consistent with them.
  s.count = total;
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> out;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) out.push_back(v);
  return out;
}

std::vector<double> LinearBuckets(double start, double width, int count) {
  std::vector<double> out;
  for (int i = 0; i < count; ++i) out.push_back(start + width * i);
  return out;
}

std::vector<double> LatencyBuckets() { return ExponentialBuckets(0.0001, 2, 21); }

// ---------------------------------------------------------------- Registry

struct Registry::Series {
  Labels labels;
  std::shared_ptr<Counter> counter;
  std::shared_ptr<Gauge> gauge;
  std::shared_ptr<DoubleGauge> dgauge;
  std::shared_ptr<Histogram> histogram;
  std::function<double()> computed;

  double Value() const {
    if (counter) return double(counter->Value());
    if (gauge) return double(gauge->Value());
    if (dgauge) return dgauge->Value();
    if (computed) return computed();
    return 0;
  }
};

struct Registry::Family {
  std::string name;
  std::string help;
  Type type;
  std::vector<double> bounds;  // histograms
  std::map<Labels, Series> series;
};

Registry::Registry() = default;
Registry::~Registry() = default;

Registry::Family& Registry::FamilyFor(std::string_view name, std::string_view help, Type type) {
  if (!ValidMetricName(name)) throw std::logic_error("metrics: bad metric name '" + std::string(name) + "'");
  auto it = families_.find(name);
  if (it == families_.end()) {
    auto f = std::make_unique<Family>();
    f->name = std::string(name);
    f->help = std::string(help);
    f->type = type;
    it = families_.emplace(f->name, std::move(f)).first;
  } else if (it->second->type != type) {
    throw std::logic_error("metrics: '" + std::string(name) + "' already registered as " +
                           TypeName(it->second->type));
  }
  return *it->second;
}

template <typename T>
std::shared_ptr<T> Registry::Scalar(std::string_view name, std::string_view help, Labels labels, Type type,
                                    std::shared_ptr<T> Series::*slot, const char* kind) {
  labels = Canonical(std::move(labels), type);
  std::lock_guard lock(mu_);
  Family& f = FamilyFor(name, help, type);
  Series& s = f.series[labels];
  const int kinds = int(bool(s.counter)) + int(bool(s.gauge)) + int(bool(s.dgauge)) + int(bool(s.histogram)) +
                    int(bool(s.computed));
  if (kinds > (s.*slot ? 1 : 0)) throw std::logic_error("metrics: '" + f.name + "' series is not " + kind);
  if (!(s.*slot)) {
    s.labels = labels;
    s.*slot = std::make_shared<T>();
  }
  return s.*slot;
}

std::shared_ptr<Counter> Registry::GetCounter(std::string_view name, std::string_view help, Labels labels) {
  return Scalar(name, help, std::move(labels), Type::kCounter, &Series::counter, "a counter");
}

std::shared_ptr<Gauge> Registry::GetGauge(std::string_view name, std::string_view help, Labels labels) {
  return Scalar(name, help, std::move(labels), Type::kGauge, &Series::gauge, "an integer gauge");
}

std::shared_ptr<DoubleGauge> Registry::GetDoubleGauge(std::string_view name, std::string_view help, Labels labels) {
  return Scalar(name, help, std::move(labels), Type::kGauge, &Series::dgauge, "a double gauge");
}

std::shared_ptr<Histogram> Registry::GetHistogram(std::string_view name, std::string_view help,
                                                  std::vector<double> bounds, Labels labels) {
  labels = Canonical(std::move(labels), Type::kHistogram);
  auto fresh = std::make_shared<Histogram>(bounds);  // validates bounds outside the lock
  std::lock_guard lock(mu_);
  Family& f = FamilyFor(name, help, Type::kHistogram);
  if (f.series.empty()) {
    f.bounds = bounds;
  } else if (f.bounds != bounds) {
    throw std::logic_error("metrics: histogram '" + f.name + "' registered with other bounds");
  }
  Series& s = f.series[labels];
  if (!s.histogram) {
    s.labels = labels;
    s.histogram = std::move(fresh);
  }
  return s.histogram;
}

void Registry::AddComputed(std::string_view name, std::string_view help, Type type, std::function<double()> fn,
                           Labels labels) {
  if (type == Type::kHistogram) throw std::logic_error("metrics: a computed series cannot be a histogram");
  labels = Canonical(std::move(labels), type);
  std::lock_guard lock(mu_);
  Family& f = FamilyFor(name, help, type);
  Series& s = f.series[labels];
  if (s.counter || s.gauge || s.dgauge) throw std::logic_error("metrics: '" + f.name + "' series is not computed");
  s.labels = labels;
  s.computed = std::move(fn);
}

bool Registry::RemoveSeries(std::string_view name, const Labels& labels) {
  Labels key = labels;
  std::sort(key.begin(), key.end());
  std::lock_guard lock(mu_);
  auto it = families_.find(name);
  if (it == families_.end()) return false;
  bool erased = it->second->series.erase(key) > 0;
  if (it->second->series.empty()) families_.erase(it);
  return erased;
}

std::string Registry::RenderPrometheus() const {
  std::lock_guard lock(mu_);
  std::string out;
  for (const auto& [name, f] : families_) {
    out += "# HELP " + name + " " + Escape(f->help, /*quote=*/false) + "\n";
    out += "# TYPE " + name + " " + TypeName(f->type) + "\n";
    for (const auto& [labels, s] : f->series) {
      if (f->type != Type::kHistogram) {
        double v = s.Value();
        std::string value = (s.counter || s.gauge) ? (s.counter ? std::to_string(s.counter->Value())
                                                                : std::to_string(s.gauge->Value()))
                                                   : FormatValue(v);
        out += name + LabelText(labels) + " " + value + "\n";
        continue;
      }
      HistogramSnapshot h = s.histogram->Snapshot();
      uint64_t cum = 0;
      for (size_t i = 0; i < h.bounds.size(); ++i) {
        cum += h.counts[i];
        out += name + "_bucket" + LabelText(labels, "le", FormatValue(h.bounds[i])) + " " + std::to_string(cum) + "\n";
      }
      cum += h.counts.back();
      out += name + "_bucket" + LabelText(labels, "le", "+Inf") + " " + std::to_string(cum) + "\n";
      out += name + "_sum" + LabelText(labels) + " " + FormatValue(h.sum) + "\n";
      out += name + "_count" + LabelText(labels) + " " + std::to_string(h.count) + "\n";
    }
  }
  return out;
}

boost::json::value Registry::RenderJson() const {
  namespace json = boost::json;
  // JSON has no NaN/Inf: those become null.
  auto num = [](double v) -> json::value {
    if (!std::isfinite(v)) return nullptr;
    return v;
  };
  std::lock_guard lock(mu_);
  json::object out;
  for (const auto& [name, f] : families_) {
    json::object fam;
    fam["type"] = TypeName(f->type);
    fam["help"] = f->help;
    json::array series;
    for (const auto& [labels, s] : f->series) {
      json::object one;
      json::object lab;
      for (const auto& [k, v] : labels) lab[k] = v;
      one["labels"] = std::move(lab);
      if (f->type != Type::kHistogram) {
        if (s.counter) {
          one["value"] = s.counter->Value();
        } else if (s.gauge) {
          one["value"] = s.gauge->Value();
        } else {
          one["value"] = num(s.Value());
        }
      } else {
        HistogramSnapshot h = s.histogram->Snapshot();
        one["count"] = h.count;
        one["sum"] = num(h.sum);
        one["p50"] = num(EstimateQuantile(h, 0.5));
        one["p99"] = num(EstimateQuantile(h, 0.99));
        json::array buckets;
        uint64_t cum = 0;
        for (size_t i = 0; i < h.bounds.size(); ++i) {
          cum += h.counts[i];
          buckets.push_back(json::object{{"le", h.bounds[i]}, {"count", cum}});
        }
        cum += h.counts.back();
        buckets.push_back(json::object{{"le", "+Inf"}, {"count", cum}});
        one["buckets"] = std::move(buckets);
      }
      series.push_back(std::move(one));
    }
    fam["series"] = std::move(series);
    out[name] = std::move(fam);
  }
  return out;
}

// ---------------------------------------------------------------- process metrics

namespace {

// /proc/self/statm: "size resident shared text lib data dt" in pages.
// Returns {virtual, resident} bytes, NaN when unreadable.
std::pair<double, double> ReadStatm(Env* env) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  OpenOptions o;
  o.read_only = true;
  auto f = env->Open("/proc/self/statm", o);
  if (!f.ok()) return {kNaN, kNaN};
  uint8_t buf[256];
  auto n = (*f)->ReadUpTo(0, sizeof(buf) - 1, buf);
  if (!n.ok()) return {kNaN, kNaN};
  std::string text(reinterpret_cast<const char*>(buf), *n);
  unsigned long long pages_virt = 0, pages_res = 0;
  if (std::sscanf(text.c_str(), "%llu %llu", &pages_virt, &pages_res) != 2) return {kNaN, kNaN};
  double page = double(::sysconf(_SC_PAGESIZE));
  return {double(pages_virt) * page, double(pages_res) * page};
}

}  // namespace

double ResidentMemoryBytes(Env* env) { return ReadStatm(env).second; }

void RegisterProcessMetrics(Registry& registry, Env* env, const Clock* clock) {
  registry.AddComputed("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", Type::kCounter,
                       [] {
                         struct rusage ru {};
                         if (::getrusage(RUSAGE_SELF, &ru) != 0) return std::numeric_limits<double>::quiet_NaN();
                         auto secs = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) / 1e6; };
                         return secs(ru.ru_utime) + secs(ru.ru_stime);
                       });
  registry.AddComputed("process_resident_memory_bytes", "Resident memory size in bytes.", Type::kGauge,
                       [env] { return ResidentMemoryBytes(env); });
  registry.AddComputed("process_virtual_memory_bytes", "Virtual memory size in bytes.", Type::kGauge,
                       [env] { return ReadStatm(env).first; });
  registry.AddComputed("process_open_fds", "Number of open file descriptors.", Type::kGauge, [env] {
    auto names = env->ListDir("/proc/self/fd");
    if (!names.ok()) return std::numeric_limits<double>::quiet_NaN();
    return double(names->size());
  });
  double start = double(clock->WallMicros()) / 1e6;
  registry.AddComputed("process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
                       Type::kGauge, [start] { return start; });
}

}  // namespace cdp::metrics

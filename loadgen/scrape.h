// SPDX-License-Identifier: Apache-2.0
// Scrape: read daemons' Prometheus /metrics, and record a churn profile.
//
// ParsePrometheusText() reads the text exposition format 0.0.4 that
// common/daemon/metrics.h renders: comment lines, then `name{labels} value` or
// `name value` (an optional timestamp after the value is ignored). It sums the
// series of each metric name over all label sets (a daemon with several
// volumes reports one series per volume), which is what the loadgen needs.
//
// `cdp-loadgen record --url http://HOST:PORT/metrics --interval 10s --samples N
//  [--metric cdp_agent_captured_bytes_total] [--out FILE]` polls the counter and
// writes a profile CSV (profile.h): one row per interval with the counter's
// increase. A counter that goes down (daemon restart) counts from zero again.
//
// Thread safety: pure functions; Scrape() does one blocking HTTP request.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "common/base/clock.h"
#include "common/base/result.h"
#include "loadgen/profile.h"

namespace cdp::loadgen {

// metric name -> sum over its series. Histogram series appear under their
// exposed names (x_bucket, x_sum, x_count). Failure: kCorruption naming the
// line, for a line that is neither a comment nor a sample.
using MetricSums = std::map<std::string, double, std::less<>>;
Result<MetricSums> ParsePrometheusText(std::string_view text);

// https://HOST:PORT/PATH or http://HOST:PORT/PATH (PATH defaults to /metrics).
struct HttpUrl {
  std::string host;
  uint16_t port = 80;
  std::string target = "/metrics";
  bool https = false;
  std::string token;   // control token sent as a bearer ("" = none; common/http/control_token.h)
  std::string tls_ca;  // https: the site CA the daemon's certificate verifies against
};
Result<HttpUrl> ParseHttpUrl(std::string_view url);

// GET the URL and parse it. Failure: the HTTP client's status, kUnavailable
// for a non-200 answer, or the parser's; kInvalidArgument for https without tls_ca.
Result<MetricSums> Scrape(const HttpUrl& url, uint32_t timeout_ms = 5000);

// One polled counter reading.
struct CounterReading {
  double wall_s = 0;  // Unix seconds
  double value = 0;
};

// Turns consecutive readings into profile rows: row i covers [r_i, r_{i+1}).
Profile ProfileFromReadings(const std::vector<CounterReading>& readings);

}  // namespace cdp::loadgen

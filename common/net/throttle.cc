// SPDX-License-Identifier: Apache-2.0
#include "common/net/throttle.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace cdp {
namespace {

constexpr int64_t kMinuteUs = 60'000'000;
constexpr int64_t kDayUs = 1440 * kMinuteUs;

bool ParseHhMm(std::string_view s, uint32_t* minute) {
  if (s.size() != 5 || s[2] != ':') return false;
  for (size_t i : {0, 1, 3, 4})
    if (s[i] < '0' || s[i] > '9') return false;
  uint32_t h = uint32_t((s[0] - '0') * 10 + (s[1] - '0'));
  uint32_t m = uint32_t((s[3] - '0') * 10 + (s[4] - '0'));
  if (m > 59 || h > 24 || (h == 24 && m != 0)) return false;
  *minute = h * 60 + m;
  return true;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

Status ValidateThrottle(const ThrottleOptions& options) {
  auto check = [](double mbps, const std::string& what) -> Status {
    if (mbps == 0 || (mbps >= kMinThrottleMbps && mbps <= kMaxThrottleMbps)) return Status::OK();
    char buf[160];
    snprintf(buf, sizeof buf, "%s: %g Mbit/s is outside 0 (unlimited) or %g..%g", what.c_str(), mbps,
             kMinThrottleMbps, kMaxThrottleMbps);
    return Status::InvalidArgument(buf);
  };
  CDP_RETURN_IF_ERROR(check(options.default_mbps, "throttle rate"));
  for (const ThrottleWindow& w : options.schedule) {
    char when[96];
    snprintf(when, sizeof when, "schedule window %02u:%02u-%02u:%02u", w.start_minute / 60, w.start_minute % 60,
             w.end_minute / 60, w.end_minute % 60);
    CDP_RETURN_IF_ERROR(check(w.mbps, when));
  }
  return Status::OK();
}

Result<std::vector<ThrottleWindow>> ParseSchedule(std::string_view text) {
  std::vector<ThrottleWindow> out;
  text = Trim(text);
  while (!text.empty()) {
    size_t comma = text.find(',');
    std::string_view part = Trim(text.substr(0, comma));
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    auto bad = [&] {
      return Status::InvalidArgument("throttle schedule: bad window '" + std::string(part) +
                                     "' (want MBPS@HH:MM-HH:MM)");
    };
    size_t at = part.find('@');
    size_t dash = part.find('-', at == std::string_view::npos ? 0 : at);
    if (at == std::string_view::npos || dash == std::string_view::npos) return bad();
    std::string rate(Trim(part.substr(0, at)));
    char* end = nullptr;
    double mbps = std::strtod(rate.c_str(), &end);
    if (rate.empty() || end != rate.c_str() + rate.size() || !(mbps >= 0) || std::isinf(mbps)) return bad();
    ThrottleWindow w;
    w.mbps = mbps;
    if (!ParseHhMm(Trim(part.substr(at + 1, dash - at - 1)), &w.start_minute) ||
        !ParseHhMm(Trim(part.substr(dash + 1)), &w.end_minute) || w.start_minute >= 1440 ||
        w.start_minute == w.end_minute)
      return bad();
    out.push_back(w);
  }
  return out;
}

Throttle::Throttle(Clock* clock, ThrottleOptions options) : clock_(clock), opt_(std::move(options)) {
  tokens_ = double(opt_.burst_bytes);
  last_now_ = clock_->NowMicros();
  last_wall_ = clock_->WallMicros();
}

double Throttle::RateAtLocked(uint64_t wall_us) const {
  int64_t local = int64_t(wall_us) + int64_t(opt_.utc_offset_minutes) * kMinuteUs;
  int64_t tod = ((local % kDayUs) + kDayUs) % kDayUs;
  for (const ThrottleWindow& w : opt_.schedule) {
    int64_t s = int64_t(w.start_minute) * kMinuteUs, e = int64_t(w.end_minute) * kMinuteUs;
    bool in = s <= e ? (tod >= s && tod < e) : (tod >= s || tod < e);
    if (in) return w.mbps / 8.0;
  }
  return opt_.default_mbps / 8.0;
}

uint64_t Throttle::NextBoundaryLocked(uint64_t wall_us) const {
  int64_t local = int64_t(wall_us) + int64_t(opt_.utc_offset_minutes) * kMinuteUs;
  int64_t tod = ((local % kDayUs) + kDayUs) % kDayUs;
  int64_t next = kDayUs;
  for (const ThrottleWindow& w : opt_.schedule) {
    for (int64_t edge : {int64_t(w.start_minute) * kMinuteUs, int64_t(w.end_minute) * kMinuteUs})
      if (edge > tod && edge < next) next = edge;
  }
  return wall_us + uint64_t(next - tod);
}

void Throttle::RefillLocked(uint64_t now_us, uint64_t wall_us) {
  uint64_t elapsed = now_us > last_now_ ? now_us - last_now_ : 0;
  uint64_t t = last_wall_;
  const double burst = double(opt_.burst_bytes);
  while (elapsed > 0) {
    double rate = RateAtLocked(t);
    uint64_t step = std::min<uint64_t>(elapsed, NextBoundaryLocked(t) - t);
    if (rate == 0)
      tokens_ = burst;
    else
      tokens_ = std::min(burst, tokens_ + rate * double(step));
    t += step;
    elapsed -= step;
  }
  last_now_ = now_us;
  last_wall_ = wall_us;
}

uint64_t Throttle::Reserve(uint64_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  uint64_t now = clock_->NowMicros(), wall = clock_->WallMicros();
  RefillLocked(now, wall);
  state_.reserved_bytes += bytes;
  double rate = RateAtLocked(wall);
  state_.limit_mbps = rate * 8.0;
  if (rate == 0) {
    tokens_ = double(opt_.burst_bytes);
    state_.throttling = false;
    return 0;
  }
  tokens_ -= double(bytes);
  if (tokens_ >= 0) {
    state_.throttling = false;
    return 0;
  }
  // Walk forward through the schedule until the debt is paid.
  double debt = -tokens_;
  double wait = 0;
  uint64_t t = wall;
  while (debt > 0) {
    double r = RateAtLocked(t);
    uint64_t nb = NextBoundaryLocked(t);
    if (r == 0) break;  // an unlimited window starts: the debt is forgiven there
    double need = debt / r;
    if (need <= double(nb - t)) {
      wait += need;
      break;
    }
    wait += double(nb - t);
    debt -= r * double(nb - t);
    t = nb;
  }
  uint64_t w = uint64_t(std::ceil(wait));
  state_.waited_micros += w;
  state_.throttling = true;
  return w;
}

void Throttle::Reconfigure(ThrottleOptions options) {
  std::lock_guard<std::mutex> l(mu_);
  RefillLocked(clock_->NowMicros(), clock_->WallMicros());
  opt_ = std::move(options);
  tokens_ = std::min(tokens_, double(opt_.burst_bytes));
}

double Throttle::CurrentMbps() const {
  std::lock_guard<std::mutex> l(mu_);
  return RateAtLocked(clock_->WallMicros()) * 8.0;
}

ThrottleState Throttle::state() const {
  std::lock_guard<std::mutex> l(mu_);
  ThrottleState s = state_;
  s.limit_mbps = RateAtLocked(clock_->WallMicros()) * 8.0;
  return s;
}

}  // namespace cdp

// SPDX-License-Identifier: Apache-2.0
#include "loadgen/profile.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace cdp::loadgen {

double Profile::total_bytes() const {
  double s = 0;
  for (const auto& x : samples) s += x.bytes;
  return s;
}
double Profile::total_seconds() const {
  double s = 0;
  for (const auto& x : samples) s += x.seconds;
  return s;
}

namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

bool ParseNumber(std::string_view s, double* out) {
  s = Trim(s);
  if (s.empty() || s.size() > 64) return false;
  std::string t(s);
  char* end = nullptr;
  double v = std::strtod(t.c_str(), &end);
  if (*end != '\0' || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

}  // namespace

Result<Profile> ParseProfileCsv(std::string_view text) {
  constexpr size_t kMaxRows = 10'000'000;
  Profile p;
  std::vector<bool> has_seconds;
  size_t line_no = 0;
  bool first_content = true;
  size_t wide_columns = 0;  // a header with optional columns: every row has its count
  // The optional columns: the role of each column after `seconds`.
  enum class Col { kUnique, kLost, kDevBytes, kDevUnique };
  std::vector<std::pair<Col, size_t>> extra;  // (role, device index)
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = Trim(text.substr(0, nl));
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    ++line_no;
    if (line.empty() || line.front() == '#') continue;
    auto err = [&](const std::string& m) { return Status::InvalidArgument("profile line " + std::to_string(line_no) + ": " + m); };
    std::vector<std::string_view> cols;
    for (size_t pos = 0;;) {
      size_t c = line.find(',', pos);
      cols.push_back(line.substr(pos, c == std::string_view::npos ? std::string_view::npos : c - pos));
      if (c == std::string_view::npos) break;
      pos = c + 1;
    }
    if (first_content) {
      first_content = false;
      double dummy;
      if (!ParseNumber(cols[0], &dummy)) {  // a header
        if (Trim(cols[0]) != "timestamp" || cols.size() < 2 || Trim(cols[1]) != "bytes" ||
            (cols.size() >= 3 && Trim(cols[2]) != "seconds"))
          return err("header must be 'timestamp,bytes' or 'timestamp,bytes,seconds[,...]'");
        if (cols.size() > 3) {
          if (cols.size() > 3 + 2 + 2 * 256) return err("too many columns");
          for (size_t i = 3; i < cols.size(); ++i) {
            const std::string_view c = Trim(cols[i]);
            if (c == "unique_bytes") {
              extra.emplace_back(Col::kUnique, 0);
            } else if (c == "lost_events") {
              extra.emplace_back(Col::kLost, 0);
            } else if (c.rfind("bytes:", 0) == 0 && c.size() > 6) {
              p.devices.emplace_back(c.substr(6));
              extra.emplace_back(Col::kDevBytes, p.devices.size() - 1);
            } else if (c.rfind("unique_bytes:", 0) == 0 && c.size() > 13) {
              const std::string_view dev = c.substr(13);
              size_t d = 0;
              while (d < p.devices.size() && p.devices[d] != dev) ++d;
              if (d == p.devices.size()) return err("unique_bytes:" + std::string(dev) + " before bytes:" + std::string(dev));
              extra.emplace_back(Col::kDevUnique, d);
            } else {
              return err("unknown column '" + std::string(c) + "'");
            }
          }
          wide_columns = cols.size();
        }
        continue;
      }
    }
    if (wide_columns != 0 && cols.size() != wide_columns)
      return err("expected " + std::to_string(wide_columns) + " columns, as the header");
    if (wide_columns == 0 && (cols.size() < 2 || cols.size() > 3)) return err("expected 2 or 3 columns");
    ProfileSample s;
    if (!ParseNumber(cols[0], &s.timestamp)) return err("bad timestamp '" + std::string(Trim(cols[0])) + "'");
    if (!ParseNumber(cols[1], &s.bytes) || s.bytes < 0) return err("bad bytes '" + std::string(Trim(cols[1])) + "'");
    if (cols.size() >= 3 && (!ParseNumber(cols[2], &s.seconds) || !(s.seconds > 0)))
      return err("bad seconds '" + std::string(Trim(cols[2])) + "'");
    if (wide_columns != 0) {
      s.device_bytes.assign(p.devices.size(), 0);
      s.device_unique.assign(p.devices.size(), -1);
      for (size_t i = 0; i < extra.size(); ++i) {
        const std::string_view c = Trim(cols[3 + i]);
        const auto [role, dev] = extra[i];
        const bool may_be_empty = role == Col::kUnique || role == Col::kDevUnique;
        if (c.empty() && may_be_empty) continue;  // not known
        double v = 0;
        if (!ParseNumber(c, &v) || v < 0) return err("bad value '" + std::string(c) + "' in column " + std::to_string(4 + i));
        if (role == Col::kUnique) s.unique_bytes = v;
        else if (role == Col::kLost) s.lost_events = v;
        else if (role == Col::kDevBytes) s.device_bytes[dev] = v;
        else s.device_unique[dev] = v;
      }
    }
    if (!p.samples.empty() && !(s.timestamp > p.samples.back().timestamp)) return err("timestamps must increase");
    if (p.samples.size() >= kMaxRows) return err("too many rows (max 10000000)");
    p.samples.push_back(s);
    has_seconds.push_back(cols.size() >= 3);
  }
  if (p.samples.empty()) return Status::InvalidArgument("profile has no rows");
  for (size_t i = 0; i < p.samples.size(); ++i) {
    if (has_seconds[i]) continue;
    if (i + 1 < p.samples.size()) {
      p.samples[i].seconds = p.samples[i + 1].timestamp - p.samples[i].timestamp;
    } else if (i > 0) {
      p.samples[i].seconds = p.samples[i - 1].seconds;
    } else {
      return Status::InvalidArgument("profile: a single row needs the seconds column");
    }
  }
  return p;
}

std::string FormatProfileCsv(const Profile& p) {
  std::string out = "timestamp,bytes,seconds\n";
  char buf[128];
  for (const auto& s : p.samples) {
    std::snprintf(buf, sizeof(buf), "%.3f,%.0f,%.3f\n", s.timestamp, s.bytes, s.seconds);
    out += buf;
  }
  return out;
}

}  // namespace cdp::loadgen

// SPDX-License-Identifier: Apache-2.0
#include "master-target/replica_types.h"

namespace cdp::mt {

const char* StateName(VolumeState s) {
  switch (s) {
    case VolumeState::kReplicating: return "protecting";
    case VolumeState::kRollingBack: return "rolling-back";
    case VolumeState::kFailedOver: return "failed-over";
    case VolumeState::kFailingBack: return "failing-back";
    case VolumeState::kFailedBack: return "failed-back";
  }
  return "unknown";
}

const char* StallCauseName(StallCause c) {
  switch (c) {
    case StallCause::kNone: return "";
    case StallCause::kNoSpace: return "no space";
    case StallCause::kIOError: return "I/O error";
    case StallCause::kHistoryLock: return "history lock";
  }
  return "unknown";
}

std::string ShownState(const VolumeStatus& st) {
  if (st.state == VolumeState::kReplicating && st.stall && st.stall->cause == StallCause::kHistoryLock)
    return "LOCKED: journal full inside the history lock";
  if (st.state == VolumeState::kReplicating && st.stall) return std::string("stalled: ") + StallCauseName(st.stall->cause);
  return StateName(st.state);
}

const char* PointKindName(PointKind k) { return k == PointKind::kTag ? "tag" : "crash-consistent"; }

std::optional<RecoveryPoint> PointAtTime(const std::vector<RecoveryPoint>& points, uint64_t time_us) {
  std::optional<RecoveryPoint> best;
  for (const RecoveryPoint& p : points) {
    if (p.time_us > time_us) continue;
    if (!best || p.time_us > best->time_us || (p.time_us == best->time_us && p.seq > best->seq)) best = p;
  }
  return best;
}

Result<uint64_t> ParseUtcTime(std::string_view t) {
  const Status bad = Status::InvalidArgument("'" + std::string(t) +
                                             "' is not a UTC time: give YYYY-MM-DDTHH:MM[:SS[.ffffff]][Z]");
  if (!t.empty() && t.back() == 'Z') t.remove_suffix(1);
  auto num = [&](size_t at, size_t len, int lo, int hi, int* out) {
    if (at + len > t.size()) return false;
    int v = 0;
    for (size_t i = at; i < at + len; ++i) {
      if (t[i] < '0' || t[i] > '9') return false;
      v = v * 10 + (t[i] - '0');
    }
    *out = v;
    return v >= lo && v <= hi;
  };
  int y = 0, mo = 0, d = 0, h = 0, mi = 0, sec = 0;
  if (t.size() < 16 || !num(0, 4, 1970, 9999, &y) || t[4] != '-' || !num(5, 2, 1, 12, &mo) || t[7] != '-' ||
      !num(8, 2, 1, 31, &d) || (t[10] != 'T' && t[10] != ' ') || !num(11, 2, 0, 23, &h) || t[13] != ':' ||
      !num(14, 2, 0, 59, &mi))
    return bad;
  size_t at = 16;
  if (at < t.size()) {
    if (t[at] != ':' || !num(at + 1, 2, 0, 60, &sec)) return bad;
    at += 3;
  }
  uint64_t frac = 0;
  if (at < t.size()) {
    if (t[at] != '.' || t.size() - at - 1 < 1 || t.size() - at - 1 > 6) return bad;
    int digits = 0;
    for (size_t i = at + 1; i < t.size(); ++i, ++digits) {
      if (t[i] < '0' || t[i] > '9') return bad;
      frac = frac * 10 + uint64_t(t[i] - '0');
    }
    for (; digits < 6; ++digits) frac *= 10;
  }
  // Days from the civil date (Howard Hinnant's algorithm).
  const int yy = y - (mo <= 2 ? 1 : 0);
  const int era = yy / 400;
  const int yoe = yy - era * 400;
  const int doy = (153 * (mo + (mo > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const int doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  const int64_t days = int64_t(era) * 146097 + doe - 719468;
  const int64_t secs = days * 86400 + h * 3600 + mi * 60 + sec;
  return uint64_t(secs) * 1'000'000 + frac;
}

std::string Upstream::Describe() const {
  return (role == "ps" ? "process server '" : role + " '") + name + "'";
}

uint64_t DeviceSize(const VolumeIdentity& id) { return id.size + (id.sealed ? proto::SealMacBytes(id.size) : 0); }

}  // namespace cdp::mt

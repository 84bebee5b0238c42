// SPDX-License-Identifier: Apache-2.0
#include "common/base/group_marker.h"

#include <charconv>

#include "common/base/names.h"

namespace cdp {

namespace {
constexpr std::string_view kPrefix = "group.";

std::optional<uint64_t> Decimal(std::string_view s) {
  if (s.empty() || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}
}  // namespace

std::string GroupMarker(std::string_view group, uint64_t round, uint64_t members) {
  return std::string(kPrefix) + std::string(group) + "." + std::to_string(round) + "." + std::to_string(members);
}

std::optional<GroupMarkerName> ParseGroupMarker(std::string_view name) {
  if (name.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  std::string_view rest = name.substr(kPrefix.size());
  const size_t last = rest.rfind('.');
  if (last == std::string_view::npos) return std::nullopt;
  const size_t mid = rest.rfind('.', last == 0 ? 0 : last - 1);
  if (mid == std::string_view::npos || mid == 0) return std::nullopt;
  auto round = Decimal(rest.substr(mid + 1, last - mid - 1));
  auto members = Decimal(rest.substr(last + 1));
  const std::string_view group = rest.substr(0, mid);
  if (!round || !members || *members == 0 || !ValidName(group)) return std::nullopt;
  return GroupMarkerName{std::string(group), *round, *members};
}

}  // namespace cdp

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

constexpr std::string_view kTagPart = ".tag.";

bool ValidGroupTag(std::string_view tag) { return ValidName(tag) && tag.find('.') == std::string_view::npos; }

std::string GroupMarker(std::string_view group, uint64_t round, uint64_t members, std::string_view tag) {
  std::string s = std::string(kPrefix) + std::string(group) + "." + std::to_string(round) + "." + std::to_string(members);
  if (!tag.empty()) s += std::string(kTagPart) + std::string(tag);
  return s;
}

std::optional<GroupMarkerName> ParseGroupMarker(std::string_view name) {
  if (name.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  std::string_view rest = name.substr(kPrefix.size());
  std::string_view tag;
  // The application-consistent form ends in ".tag.<tag>", where a crash
  // point's marker ends in two decimal parts.
  if (const size_t t = rest.rfind(kTagPart); t != std::string_view::npos) {
    const std::string_view after = rest.substr(t + kTagPart.size());
    if (after.find('.') == std::string_view::npos) {
      if (!ValidGroupTag(after)) return std::nullopt;
      tag = after;
      rest = rest.substr(0, t);
    }
  }
  const size_t last = rest.rfind('.');
  if (last == std::string_view::npos) return std::nullopt;
  const size_t mid = rest.rfind('.', last == 0 ? 0 : last - 1);
  if (mid == std::string_view::npos || mid == 0) return std::nullopt;
  auto round = Decimal(rest.substr(mid + 1, last - mid - 1));
  auto members = Decimal(rest.substr(last + 1));
  const std::string_view group = rest.substr(0, mid);
  if (!round || !members || *members == 0 || !ValidName(group)) return std::nullopt;
  return GroupMarkerName{std::string(group), *round, *members, std::string(tag)};
}

}  // namespace cdp

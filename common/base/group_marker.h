// SPDX-License-Identifier: Apache-2.0
// The name of a group point's marker (docs/formats/groups.md): the tag record
// a made group round queues in every member volume,
//
//   group.<group>.<round>.<members>
//
// <group> a valid name (it may hold dots), <round> and <members> decimal.
// Written by the process server's coordinator; read by the master target
// (its /v1/groups) and cdpctl. One format, in one place.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace cdp {

struct GroupMarkerName {
  std::string group;
  uint64_t round = 0;
  uint64_t members = 0;
};

std::string GroupMarker(std::string_view group, uint64_t round, uint64_t members);
// nullopt unless `name` is a marker: the prefix, a valid group name, and two
// decimal numbers (members >= 1) without leading zeros.
std::optional<GroupMarkerName> ParseGroupMarker(std::string_view name);

}  // namespace cdp

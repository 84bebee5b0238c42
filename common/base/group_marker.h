// SPDX-License-Identifier: Apache-2.0
// The name of a group point's marker (docs/formats/groups.md): the tag record
// a made group round queues in every member volume,
//
//   group.<group>.<round>.<members>              a crash-consistent point
//   group.<group>.<round>.<members>.tag.<tag>    an application-consistent
//                                                one (`cdpctl tag --group`)
//
// <group> a valid name (it may hold dots), <round> and <members> decimal,
// <tag> a valid name without dots (so the two forms never read alike: the
// second-last part of a crash point's marker is decimal, never "tag").
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
  std::string tag;  // "" for a crash-consistent point
};

// `tag` "" or a ValidGroupTag.
std::string GroupMarker(std::string_view group, uint64_t round, uint64_t members, std::string_view tag = {});
// nullopt unless `name` is a marker: the prefix, a valid group name, and two
// decimal numbers (members >= 1) without leading zeros, then optionally
// ".tag." and a ValidGroupTag.
std::optional<GroupMarkerName> ParseGroupMarker(std::string_view name);
// A valid name without dots.
bool ValidGroupTag(std::string_view tag);
}  // namespace cdp

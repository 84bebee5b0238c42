// SPDX-License-Identifier: Apache-2.0
// The marker name of a group point (common/base/group_marker.h).
#include "common/base/group_marker.h"

#include <catch2/catch.hpp>

TEST_CASE("group markers: made and parsed back, and anything else is not one", "[groups]") {
  CHECK(cdp::GroupMarker("app", 1795841478276528, 3) == "group.app.1795841478276528.3");
  auto m = cdp::ParseGroupMarker("group.web.tier.42.16");  // a group name may hold dots
  REQUIRE(m.has_value());
  CHECK(m->group == "web.tier");
  CHECK(m->round == 42);
  CHECK(m->members == 16);
  auto back = cdp::ParseGroupMarker(cdp::GroupMarker("x", ~uint64_t(0), 64));
  REQUIRE(back.has_value());
  CHECK(back->round == ~uint64_t(0));
  for (const char* bad : {"nightly", "group.", "group.app", "group.app.1", "group..1.2", "group.app.1.0",
                          "group.app.01.2", "group.app.1.x", "group.app.-1.2", "group.-app.1.2",
                          "group.app.18446744073709551616.2", "Group.app.1.2", "group.app.1.2.", "group.a b.1.2"}) {
    INFO(bad);
    CHECK_FALSE(cdp::ParseGroupMarker(bad).has_value());
  }
}

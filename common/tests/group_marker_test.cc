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

TEST_CASE("group markers: an application-consistent point's marker carries its tag and never reads as a crash point's",
          "[groups]") {
  CHECK(cdp::GroupMarker("app", 7, 2, "nightly") == "group.app.7.2.tag.nightly");
  auto m = cdp::ParseGroupMarker("group.web.tag.7.2.tag.nightly-1");  // "tag" inside the group name
  REQUIRE(m.has_value());
  CHECK(m->group == "web.tag");
  CHECK(m->round == 7);
  CHECK(m->members == 2);
  CHECK(m->tag == "nightly-1");
  auto crash = cdp::ParseGroupMarker("group.web.tag.7.2");
  REQUIRE(crash.has_value());
  CHECK(crash->group == "web.tag");
  CHECK(crash->round == 7);
  CHECK(crash->tag.empty());
  auto a = cdp::ParseGroupMarker("group.a.tag.b.3.4");  // group "a.tag.b", a crash point
  REQUIRE(a.has_value());
  CHECK(a->group == "a.tag.b");
  CHECK(a->tag.empty());
  auto num = cdp::ParseGroupMarker("group.a.3.4.tag.5");  // a decimal tag is a tag
  REQUIRE(num.has_value());
  CHECK(num->tag == "5");
  CHECK(num->round == 3);
  CHECK(cdp::ValidGroupTag("daily_2026-11-28"));
  CHECK_FALSE(cdp::ValidGroupTag("a.b"));
  CHECK_FALSE(cdp::ValidGroupTag(""));
  for (const char* bad : {"group.app.1.2.tag.", "group.app.1.2.tag.-x", "group.app.tag.x", "group.app.1.tag.x",
                          "group.app.1.0.tag.x", "group.app.1.2.tag.a b"}) {
    INFO(bad);
    CHECK_FALSE(cdp::ParseGroupMarker(bad).has_value());
  }
}

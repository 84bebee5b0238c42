// SPDX-License-Identifier: Apache-2.0
// The control API of a GroupCoordinator (common/wire/group_coordinator.h),
// the same at the process server and at the master target:
//
//   POST /v1/groups          {tenant, name, members: "AGENT:VOLUME,...",
//                             interval_ms?, hold_max_ms?, hold_timeout_ms?}
//                            creates or replaces the group -> {group, members}
//   POST /v1/groups/remove   {tenant, name} -> {removed}; 404 when there is none
//   POST /v1/groups/point    {tenant, name, tag?, freeze_ms?}: one round now;
//                            200 {round, marker, hold_us} when made, 409 with
//                            the reason when abandoned
//
// Every request is scoped to its tenant: a tenant token acts on its own
// tenant's groups only (403 otherwise). GET /v1/groups is each daemon's own
// (the PS's rounds; the MT's points, with the groups it coordinates).
#pragma once

#include "common/http/http_server.h"
#include "common/wire/group_coordinator.h"

namespace cdp {

// Adds the routes above to `server`; `groups` must outlive it.
void AddGroupRoutes(http::Server& server, GroupCoordinator& groups);

}  // namespace cdp

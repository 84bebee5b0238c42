// SPDX-License-Identifier: Apache-2.0
// Control API of the process server: the HTTP routes over its volumes and
// throttle. Implemented by ProcessServer::StartControl, VolumesJson and
// StatusJson (control_api.cc); the handlers run on the HTTP server's threads.
//
// Control (common/http/http_server.h, default port 9101), every route behind the
// PS's admin token (common/http/control_token.h; /metrics public only with
// metrics_public); a bad parameter is a 400 naming it:
//   GET  /metrics, /status
//   GET  /v1/volumes               every volume: spool backlog, ages, rates, ratio, link state
//   GET  /v1/throttle              the throttle's state
//   POST /v1/throttle              {"mbps": N, "schedule": "20@08:00-18:00"} replaces it;
//                                  each rate 0 (unlimited) or kMinThrottleMbps..kMaxThrottleMbps
//
#pragma once

#include "process-server/process_server_impl.h"

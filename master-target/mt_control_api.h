// SPDX-License-Identifier: Apache-2.0
// Control API of the master target: the HTTP routes over the daemon's
// volumes and exports. Implemented by MasterTarget::Impl::AddRoutes and its
// JSON helpers (control_api.cc); the handlers run on the HTTP server's
// threads and take the daemon's locks (master-target/master_target_impl.h).
//
// Control API (JSON over HTTP on `control`, common/http/http_server.h). Every
// request carries a control token (common/http/control_token.h): the admin token
// acts on every tenant; a tenant token only on its tenant's volumes and
// exports, and another tenant's volume or export answers exactly like a
// missing one (404 "no volume NAME" / "no export NAME"). A volume is named by
// `tenant` + `volume`, or `volume` alone when unique among those the caller
// sees. GETs take query parameters; state changes are POSTs whose parameters
// come only from the JSON object body. An unknown parameter or a value of the
// wrong type is a 400 naming it.
//   GET  /v1/whoami                           the caller: {"admin", "tenant", "read_only", "token_id",
//                                             "tenants" it sees, "nbd_port", "nbd_tls"}
//   GET  /v1/volumes                          the caller's volumes and their state ("protecting",
//                                             "stalled: no space", "failed-over", ...; "stall",
//                                             "failover", retention_max_bytes / _age_seconds)
//   GET  /v1/lag?volume=V[&tenant=T]          apply lag and link use over the last hour
//                                             (master-target/lag_history.h):
//                                             {"bucket_seconds", "window_seconds", "now_us", "link_mbit",
//                                              "samples": [{"time_us", "max_lag_seconds", "batches",
//                                                           "wire_bytes"}]}
//   GET  /v1/points?volume=V[&tenant=T]       recovery points
//   POST /v1/rollback {"volume","tenant","point": id | "tag": name | "seq": n}
//   POST /v1/export   {"volume","tenant","point": id | "tag": name | "seq": n, "writable": bool}
//                     -> {"export": name, "port": nbd port}
//   POST /v1/unexport {"export": NAME}
//   GET  /v1/exports                          the caller's open exports
//   GET  /v1/hashes?volume=V[&tenant=T]&region_size=&first=&count=
//   POST /v1/failover {"volume","tenant","point": id | "tag": name | "seq": n}
//                     promote the point as the persistent read-write export
//                     -> {"export", "port", "tls", "seq", "point", "changed", "state", ...}
//                     (409 when failed over at another point)
//   POST /v1/failover/undo   {"volume","tenant"}  back to protecting (409 once committed)
//   POST /v1/failover/commit {"volume","tenant"}  the failover is final
//                     (both -> {"changed", "state", ...}; "changed": false when nothing was to do)
//   POST /v1/reprotect {"volume","tenant"}    accept the next generation
//   POST /v1/retention {}                     run retention now (the caller's volumes)
//   GET  /v1/tokens                           admin: {"tenants": tenant -> number of tokens,
//                                             "tokens": [{"id", "scope", "tenant", "created_us",
//                                             "expires_us", "last_used_us"}]} (never a secret)
//   POST /v1/tokens {"tenant": T, "scope": "tenant"|"tenant-read", "expires_seconds": N}
//                   or {"scope": "admin", "expires_seconds": N}
//                                             admin: a new token (default scope tenant, 90 days),
//                                             shown once -> {"token", "id", "scope", "expires_us", ...}
//   POST /v1/tokens/revoke {"id": ID[, "tenant": T]} | {"tenant": T}
//                                             admin: remove one token, or every token of T
// A tenant-read token (Caller::read_only) may make only the requests that do
// not change state: every GET and a read-only POST /v1/export; the router
// answers anything else 403 before a handler runs (http::ChangesState).
// /status and /metrics cover every tenant: admin token only (/metrics public
// when the operator sets metrics_public). The dashboard at /ui
// (master-target/dashboard.h) is a page over these routes.
//
#pragma once

#include "master-target/master_target_impl.h"

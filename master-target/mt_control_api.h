// Control API of the master target: the HTTP routes over the daemon's
// volumes and exports. Implemented by MasterTarget::Impl::AddRoutes and its
// JSON helpers (control_api.cc); the handlers run on the HTTP server's
// threads and take the daemon's locks (master-target/master_target_impl.h).
//
// Control API (JSON over HTTP on `control`, common/http_server.h); a volume is
// named by `tenant` + `volume`, or `volume` alone when unique across tenants:
//   GET    /v1/volumes                       every volume and its state
//   GET    /v1/points?volume=V[&tenant=T]    recovery points
//   POST   /v1/rollback {"volume","tenant","point": id | "seq": n}
//   POST   /v1/export   {"volume","tenant","point": id | "seq": n, "writable": bool}
//                       -> {"export": name, "port": nbd port}
//   DELETE /v1/export?name=NAME              (or body {"export": NAME})
//   GET    /v1/exports                       open exports
//   GET    /v1/hashes?volume=V[&tenant=T]&region_size=&first=&count=
//   POST   /v1/retention                     run retention now on every volume
//
#pragma once

#include "master-target/master_target_impl.h"

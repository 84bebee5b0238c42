// SPDX-License-Identifier: Apache-2.0
// Dashboard: the provider's web page, served by the master target's control
// port (common/http/http_server.h) at /ui. Per tenant, each volume's state (a
// stalled apply and a failover included), its RPO lag over the last hour, its
// undo journal against the retention budget, its recovery points on a
// timeline, the open exports (created and removed from the page); plain HTML,
// CSS, JavaScript and SVG.
//
// Files: master-target/ui/, embedded in the binary at build time by
// cmake/embed_assets.cmake (no CDN, no network at build or run time):
//   GET /ui, /ui/             index.html   the dashboard       (token needed)
//   GET /ui/app.js                          its script          (token needed)
//   GET /ui/app.css, /ui/favicon.svg        style and icon      (public)
//   GET /ui/login, /ui/login.js             the sign-in page    (public)
//   POST /ui/session  (bearer token)        checks the token, sets the cookie below
//   POST /ui/logout                         clears it
// Any other /ui/ path: 404. The page's data all comes from the control API
// (master-target/mt_control_api.h: /v1/whoami, /v1/volumes, /v1/groups,
// /v1/points, /v1/lag, /v1/exports, /v1/export, /v1/unexport).
//
// Access (the router's modes, common/http/http_server.h; what each answers, here):
//  - Data is read and changed only through the control API, with
//    "Authorization: Bearer TOKEN": the same tokens (common/http/control_token.h)
//    and the same tenant scoping as cdpctl. A tenant token sees its tenant's
//    volumes only; the admin token sees every tenant. Nothing of a tenant is
//    in the static files.
//  - The sign-in page takes the token typed in, or from the URL fragment
//    (/ui/login#token=TOKEN: a fragment is never sent to the server, so it
//    reaches no log), and sends it as a bearer header to POST /ui/session,
//    which answers 401 for a token that is not valid, else opens a session
//    and sets its cookie: a random session id, never the token, named
//    `__Host-cdp_session` (Secure, HttpOnly, SameSite=Strict, Path=/, expires
//    with the session; http_server.h, Access::kSession) as the control port
//    speaks HTTPS, so that the browser's GET /ui is authenticated too. The
//    page keeps the token in the tab's sessionStorage for its API calls.
//    Sign-out ends the session and clears both (POST /ui/logout).
//  - GET /ui and /ui/app.js need a valid token, from that cookie or a bearer
//    header; without one they answer 401 with a page that says so and links
//    to the sign-in page. The page itself shows "unauthorized" when an API
//    call answers 401 (a token revoked meanwhile).
//  - The cookie is honoured only by these GETs of static files, never by the
//    API: a cross-site request cannot act with it (no CSRF); state changes
//    stay JSON POSTs with the bearer header.
//  - Every /ui answer carries a strict Content-Security-Policy (script, style,
//    images and fetches from the page's origin only; no inline script or
//    style; no framing), nosniff, no-referrer and no-store.
//
// Thread safety: the routes' handlers are thread-safe (they read constant data).
#pragma once

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "common/http/http_server.h"

namespace cdp::mt {

struct DashboardAsset {
  std::string_view name;          // file name in master-target/ui/
  std::string_view content_type;  // from its extension
  std::string_view data;          // the file's bytes (static storage)
};

// Every embedded file (generated: dashboard_assets.cc in the build tree).
std::span<const DashboardAsset> DashboardAssets();
// The asset named `name`, or null.
const DashboardAsset* FindDashboardAsset(std::string_view name);

// The Content-Security-Policy of every /ui answer.
extern const char kDashboardCsp[];

// Adds the /ui routes: the pages Access::kSession (the router checks the
// bearer token or the session cookie, http::kSessionCookieTls; a page answers an
// anonymous request), POST /ui/session Access::kToken, the rest kPublic.
// Before server.Start().
void AddDashboardRoutes(http::Server& server);

}  // namespace cdp::mt

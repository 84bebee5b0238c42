// SPDX-License-Identifier: Apache-2.0
#include "master-target/dashboard.h"

#include <boost/json.hpp>
#include <cctype>
#include <utility>

namespace cdp::mt {

const char kDashboardCsp[] =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'none'; base-uri 'none'; frame-ancestors 'none'";

const DashboardAsset* FindDashboardAsset(std::string_view name) {
  for (const DashboardAsset& a : DashboardAssets()) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

namespace {

http::Response Page(int status, const DashboardAsset& a) {
  http::Response r;
  r.status = status;
  r.body = std::string(a.data);
  r.content_type = std::string(a.content_type);
  r.headers = {{"Content-Security-Policy", kDashboardCsp},
               {"X-Content-Type-Options", "nosniff"},
               {"X-Frame-Options", "DENY"},
               {"Referrer-Policy", "no-referrer"},
               {"Cache-Control", "no-store"}};
  return r;
}

}  // namespace

void AddDashboardRoutes(http::Server& server) {
  auto serve = [](std::string_view name, bool needs_token) {
    return [name, needs_token](const http::Request& r) {
      const DashboardAsset* a = FindDashboardAsset(name);
      if (a == nullptr) return http::Response::Error(404, "no such path: " + r.path);
      if (needs_token && !r.signed_in) {
        const DashboardAsset* denied = FindDashboardAsset("denied.html");
        if (name != "index.html" || denied == nullptr) {
          return http::Response::Error(401, "a control token is required (sign in at /ui/login)");
        }
        return Page(401, *denied);
      }
      return Page(200, *a);
    };
  };
  // The session cookie is set by the server (HttpOnly), so that it is stored
  // before the page navigates to /ui (a cookie written by script may not be).
  server.Route(
      "POST", "/ui/session",
      [&server](const http::Request& r) {
        // Access::kToken: the router has checked the bearer token (a 401 before this).
        // The cookie holds a random session id, never the token (http_server.h).
        auto cookie = server.OpenSession(r, r.token);
        if (!cookie.ok()) return http::ErrorResponse(cookie.status());
        http::Response resp = http::Response::Json(200, boost::json::object{{"signed_in", true}});
        resp.headers = {{"Set-Cookie", *cookie}, {"Cache-Control", "no-store"}};
        return resp;
      },
      // Signing in changes nothing at the daemon: a tenant-read token may too.
      http::Access::kToken, [](const http::Request&) { return false; });
  server.Route(
      "POST", "/ui/logout",
      [&server](const http::Request& r) {
        http::Response resp = http::Response::Json(200, boost::json::object{{"signed_in", false}});
        resp.headers = {{"Set-Cookie", server.EndSession(r)}, {"Cache-Control", "no-store"}};
        return resp;
      },
      http::Access::kPublic);
  server.Route("GET", "/ui", serve("index.html", true), http::Access::kSession);
  server.Route("GET", "/ui/", serve("index.html", true), http::Access::kSession);
  server.Route(
      "GET", "/ui/*",
      [serve](const http::Request& r) {
        struct Entry {
          std::string_view path, file;
          bool needs_token;
        };
        static constexpr Entry kFiles[] = {{"app.js", "app.js", true},
                                           {"app.css", "app.css", false},
                                           {"favicon.svg", "favicon.svg", false},
                                           {"login", "login.html", false},
                                           {"login.js", "login.js", false}};
        for (const Entry& e : kFiles) {
          if (r.rest == e.path) return serve(e.file, e.needs_token)(r);
        }
        return http::Response::Error(404, "no such path: " + r.path);
      },
      http::Access::kSession);
}

}  // namespace cdp::mt

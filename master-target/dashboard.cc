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
constexpr std::string_view kCookieName = "cdp_ui_token";
}  // namespace

std::string DashboardCookieToken(std::string_view header) {
  constexpr std::string_view kName = kCookieName;
  while (!header.empty()) {
    size_t end = header.find(';');
    std::string_view item = header.substr(0, end);
    header = end == std::string_view::npos ? std::string_view() : header.substr(end + 1);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    size_t eq = item.find('=');
    if (eq != std::string_view::npos && item.substr(0, eq) == kName) return std::string(item.substr(eq + 1));
  }
  return "";
}

namespace {

// The token of an "Authorization: Bearer TOKEN" header (scheme in any case), or "".
std::string_view BearerToken(std::string_view auth) {
  constexpr std::string_view kBearer = "bearer ";
  if (auth.size() <= kBearer.size()) return {};
  for (size_t i = 0; i < kBearer.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(auth[i])) != kBearer[i]) return {};
  }
  return auth.substr(kBearer.size());
}

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

void AddDashboardRoutes(http::Server& server,
                        std::function<std::optional<http::Caller>(std::string_view token)> authenticate) {
  auto allowed = [authenticate](const http::Request& r) {
    if (!authenticate) return true;
    if (std::string_view token = BearerToken(r.authorization); !token.empty()) {
      return authenticate(token).has_value();
    }
    std::string token = DashboardCookieToken(r.cookie);
    return !token.empty() && authenticate(token).has_value();
  };
  auto serve = [allowed](std::string_view name, bool needs_token) {
    return [allowed, name, needs_token](const http::Request& r) {
      const DashboardAsset* a = FindDashboardAsset(name);
      if (a == nullptr) return http::Response::Error(404, "no such path: " + r.path);
      if (needs_token && !allowed(r)) {
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
      [authenticate](const http::Request& r) {
        std::string_view token = BearerToken(r.authorization);
        if (authenticate && (token.empty() || !authenticate(token))) {
          return http::Response::Error(401, "the control token is not valid here");
        }
        http::Response resp = http::Response::Json(200, boost::json::object{{"signed_in", true}});
        resp.headers = {{"Set-Cookie", std::string(kCookieName) + "=" + std::string(token) +
                                           "; Path=/ui; HttpOnly; SameSite=Strict"},
                        {"Cache-Control", "no-store"}};
        return resp;
      },
      http::Access::kPublic);
  server.Route(
      "POST", "/ui/logout",
      [](const http::Request&) {
        http::Response resp = http::Response::Json(200, boost::json::object{{"signed_in", false}});
        resp.headers = {{"Set-Cookie", std::string(kCookieName) + "=; Path=/ui; Max-Age=0; HttpOnly; SameSite=Strict"},
                        {"Cache-Control", "no-store"}};
        return resp;
      },
      http::Access::kPublic);
  server.Route("GET", "/ui", serve("index.html", true), http::Access::kPublic);
  server.Route("GET", "/ui/", serve("index.html", true), http::Access::kPublic);
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
      http::Access::kPublic);
}

}  // namespace cdp::mt

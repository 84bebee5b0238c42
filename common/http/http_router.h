// SPDX-License-Identifier: Apache-2.0
// HTTP routing: everything the control server (common/http/http_server.h) does with
// a request between Beast's parser and the socket, as functions of their
// inputs. The server's Session calls them; so do tests and the fuzzer
// (fuzz/http_fuzz.cc), which therefore exercise exactly what a peer reaches.
//
//   bytes --request_parser (LimitRequestParser)--> BodyTooLarge? -> 413
//         --ToRequest--> Request --Router::Dispatch--> Response
//
// Internal to common/http/http_server.cc (and its fuzzer); not for daemons.
//
// Thread safety: the functions are pure. A Router is built (Add) by one thread
// and then only read: Dispatch may run on many threads at once, and calls
// handlers and ServerOptions::status concurrently if the server has several.
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/http/http_detail.h"
#include "common/http/http_server.h"

namespace cdp::http::detail {

using RequestParser = bhttp::request_parser<bhttp::string_body>;

// Applies the server's limits to a fresh parser: headers up to kHeaderLimit,
// a body up to `max_body_bytes` (Beast then fails with error::body_limit).
void LimitRequestParser(RequestParser& parser, size_t max_body_bytes);

// True when the parsed header announces a body longer than `max_body_bytes`
// (answered 413 before the body is read). Call once the header is done.
bool BodyTooLarge(const RequestParser& parser, size_t max_body_bytes);

// The Request a handler sees, from a complete parsed request: path and query
// percent-decoded, params parsed (the last of a repeated key wins), Host,
// Content-Type, Authorization and Cookie copied. The body is moved out of `parsed`.
Request ToRequest(bhttp::request<bhttp::string_body>& parsed);

// Percent-decoding; with `plus_is_space` (query strings) '+' is a space. A bad
// or truncated escape is kept literally.
std::string PercentDecode(std::string_view s, bool plus_is_space);

// True when the Host header names an IP literal, "localhost" (any case), or
// one of `allowed` (lower-case names); the port part is ignored.
bool HostAllowed(std::string_view host_header, const std::vector<std::string>& allowed);

// The token of an "Authorization: Bearer TOKEN" header (scheme in any case), or "".
std::string_view BearerToken(std::string_view authorization);

// The value of the cookie `name` in a Cookie header; "" when absent.
std::string CookieValue(std::string_view cookie_header, std::string_view name);

// ASCII case-insensitive equality (header names and auth schemes).
bool EqualsIgnoreCase(std::string_view a, std::string_view b);

// True when the media type of a Content-Type value is application/json.
bool IsJson(std::string_view content_type);

// The routes of one server and the checks before them (see http_server.h:
// Host 403, content type 415, the bearer token 401 (ServerOptions::
// authenticate; sets Request::caller; not for Access::kPublic routes), 403 for a
// read-only caller's request that changes state (ChangesState), /status and /metrics 403 for a tenant
// caller, /metrics, /status, 404, 405, handler exceptions 500). `opts` must outlive the Router.
class Router {
 public:
  explicit Router(const ServerOptions& opts) : opts_(opts) {}

  // Server::Route's contract: exact path, or a prefix ending in "/*".
  void Add(std::string method, std::string path, Handler handler, Access access = Access::kToken,
           ChangesState changes = nullptr);

  // The response to `req`; sets req.rest for a prefix route. Never throws.
  Response Dispatch(Request& req) const;

  // Browser sessions (http_server.h, Access::kSession). OpenSession returns
  // the new id; SessionToken the token of a live session ("" when unknown or
  // past its lifetime, which also forgets it); EndSession forgets one. `now`
  // is steady time, for tests.
  Result<std::string> OpenSession(const std::string& token, std::chrono::steady_clock::time_point now);
  std::string SessionToken(const std::string& id, std::chrono::steady_clock::time_point now) const;
  void EndSession(const std::string& id);
  // The session id in a request's cookie ("" when none).
  static std::string SessionId(const Request& req);

 private:
  struct Entry {
    std::string method;
    std::string path;  // exact path, or the prefix including its trailing '/'
    bool prefix = false;
    Access access = Access::kToken;
    Handler handler;
    ChangesState changes;  // null: every method but GET and HEAD
  };
  const ServerOptions& opts_;
  std::vector<Entry> routes_;
  struct Session {
    std::string token;
    std::chrono::steady_clock::time_point expires;
  };
  mutable std::mutex session_mu_;
  mutable std::map<std::string, Session> sessions_;  // id -> session; guarded by session_mu_
  mutable std::deque<std::string> session_order_;    // ids, oldest first (may hold ended ones)
};

}  // namespace cdp::http::detail

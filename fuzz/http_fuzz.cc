// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the HTTP control server's request handling
// (common/http/http_router.h, common/http/http_server.h).
//
// The input is the byte stream a client sends on one connection. It is parsed
// with Beast's request_parser under the server's limits (LimitRequestParser,
// BodyTooLarge), request after request as keep-alive does, and every complete
// request goes through ToRequest and the Router the server uses, with routes
// shaped like the daemons' control API, a metrics registry, a status callback
// and a handler that throws.
//
// The Router authenticates bearer tokens (an admin and a tenant token) and a
// route reads its parameters with http::Params, as the daemons' routes do.
//
// Properties: no crash, leak or sanitizer report; every response has a status
// the server may send; a prefix route's rest is the tail of the path.
#include <boost/json.hpp>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>

#include "common/daemon/metrics.h"
#include "common/http/http_router.h"
#include "fuzz/fuzz_util.h"

namespace {

using namespace cdp;
using namespace cdp::http;
using namespace cdp::http::detail;
using cdp::fuzz::Check;

struct Fixture {
  metrics::Registry registry;
  ServerOptions opts;
  Router router{opts};

  Fixture() {
    registry.GetCounter("cdp_fuzz_requests_total", "requests", {{"kind", "a\"b\\c\n"}})->Inc();
    opts.registry = &registry;
    opts.status = [] { return boost::json::value{{"ok", true}}; };
    opts.allowed_hosts = {"cdp.example"};
    // Bearer tokens as a daemon's ControlTokens answers them: an admin and one tenant.
    opts.authenticate = [](std::string_view token) -> Result<Caller> {
      if (token == "admin-token") return Caller{true, "", false, ""};
      if (token == "acme-token") return Caller{false, "acme", false, ""};
      if (token == "acme-read-token") return Caller{false, "acme", true, "0123456789ab"};
      return Status::PermissionDenied("the control token is not valid here");
    };
    auto echo = [](const Request& r) {
      if (!r.body.empty()) (void)boost::json::parse(r.body);  // handlers parse JSON; may throw
      return Response::Json(200, {{"rest", r.rest}, {"n", r.params.size()}});
    };
    router.Add("GET", "/v1/volumes", echo);
    router.Add("POST", "/v1/volumes/*", echo);
    router.Add("DELETE", "/v1/volumes/*", echo);
    router.Add("GET", "/v1/volumes/db1/points/*", echo);
    // The control API's parameter reader (http::Params), every accessor.
    auto params = [](const Request& r) {
      auto p = Params::Of(r, {"volume", "seq", "writable", "mbps"});
      if (!p.ok()) return ErrorResponse(p.status());
      auto v = p->String("volume");
      auto s = p->Uint("seq");
      auto i = p->Int("seq");
      auto w = p->Bool("writable");
      auto m = p->Number("mbps");
      for (const Status& st : {v.status(), s.status(), w.status(), m.status()}) {
        if (!st.ok()) return ErrorResponse(st);
      }
      Check(!m->has_value() || std::isfinite(**m));
      Check(!i.ok() || !s->has_value() || !i->has_value() || uint64_t(**i) == **s);
      return Response::Json(200, {{"tenant", r.caller.tenant}, {"admin", r.caller.admin}});
    };
    router.Add("GET", "/v1/params", params);
    router.Add("POST", "/v1/params", params);
    router.Add("PUT", "/v1/throw", [](const Request&) -> Response { throw std::runtime_error("boom"); });
  }
};

Fixture& F() {
  static Fixture* f = new Fixture;  // lives for the process, like a daemon's server
  return *f;
}

bool KnownStatus(int s) {
  return s == 200 || s == 400 || s == 401 || s == 403 || s == 404 || s == 405 || s == 415 || s == 500;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Fixture& f = F();
  const char* p = reinterpret_cast<const char*>(data);
  size_t left = size;
  for (int n = 0; n < 8; ++n) {  // keep-alive: requests one after another
    RequestParser parser;
    LimitRequestParser(parser, f.opts.max_body_bytes);
    parser.eager(true);
    beast::error_code ec;
    bool header_checked = false;
    bool too_large = false;
    while (!parser.is_done()) {
      size_t used = parser.put(net::buffer(p, left), ec);
      p += used;
      left -= used;
      if (ec == bhttp::error::need_more) {
        // Every byte left was offered: the parser needs bytes the client
        // never sent. Beast's read would now read from the socket and offer
        // the unconsumed bytes plus new ones, never the same bytes again
        // (offering them again trips its assertions: a chunk header cut after
        // "0\r\n" did). So the client has closed the connection: as Beast's
        // read does, end of stream before any byte, else the parser decides.
        if (!parser.got_some()) return 0;
        parser.put_eof(ec);
        break;
      }
      if (ec) break;
      if (parser.is_header_done() && !header_checked) {
        header_checked = true;
        if (BodyTooLarge(parser, f.opts.max_body_bytes)) {
          too_large = true;
          break;
        }
      }
      if (used == 0 && !parser.is_done()) break;
    }
    if (too_large || ec == bhttp::error::body_limit) return 0;  // 413 and close
    if (ec || !parser.is_done()) return 0;                      // garbage or closed: nothing answered
    auto& parsed = parser.get();
    const bool keep_alive = parsed.keep_alive();
    Request req = ToRequest(parsed);
    Response r = f.router.Dispatch(req);
    Check(KnownStatus(r.status));
    Check(req.rest.empty() || (req.path.size() > req.rest.size() &&
                               req.path.compare(req.path.size() - req.rest.size(), req.rest.size(), req.rest) == 0));
    if (!keep_alive || left == 0) break;
  }
  return 0;
}

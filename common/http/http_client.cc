// SPDX-License-Identifier: Apache-2.0
#include "common/http/http_client.h"

#include "common/base/asio_status.h"
#include "common/http/http_detail.h"

namespace cdp::http {

using namespace detail;

Result<ClientResponse> HttpRequest(const std::string& host, uint16_t port, std::string_view method,
                                   std::string_view target, std::string_view body, std::chrono::milliseconds timeout,
                                   const ClientOptions& opts) {
  std::string where = std::string(method) + " http://" + host + ":" + std::to_string(port) + std::string(target);
  bhttp::verb verb = bhttp::string_to_verb(method);
  if (verb == bhttp::verb::unknown) return Status::InvalidArgument(where + ": unknown method");
  if (target.empty() || target.front() != '/') return Status::InvalidArgument(where + ": target must start with '/'");

  net::io_context ioc;
  tcp::resolver resolver(ioc);
  beast::tcp_stream stream(ioc);
  bhttp::request<bhttp::string_body> req{verb, std::string(target), 11};
  req.set(bhttp::field::host, host + ":" + std::to_string(port));
  req.set(bhttp::field::user_agent, "opencdp");
  req.set(bhttp::field::connection, "close");
  if (!opts.bearer_token.empty()) req.set(bhttp::field::authorization, "Bearer " + opts.bearer_token);
  if (!body.empty()) {
    req.set(bhttp::field::content_type, opts.content_type);
    req.body() = std::string(body);
  }
  req.prepare_payload();
  beast::flat_buffer buf;
  bhttp::response_parser<bhttp::string_body> parser;
  parser.body_limit(opts.max_response_bytes);
  parser.header_limit(kHeaderLimit);

  Status result;
  bool done = false;
  auto fail = [&](beast::error_code ec, const char* step) {
    if (ec == beast::error::timeout) {
      result = Status::Unavailable(where + ": " + step + ": timed out after " + std::to_string(timeout.count()) + " ms");
    } else if (ec.category() == bhttp::make_error_code(bhttp::error::body_limit).category()) {
      result = Status::Corruption(where + ": " + step + ": " + ec.message());
    } else {
      result = FromAsioError(ec, where + ": " + step);
      if (result.code() == Code::kNotFound) result = Status::InvalidArgument(result.message());
    }
    done = true;
  };

  auto deadline = std::chrono::steady_clock::now() + timeout;
  resolver.async_resolve(host, std::to_string(port), [&](beast::error_code ec, tcp::resolver::results_type results) {
    if (ec) {
      result = Status::InvalidArgument(where + ": resolve " + host + ": " + ec.message());
      done = true;
      return;
    }
    stream.expires_at(deadline);
    stream.async_connect(results, [&](beast::error_code ec2, const tcp::endpoint&) {
      if (ec2) return fail(ec2, "connect");
      bhttp::async_write(stream, req, [&](beast::error_code ec3, size_t) {
        // A server that answers early (413) may close while we write: still read its answer.
        if (ec3 && ec3 != net::error::broken_pipe && ec3 != net::error::connection_reset) return fail(ec3, "write");
        bhttp::async_read(stream, buf, parser, [&](beast::error_code ec4, size_t) {
          if (ec4) return fail(ec4, "read");
          done = true;
        });
      });
    });
  });
  ioc.run_for(timeout + std::chrono::milliseconds(100));
  if (!done) return Status::Unavailable(where + ": timed out after " + std::to_string(timeout.count()) + " ms");
  if (!result.ok()) return result;
  auto& res = parser.get();
  ClientResponse out;
  out.status = int(res.result_int());
  out.content_type = std::string(res[bhttp::field::content_type]);
  out.body = std::move(res.body());
  return out;
}

}  // namespace cdp::http

// SPDX-License-Identifier: Apache-2.0
#include "common/http/http_client.h"

#include <openssl/ssl.h>

#include <boost/asio/ssl.hpp>
#include <optional>

#include "common/base/asio_status.h"
#include "common/crypto/pki.h"
#include "common/http/http_detail.h"

namespace cdp::http {

using namespace detail;

namespace {

// The TLS client side: TLS 1.3 only, the server's certificate verified
// against `o.tls_ca` (the site CA) and carrying a site identity; our own
// certificate when one is given.
Result<std::unique_ptr<net::ssl::context>> ClientContext(const ClientOptions& o) {
  auto ctx = std::make_unique<net::ssl::context>(net::ssl::context::tls_client);
  SSL_CTX_set_min_proto_version(ctx->native_handle(), TLS1_3_VERSION);
  boost::system::error_code ec;
  ctx->load_verify_file(o.tls_ca, ec);
  if (ec) return Status::InvalidArgument("tls ca " + o.tls_ca + ": " + ec.message());
  ctx->set_verify_mode(net::ssl::verify_peer, ec);
  ctx->set_verify_callback(
      [](bool ok, net::ssl::verify_context& v) {
        if (!ok) return false;
        // The leaf must be one of the site's daemons (common/crypto/pki.h).
        if (X509_STORE_CTX_get_error_depth(v.native_handle()) != 0) return true;
        return pki::IdentityOf(X509_STORE_CTX_get_current_cert(v.native_handle())).ok();
      },
      ec);
  if (!o.tls_cert.empty()) {
    ctx->use_certificate_chain_file(o.tls_cert, ec);
    if (ec) return Status::InvalidArgument("tls cert " + o.tls_cert + ": " + ec.message());
    ctx->use_private_key_file(o.tls_key, net::ssl::context::pem, ec);
    if (ec) return Status::InvalidArgument("tls key " + o.tls_key + ": " + ec.message());
  }
  return ctx;
}

}  // namespace

Result<ClientResponse> HttpRequest(const std::string& host, uint16_t port, std::string_view method,
                                   std::string_view target, std::string_view body, std::chrono::milliseconds timeout,
                                   const ClientOptions& opts) {
  const bool tls = !opts.tls_ca.empty();
  std::string where = std::string(method) + (tls ? " https://" : " http://") + host + ":" + std::to_string(port) + std::string(target);
  bhttp::verb verb = bhttp::string_to_verb(method);
  if (verb == bhttp::verb::unknown) return Status::InvalidArgument(where + ": unknown method");
  if (target.empty() || target.front() != '/') return Status::InvalidArgument(where + ": target must start with '/'");

  std::unique_ptr<net::ssl::context> ctx;
  if (tls) {
    CDP_ASSIGN_OR_RETURN(ctx, ClientContext(opts));
  }
  net::io_context ioc;
  tcp::resolver resolver(ioc);
  beast::tcp_stream plain(ioc);
  std::optional<net::ssl::stream<beast::tcp_stream&>> secure;
  if (tls) secure.emplace(plain, *ctx);
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
    plain.expires_at(deadline);
    plain.async_connect(results, [&](beast::error_code ec2, const tcp::endpoint&) {
      if (ec2) return fail(ec2, "connect");
      auto exchange = [&](auto& stream) {
        bhttp::async_write(stream, req, [&](beast::error_code ec3, size_t) {
          // A server that answers early (413) may close while we write: still read its answer.
          if (ec3 && ec3 != net::error::broken_pipe && ec3 != net::error::connection_reset) return fail(ec3, "write");
          bhttp::async_read(stream, buf, parser, [&](beast::error_code ec4, size_t) {
            if (ec4) return fail(ec4, "read");
            done = true;
          });
        });
      };
      if (!tls) return exchange(plain);
      secure->async_handshake(net::ssl::stream_base::client, [&, exchange](beast::error_code ec5) {
        if (ec5) {
          // Another CA, no site identity, or not TLS at all.
          result = Status::PermissionDenied(where + ": TLS handshake: " + ec5.message() +
                                            " (is the server's certificate from the CA in " + opts.tls_ca + "?)");
          done = true;
          return;
        }
        exchange(*secure);
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

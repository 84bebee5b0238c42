// SPDX-License-Identifier: Apache-2.0
// HTTP client: one synchronous HTTP/1.1 request, for cdpctl, loadgen and tests.
//
// Thread safety: HttpRequest() is reentrant; each call runs its own io_context.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/base/result.h"
#include "common/base/status.h"

namespace cdp::http {

// A synchronous HTTP/1.1 client for cdpctl and tests: connects to host:port,
// sends one request (Connection: close) and reads the whole response.
// `timeout` bounds the whole exchange (resolve, connect, write, read).
// Success: the response, whatever its status code (404 is a success here).
// Failure: kUnavailable (refused, reset, timed out; retryable), kInvalidArgument
// (host does not resolve, bad method), kCorruption (malformed or too large response).
struct ClientResponse {
  int status = 0;
  std::string body;
  std::string content_type;
};

struct ClientOptions {
  std::string content_type = "application/json";  // sent when body is non-empty
  size_t max_response_bytes = 64 << 20;
  std::string bearer_token;  // sent as "Authorization: Bearer TOKEN" when non-empty (common/http/control_token.h)
  // HTTPS when set: the server's certificate must verify against this CA
  // file (the site CA, `cdpctl pki`) and carry a site identity
  // (common/crypto/pki.h); TLS 1.3 only. A failed handshake is
  // kPermissionDenied. tls_cert / tls_key: a client certificate to present
  // (optional).
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
};

Result<ClientResponse> HttpRequest(const std::string& host, uint16_t port, std::string_view method,
                                   std::string_view target, std::string_view body = {},
                                   std::chrono::milliseconds timeout = std::chrono::milliseconds(5000),
                                   const ClientOptions& opts = {});

}  // namespace cdp::http

// SPDX-License-Identifier: Apache-2.0
// Internal to common/http/http_server.cc and common/http/http_client.cc: the Beast
// aliases and the limits both ends of our HTTP apply. Not for other users.
#pragma once

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstddef>

namespace cdp::http::detail {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

// Request and response headers larger than this are refused (431 / an error).
inline constexpr size_t kHeaderLimit = 16 << 10;

}  // namespace cdp::http::detail

// SPDX-License-Identifier: Apache-2.0
// The one host:port parser every binary uses.
#include <catch2/catch.hpp>

#include "common/base/host_port.h"

namespace {

using cdp::HostPort;
using cdp::ParseHostPort;
using Rules = cdp::HostPort::Rules;

TEST_CASE("host:port: names, IPv4 and bracketed IPv6", "[host_port]") {
  CHECK(*ParseHostPort("ps.example.com:7400") == HostPort{"ps.example.com", 7400});
  CHECK(*ParseHostPort("10.0.0.1:1") == HostPort{"10.0.0.1", 1});
  CHECK(*ParseHostPort("[::1]:65535") == HostPort{"::1", 65535});
  CHECK(*ParseHostPort("[fe80::1%eth0]:7500") == HostPort{"fe80::1%eth0", 7500});
  CHECK(HostPort{"::1", 7400}.ToString() == "[::1]:7400");
  CHECK(HostPort{"10.0.0.1", 7400}.ToString() == "10.0.0.1:7400");
  CHECK(HostPort{}.ToString() == "none");
}

TEST_CASE("host:port: every malformed address is refused with its reason", "[host_port]") {
  auto msg = [](std::string_view t, Rules r = Rules::Peer()) {
    auto hp = ParseHostPort(t, r);
    REQUIRE_FALSE(hp.ok());
    CHECK(hp.status().code() == cdp::Code::kInvalidArgument);
    return hp.status().message();
  };
  CHECK(msg("host") == "bad address 'host': want host:port");
  CHECK(msg(":7400") == "bad address ':7400': no host");
  CHECK(msg("host:") == "bad port in 'host:'");
  CHECK(msg("host:65536") == "bad port in 'host:65536'");
  CHECK(msg("host:123456") == "bad port in 'host:123456'");
  CHECK(msg("host:-1") == "bad port in 'host:-1'");
  CHECK(msg("host:74x") == "bad port in 'host:74x'");
  CHECK(msg("host:0") == "bad port in 'host:0'");
  CHECK(msg("::1:7400") == "bad address '::1:7400': write an IPv6 address as [address]:port");
  CHECK(msg("[::1:7400") == "bad address '[::1:7400': no closing ']'");
  CHECK(msg("[::1]7400") == "bad address '[::1]7400': want [address]:port");
  CHECK(msg("[]:7400") == "bad address '[]:7400': no host");
  CHECK(msg("none") == "bad address 'none': want host:port");
  CHECK(msg("") == "bad address '': want host:port");
}

TEST_CASE("host:port: listeners may ask for port 0 and may be off", "[host_port]") {
  CHECK(*ParseHostPort("127.0.0.1:0", Rules::Listen()) == HostPort{"127.0.0.1", 0});
  CHECK_FALSE(ParseHostPort("none", Rules::Listen()).ok());
  CHECK(ParseHostPort("none", Rules::OptionalListen())->off());
  CHECK(ParseHostPort("", Rules::OptionalListen())->off());
  CHECK(*ParseHostPort("0.0.0.0:7400", Rules::OptionalListen()) == HostPort{"0.0.0.0", 7400});
}

TEST_CASE("host:port: a URL authority without a port gets the scheme's", "[host_port]") {
  CHECK(*ParseHostPort("nbd.example", Rules::UrlAuthority(10809)) == HostPort{"nbd.example", 10809});
  CHECK(*ParseHostPort("[::1]", Rules::UrlAuthority(80)) == HostPort{"::1", 80});
  CHECK(*ParseHostPort("h:81", Rules::UrlAuthority(80)) == HostPort{"h", 81});
  CHECK_FALSE(ParseHostPort("h:0", Rules::UrlAuthority(80)).ok());
}

}  // namespace

// SPDX-License-Identifier: Apache-2.0
// HostPort: a network address as operators write it in configs and flags,
// "host:port" or "[v6 address]:port", parsed in this one place for every
// binary (daemon listeners and peers, cdpctl endpoints, loadgen URLs).
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/base/result.h"

namespace cdp {

struct HostPort {
  std::string host;  // name or address, without brackets; "" = off (see Rules::allow_off)
  uint16_t port = 0;

  bool off() const { return host.empty(); }
  // "10.0.0.1:7400", "[::1]:7400", or "none" when off.
  std::string ToString() const;
  bool operator==(const HostPort&) const = default;

  struct Rules {
    bool allow_off = false;        // "none" and "" mean "no address" (off())
    bool allow_port_zero = false;  // port 0: an ephemeral port (listeners in tests)
    std::optional<uint16_t> default_port;  // "host" alone is allowed and gets this port

    static constexpr Rules Peer() { return {}; }  // where to connect: host:port, port 1..65535
    static constexpr Rules Listen() { return {false, true, std::nullopt}; }          // port 0 = ephemeral
    static constexpr Rules OptionalListen() { return {true, true, std::nullopt}; }  // and "none" = off
    static constexpr Rules UrlAuthority(uint16_t port) { return {false, false, port}; }  // "host" = host:port
  };
};

// Success: the address. Failure: kInvalidArgument saying what is wrong with
// `text` ("bad address 'x': want host:port" and the like); no port, a port
// outside 1..65535 (0 only when allowed), an empty host, an unclosed '['.
Result<HostPort> ParseHostPort(std::string_view text, const HostPort::Rules& rules);

// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then
// released): for local clusters and tests; another process may take it first.
Result<uint16_t> FreeLoopbackPort();

// An IPv4 or IPv6 address literal ("10.0.0.1", "::1"), without brackets.
bool IsIpAddress(const std::string& host);
// An address literal, or a DNS name of letters, digits, '-' and '.' (at most
// 253 characters): what a certificate's subjectAltName or allowed_hosts holds.
bool ValidHostName(const std::string& host);
// "localhost", 127.0.0.0/8 or ::1: a host only this machine can reach.
bool IsLoopbackHost(const std::string& host);
inline Result<HostPort> ParseHostPort(std::string_view text) { return ParseHostPort(text, HostPort::Rules{}); }

}  // namespace cdp

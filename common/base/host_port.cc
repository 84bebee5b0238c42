// SPDX-License-Identifier: Apache-2.0
#include "common/base/host_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>

namespace cdp {

std::string HostPort::ToString() const {
  if (off()) return "none";
  std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return h + ":" + std::to_string(port);
}

Result<HostPort> ParseHostPort(std::string_view text, const HostPort::Rules& rules) {
  const std::string quoted = "'" + std::string(text) + "'";
  HostPort hp;
  if (text.empty() || text == "none") {
    if (rules.allow_off) return hp;
    return Status::InvalidArgument("bad address " + quoted + ": want host:port");
  }
  std::string_view port_text;
  bool has_port = false;
  if (text.front() == '[') {
    size_t close = text.find(']');
    if (close == std::string_view::npos) return Status::InvalidArgument("bad address " + quoted + ": no closing ']'");
    hp.host = std::string(text.substr(1, close - 1));
    std::string_view rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return Status::InvalidArgument("bad address " + quoted + ": want [address]:port");
      port_text = rest.substr(1);
      has_port = true;
    }
  } else {
    size_t colon = text.rfind(':');
    if (colon != std::string_view::npos && text.find(':') != colon) {
      return Status::InvalidArgument("bad address " + quoted + ": write an IPv6 address as [address]:port");
    }
    hp.host = std::string(text.substr(0, colon));
    if (colon != std::string_view::npos) {
      port_text = text.substr(colon + 1);
      has_port = true;
    }
  }
  if (hp.host.empty()) return Status::InvalidArgument("bad address " + quoted + ": no host");
  if (!has_port) {
    if (!rules.default_port) return Status::InvalidArgument("bad address " + quoted + ": want host:port");
    hp.port = *rules.default_port;
    return hp;
  }
  uint32_t port = 0;
  if (port_text.empty() || port_text.size() > 5) return Status::InvalidArgument("bad port in " + quoted);
  for (char c : port_text) {
    if (c < '0' || c > '9') return Status::InvalidArgument("bad port in " + quoted);
    port = port * 10 + uint32_t(c - '0');
  }
  if (port > 65535 || (port == 0 && !rules.allow_port_zero)) return Status::InvalidArgument("bad port in " + quoted);
  hp.port = uint16_t(port);
  return hp;
}

Result<uint16_t> FreeLoopbackPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::FromErrno(errno, "socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    Status s = Status::FromErrno(errno, "bind 127.0.0.1:0");
    ::close(fd);
    return s;
  }
  ::close(fd);
  return uint16_t(ntohs(a.sin_port));
}

bool IsIpAddress(const std::string& h) {
  in6_addr a6;
  in_addr a4;
  return ::inet_pton(AF_INET, h.c_str(), &a4) == 1 || ::inet_pton(AF_INET6, h.c_str(), &a6) == 1;
}

bool ValidHostName(const std::string& h) {
  if (h.empty() || h.size() > 253) return false;
  if (IsIpAddress(h)) return true;
  for (char c : h) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.')) return false;
  }
  return true;
}

bool IsLoopbackHost(const std::string& h) {
  if (h == "localhost") return true;
  in_addr a4;
  if (::inet_pton(AF_INET, h.c_str(), &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
  in6_addr a6;
  return ::inet_pton(AF_INET6, h.c_str(), &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6);
}

}  // namespace cdp

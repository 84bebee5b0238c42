// SPDX-License-Identifier: Apache-2.0
#include "loadgen/nbd_client.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/base/host_port.h"
#include "common/nbd/nbd_proto.h"

namespace cdp::loadgen {

Result<NbdUri> ParseNbdUri(std::string_view uri) {
  constexpr std::string_view kUnix = "nbd+unix:///";
  if (uri.substr(0, kUnix.size()) == kUnix) {
    std::string_view rest = uri.substr(kUnix.size());
    const size_t q = rest.find('?');
    constexpr std::string_view kSocket = "socket=";
    NbdUri u;
    u.export_name = std::string(rest.substr(0, q));
    std::string_view query = q == std::string_view::npos ? std::string_view() : rest.substr(q + 1);
    if (query.substr(0, kSocket.size()) != kSocket || query.size() == kSocket.size() ||
        query.find('&') != std::string_view::npos) {
      return Status::InvalidArgument("nbd+unix URI needs exactly ?socket=PATH: " + std::string(uri));
    }
    u.socket_path = std::string(query.substr(kSocket.size()));
    if (!nbd::ValidWireName(u.export_name)) return Status::InvalidArgument("bad export name in " + std::string(uri));
    return u;
  }
  constexpr std::string_view kScheme = "nbd://";
  if (uri.substr(0, kScheme.size()) != kScheme) {
    return Status::InvalidArgument("not an nbd:// or nbd+unix:// URI (no TLS in this client): " + std::string(uri));
  }
  std::string_view rest = uri.substr(kScheme.size());
  size_t slash = rest.find('/');
  std::string_view hostport = rest.substr(0, slash);
  NbdUri u;
  if (slash != std::string_view::npos) u.export_name = std::string(rest.substr(slash + 1));
  if (!nbd::ValidWireName(u.export_name)) return Status::InvalidArgument("bad export name in " + std::string(uri));
  auto hp = ParseHostPort(hostport, HostPort::Rules::UrlAuthority(u.port));
  if (!hp.ok()) return Status::InvalidArgument(std::string(uri) + ": " + hp.status().message());
  u.host = hp->host;
  u.port = hp->port;
  return u;
}

namespace {

void SetTimeouts(int fd, uint32_t timeout_ms) {
  timeval tv{};
  tv.tv_sec = timeout_ms / 1000;
  tv.tv_usec = (timeout_ms % 1000) * 1000;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

Result<int> ConnectUnix(const std::string& path, uint32_t timeout_ms) {
  sockaddr_un sa{};
  if (path.size() >= sizeof sa.sun_path) return Status::InvalidArgument("socket path too long: " + path);
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, path.data(), path.size());
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::FromErrno(errno, "socket");
  SetTimeouts(fd, timeout_ms);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    Status s = Status::FromErrno(errno, "connect unix:" + path);
    ::close(fd);
    return Status::Unavailable(s.message());
  }
  return fd;
}

}  // namespace

Result<std::unique_ptr<NbdClient>> NbdClient::Connect(const NbdUri& uri, const NbdClientOptions& opts) {
  if (!uri.socket_path.empty()) {
    CDP_ASSIGN_OR_RETURN(int ufd, ConnectUnix(uri.socket_path, opts.timeout_ms));
    NbdClientOptions o = opts;
    if (o.max_inflight == 0) o.max_inflight = 1;
    std::unique_ptr<NbdClient> c(new NbdClient(ufd, o));
    CDP_RETURN_IF_ERROR(
        c->Negotiate(uri.export_name).WithContext("nbd+unix:///" + uri.export_name + "?socket=" + uri.socket_path));
    return c;
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string port = std::to_string(uri.port);
  int rc = getaddrinfo(uri.host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) return Status::InvalidArgument("resolve " + uri.host + ": " + gai_strerror(rc));
  Status last = Status::Unavailable("no address for " + uri.host);
  int fd = -1;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    timeval tv{};
    tv.tv_sec = opts.timeout_ms / 1000;
    tv.tv_usec = (opts.timeout_ms % 1000) * 1000;
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
    Status s = Status::FromErrno(errno, "connect " + uri.host + ":" + port);
    last = Status::Unavailable(s.message());
    ::close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd < 0) return last;
  NbdClientOptions o = opts;
  if (o.max_inflight == 0) o.max_inflight = 1;
  std::unique_ptr<NbdClient> c(new NbdClient(fd, o));
  CDP_RETURN_IF_ERROR(c->Negotiate(uri.export_name).WithContext("nbd://" + uri.host + ":" + port + "/" + uri.export_name));
  return c;
}

NbdClient::~NbdClient() {
  if (fd_ >= 0) ::close(fd_);
}

bool NbdClient::can_flush() const { return tflags_ & nbd::kFlagSendFlush; }

Status NbdClient::Fail(Status s) {
  if (broken_.ok()) broken_ = s;
  return s;
}

Status NbdClient::SendAll(const uint8_t* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::send(fd_, p, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Fail(Status::Unavailable(Status::FromErrno(errno, "nbd send").message()));
    }
    p += w;
    n -= size_t(w);
  }
  return Status::OK();
}

Status NbdClient::RecvAll(uint8_t* p, size_t n) {
  while (n > 0) {
    ssize_t r = ::recv(fd_, p, n, 0);
    if (r == 0) return Fail(Status::Unavailable("nbd: server closed the connection"));
    if (r < 0) {
      if (errno == EINTR) continue;
      return Fail(Status::Unavailable(Status::FromErrno(errno, "nbd recv").message()));
    }
    p += r;
    n -= size_t(r);
  }
  return Status::OK();
}

Status NbdClient::Negotiate(const std::string& export_name) {
  uint8_t greet[nbd::kGreetingSize];
  CDP_RETURN_IF_ERROR(RecvAll(greet, sizeof(greet)));
  if (nbd::DecodeBE64(greet) != nbd::kNbdMagic || nbd::DecodeBE64(greet + 8) != nbd::kIHaveOpt)
    return Fail(Status::Corruption("not a newstyle NBD server (bad greeting magic)"));
  uint16_t hflags = nbd::DecodeBE16(greet + 16);
  if (!(hflags & nbd::kFlagFixedNewstyle)) return Fail(Status::NotSupported("server is not fixed newstyle"));
  uint32_t cflags = nbd::kClientFlagFixedNewstyle | ((hflags & nbd::kFlagNoZeroes) ? nbd::kClientFlagNoZeroes : 0);
  Bytes out;
  nbd::PutBE32(out, cflags);
  // NBD_OPT_GO: u32 name length, name, u16 info count, u16 NBD_INFO_BLOCK_SIZE.
  Bytes data;
  nbd::PutBE32(data, uint32_t(export_name.size()));
  data.insert(data.end(), export_name.begin(), export_name.end());
  nbd::PutBE16(data, 1);
  nbd::PutBE16(data, nbd::kInfoBlockSize);
  nbd::PutBE64(out, nbd::kIHaveOpt);
  nbd::PutBE32(out, nbd::kOptGo);
  nbd::PutBE32(out, uint32_t(data.size()));
  out.insert(out.end(), data.begin(), data.end());
  CDP_RETURN_IF_ERROR(SendAll(out.data(), out.size()));

  bool have_size = false;
  for (int replies = 0; replies < 64; ++replies) {
    uint8_t h[nbd::kOptReplyHeaderSize];
    CDP_RETURN_IF_ERROR(RecvAll(h, sizeof(h)));
    if (nbd::DecodeBE64(h) != nbd::kOptReplyMagic) return Fail(Status::Corruption("bad option reply magic"));
    uint32_t type = nbd::DecodeBE32(h + 12), len = nbd::DecodeBE32(h + 16);
    if (len > 65536) return Fail(Status::Corruption("option reply too long: " + std::to_string(len)));
    Bytes body(len);
    if (len) CDP_RETURN_IF_ERROR(RecvAll(body.data(), len));
    if (type & nbd::kRepErrBit) {
      std::string msg(body.begin(), body.end());
      if (type == nbd::kRepErrUnknown)
        return Fail(Status::NotFound("export '" + export_name + "' unknown" + (msg.empty() ? "" : ": " + msg)));
      return Fail(Status::InvalidArgument("NBD_OPT_GO refused (error " + std::to_string(type & ~nbd::kRepErrBit) +
                                          ")" + (msg.empty() ? "" : ": " + msg)));
    }
    if (type == nbd::kRepInfo) {
      if (len < 2) return Fail(Status::Corruption("short NBD_REP_INFO"));
      uint16_t info = nbd::DecodeBE16(body.data());
      if (info == nbd::kInfoExport) {
        if (len != 12) return Fail(Status::Corruption("bad NBD_INFO_EXPORT length"));
        size_ = nbd::DecodeBE64(body.data() + 2);
        tflags_ = nbd::DecodeBE16(body.data() + 10);
        have_size = true;
      } else if (info == nbd::kInfoBlockSize) {
        if (len != 14) return Fail(Status::Corruption("bad NBD_INFO_BLOCK_SIZE length"));
        uint32_t mx = nbd::DecodeBE32(body.data() + 10);
        if (mx > 0) max_block_ = std::min<uint32_t>(mx, 32u << 20);
      }
      continue;
    }
    if (type == nbd::kRepAck) {
      if (!have_size) return Fail(Status::Corruption("NBD_OPT_GO acknowledged without NBD_INFO_EXPORT"));
      return Status::OK();
    }
    return Fail(Status::Corruption("unexpected option reply type " + std::to_string(type)));
  }
  return Fail(Status::Corruption("too many option replies"));
}

Status NbdClient::ReadOneReply() {
  uint8_t r[nbd::kSimpleReplySize];
  CDP_RETURN_IF_ERROR(RecvAll(r, sizeof(r)));
  if (nbd::DecodeBE32(r) != nbd::kSimpleReplyMagic) return Fail(Status::Corruption("bad NBD reply magic"));
  uint32_t err = nbd::DecodeBE32(r + 4);
  uint64_t handle = nbd::DecodeBE64(r + 8);
  auto it = outstanding_.find(handle);
  if (it == outstanding_.end()) return Fail(Status::Corruption("NBD reply for unknown handle " + std::to_string(handle)));
  auto [off, len] = it->second;
  outstanding_.erase(it);
  if (err != 0)
    return Fail(Status::IOError("NBD request at offset " + std::to_string(off) + " length " + std::to_string(len) +
                                " failed: error " + std::to_string(err) + " (" + std::strerror(int(err)) + ")"));
  return Status::OK();
}

Status NbdClient::Write(uint64_t offset, ByteSpan data, bool fua) {
  if (!broken_.ok()) return broken_;
  if (closed_) return Status::Aborted("nbd client closed");
  if (tflags_ & nbd::kFlagReadOnly) return Status::PermissionDenied("export is read-only");
  if (data.size() > max_block_ || data.empty())
    return Status::InvalidArgument("write length " + std::to_string(data.size()) + " outside 1.." + std::to_string(max_block_));
  if (offset > size_ || data.size() > size_ - offset)
    return Status::OutOfRange("write [" + std::to_string(offset) + ", +" + std::to_string(data.size()) +
                              ") past export size " + std::to_string(size_));
  while (outstanding_.size() >= opts_.max_inflight) CDP_RETURN_IF_ERROR(ReadOneReply());
  uint64_t handle = next_handle_++;
  uint8_t h[nbd::kRequestHeaderSize];
  nbd::EncodeBE32(h, nbd::kRequestMagic);
  uint16_t flags = (fua && (tflags_ & nbd::kFlagSendFua)) ? nbd::kCmdFlagFua : 0;
  h[4] = uint8_t(flags >> 8);
  h[5] = uint8_t(flags);
  h[6] = uint8_t(nbd::kCmdWrite >> 8);
  h[7] = uint8_t(nbd::kCmdWrite);
  nbd::EncodeBE64(h + 8, handle);
  nbd::EncodeBE64(h + 16, offset);
  nbd::EncodeBE32(h + 24, uint32_t(data.size()));
  outstanding_[handle] = {offset, uint32_t(data.size())};
  CDP_RETURN_IF_ERROR(SendAll(h, sizeof(h)));
  return SendAll(data.data(), data.size());
}

Status NbdClient::Flush() {
  if (!broken_.ok()) return broken_;
  if (closed_) return Status::Aborted("nbd client closed");
  while (!outstanding_.empty()) CDP_RETURN_IF_ERROR(ReadOneReply());
  if (!can_flush()) return Status::OK();
  uint64_t handle = next_handle_++;
  uint8_t h[nbd::kRequestHeaderSize] = {};
  nbd::EncodeBE32(h, nbd::kRequestMagic);
  h[7] = uint8_t(nbd::kCmdFlush);
  nbd::EncodeBE64(h + 8, handle);
  outstanding_[handle] = {0, 0};
  CDP_RETURN_IF_ERROR(SendAll(h, sizeof(h)));
  return ReadOneReply();
}

Status NbdClient::Close() {
  if (closed_) return broken_;
  Status s = broken_;
  if (s.ok()) {
    while (!outstanding_.empty() && s.ok()) s = ReadOneReply();
  }
  if (fd_ >= 0) {
    if (broken_.ok()) {
      uint8_t h[nbd::kRequestHeaderSize] = {};
      nbd::EncodeBE32(h, nbd::kRequestMagic);
      h[7] = uint8_t(nbd::kCmdDisc);
      nbd::EncodeBE64(h + 8, next_handle_++);
      Status ds = SendAll(h, sizeof(h));
      if (s.ok()) s = ds;
    }
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    fd_ = -1;
  }
  closed_ = true;
  return s;
}

}  // namespace cdp::loadgen

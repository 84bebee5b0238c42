// SPDX-License-Identifier: Apache-2.0
#include "common/nbd/nbd_client.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "common/base/host_port.h"
#include "common/nbd/nbd_proto.h"
#include "common/net/byte_stream.h"
#include "common/net/tls_stream.h"

namespace cdp {

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
  NbdUri u;
  std::string_view rest;
  if (uri.rfind("nbd://", 0) == 0) {
    rest = uri.substr(6);
  } else if (uri.rfind("nbds://", 0) == 0) {
    rest = uri.substr(7);
    u.tls = true;
  } else {
    return Status::InvalidArgument("not an nbd://, nbds:// or nbd+unix:// URI: " + std::string(uri));
  }
  const size_t q = rest.find('?');
  if (q != std::string_view::npos) {
    constexpr std::string_view kCerts = "tls-certificates=";
    std::string_view query = rest.substr(q + 1);
    if (!u.tls || query.substr(0, kCerts.size()) != kCerts || query.size() == kCerts.size() ||
        query.find('&') != std::string_view::npos) {
      return Status::InvalidArgument("the only query an NBD URI may have is nbds://...?tls-certificates=DIR: " +
                                     std::string(uri));
    }
    u.tls_certificates = std::string(query.substr(kCerts.size()));
    rest = rest.substr(0, q);
  }
  size_t slash = rest.find('/');
  std::string_view hostport = rest.substr(0, slash);
  if (slash != std::string_view::npos) u.export_name = std::string(rest.substr(slash + 1));
  if (!nbd::ValidWireName(u.export_name)) return Status::InvalidArgument("bad export name in " + std::string(uri));
  auto hp = ParseHostPort(hostport, HostPort::Rules::UrlAuthority(u.port));
  if (!hp.ok()) return Status::InvalidArgument(std::string(uri) + ": " + hp.status().message());
  u.host = hp->host;
  u.port = hp->port;
  return u;
}

NbdClient::NbdClient(std::unique_ptr<ByteStream> stream, const NbdClientOptions& opts)
    : stream_(std::move(stream)), opts_(opts) {
  if (opts_.max_inflight == 0) opts_.max_inflight = 1;
}

Result<std::unique_ptr<NbdClient>> NbdClient::Connect(const NbdUri& uri, const NbdClientOptions& opts) {
  if (uri.tls && uri.tls_certificates.empty())
    return Status::InvalidArgument("an nbds:// URI needs ?tls-certificates=DIR (ca-cert.pem, client-cert.pem, "
                                   "client-key.pem)");
  const std::chrono::milliseconds timeout(opts.timeout_ms);
  const bool unix_socket = !uri.socket_path.empty();
  const std::string where = unix_socket ? "nbd+unix:///" + uri.export_name + "?socket=" + uri.socket_path
                                        : std::string(uri.tls ? "nbds://" : "nbd://") + uri.host + ":" +
                                              std::to_string(uri.port) + "/" + uri.export_name;
  Result<std::unique_ptr<ByteStream>> s =
      unix_socket ? ConnectUnixStream(uri.socket_path, timeout) : ConnectTcpStream(uri.host, uri.port, timeout);
  if (!s.ok()) return s.status().WithContext(where);
  auto c = ConnectOver(std::move(*s), uri, opts);
  if (!c.ok()) return c.status().WithContext(where);
  return c;
}

Result<std::unique_ptr<NbdClient>> NbdClient::ConnectOver(std::unique_ptr<ByteStream> stream, const NbdUri& uri,
                                                          const NbdClientOptions& opts) {
  if (uri.tls && uri.tls_certificates.empty()) {
    return Status::InvalidArgument("an nbds:// URI needs ?tls-certificates=DIR");
  }
  std::unique_ptr<NbdClient> c(new NbdClient(std::move(stream), opts));
  CDP_RETURN_IF_ERROR(c->Negotiate(uri));
  return c;
}

NbdClient::~NbdClient() {
  if (stream_) stream_->Shutdown();
}

bool NbdClient::can_flush() const { return tflags_ & nbd::kFlagSendFlush; }
bool NbdClient::read_only() const { return tflags_ & nbd::kFlagReadOnly; }
bool NbdClient::can_write_zeroes() const { return tflags_ & nbd::kFlagSendWriteZeroes; }

Status NbdClient::Fail(Status s) {
  if (broken_.ok()) broken_ = s;
  return s;
}

Status NbdClient::SendAll(std::initializer_list<ByteSpan> bufs) {
  const std::vector<ByteSpan> v(bufs);
  Status s = stream_->WriteAll(v, std::chrono::steady_clock::now() + std::chrono::milliseconds(opts_.timeout_ms));
  return s.ok() ? s : Fail(s.WithContext("nbd send"));
}

Status NbdClient::RecvAll(uint8_t* p, size_t n) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(opts_.timeout_ms);
  while (n > 0) {
    auto r = stream_->ReadSome(std::span<uint8_t>(p, n), deadline);
    if (!r.ok()) return Fail(r.status().WithContext("nbd receive"));
    p += *r;
    n -= *r;
  }
  return Status::OK();
}

namespace {

// One option request: magic, option, length, data.
Bytes OptionRequest(uint32_t option, const Bytes& data) {
  Bytes out;
  nbd::PutBE64(out, nbd::kIHaveOpt);
  nbd::PutBE32(out, option);
  nbd::PutBE32(out, uint32_t(data.size()));
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// A server's error text as it may be shown: printable ASCII, at most 256 bytes.
std::string PrintableText(const Bytes& body) {
  std::string out;
  for (size_t i = 0; i < body.size() && i < 256; ++i) out += body[i] >= 0x20 && body[i] < 0x7f ? char(body[i]) : '?';
  return out;
}

}  // namespace

Status NbdClient::StartTls(const std::string& dir) {
  TlsFiles files{dir + "/ca-cert.pem", dir + "/client-cert.pem", dir + "/client-key.pem", ""};
  auto ctx = TlsContext::Load(files);
  if (!ctx.ok()) return Fail(ctx.status().WithContext("tls-certificates " + dir));
  CDP_RETURN_IF_ERROR(SendAll({OptionRequest(nbd::kOptStartTls, {})}));
  uint8_t h[nbd::kOptReplyHeaderSize];
  CDP_RETURN_IF_ERROR(RecvAll(h, sizeof(h)));
  if (nbd::DecodeBE64(h) != nbd::kOptReplyMagic) return Fail(Status::Corruption("bad option reply magic"));
  const uint32_t type = nbd::DecodeBE32(h + 12), len = nbd::DecodeBE32(h + 16);
  if (len > 4096) return Fail(Status::Corruption("option reply too long: " + std::to_string(len)));
  Bytes body(len);
  if (len) CDP_RETURN_IF_ERROR(RecvAll(body.data(), len));
  if (type != nbd::kRepAck)
    return Fail(Status::PermissionDenied("the server refused STARTTLS (reply " + std::to_string(type & ~nbd::kRepErrBit) +
                                         ")" + (len ? ": " + std::string(body.begin(), body.end()) : "")));
  auto tls = cdp::StartTls(std::move(stream_), *ctx, TlsSide::kClient, std::chrono::milliseconds(opts_.timeout_ms));
  if (!tls.ok()) return Fail(tls.status());
  stream_ = std::move(*tls);
  return Status::OK();
}

Status NbdClient::Negotiate(const NbdUri& uri) {
  const std::string& export_name = uri.export_name;
  uint8_t greet[nbd::kGreetingSize];
  CDP_RETURN_IF_ERROR(RecvAll(greet, sizeof(greet)));
  if (nbd::DecodeBE64(greet) != nbd::kNbdMagic || nbd::DecodeBE64(greet + 8) != nbd::kIHaveOpt)
    return Fail(Status::Corruption("not a newstyle NBD server (bad greeting magic)"));
  uint16_t hflags = nbd::DecodeBE16(greet + 16);
  if (!(hflags & nbd::kFlagFixedNewstyle)) return Fail(Status::NotSupported("server is not fixed newstyle"));
  uint32_t cflags = nbd::kClientFlagFixedNewstyle | ((hflags & nbd::kFlagNoZeroes) ? nbd::kClientFlagNoZeroes : 0);
  Bytes flags;
  nbd::PutBE32(flags, cflags);
  CDP_RETURN_IF_ERROR(SendAll({flags}));
  if (uri.tls) CDP_RETURN_IF_ERROR(StartTls(uri.tls_certificates));
  // NBD_OPT_GO: u32 name length, name, u16 info count, u16 NBD_INFO_BLOCK_SIZE.
  Bytes data;
  nbd::PutBE32(data, uint32_t(export_name.size()));
  data.insert(data.end(), export_name.begin(), export_name.end());
  nbd::PutBE16(data, 1);
  nbd::PutBE16(data, nbd::kInfoBlockSize);
  CDP_RETURN_IF_ERROR(SendAll({OptionRequest(nbd::kOptGo, data)}));

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
      std::string msg = PrintableText(body);
      if (type == nbd::kRepErrUnknown)
        return Fail(Status::NotFound("export '" + export_name + "' unknown" + (msg.empty() ? "" : ": " + msg)));
      if (type == nbd::kRepErrTlsReqd)
        return Fail(Status::PermissionDenied("the server requires TLS (use nbds://)" + (msg.empty() ? "" : ": " + msg)));
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

Status NbdClient::CheckRange(std::string_view what, uint64_t offset, uint64_t len) const {
  if (!broken_.ok()) return broken_;
  if (closed_) return Status::Aborted("nbd client closed");
  if (len > max_block_ || len == 0)
    return Status::InvalidArgument(std::string(what) + " length " + std::to_string(len) + " outside 1.." +
                                   std::to_string(max_block_));
  if (offset > size_ || len > size_ - offset)
    return Status::OutOfRange(std::string(what) + " [" + std::to_string(offset) + ", +" + std::to_string(len) +
                              ") past export size " + std::to_string(size_));
  return Status::OK();
}

Status NbdClient::SendRequest(uint16_t cmd, uint16_t flags, uint64_t offset, uint32_t len, ByteSpan payload) {
  while (outstanding_.size() >= opts_.max_inflight) CDP_RETURN_IF_ERROR(ReadOneReply());
  const uint64_t handle = next_handle_++;
  uint8_t h[nbd::kRequestHeaderSize];
  nbd::EncodeBE32(h, nbd::kRequestMagic);
  h[4] = uint8_t(flags >> 8);
  h[5] = uint8_t(flags);
  h[6] = uint8_t(cmd >> 8);
  h[7] = uint8_t(cmd);
  nbd::EncodeBE64(h + 8, handle);
  nbd::EncodeBE64(h + 16, offset);
  nbd::EncodeBE32(h + 24, len);
  outstanding_[handle] = {offset, len};
  return SendAll({ByteSpan(h, sizeof h), payload});
}

Status NbdClient::Write(uint64_t offset, ByteSpan data, bool fua) {
  CDP_RETURN_IF_ERROR(CheckRange("write", offset, data.size()));
  if (read_only()) return Status::PermissionDenied("export is read-only");
  const uint16_t flags = (fua && (tflags_ & nbd::kFlagSendFua)) ? nbd::kCmdFlagFua : 0;
  return SendRequest(nbd::kCmdWrite, flags, offset, uint32_t(data.size()), data);
}

Status NbdClient::WriteZeroes(uint64_t offset, uint32_t len, bool fua, bool may_trim) {
  CDP_RETURN_IF_ERROR(CheckRange("write zeroes", offset, len));
  if (read_only()) return Status::PermissionDenied("export is read-only");
  if (!can_write_zeroes()) return Status::NotSupported("the server does not offer WRITE_ZEROES");
  uint16_t flags = (fua && (tflags_ & nbd::kFlagSendFua)) ? nbd::kCmdFlagFua : 0;
  if (!may_trim) flags |= nbd::kCmdFlagNoHole;
  return SendRequest(nbd::kCmdWriteZeroes, flags, offset, len, {});
}

Status NbdClient::Read(uint64_t offset, uint32_t len, uint8_t* buf) {
  CDP_RETURN_IF_ERROR(CheckRange("read", offset, len));
  while (!outstanding_.empty()) CDP_RETURN_IF_ERROR(ReadOneReply());
  CDP_RETURN_IF_ERROR(SendRequest(nbd::kCmdRead, 0, offset, len, {}));
  CDP_RETURN_IF_ERROR(ReadOneReply());  // an error reply carries no data
  return RecvAll(buf, len);
}

Status NbdClient::Drain() {
  if (!broken_.ok()) return broken_;
  if (closed_) return Status::Aborted("nbd client closed");
  while (!outstanding_.empty()) CDP_RETURN_IF_ERROR(ReadOneReply());
  return Status::OK();
}

Status NbdClient::Flush() {
  CDP_RETURN_IF_ERROR(Drain());
  if (!can_flush()) return Status::OK();
  CDP_RETURN_IF_ERROR(SendRequest(nbd::kCmdFlush, 0, 0, 0, {}));
  return ReadOneReply();
}

Status NbdClient::Close() {
  if (closed_) return broken_;
  Status s = broken_;
  if (s.ok()) {
    while (!outstanding_.empty() && s.ok()) s = ReadOneReply();
  }
  if (stream_) {
    if (broken_.ok()) {
      uint8_t h[nbd::kRequestHeaderSize] = {};
      nbd::EncodeBE32(h, nbd::kRequestMagic);
      h[7] = uint8_t(nbd::kCmdDisc);
      nbd::EncodeBE64(h + 8, next_handle_++);
      Status ds = SendAll({ByteSpan(h, sizeof h)});
      if (s.ok()) s = ds;
    }
    stream_->Shutdown();
    stream_.reset();
  }
  closed_ = true;
  return s;
}

}  // namespace cdp

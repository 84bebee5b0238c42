// SPDX-License-Identifier: Apache-2.0
// Tests of the NBD server: the pure parsers byte by byte, the server through a
// raw socket client (exact error codes, pipelining, caps, bad handshakes),
// and real clients (nbdinfo, qemu-io, nbdcopy) tagged [e2e].
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <openssl/ssl.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <condition_variable>
#include <mutex>
#include <cstring>
#include <atomic>
#include <map>
#include <set>
#include <random>
#include <thread>

#include "common/crypto/pki.h"
#include "common/env/env.h"
#include "common/env/subprocess.h"
#include "common/nbd/nbd_proto.h"
#include "common/nbd/nbd_server.h"
#include "common/net/tls_stream.h"
#include "common/tests/test_util.h"

namespace cdp {
namespace {

using cdp::testing::WaitUntil;

using testing::RunCommand;
using testing::ScratchDir;

Bytes Pattern(size_t n, uint32_t seed) {
  Bytes b(n);
  std::mt19937 rng(seed);
  for (auto& x : b) x = uint8_t(rng());
  return b;
}

// ---------------------------------------------------------------------------
// Pure parsers
// ---------------------------------------------------------------------------

// One transmission request.
nbd::Request Req(uint16_t type, uint64_t handle, uint64_t offset, uint32_t length, uint16_t flags = 0) {
  nbd::Request r;
  r.type = type;
  r.handle = handle;
  r.offset = offset;
  r.length = length;
  r.flags = flags;
  return r;
}

TEST_CASE("nbd request parser byte by byte", "[nbd]") {
  nbd::Request r;
  r.flags = nbd::kCmdFlagFua;
  r.type = nbd::kCmdWrite;
  r.handle = 0x0102030405060708ull;
  r.offset = 0x1122334455667788ull;
  r.length = 0xa0b0c0d0u;
  Bytes wire = nbd::EncodeRequest(r);
  REQUIRE(wire.size() == nbd::kRequestHeaderSize);
  // Network byte order on the wire.
  CHECK(wire[0] == 0x25);
  CHECK(wire[3] == 0x13);
  CHECK(wire[8] == 0x01);
  CHECK(wire[27] == 0xd0);
  for (size_t n = 0; n < wire.size(); ++n) {
    nbd::Request out;
    INFO("prefix " << n);
    CHECK(nbd::ParseRequest(ByteSpan(wire.data(), n), &out) == nbd::ParseResult::kNeedMore);
  }
  nbd::Request out;
  wire.push_back(0xee);  // the next message's first byte is not consumed
  REQUIRE(nbd::ParseRequest(wire, &out) == nbd::ParseResult::kComplete);
  CHECK(out.flags == r.flags);
  CHECK(out.type == r.type);
  CHECK(out.handle == r.handle);
  CHECK(out.offset == r.offset);
  CHECK(out.length == r.length);

  // A wrong magic is reported as soon as its first wrong byte arrives.
  for (size_t i = 0; i < 4; ++i) {
    Bytes bad = nbd::EncodeRequest(r);
    bad[i] ^= 0x40;
    for (size_t n = 0; n <= i; ++n) {
      CHECK(nbd::ParseRequest(ByteSpan(bad.data(), n), &out) == nbd::ParseResult::kNeedMore);
    }
    CHECK(nbd::ParseRequest(ByteSpan(bad.data(), i + 1), &out) == nbd::ParseResult::kBad);
    CHECK(nbd::ParseRequest(bad, &out) == nbd::ParseResult::kBad);
  }
}

TEST_CASE("nbd option header and client flags parsers", "[nbd]") {
  Bytes wire;
  nbd::PutBE64(wire, nbd::kIHaveOpt);
  nbd::PutBE32(wire, nbd::kOptGo);
  nbd::PutBE32(wire, 0x01020304);
  for (size_t n = 0; n < wire.size(); ++n) {
    nbd::OptionHeader h;
    CHECK(nbd::ParseOptionHeader(ByteSpan(wire.data(), n), &h) == nbd::ParseResult::kNeedMore);
  }
  nbd::OptionHeader h;
  REQUIRE(nbd::ParseOptionHeader(wire, &h) == nbd::ParseResult::kComplete);
  CHECK(h.option == nbd::kOptGo);
  CHECK(h.length == 0x01020304u);
  wire[7] = 'X';
  CHECK(nbd::ParseOptionHeader(ByteSpan(wire.data(), 7), &h) == nbd::ParseResult::kNeedMore);
  CHECK(nbd::ParseOptionHeader(ByteSpan(wire.data(), 8), &h) == nbd::ParseResult::kBad);

  auto flags = [](uint32_t v) {
    Bytes b;
    nbd::PutBE32(b, v);
    return b;
  };
  uint32_t f = 0;
  Bytes ok = flags(nbd::kClientFlagFixedNewstyle | nbd::kClientFlagNoZeroes);
  for (size_t n = 0; n < 4; ++n) {
    CHECK(nbd::ParseClientFlags(ByteSpan(ok.data(), n), true, &f) == nbd::ParseResult::kNeedMore);
  }
  CHECK(nbd::ParseClientFlags(ok, true, &f) == nbd::ParseResult::kComplete);
  CHECK(f == 3);
  CHECK(nbd::ParseClientFlags(ok, false, &f) == nbd::ParseResult::kBad);  // NO_ZEROES not offered
  CHECK(nbd::ParseClientFlags(flags(0), true, &f) == nbd::ParseResult::kBad);  // not fixed newstyle
  CHECK(nbd::ParseClientFlags(flags(1 | 4), true, &f) == nbd::ParseResult::kBad);  // unknown bit
}

TEST_CASE("nbd info request parser", "[nbd]") {
  auto make = [](std::string_view name, std::vector<uint16_t> infos, int name_len_delta = 0,
                 int count_delta = 0) {
    Bytes b;
    nbd::PutBE32(b, uint32_t(int(name.size()) + name_len_delta));
    PutBytes(b, name);
    nbd::PutBE16(b, uint16_t(int(infos.size()) + count_delta));
    for (auto i : infos) nbd::PutBE16(b, i);
    return b;
  };
  nbd::InfoRequest req;
  REQUIRE(nbd::ParseInfoRequest(make("vol1", {nbd::kInfoName, nbd::kInfoBlockSize}), &req).ok());
  CHECK(req.name == "vol1");
  CHECK(req.infos == std::vector<uint16_t>{nbd::kInfoName, nbd::kInfoBlockSize});
  REQUIRE(nbd::ParseInfoRequest(make("", {}), &req).ok());
  CHECK(req.name.empty());
  CHECK(req.infos.empty());
  CHECK(nbd::ParseInfoRequest(make("vol1", {}, 1), &req).code() == Code::kInvalidArgument);
  CHECK(nbd::ParseInfoRequest(make("vol1", {}, 1000000), &req).code() == Code::kInvalidArgument);
  CHECK(nbd::ParseInfoRequest(make("vol1", {1}, 0, 1), &req).code() == Code::kInvalidArgument);
  CHECK(nbd::ParseInfoRequest(make("vol1", {1, 2}, 0, -1), &req).code() == Code::kInvalidArgument);
  CHECK(nbd::ParseInfoRequest(make(std::string("a\0b", 3), {}), &req).code() == Code::kInvalidArgument);
  CHECK(nbd::ParseInfoRequest(ByteSpan(), &req).code() == Code::kInvalidArgument);
  Bytes five(5, 0);
  CHECK(nbd::ParseInfoRequest(five, &req).code() == Code::kInvalidArgument);
}

TEST_CASE("nbd request validation follows the spec's error values", "[nbd]") {
  nbd::ExportLimits rw;
  rw.size = 1 << 20;
  rw.max_payload = 65536;
  rw.transmission_flags = nbd::kFlagHasFlags | nbd::kFlagSendFlush | nbd::kFlagSendFua |
                          nbd::kFlagSendTrim | nbd::kFlagSendWriteZeroes;
  nbd::ExportLimits ro = rw;
  ro.transmission_flags = nbd::kFlagHasFlags | nbd::kFlagReadOnly | nbd::kFlagSendFlush;
  auto req = [](uint16_t type, uint64_t off, uint32_t len, uint16_t flags = 0) { return Req(type, 0, off, len, flags); };
  CHECK(nbd::CheckRequest(req(nbd::kCmdRead, 0, 4096), rw) == 0);
  CHECK(nbd::CheckRequest(req(nbd::kCmdRead, (1 << 20) - 4096, 4096), rw) == 0);
  CHECK(nbd::CheckRequest(req(nbd::kCmdRead, (1 << 20) - 4095, 4096), rw) == nbd::kEINVAL);
  CHECK(nbd::CheckRequest(req(nbd::kCmdRead, ~0ull, 1), rw) == nbd::kEINVAL);  // overflow
  CHECK(nbd::CheckRequest(req(nbd::kCmdWrite, (1 << 20) - 1, 2), rw) == nbd::kENOSPC);
  CHECK(nbd::CheckRequest(req(nbd::kCmdWriteZeroes, 1 << 20, 1), rw) == nbd::kENOSPC);
  CHECK(nbd::CheckRequest(req(nbd::kCmdTrim, 1 << 20, 1), rw) == nbd::kEINVAL);
  CHECK(nbd::CheckRequest(req(nbd::kCmdRead, 0, 65537), rw) == nbd::kEINVAL);
  CHECK(nbd::CheckRequest(req(nbd::kCmdWrite, 0, 65537), rw) == nbd::kEINVAL);
  CHECK(nbd::CheckRequest(req(nbd::kCmdWriteZeroes, 0, 1 << 20), rw) == 0);  // no payload: not capped
  CHECK(nbd::CheckRequest(req(nbd::kCmdWrite, 0, 512, nbd::kCmdFlagFua), rw) == 0);
  CHECK(nbd::CheckRequest(req(nbd::kCmdFlush, 0, 0, nbd::kCmdFlagFua), rw) == 0);
  CHECK(nbd::CheckRequest(req(nbd::kCmdWriteZeroes, 0, 512, nbd::kCmdFlagNoHole), rw) == 0);
  CHECK(nbd::CheckRequest(req(nbd::kCmdWrite, 0, 512, nbd::kCmdFlagNoHole), rw) == nbd::kEINVAL);
  CHECK(nbd::CheckRequest(req(nbd::kCmdRead, 0, 512, nbd::kCmdFlagDf), rw) == nbd::kEINVAL);
  CHECK(nbd::CheckRequest(req(nbd::kCmdWriteZeroes, 0, 512, nbd::kCmdFlagFastZero), rw) == nbd::kEINVAL);
  CHECK(nbd::CheckRequest(req(nbd::kCmdCache, 0, 512), rw) == nbd::kEINVAL);
  CHECK(nbd::CheckRequest(req(nbd::kCmdBlockStatus, 0, 512), rw) == nbd::kEINVAL);
  CHECK(nbd::CheckRequest(req(99, 0, 0), rw) == nbd::kEINVAL);
  CHECK(nbd::CheckRequest(req(nbd::kCmdDisc, 5, 5), rw) == 0);
  // Read-only: writes are EPERM (before the range check), FUA not advertised.
  CHECK(nbd::CheckRequest(req(nbd::kCmdWrite, 0, 512), ro) == nbd::kEPERM);
  CHECK(nbd::CheckRequest(req(nbd::kCmdWrite, 1 << 20, 512), ro) == nbd::kEPERM);
  CHECK(nbd::CheckRequest(req(nbd::kCmdRead, 0, 512), ro) == 0);
  CHECK(nbd::CheckRequest(req(nbd::kCmdRead, 0, 512, nbd::kCmdFlagFua), ro) == nbd::kEINVAL);
  CHECK(nbd::CheckRequest(req(nbd::kCmdTrim, 0, 512), ro) == nbd::kEINVAL);  // not advertised
  // BLOCK_STATUS once base:allocation was negotiated; REQ_ONE on it only.
  nbd::ExportLimits bs = rw;
  bs.block_status = true;
  CHECK(nbd::CheckRequest(req(nbd::kCmdBlockStatus, 0, 1 << 20), bs) == 0);
  CHECK(nbd::CheckRequest(req(nbd::kCmdBlockStatus, 0, 512, nbd::kCmdFlagReqOne), bs) == 0);
  CHECK(nbd::CheckRequest(req(nbd::kCmdBlockStatus, 0, 0), bs) == nbd::kEINVAL);
  CHECK(nbd::CheckRequest(req(nbd::kCmdBlockStatus, 1 << 20, 1), bs) == nbd::kEINVAL);
  CHECK(nbd::CheckRequest(req(nbd::kCmdRead, 0, 512, nbd::kCmdFlagReqOne), bs) == nbd::kEINVAL);
  // FAST_ZERO once advertised; with NO_HOLE it would write zeros: ENOTSUP.
  nbd::ExportLimits fz = rw;
  fz.transmission_flags |= nbd::kFlagSendFastZero;
  CHECK(nbd::CheckRequest(req(nbd::kCmdWriteZeroes, 0, 512, nbd::kCmdFlagFastZero), fz) == 0);
  CHECK(nbd::CheckRequest(req(nbd::kCmdWriteZeroes, 0, 512, nbd::kCmdFlagFastZero | nbd::kCmdFlagNoHole), fz) ==
        nbd::kENOTSUP);
  CHECK(nbd::CheckRequest(req(nbd::kCmdWrite, 0, 512, nbd::kCmdFlagFastZero), fz) == nbd::kEINVAL);
}

TEST_CASE("nbd maps Status codes to NBD errors", "[nbd]") {
  CHECK(nbd::ErrorFromStatus(Status::OK()) == 0);
  CHECK(nbd::ErrorFromStatus(Status::NoSpace("x")) == nbd::kENOSPC);
  CHECK(nbd::ErrorFromStatus(Status::PermissionDenied("x")) == nbd::kEPERM);
  CHECK(nbd::ErrorFromStatus(Status::InvalidArgument("x")) == nbd::kEINVAL);
  CHECK(nbd::ErrorFromStatus(Status::OutOfRange("x")) == nbd::kEINVAL);
  CHECK(nbd::ErrorFromStatus(Status::Aborted("x")) == nbd::kESHUTDOWN);
  CHECK(nbd::ErrorFromStatus(Status::IOError("x", EIO)) == nbd::kEIO);
  CHECK(nbd::ErrorFromStatus(Status::IOError("x", EFBIG)) == nbd::kENOSPC);
  CHECK(nbd::ErrorFromStatus(Status::Corruption("x")) == nbd::kEIO);
}

// ---------------------------------------------------------------------------
// A raw client over POSIX sockets, with receive timeouts so that a broken
// server fails the test instead of hanging it.
// ---------------------------------------------------------------------------

class RawClient {
 public:
  ~RawClient() {
    if (ssl_ != nullptr) SSL_free(ssl_);
    if (fd_ >= 0) ::close(fd_);
  }
  // The TLS handshake as a client over the connection (after STARTTLS was
  // acknowledged); from then on Send/Recv go through TLS.
  bool StartTls(SSL_CTX* ctx) {
    ssl_ = SSL_new(ctx);
    if (ssl_ == nullptr || SSL_set_fd(ssl_, fd_) != 1) return false;
    return SSL_connect(ssl_) == 1;
  }
  bool ConnectTcp(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    SetTimeout();
    return ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  }
  bool ConnectUnix(const std::string& path) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
    SetTimeout();
    return ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  }
  bool Send(ByteSpan b) {
    size_t done = 0;
    while (done < b.size()) {
      ssize_t n = ssl_ != nullptr ? SSL_write(ssl_, b.data() + done, int(b.size() - done))
                                  : ::send(fd_, b.data() + done, b.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return false;
      done += size_t(n);
    }
    return true;
  }
  bool Recv(size_t n, Bytes* out) {
    out->resize(n);
    size_t done = 0;
    while (done < n) {
      ssize_t r = ssl_ != nullptr ? SSL_read(ssl_, out->data() + done, int(n - done))
                                  : ::recv(fd_, out->data() + done, n - done, 0);
      if (r <= 0) return false;
      done += size_t(r);
    }
    return true;
  }
  // True when the server closed the connection (EOF or reset) before the timeout.
  bool ClosedByPeer() {
    uint8_t b;
    while (ssl_ != nullptr) {
      if (SSL_read(ssl_, &b, 1) > 0) continue;
      const int e = SSL_get_error(ssl_, 0);
      if (e == SSL_ERROR_SYSCALL) return errno != EAGAIN && errno != EWOULDBLOCK;
      return e == SSL_ERROR_ZERO_RETURN || e == SSL_ERROR_SSL;
    }
    for (;;) {
      ssize_t r = ::recv(fd_, &b, 1, 0);
      if (r == 0) return true;
      if (r < 0) return errno == ECONNRESET;
    }
  }

  bool Handshake(uint32_t client_flags = nbd::kClientFlagFixedNewstyle | nbd::kClientFlagNoZeroes) {
    Bytes g;
    if (!Recv(nbd::kGreetingSize, &g)) return false;
    if (nbd::DecodeBE64(g.data()) != nbd::kNbdMagic || nbd::DecodeBE64(g.data() + 8) != nbd::kIHaveOpt) return false;
    if (nbd::DecodeBE16(g.data() + 16) != (nbd::kFlagFixedNewstyle | nbd::kFlagNoZeroes)) return false;
    Bytes f;
    nbd::PutBE32(f, client_flags);
    return Send(f);
  }
  bool SendOption(uint32_t option, ByteSpan data) {
    Bytes b;
    nbd::PutBE64(b, nbd::kIHaveOpt);
    nbd::PutBE32(b, option);
    nbd::PutBE32(b, uint32_t(data.size()));
    PutBytes(b, data);
    return Send(b);
  }
  struct OptReply {
    uint32_t option = 0;
    uint32_t type = 0;
    Bytes data;
  };
  bool ReadOptReply(OptReply* r) {
    Bytes h;
    if (!Recv(nbd::kOptReplyHeaderSize, &h)) return false;
    if (nbd::DecodeBE64(h.data()) != nbd::kOptReplyMagic) return false;
    r->option = nbd::DecodeBE32(h.data() + 8);
    r->type = nbd::DecodeBE32(h.data() + 12);
    const uint32_t len = nbd::DecodeBE32(h.data() + 16);
    if (len > (1u << 20)) return false;
    return Recv(len, &r->data);
  }
  static Bytes InfoData(const std::string& name, std::vector<uint16_t> infos) {
    Bytes b;
    nbd::PutBE32(b, uint32_t(name.size()));
    PutBytes(b, name);
    nbd::PutBE16(b, uint16_t(infos.size()));
    for (auto i : infos) nbd::PutBE16(b, i);
    return b;
  }
  // Sends INFO or GO; collects the NBD_REP_INFO payloads by type. Returns the
  // final reply type (kRepAck or an error), 0 on a transport failure.
  uint32_t InfoOrGo(uint32_t option, const std::string& name, std::vector<uint16_t> infos,
                    std::map<uint16_t, Bytes>* got) {
    if (!SendOption(option, InfoData(name, infos))) return 0;
    for (;;) {
      OptReply r;
      if (!ReadOptReply(&r) || r.option != option) return 0;
      if (r.type != nbd::kRepInfo) return r.type;
      if (r.data.size() < 2) return 0;
      (*got)[nbd::DecodeBE16(r.data.data())] = Bytes(r.data.begin() + 2, r.data.end());
    }
  }
  // Handshake + GO; returns the transmission flags, or -1.
  int Open(const std::string& name, uint64_t* size = nullptr) {
    if (!Handshake()) return -1;
    std::map<uint16_t, Bytes> got;
    if (InfoOrGo(nbd::kOptGo, name, {nbd::kInfoBlockSize}, &got) != nbd::kRepAck) return -1;
    if (!got.count(nbd::kInfoExport) || got[nbd::kInfoExport].size() != 10) return -1;
    if (size) *size = nbd::DecodeBE64(got[nbd::kInfoExport].data());
    return nbd::DecodeBE16(got[nbd::kInfoExport].data() + 8);
  }
  bool SendRequest(uint16_t type, uint64_t handle, uint64_t offset, uint32_t length, uint16_t flags = 0,
                   ByteSpan payload = {}) {
    Bytes b = nbd::EncodeRequest(Req(type, handle, offset, length, flags));
    PutBytes(b, payload);
    return Send(b);
  }
  // Reads one simple reply header; returns false on transport failure or bad magic.
  bool ReadReply(uint32_t* err, uint64_t* handle) {
    Bytes h;
    if (!Recv(nbd::kSimpleReplySize, &h)) return false;
    if (nbd::DecodeBE32(h.data()) != nbd::kSimpleReplyMagic) return false;
    *err = nbd::DecodeBE32(h.data() + 4);
    *handle = nbd::DecodeBE64(h.data() + 8);
    return true;
  }
  // One synchronous request; returns the error, or -1 on transport failure.
  int64_t Do(uint16_t type, uint64_t offset, uint32_t length, uint16_t flags = 0, ByteSpan payload = {},
             Bytes* read_data = nullptr) {
    const uint64_t h = ++handle_;
    if (!SendRequest(type, h, offset, length, flags, payload)) return -1;
    uint32_t err = 0;
    uint64_t got = 0;
    if (!ReadReply(&err, &got) || got != h) return -1;
    if (type == nbd::kCmdRead && err == 0) {
      Bytes d;
      if (!Recv(length, &d)) return -1;
      if (read_data) *read_data = std::move(d);
    }
    return err;
  }

 private:
  void SetTimeout() {
    timeval tv{10, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  int fd_ = -1;
  SSL* ssl_ = nullptr;
  uint64_t handle_ = 0;
};

// Waits up to `ms` for `pred`.
struct MemFixture {
  explicit MemFixture(NbdServerOptions o = {}, uint64_t size = 4 << 20, bool add_ro = true) : env(NewMemEnv()) {
    FileBlockDevice::Options fo;
    fo.create_size = size;
    auto d = FileBlockDevice::Open(env.get(), "/vol1.img", fo);
    REQUIRE(d.ok());
    dev = *d;
    o.tcp = {"127.0.0.1", 0};
    server = std::make_unique<NbdServer>(o);
    REQUIRE(server->AddExport("vol1", dev, "first volume").ok());
    if (add_ro) {
      FileBlockDevice::Options ro;
      ro.create_size = 1 << 20;
      auto d2 = FileBlockDevice::Open(env.get(), "/ro.img", ro);
      REQUIRE(d2.ok());
      ro.create_size = 0;
      ro.read_only = true;
      auto rod = FileBlockDevice::Open(env.get(), "/ro.img", ro);
      REQUIRE(rod.ok());
      REQUIRE(server->AddExport("ro", *rod).ok());
    }
    REQUIRE(server->Start().ok());
    REQUIRE(server->port() != 0);
  }
  std::unique_ptr<Env> env;
  std::shared_ptr<FileBlockDevice> dev;
  std::unique_ptr<NbdServer> server;
};

TEST_CASE("nbd server: GO, write, read back, stats", "[nbd]") {
  MemFixture fx;
  RawClient c;
  REQUIRE(c.ConnectTcp(fx.server->port()));
  uint64_t size = 0;
  const int tf = c.Open("vol1", &size);
  REQUIRE(tf >= 0);
  CHECK(size == (4u << 20));
  CHECK(tf == (nbd::kFlagHasFlags | nbd::kFlagSendFlush | nbd::kFlagSendFua | nbd::kFlagSendTrim |
               nbd::kFlagSendWriteZeroes | nbd::kFlagCanMultiConn | nbd::kFlagSendFastZero));
  Bytes data = Pattern(65536, 1);
  CHECK(c.Do(nbd::kCmdWrite, 12345, uint32_t(data.size()), nbd::kCmdFlagFua, data) == 0);
  Bytes back;
  CHECK(c.Do(nbd::kCmdRead, 12345, uint32_t(data.size()), 0, {}, &back) == 0);
  CHECK(back == data);
  // The backing file holds the bytes.
  Bytes file(data.size());
  REQUIRE(fx.dev->Read(12345, uint32_t(data.size()), file.data()).ok());
  CHECK(file == data);
  CHECK(c.Do(nbd::kCmdFlush, 0, 0) == 0);
  CHECK(c.Do(nbd::kCmdWriteZeroes, 12345, 4096, nbd::kCmdFlagNoHole) == 0);
  CHECK(c.Do(nbd::kCmdTrim, 1 << 20, 1 << 20) == 0);
  CHECK(c.Do(nbd::kCmdRead, 12345, 4096, 0, {}, &back) == 0);
  CHECK(back == Bytes(4096, 0));
  CHECK(c.Do(nbd::kCmdRead, 12345 + 4096, 100, 0, {}, &back) == 0);
  CHECK(back == Bytes(data.begin() + 4096, data.begin() + 4196));
  auto st = fx.server->ExportStats("vol1");
  REQUIRE(st.ok());
  CHECK(st->writes == 1);
  CHECK(st->bytes_written == 65536);
  CHECK(st->reads == 3);
  CHECK(st->bytes_read == 65536 + 4096 + 100);
  CHECK(st->zero_ops == 1);
  CHECK(st->trims == 1);
  CHECK(st->flushes == 1);
  CHECK(st->errors == 0);
  CHECK(st->connections == 1);
  CHECK(fx.server->ExportStats("nope").status().code() == Code::kNotFound);
}

TEST_CASE("nbd server: out-of-range and invalid requests get errors, connection survives", "[nbd]") {
  MemFixture fx;
  RawClient c;
  REQUIRE(c.ConnectTcp(fx.server->port()));
  REQUIRE(c.Open("vol1") >= 0);
  const uint64_t size = 4 << 20;
  CHECK(c.Do(nbd::kCmdRead, size, 512) == nbd::kEINVAL);
  CHECK(c.Do(nbd::kCmdRead, size - 256, 512) == nbd::kEINVAL);
  Bytes d(512, 7);
  CHECK(c.Do(nbd::kCmdWrite, size - 256, 512, 0, d) == nbd::kENOSPC);  // payload consumed
  CHECK(c.Do(nbd::kCmdWriteZeroes, size, 512) == nbd::kENOSPC);
  CHECK(c.Do(nbd::kCmdTrim, size - 1, 2) == nbd::kEINVAL);
  CHECK(c.Do(nbd::kCmdCache, 0, 512) == nbd::kEINVAL);
  CHECK(c.Do(77, 0, 0) == nbd::kEINVAL);
  CHECK(c.Do(nbd::kCmdRead, 0, 512, nbd::kCmdFlagDf) == nbd::kEINVAL);
  Bytes back;
  CHECK(c.Do(nbd::kCmdWrite, size - 512, 512, 0, d) == 0);
  CHECK(c.Do(nbd::kCmdRead, size - 512, 512, 0, {}, &back) == 0);
  CHECK(back == d);
  auto st = fx.server->ExportStats("vol1");
  CHECK(st->errors == 8);
}

TEST_CASE("nbd server: read-only export refuses writes with EPERM", "[nbd]") {
  MemFixture fx;
  RawClient c;
  REQUIRE(c.ConnectTcp(fx.server->port()));
  const int tf = c.Open("ro");
  REQUIRE(tf >= 0);
  CHECK((tf & nbd::kFlagReadOnly) != 0);
  CHECK((tf & nbd::kFlagSendTrim) == 0);
  CHECK((tf & nbd::kFlagSendWriteZeroes) == 0);
  Bytes d(4096, 1);
  CHECK(c.Do(nbd::kCmdWrite, 0, 4096, 0, d) == nbd::kEPERM);
  CHECK(c.Do(nbd::kCmdWriteZeroes, 0, 4096) == nbd::kEINVAL);  // not advertised
  Bytes back;
  CHECK(c.Do(nbd::kCmdRead, 0, 4096, 0, {}, &back) == 0);
  CHECK(back == Bytes(4096, 0));
}

TEST_CASE("nbd server: many requests in flight on one connection", "[nbd]") {
  NbdServerOptions o;
  o.max_inflight_bytes = 256 << 10;  // forces the reader to pause and resume
  MemFixture fx(o);
  RawClient c;
  REQUIRE(c.ConnectTcp(fx.server->port()));
  REQUIRE(c.Open("vol1") >= 0);
  constexpr int kN = 300;
  // Writes to overlapping places: the device sees them in arrival order, so
  // the last write to each block wins.
  Bytes expect(1 << 20, 0);
  std::atomic<bool> sent_ok{true};
  std::thread sender([&] {
    for (int i = 0; i < kN && sent_ok; ++i) {
      Bytes d = Pattern(8192, uint32_t(i));
      const uint64_t off = uint64_t(i % 50) * 4096;
      if (!c.SendRequest(nbd::kCmdWrite, 1000 + i, off, 8192, 0, d)) sent_ok = false;
    }
  });
  for (int i = 0; i < kN; ++i) {
    Bytes d = Pattern(8192, uint32_t(i));
    std::memcpy(expect.data() + (i % 50) * 4096, d.data(), d.size());
  }
  std::map<uint64_t, uint32_t> replies;
  for (int i = 0; i < kN; ++i) {
    uint32_t err = 0;
    uint64_t h = 0;
    if (!c.ReadReply(&err, &h)) {
      sent_ok = false;
      sender.join();
      FAIL("reply " << i << " missing");
    }
    replies[h] = err;
  }
  sender.join();
  REQUIRE(sent_ok);
  REQUIRE(replies.size() == size_t(kN));
  for (auto& [h, e] : replies) CHECK(e == 0);
  // Pipelined reads.
  for (int i = 0; i < 64; ++i) REQUIRE(c.SendRequest(nbd::kCmdRead, 5000 + i, uint64_t(i) * 4096, 4096));
  for (int i = 0; i < 64; ++i) {
    uint32_t err = 0;
    uint64_t h = 0;
    REQUIRE(c.ReadReply(&err, &h));
    REQUIRE(err == 0);
    REQUIRE(h >= 5000);
    Bytes d;
    REQUIRE(c.Recv(4096, &d));
    const uint64_t off = (h - 5000) * 4096;
    CHECK(std::memcmp(d.data(), expect.data() + off, 4096) == 0);
  }
  CHECK(fx.server->ExportStats("vol1")->writes == uint64_t(kN));
}

TEST_CASE("nbd server: request length caps", "[nbd]") {
  NbdServerOptions o;
  o.max_request_bytes = 64 << 10;
  o.max_skip_bytes = 256 << 10;
  MemFixture fx(o);
  RawClient c;
  REQUIRE(c.ConnectTcp(fx.server->port()));
  REQUIRE(c.Open("vol1") >= 0);
  CHECK(c.Do(nbd::kCmdRead, 0, (64 << 10) + 1) == nbd::kEINVAL);
  Bytes big = Pattern(128 << 10, 9);
  CHECK(c.Do(nbd::kCmdWrite, 0, uint32_t(big.size()), 0, big) == nbd::kEINVAL);  // skipped
  Bytes back;
  CHECK(c.Do(nbd::kCmdRead, 0, 4096, 0, {}, &back) == 0);  // still in sync
  CHECK(back == Bytes(4096, 0));
  // A payload too large to skip closes the connection.
  REQUIRE(c.SendRequest(nbd::kCmdWrite, 1, 0, 1 << 20));
  CHECK(c.ClosedByPeer());
}

TEST_CASE("nbd server: options LIST, INFO, unsupported, default export, ABORT", "[nbd]") {
  MemFixture fx;
  RawClient c;
  REQUIRE(c.ConnectTcp(fx.server->port()));
  REQUIRE(c.Handshake());
  REQUIRE(c.SendOption(nbd::kOptList, {}));
  std::vector<std::string> names;
  for (;;) {
    RawClient::OptReply r;
    REQUIRE(c.ReadOptReply(&r));
    CHECK(r.option == nbd::kOptList);
    if (r.type == nbd::kRepAck) break;
    REQUIRE(r.type == nbd::kRepServer);
    const uint32_t n = nbd::DecodeBE32(r.data.data());
    names.emplace_back(reinterpret_cast<const char*>(r.data.data() + 4), n);
    if (names.back() == "vol1") {
      CHECK(std::string(r.data.begin() + 4 + n, r.data.end()) == "first volume");
    }
  }
  CHECK(names == std::vector<std::string>{"ro", "vol1"});
  Bytes junk(3, 1);
  REQUIRE(c.SendOption(nbd::kOptList, junk));
  RawClient::OptReply r;
  REQUIRE(c.ReadOptReply(&r));
  CHECK(r.type == nbd::kRepErrInvalid);

  std::map<uint16_t, Bytes> got;
  CHECK(c.InfoOrGo(nbd::kOptInfo, "vol1", {nbd::kInfoName, nbd::kInfoDescription, nbd::kInfoBlockSize}, &got) ==
        nbd::kRepAck);
  REQUIRE(got.count(nbd::kInfoExport));
  CHECK(nbd::DecodeBE64(got[nbd::kInfoExport].data()) == (4u << 20));
  CHECK(std::string(got[nbd::kInfoName].begin(), got[nbd::kInfoName].end()) == "vol1");
  CHECK(std::string(got[nbd::kInfoDescription].begin(), got[nbd::kInfoDescription].end()) == "first volume");
  REQUIRE(got[nbd::kInfoBlockSize].size() == 12);
  CHECK(nbd::DecodeBE32(got[nbd::kInfoBlockSize].data()) == 1);
  CHECK(nbd::DecodeBE32(got[nbd::kInfoBlockSize].data() + 4) == 4096);
  CHECK(nbd::DecodeBE32(got[nbd::kInfoBlockSize].data() + 8) == (32u << 20));
  got.clear();
  CHECK(c.InfoOrGo(nbd::kOptInfo, "missing", {}, &got) == nbd::kRepErrUnknown);
  CHECK(got.empty());
  CHECK(c.InfoOrGo(nbd::kOptInfo, "", {}, &got) == nbd::kRepErrUnknown);  // two exports: no default
  REQUIRE(c.SendOption(nbd::kOptStructuredReply, {}));  // structured replies: supported
  REQUIRE(c.ReadOptReply(&r));
  CHECK(r.type == nbd::kRepAck);
  REQUIRE(c.SendOption(nbd::kOptStartTls, {}));
  REQUIRE(c.ReadOptReply(&r));
  CHECK(r.type == nbd::kRepErrUnsup);
  REQUIRE(c.SendOption(4242, junk));
  REQUIRE(c.ReadOptReply(&r));
  CHECK(r.type == nbd::kRepErrUnsup);
  CHECK(r.option == 4242u);
  // An option longer than the cap is skipped and refused, not allocated.
  Bytes longopt(20000, 'x');
  REQUIRE(c.SendOption(nbd::kOptInfo, longopt));
  REQUIRE(c.ReadOptReply(&r));
  CHECK(r.type == nbd::kRepErrTooBig);
  REQUIRE(c.SendOption(nbd::kOptAbort, {}));
  REQUIRE(c.ReadOptReply(&r));
  CHECK(r.type == nbd::kRepAck);
  CHECK(c.ClosedByPeer());

  // With a single export, "" is that export; EXPORT_NAME gets the short reply.
  MemFixture one(NbdServerOptions{}, 1 << 20, /*add_ro=*/false);
  RawClient d;
  REQUIRE(d.ConnectTcp(one.server->port()));
  REQUIRE(d.Handshake());
  REQUIRE(d.SendOption(nbd::kOptExportName, {}));
  Bytes rep;
  REQUIRE(d.Recv(10, &rep));  // NO_ZEROES negotiated: no 124 zero bytes
  CHECK(nbd::DecodeBE64(rep.data()) == (1u << 20));
  Bytes back;
  CHECK(d.Do(nbd::kCmdRead, 0, 512, 0, {}, &back) == 0);

  // Without NO_ZEROES the EXPORT_NAME reply carries the 124 reserved zero bytes.
  RawClient z;
  REQUIRE(z.ConnectTcp(one.server->port()));
  REQUIRE(z.Handshake(nbd::kClientFlagFixedNewstyle));
  std::string name = "vol1";
  REQUIRE(z.SendOption(nbd::kOptExportName, ByteSpan(reinterpret_cast<const uint8_t*>(name.data()), name.size())));
  REQUIRE(z.Recv(10 + 124, &rep));
  CHECK(nbd::DecodeBE64(rep.data()) == (1u << 20));
  CHECK(Bytes(rep.begin() + 10, rep.end()) == Bytes(124, 0));
  CHECK(z.Do(nbd::kCmdRead, 0, 512, 0, {}, &back) == 0);
}

TEST_CASE("nbd server: bad handshakes close the connection", "[nbd]") {
  NbdServerOptions o;
  o.handshake_timeout_ms = 300;
  MemFixture fx(o);
  {
    RawClient c;  // not fixed newstyle
    REQUIRE(c.ConnectTcp(fx.server->port()));
    REQUIRE(c.Handshake(0));
    CHECK(c.ClosedByPeer());
  }
  {
    RawClient c;  // unknown client flag
    REQUIRE(c.ConnectTcp(fx.server->port()));
    REQUIRE(c.Handshake(nbd::kClientFlagFixedNewstyle | 8));
    CHECK(c.ClosedByPeer());
  }
  {
    RawClient c;  // bad option magic
    REQUIRE(c.ConnectTcp(fx.server->port()));
    REQUIRE(c.Handshake());
    Bytes b(16, 'z');
    REQUIRE(c.Send(b));
    CHECK(c.ClosedByPeer());
  }
  {
    RawClient c;  // EXPORT_NAME of a missing export cannot be answered: closed
    REQUIRE(c.ConnectTcp(fx.server->port()));
    REQUIRE(c.Handshake());
    std::string n = "missing";
    REQUIRE(c.SendOption(nbd::kOptExportName, ByteSpan(reinterpret_cast<const uint8_t*>(n.data()), n.size())));
    CHECK(c.ClosedByPeer());
  }
  {
    RawClient c;  // huge option length
    REQUIRE(c.ConnectTcp(fx.server->port()));
    REQUIRE(c.Handshake());
    Bytes b;
    nbd::PutBE64(b, nbd::kIHaveOpt);
    nbd::PutBE32(b, nbd::kOptGo);
    nbd::PutBE32(b, 0xffffffffu);
    REQUIRE(c.Send(b));
    CHECK(c.ClosedByPeer());
  }
  {
    RawClient c;  // bad request magic in transmission
    REQUIRE(c.ConnectTcp(fx.server->port()));
    REQUIRE(c.Open("vol1") >= 0);
    Bytes b(28, 0);
    REQUIRE(c.Send(b));
    CHECK(c.ClosedByPeer());
  }
  {
    RawClient c;  // silent client: handshake timeout
    REQUIRE(c.ConnectTcp(fx.server->port()));
    Bytes g;
    REQUIRE(c.Recv(nbd::kGreetingSize, &g));
    CHECK(c.ClosedByPeer());
  }
  CHECK(WaitUntil([&] { return fx.server->connection_count() == 0; }));
  // The server still serves.
  RawClient c;
  REQUIRE(c.ConnectTcp(fx.server->port()));
  REQUIRE(c.Open("vol1") >= 0);
  CHECK(c.Do(nbd::kCmdRead, 0, 512) == 0);
}

TEST_CASE("nbd server: DISC answers outstanding requests then closes", "[nbd]") {
  MemFixture fx;
  RawClient c;
  REQUIRE(c.ConnectTcp(fx.server->port()));
  REQUIRE(c.Open("vol1") >= 0);
  Bytes d = Pattern(4096, 3);
  REQUIRE(c.SendRequest(nbd::kCmdWrite, 1, 0, 4096, 0, d));
  REQUIRE(c.SendRequest(nbd::kCmdFlush, 2, 0, 0));
  REQUIRE(c.SendRequest(nbd::kCmdDisc, 3, 0, 0));
  uint32_t err = 0;
  uint64_t h = 0;
  REQUIRE(c.ReadReply(&err, &h));
  CHECK((h == 1 && err == 0));
  REQUIRE(c.ReadReply(&err, &h));
  CHECK((h == 2 && err == 0));
  CHECK(c.ClosedByPeer());
  Bytes back(4096);
  REQUIRE(fx.dev->Read(0, 4096, back.data()).ok());
  CHECK(back == d);
}

TEST_CASE("nbd server: two connections at once, unix socket, RemoveExport", "[nbd]") {
  ScratchDir dir;
  REQUIRE(!dir.path().empty());
  NbdServerOptions o;
  o.unix_path = dir.Join("nbd.sock");
  MemFixture fx(o);
  RawClient a, b;
  REQUIRE(a.ConnectTcp(fx.server->port()));
  REQUIRE(b.ConnectUnix(o.unix_path));
  REQUIRE(a.Open("vol1") >= 0);
  REQUIRE(b.Open("vol1") >= 0);
  CHECK(fx.server->ExportStats("vol1")->connections == 2);
  Bytes da = Pattern(4096, 10), db = Pattern(4096, 11);
  CHECK(a.Do(nbd::kCmdWrite, 0, 4096, 0, da) == 0);
  CHECK(b.Do(nbd::kCmdWrite, 4096, 4096, 0, db) == 0);
  Bytes back;
  CHECK(b.Do(nbd::kCmdRead, 0, 4096, 0, {}, &back) == 0);
  CHECK(back == da);
  CHECK(a.Do(nbd::kCmdRead, 4096, 4096, 0, {}, &back) == 0);
  CHECK(back == db);
  REQUIRE(fx.server->RemoveExport("vol1").ok());
  CHECK(a.ClosedByPeer());
  CHECK(b.ClosedByPeer());
  CHECK(fx.server->RemoveExport("vol1").code() == Code::kNotFound);
  CHECK(fx.server->ExportNames() == std::vector<std::string>{"ro"});
  fx.server->Stop();
  CHECK(::access(o.unix_path.c_str(), F_OK) != 0);  // socket file removed
}

// A device that forwards every call to another; the test devices below
// override what they watch.
class ForwardingDevice : public BlockDevice {
 public:
  explicit ForwardingDevice(std::shared_ptr<BlockDevice> next) : next_(std::move(next)) {}
  uint64_t size() const override { return next_->size(); }
  bool read_only() const override { return next_->read_only(); }
  BlockDeviceFeatures features() const override { return next_->features(); }
  Status Read(uint64_t offset, uint32_t len, uint8_t* buf) override { return next_->Read(offset, len, buf); }
  Status Write(uint64_t offset, ByteSpan data, bool fua) override { return next_->Write(offset, data, fua); }
  Status WriteZeroes(uint64_t offset, uint64_t len, bool fua, bool may_trim) override {
    return next_->WriteZeroes(offset, len, fua, may_trim);
  }
  Status Trim(uint64_t offset, uint64_t len, bool fua) override { return next_->Trim(offset, len, fua); }
  Status Flush() override { return next_->Flush(); }

 protected:
  std::shared_ptr<BlockDevice> next_;
};

// A device over another that can hold a READ at kHoldOffset until released,
// and fails a READ at kFailOffset after scribbling over part of the buffer.
class HoldingDevice final : public ForwardingDevice {
 public:
  static constexpr uint64_t kHoldOffset = 1 << 20;
  static constexpr uint64_t kFailOffset = 2 << 20;
  using ForwardingDevice::ForwardingDevice;
  Status Read(uint64_t offset, uint32_t len, uint8_t* buf) override {
    if (offset == kHoldOffset) {
      std::unique_lock<std::mutex> lk(mu_);
      held_ = true;
      cv_.notify_all();
      cv_.wait_for(lk, std::chrono::seconds(20), [&] { return released_; });
    }
    if (offset == kFailOffset) {
      std::memset(buf, 0xEE, len / 2);
      return Status::IOError("injected read failure");
    }
    return next_->Read(offset, len, buf);
  }
  bool WaitHeld() {
    std::unique_lock<std::mutex> lk(mu_);
    return cv_.wait_for(lk, std::chrono::seconds(10), [&] { return held_; });
  }
  void Release() {
    std::lock_guard<std::mutex> lk(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool held_ = false, released_ = false;
};

// A device over another that keeps every buffer WriteShared hands it.
class KeepingDevice final : public ForwardingDevice {
 public:
  using ForwardingDevice::ForwardingDevice;
  Status Write(uint64_t offset, ByteSpan data, bool fua) override {
    ++copied_writes;
    return next_->Write(offset, data, fua);
  }
  Status WriteShared(uint64_t offset, std::shared_ptr<const Bytes> data, bool fua) override {
    kept.push_back(data);
    return next_->Write(offset, ByteSpan(data->data(), data->size()), fua);
  }

  std::vector<std::shared_ptr<const Bytes>> kept;  // the connection's requests reach the device one at a time
  int copied_writes = 0;
};

// Issue 41 (a leaner agent): a WRITE's payload is handed to the device, which
// may keep that very buffer (the agent's capture queue does) instead of
// copying it. Small writes run on the socket's strand, large ones on the
// device strand after the rest of the payload is read: both hand it over.
TEST_CASE("nbd server: a WRITE's payload is handed over to the device, not copied", "[nbd]") {
  auto env = NewMemEnv();
  FileBlockDevice::Options fo;
  fo.create_size = 4 << 20;
  auto base = FileBlockDevice::Open(env.get(), "/keep.img", fo);
  REQUIRE(base.ok());
  auto dev = std::make_shared<KeepingDevice>(*base);
  NbdServerOptions o;
  o.tcp = {"127.0.0.1", 0};
  NbdServer server(o);
  REQUIRE(server.AddExport("keep", dev).ok());
  REQUIRE(server.Start().ok());
  RawClient c;
  REQUIRE(c.ConnectTcp(server.port()));
  REQUIRE(c.Open("keep") >= 0);
  const Bytes small = Pattern(4096, 3), large = Pattern(1 << 20, 4);
  REQUIRE(c.Do(nbd::kCmdWrite, 8192, uint32_t(small.size()), 0, small) == 0);
  REQUIRE(c.Do(nbd::kCmdWrite, 1 << 20, uint32_t(large.size()), 0, large) == 0);
  Bytes back;
  REQUIRE(c.Do(nbd::kCmdRead, 1 << 20, uint32_t(large.size()), 0, {}, &back) == 0);
  CHECK(back == large);
  server.Stop();
  CHECK(dev->copied_writes == 0);
  REQUIRE(dev->kept.size() == 2);
  CHECK(*dev->kept[0] == small);
  CHECK(*dev->kept[1] == large);
  // The server let go of both: the device holds the only reference.
  CHECK(dev->kept[0].use_count() == 1);
  CHECK(dev->kept[1].use_count() == 1);
}

// Regression (issue 17, export reads slower than nbdkit file): a READ reply
// buffer is no longer zero-filled before the device fills it (one pass over
// every byte read; bench/export_profile.sh counted it). What the buffer held
// must never leak: a failed read answers the header alone, whatever the device
// left in the buffer, and the connection goes on. And the pipeline's other
// property: a device call that blocks holds its own connection (and one
// worker) only; a second client completes its handshake and its reads
// meanwhile.
TEST_CASE("nbd server: READ replies are not zero-filled, a failed read sends the header alone, a blocked device call holds one connection", "[nbd]") {
  auto env = NewMemEnv();
  FileBlockDevice::Options fo;
  fo.create_size = 4 << 20;
  auto base = FileBlockDevice::Open(env.get(), "/hold.img", fo);
  REQUIRE(base.ok());
  Bytes data = Pattern(fo.create_size, 7);
  REQUIRE((*base)->Write(0, data, false).ok());
  auto dev = std::make_shared<HoldingDevice>(*base);
  NbdServerOptions o;
  o.tcp = {"127.0.0.1", 0};
  o.io_threads = 1;
  o.worker_threads = 2;  // one for the held read, one for everyone else
  NbdServer server(o);
  REQUIRE(server.AddExport("hold", dev).ok());
  REQUIRE(server.Start().ok());

  RawClient a;
  REQUIRE(a.ConnectTcp(server.port()));
  REQUIRE(a.Open("hold") >= 0);
  REQUIRE(a.SendRequest(nbd::kCmdRead, 1, HoldingDevice::kHoldOffset, 4096));
  REQUIRE(dev->WaitHeld());

  // A new client is served end to end while `a` is held.
  RawClient b;
  REQUIRE(b.ConnectTcp(server.port()));
  REQUIRE(b.Open("hold") >= 0);
  for (uint64_t off : {uint64_t(0), uint64_t(8192), uint64_t(3) << 20}) {
    Bytes back;
    REQUIRE(b.Do(nbd::kCmdRead, off, 65536, 0, {}, &back) == 0);
    CHECK(std::memcmp(back.data(), data.data() + off, back.size()) == 0);
  }
  // A failed read: header only, then the connection goes on.
  CHECK(b.Do(nbd::kCmdRead, HoldingDevice::kFailOffset, 8192) == nbd::kEIO);
  Bytes back;
  REQUIRE(b.Do(nbd::kCmdRead, 4096, 4096, 0, {}, &back) == 0);
  CHECK(std::memcmp(back.data(), data.data() + 4096, 4096) == 0);

  dev->Release();
  uint32_t err = 1;
  uint64_t h = 0;
  REQUIRE(a.ReadReply(&err, &h));
  CHECK(err == 0);
  CHECK(h == 1);
  REQUIRE(a.Recv(4096, &back));
  CHECK(std::memcmp(back.data(), data.data() + HoldingDevice::kHoldOffset, 4096) == 0);
  CHECK(server.ExportStats("hold")->errors == 1);
  server.Stop();
}

// A device over another whose READs of [0, kGatherEnd) wait until `gather`
// of them are inside Read() at once (and fail after 5 s without them), and
// which counts WRITEs that started while a READ was inside.
class GatheringDevice final : public ForwardingDevice {
 public:
  static constexpr uint64_t kGatherEnd = 4 << 20;
  GatheringDevice(std::shared_ptr<BlockDevice> next, int gather) : ForwardingDevice(std::move(next)), gather_(gather) {}
  Status Read(uint64_t offset, uint32_t len, uint8_t* buf) override {
    {
      std::unique_lock<std::mutex> lk(mu_);
      ++inside_;
      max_inside_ = std::max(max_inside_, inside_);
      cv_.notify_all();
      if (offset < kGatherEnd &&
          !cv_.wait_for(lk, std::chrono::seconds(5), [&] { return max_inside_ >= gather_; })) {
        --inside_;
        return Status::IOError("READs did not meet: " + std::to_string(max_inside_) + " at once");
      }
    }
    Status s = next_->Read(offset, len, buf);
    std::lock_guard<std::mutex> lk(mu_);
    --inside_;
    return s;
  }
  Status Write(uint64_t offset, ByteSpan data, bool fua) override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (inside_ > 0) ++writes_beside_reads_;
    }
    return next_->Write(offset, data, fua);
  }
  int max_inside() {
    std::lock_guard<std::mutex> lk(mu_);
    return max_inside_;
  }
  int writes_beside_reads() {
    std::lock_guard<std::mutex> lk(mu_);
    return writes_beside_reads_;
  }

 private:
  const int gather_;
  std::mutex mu_;
  std::condition_variable cv_;
  int inside_ = 0, max_inside_ = 0, writes_beside_reads_ = 0;
};

// Sends `reqs` in one write; reads one simple reply per request, with the
// data of a successful READ. Returns handle -> {error, data}.
std::map<uint64_t, std::pair<uint32_t, Bytes>> Pipeline(RawClient& c, const std::vector<nbd::Request>& reqs,
                                                        const std::map<uint64_t, Bytes>& payloads = {}) {
  Bytes wire;
  std::map<uint64_t, uint32_t> read_len;
  for (const nbd::Request& r : reqs) {
    PutBytes(wire, nbd::EncodeRequest(r));
    if (auto it = payloads.find(r.handle); it != payloads.end()) PutBytes(wire, it->second);
    if (r.type == nbd::kCmdRead) read_len[r.handle] = r.length;
  }
  std::map<uint64_t, std::pair<uint32_t, Bytes>> got;
  if (!c.Send(wire)) return got;
  for (size_t i = 0; i < reqs.size(); ++i) {
    uint32_t err = 0;
    uint64_t h = 0;
    if (!c.ReadReply(&err, &h)) return got;
    Bytes d;
    if (err == 0 && read_len.count(h) && !c.Recv(read_len[h], &d)) return got;
    got[h] = {err, std::move(d)};
  }
  return got;
}

// Regression (issue 41, target 1: a cold restore kept half a read in flight
// at the disk where nbdkit kept three): one connection's pipelined READs run
// at once on the read pool, and only READs: a WRITE waits for the READs
// before it and a READ after the WRITE sees it; a DISC waits for the pool.
// On the old pipeline the READs ran one at a time and never met.
TEST_CASE("nbd server: pipelined READs of one connection run at once, a WRITE waits for the READs before it",
          "[nbd]") {
  auto env = NewMemEnv();
  FileBlockDevice::Options fo;
  fo.create_size = 8 << 20;
  auto base = FileBlockDevice::Open(env.get(), "/gather.img", fo);
  REQUIRE(base.ok());
  const Bytes data = Pattern(fo.create_size, 11);
  REQUIRE((*base)->Write(0, data, false).ok());
  const Bytes fresh = Pattern(4096, 12);
  NbdServerOptions o;
  o.tcp = {"127.0.0.1", 0};
  std::shared_ptr<GatheringDevice> dev;
  std::unique_ptr<NbdServer> server;
  RawClient c;
  auto serve = [&](int gather) {
    dev = std::make_shared<GatheringDevice>(*base, gather);
    server = std::make_unique<NbdServer>(o);
    REQUIRE(server->AddExport("g", dev).ok());
    REQUIRE(server->Start().ok());
    REQUIRE(c.ConnectTcp(server->port()));
    REQUIRE(c.Open("g") >= 0);
  };

  SECTION("read pool") {
    serve(3);
    // A large READ goes to the pool; the small ones behind it follow it there.
    auto got = Pipeline(c, {Req(nbd::kCmdRead, 1, 0, 512 << 10), Req(nbd::kCmdRead, 2, 1 << 20, 4096),
                            Req(nbd::kCmdRead, 3, 2 << 20, 4096), Req(nbd::kCmdWrite, 4, 1 << 20, 4096),
                            Req(nbd::kCmdRead, 5, 1 << 20, 4096), Req(nbd::kCmdFlush, 6, 0, 0)},
                       {{4, fresh}});
    REQUIRE(got.size() == 6);
    for (auto& [h, r] : got) CHECK(r.first == 0);
    CHECK(dev->max_inside() == 3);
    CHECK(dev->writes_beside_reads() == 0);
    CHECK(got[1].second == Bytes(data.begin(), data.begin() + (512 << 10)));
    CHECK(got[2].second == Bytes(data.begin() + (1 << 20), data.begin() + (1 << 20) + 4096));  // before the WRITE
    CHECK(got[5].second == fresh);                                                             // after it
    // DISC after pool READs: both answered, then the close.
    REQUIRE(c.SendRequest(nbd::kCmdRead, 7, 4 << 20, 1 << 20));
    REQUIRE(c.SendRequest(nbd::kCmdRead, 8, 6 << 20, 1 << 20));
    REQUIRE(c.SendRequest(nbd::kCmdDisc, 9, 0, 0));
    std::set<uint64_t> answered;
    for (int i = 0; i < 2; ++i) {
      uint32_t err = 1;
      uint64_t h = 0;
      REQUIRE(c.ReadReply(&err, &h));
      CHECK(err == 0);
      Bytes d;
      REQUIRE(c.Recv(1 << 20, &d));
      const size_t off = h == 7 ? (4 << 20) : (6 << 20);
      CHECK(std::memcmp(d.data(), data.data() + off, d.size()) == 0);
      answered.insert(h);
    }
    CHECK(answered == std::set<uint64_t>{7, 8});
    CHECK(c.ClosedByPeer());
    CHECK(server->ExportStats("g")->reads == 6);
  }

  SECTION("read_threads 0: one READ at a time") {
    o.read_threads = 0;
    serve(1);
    auto got = Pipeline(c, {Req(nbd::kCmdRead, 1, 0, 512 << 10), Req(nbd::kCmdRead, 2, 1 << 20, 4096),
                            Req(nbd::kCmdRead, 3, 2 << 20, 4096)});
    REQUIRE(got.size() == 3);
    for (auto& [h, r] : got) CHECK(r.first == 0);
    CHECK(dev->max_inside() == 1);
  }
}

TEST_CASE("nbd server: export names and start-up errors", "[nbd]") {
  auto env = NewMemEnv();
  FileBlockDevice::Options fo;
  fo.create_size = 1 << 20;
  auto dev = FileBlockDevice::Open(env.get(), "/x.img", fo);
  REQUIRE(dev.ok());
  NbdServer s(NbdServerOptions{});
  CHECK(s.AddExport("", *dev).code() == Code::kInvalidArgument);
  CHECK(s.AddExport(std::string(257, 'a'), *dev).code() == Code::kInvalidArgument);
  CHECK(s.AddExport("a\nb", *dev).code() == Code::kInvalidArgument);
  CHECK(s.AddExport("vol@point-3", *dev).ok());
  CHECK(s.AddExport("vol@point-3", *dev).code() == Code::kAlreadyExists);
  CHECK(s.AddExport("null", nullptr).code() == Code::kInvalidArgument);
  CHECK(s.Start().code() == Code::kInvalidArgument);  // no listener configured
  CHECK(FileBlockDevice::Open(env.get(), "/missing.img", FileBlockDevice::Options{}).status().code() ==
        Code::kNotFound);
}

// ---------------------------------------------------------------------------
// Security at the port: STARTTLS, tenants, caps, eviction, idle timeout
// ---------------------------------------------------------------------------

// A site PKI in a scratch directory: the server's certificate (role mt) and
// client certificates of tenants acme and umbrella and of the provider.
struct Pki {
  Pki() {
    REQUIRE(!dir.path().empty());
    ca = dir.Join("ca");
    REQUIRE(pki::InitCa(ca, pki::CaOptions{}).ok());
    server = Issue(pki::CertRole::kMasterTarget, "", "nbd-server");
    Load(Issue(pki::CertRole::kAgent, "acme", "acme-client"), &acme);
    Load(Issue(pki::CertRole::kAgent, "umbrella", "umbrella-client"), &umbrella);
    Load(Issue(pki::CertRole::kMasterTarget, "", "provider"), &provider);
  }
  TlsFiles Issue(pki::CertRole role, const std::string& tenant, const std::string& name) {
    pki::IssueOptions io;
    io.identity = pki::Identity{role, tenant, name};
    TlsFiles f{ca + "/ca.crt", dir.Join(name + ".crt"), dir.Join(name + ".key"), ""};
    REQUIRE(pki::Issue(ca, io, f.key, f.cert).ok());
    return f;
  }
  static void Load(const TlsFiles& f, std::shared_ptr<const TlsContext>* out) {
    auto c = TlsContext::Load(f);
    REQUIRE(c.ok());
    *out = *c;
  }
  ScratchDir dir;
  std::string ca;
  TlsFiles server;
  std::shared_ptr<const TlsContext> acme, umbrella, provider;
};

// A server with TLS required on TCP, exports of two tenants and one without
// owner, and a Unix socket.
struct TlsFixture {
  explicit TlsFixture(NbdServerOptions o = {}) : env(NewMemEnv()) {
    auto creds = TlsCredentials::Load(pk.server);
    REQUIRE(creds.ok());
    tls = std::move(*creds);
    o.tcp = {"127.0.0.1", 0};
    o.unix_path = pk.dir.Join("nbd.sock");
    o.tls = tls.get();
    o.tls_mode = NbdServerOptions::TlsMode::kRequire;
    server = std::make_unique<NbdServer>(o);
    for (auto [name, owner] : {std::pair{"acme/db@1", "acme"}, {"acme/logs@2", "acme"}, {"umbrella/db@1", "umbrella"}}) {
      FileBlockDevice::Options fo;
      fo.create_size = 1 << 20;
      auto d = FileBlockDevice::Open(env.get(), std::string("/") + std::to_string(std::hash<std::string>()(name)), fo);
      REQUIRE(d.ok());
      REQUIRE(server->AddExport(name, *d, "", owner).ok());
    }
    REQUIRE(server->Start().ok());
  }
  // Connects over TCP, STARTTLS, TLS handshake with `ctx`.
  bool Secure(RawClient* c, const TlsContext& ctx) {
    if (!c->ConnectTcp(server->port()) || !c->Handshake() || !c->SendOption(nbd::kOptStartTls, {})) return false;
    RawClient::OptReply r;
    if (!c->ReadOptReply(&r) || r.type != nbd::kRepAck) return false;
    return c->StartTls(ctx.native());
  }
  Pki pk;
  std::unique_ptr<Env> env;
  std::unique_ptr<TlsCredentials> tls;
  std::unique_ptr<NbdServer> server;
};

std::vector<std::string> List(RawClient* c) {
  std::vector<std::string> names;
  if (!c->SendOption(nbd::kOptList, {})) return {"<send failed>"};
  for (;;) {
    RawClient::OptReply r;
    if (!c->ReadOptReply(&r)) return {"<closed>"};
    if (r.type == nbd::kRepAck) return names;
    if (r.type != nbd::kRepServer) return {"<error " + std::to_string(r.type) + ">"};
    const uint32_t n = nbd::DecodeBE32(r.data.data());
    names.emplace_back(reinterpret_cast<const char*>(r.data.data() + 4), n);
  }
}

// The error reply (type and text) of INFO for `name`.
std::pair<uint32_t, std::string> InfoError(RawClient* c, const std::string& name) {
  if (!c->SendOption(nbd::kOptInfo, RawClient::InfoData(name, {}))) return {0, ""};
  for (;;) {
    RawClient::OptReply r;
    if (!c->ReadOptReply(&r)) return {0, ""};
    if (r.type == nbd::kRepInfo) continue;
    return {r.type, std::string(r.data.begin(), r.data.end())};
  }
}

TEST_CASE("nbd server TLS required: before STARTTLS only STARTTLS and ABORT, others TLS_REQD", "[nbd][tls]") {
  TlsFixture fx;
  RawClient c;
  REQUIRE(c.ConnectTcp(fx.server->port()));
  REQUIRE(c.Handshake());
  for (uint32_t opt : {nbd::kOptList, nbd::kOptStructuredReply, 4242u}) {
    REQUIRE(c.SendOption(opt, {}));
    RawClient::OptReply r;
    REQUIRE(c.ReadOptReply(&r));
    CHECK(r.option == opt);
    CHECK(r.type == nbd::kRepErrTlsReqd);
  }
  std::map<uint16_t, Bytes> got;
  CHECK(c.InfoOrGo(nbd::kOptGo, "acme/db@1", {}, &got) == nbd::kRepErrTlsReqd);
  CHECK(c.InfoOrGo(nbd::kOptInfo, "missing", {}, &got) == nbd::kRepErrTlsReqd);
  CHECK(got.empty());
  // STARTTLS with data is invalid; the connection stays in the clear.
  Bytes junk(2, 0);
  REQUIRE(c.SendOption(nbd::kOptStartTls, junk));
  RawClient::OptReply r;
  REQUIRE(c.ReadOptReply(&r));
  CHECK(r.type == nbd::kRepErrInvalid);
  REQUIRE(c.SendOption(nbd::kOptAbort, {}));
  REQUIRE(c.ReadOptReply(&r));
  CHECK(r.type == nbd::kRepAck);
  CHECK(c.ClosedByPeer());

  // EXPORT_NAME cannot carry an error: the connection closes.
  RawClient e;
  REQUIRE(e.ConnectTcp(fx.server->port()));
  REQUIRE(e.Handshake());
  std::string n = "acme/db@1";
  REQUIRE(e.SendOption(nbd::kOptExportName, ByteSpan(reinterpret_cast<const uint8_t*>(n.data()), n.size())));
  CHECK(e.ClosedByPeer());

  // A client without a certificate fails the TLS handshake.
  RawClient anon;
  REQUIRE(anon.ConnectTcp(fx.server->port()));
  REQUIRE(anon.Handshake());
  REQUIRE(anon.SendOption(nbd::kOptStartTls, {}));
  REQUIRE(anon.ReadOptReply(&r));
  REQUIRE(r.type == nbd::kRepAck);
  SSL_CTX* bare = SSL_CTX_new(TLS_client_method());
  SSL_CTX_set_verify(bare, SSL_VERIFY_NONE, nullptr);
  bool up = anon.StartTls(bare);
  if (up) {
    const auto l = List(&anon);  // TLS 1.3: the server judges the client's certificate after SSL_connect
    up = !l.empty() && l[0][0] != '<';
  }
  CHECK_FALSE(up);
  SSL_CTX_free(bare);
  CHECK(WaitUntil([&] { return fx.server->connection_count() == 0; }));
}

TEST_CASE("nbd server TLS: STARTTLS, then the certificate's tenant scopes LIST, INFO and GO", "[nbd][tls]") {
  TlsFixture fx;
  RawClient a;
  REQUIRE(fx.Secure(&a, *fx.pk.acme));
  CHECK(List(&a) == std::vector<std::string>{"acme/db@1", "acme/logs@2"});
  // STARTTLS again is invalid.
  REQUIRE(a.SendOption(nbd::kOptStartTls, {}));
  RawClient::OptReply r;
  REQUIRE(a.ReadOptReply(&r));
  CHECK(r.type == nbd::kRepErrInvalid);
  // Another tenant's export looks exactly like a missing one.
  auto other = InfoError(&a, "umbrella/db@1");
  auto missing = InfoError(&a, "umbrella/nothing@9");
  CHECK(other.first == nbd::kRepErrUnknown);
  CHECK(missing.first == nbd::kRepErrUnknown);
  CHECK(other.second.substr(0, 10) == missing.second.substr(0, 10));
  CHECK(other.second == "no export 'umbrella/db@1'");
  CHECK(missing.second == "no export 'umbrella/nothing@9'");
  std::map<uint16_t, Bytes> got;
  CHECK(a.InfoOrGo(nbd::kOptGo, "umbrella/db@1", {}, &got) == nbd::kRepErrUnknown);
  // Its own export: GO, then I/O over TLS.
  CHECK(a.InfoOrGo(nbd::kOptGo, "acme/db@1", {}, &got) == nbd::kRepAck);
  Bytes d = Pattern(8192, 5), back;
  CHECK(a.Do(nbd::kCmdWrite, 4096, 8192, 0, d) == 0);
  CHECK(a.Do(nbd::kCmdRead, 4096, 8192, 0, {}, &back) == 0);
  CHECK(back == d);

  RawClient b;
  REQUIRE(fx.Secure(&b, *fx.pk.umbrella));
  CHECK(List(&b) == std::vector<std::string>{"umbrella/db@1"});
  CHECK(InfoError(&b, "acme/db@1").second == "no export 'acme/db@1'");
  // EXPORT_NAME of another tenant's export closes, as for a missing one.
  std::string n = "acme/db@1";
  REQUIRE(b.SendOption(nbd::kOptExportName, ByteSpan(reinterpret_cast<const uint8_t*>(n.data()), n.size())));
  CHECK(b.ClosedByPeer());

  // A tenant-less certificate (the provider) sees every export.
  RawClient p;
  REQUIRE(fx.Secure(&p, *fx.pk.provider));
  CHECK(List(&p) == std::vector<std::string>{"acme/db@1", "acme/logs@2", "umbrella/db@1"});

  // The Unix socket needs no TLS (its mode and group guard it).
  RawClient u;
  REQUIRE(u.ConnectUnix(fx.pk.dir.Join("nbd.sock")));
  REQUIRE(u.Handshake());
  CHECK(List(&u).size() == 3);
  struct stat st {};
  REQUIRE(::stat(fx.pk.dir.Join("nbd.sock").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0660);
}

// Regression (0fc0724): DoClose freed the replies' buffers while a TLS write
// of them was in flight, and asio's SSL engine went on encrypting them:
// heap-use-after-free in SSL_write, seen as a master target dying under
// make asan when a client went away mid-reply. Here the export is removed
// (DoClose posted from another thread) while the client keeps reading 16 MiB
// of replies, round after round: under ASan the old code fails.
TEST_CASE("nbd server: an export removed while TLS replies are being written closes the connection with no "
          "use of freed buffers",
          "[nbd][tls]") {
  TlsFixture fx;
  FileBlockDevice::Options fo;
  fo.create_size = 1 << 20;
  auto dev = FileBlockDevice::Open(fx.env.get(), "/removed-mid-reply", fo);
  REQUIRE(dev.ok());
  for (int round = 0; round < 12; ++round) {
    INFO("round " << round);
    const std::string name = "acme/mid@" + std::to_string(round);
    REQUIRE(fx.server->AddExport(name, *dev, "", "acme").ok());
    RawClient c;
    REQUIRE(fx.Secure(&c, *fx.pk.acme));
    std::map<uint16_t, Bytes> got;
    REQUIRE(c.InfoOrGo(nbd::kOptGo, name, {}, &got) == nbd::kRepAck);
    for (uint64_t h = 1; h <= 16; ++h) REQUIRE(c.SendRequest(nbd::kCmdRead, h, 0, 1u << 20));
    Bytes first;
    REQUIRE(c.Recv(nbd::kSimpleReplySize + (256u << 10), &first));  // the replies are being written
    std::thread remover([&] { CHECK(fx.server->RemoveExport(name).ok()); });
    size_t more = 0;
    Bytes chunk;
    while (c.Recv(64u << 10, &chunk)) more += chunk.size();  // until the server closes
    remover.join();
    CHECK(more < (16u << 20));  // closed before every reply went out
    CHECK(WaitUntil([&] { return fx.server->connection_count() == 0; }));
  }
}

TEST_CASE("nbd server: options per connection and option reply bytes are capped", "[nbd][tls]") {
  NbdServerOptions o;
  o.max_options = 5;
  MemFixture fx(o);
  RawClient c;
  REQUIRE(c.ConnectTcp(fx.server->port()));
  REQUIRE(c.Handshake());
  for (int i = 0; i < 5; ++i) {
    REQUIRE(c.SendOption(4242, {}));
    RawClient::OptReply r;
    REQUIRE(c.ReadOptReply(&r));
  }
  REQUIRE(c.SendOption(4242, {}));
  CHECK(c.ClosedByPeer());

  NbdServerOptions small;
  small.max_option_reply_bytes = 400;
  MemFixture fy(small);
  RawClient d;
  REQUIRE(d.ConnectTcp(fy.server->port()));
  REQUIRE(d.Handshake());
  bool closed = false;
  for (int i = 0; i < 50 && !closed; ++i) closed = List(&d) == std::vector<std::string>{"<closed>"};
  CHECK(closed);
}

TEST_CASE("nbd server: at the connection cap the oldest handshaking connection makes room", "[nbd][tls]") {
  NbdServerOptions o;
  o.max_connections = 4;
  MemFixture fx(o);
  // Two attached clients, then two silent ones fill the cap.
  RawClient att1, att2, idle1, idle2;
  REQUIRE(att1.ConnectTcp(fx.server->port()));
  REQUIRE(att1.Open("vol1") >= 0);
  REQUIRE(att2.ConnectTcp(fx.server->port()));
  REQUIRE(att2.Open("vol1") >= 0);
  REQUIRE(idle1.ConnectTcp(fx.server->port()));
  REQUIRE(WaitUntil([&] { return fx.server->connection_count() == 3; }));
  REQUIRE(idle2.ConnectTcp(fx.server->port()));
  REQUIRE(WaitUntil([&] { return fx.server->connection_count() == 4; }));
  // A fresh client gets in: the oldest silent one is closed for it.
  RawClient fresh;
  REQUIRE(fresh.ConnectTcp(fx.server->port()));
  REQUIRE(fresh.Open("vol1") >= 0);
  CHECK(fresh.Do(nbd::kCmdRead, 0, 512) == 0);
  CHECK(idle1.ClosedByPeer());
  CHECK(fx.server->evicted_count() == 1);
  // The attached clients were not touched.
  CHECK(att1.Do(nbd::kCmdRead, 0, 512) == 0);
  CHECK(att2.Do(nbd::kCmdRead, 0, 512) == 0);
  // Again: idle2 makes room; then everyone is attached and a new one is refused.
  RawClient fresh2;
  REQUIRE(fresh2.ConnectTcp(fx.server->port()));
  REQUIRE(fresh2.Open("vol1") >= 0);
  CHECK(idle2.ClosedByPeer());
  REQUIRE(WaitUntil([&] { return fx.server->connection_count() == 4; }));
  RawClient refused;
  REQUIRE(refused.ConnectTcp(fx.server->port()));
  CHECK(refused.ClosedByPeer());
  CHECK(fx.server->evicted_count() == 2);
}

TEST_CASE("nbd server: a tenant at its connection cap is refused by name, another tenant and the provider still "
          "attach, and a closed connection gives its place back",
          "[nbd][tls]") {
  NbdServerOptions o;
  o.max_connections_per_tenant = 2;
  TlsFixture fx(o);
  std::map<uint16_t, Bytes> got;
  RawClient a1, a2;
  REQUIRE(fx.Secure(&a1, *fx.pk.acme));
  REQUIRE(a1.InfoOrGo(nbd::kOptGo, "acme/db@1", {}, &got) == nbd::kRepAck);
  REQUIRE(fx.Secure(&a2, *fx.pk.acme));
  REQUIRE(a2.InfoOrGo(nbd::kOptGo, "acme/logs@2", {}, &got) == nbd::kRepAck);

  // The third of acme: NBD_REP_ERR_POLICY naming the cap; the connection
  // stays in negotiation (it may ABORT), and INFO is still answered.
  RawClient a3;
  REQUIRE(fx.Secure(&a3, *fx.pk.acme));
  REQUIRE(a3.SendOption(nbd::kOptGo, RawClient::InfoData("acme/db@1", {})));
  RawClient::OptReply r;
  REQUIRE(a3.ReadOptReply(&r));
  CHECK(r.type == nbd::kRepErrPolicy);
  CHECK(std::string(r.data.begin(), r.data.end()) ==
        "tenant 'acme' already has 2 NBD connections (the cap nbd_max_connections_per_tenant)");
  CHECK(a3.InfoOrGo(nbd::kOptInfo, "acme/db@1", {}, &got) == nbd::kRepAck);

  // Another tenant and the provider are not counted against acme.
  RawClient u, p;
  REQUIRE(fx.Secure(&u, *fx.pk.umbrella));
  CHECK(u.InfoOrGo(nbd::kOptGo, "umbrella/db@1", {}, &got) == nbd::kRepAck);
  CHECK(u.Do(nbd::kCmdRead, 0, 4096) == 0);
  REQUIRE(fx.Secure(&p, *fx.pk.provider));
  CHECK(p.InfoOrGo(nbd::kOptGo, "acme/db@1", {}, &got) == nbd::kRepAck);
  CHECK(a1.Do(nbd::kCmdRead, 0, 4096) == 0);

  // One of acme's goes: its place comes back.
  REQUIRE(a1.SendRequest(nbd::kCmdDisc, 9, 0, 0));
  CHECK(a1.ClosedByPeer());
  CHECK(WaitUntil([&] {
    RawClient a4;
    return fx.Secure(&a4, *fx.pk.acme) && a4.InfoOrGo(nbd::kOptGo, "acme/db@1", {}, &got) == nbd::kRepAck;
  }));
}

TEST_CASE("nbd server: attached clients idle past idle_timeout_ms are closed, busy ones stay", "[nbd][tls]") {
  NbdServerOptions o;
  o.idle_timeout_ms = 300;
  MemFixture fx(o);
  RawClient idle, busy;
  REQUIRE(idle.ConnectTcp(fx.server->port()));
  REQUIRE(idle.Open("vol1") >= 0);
  REQUIRE(busy.ConnectTcp(fx.server->port()));
  REQUIRE(busy.Open("vol1") >= 0);
  // busy sends a request every 50 ms for well over the timeout.
  std::atomic<bool> ok{true};
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1200);
  while (std::chrono::steady_clock::now() < until) {
    if (busy.Do(nbd::kCmdRead, 0, 512) != 0) ok = false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the client's request pacing, not a sync
  }
  CHECK(ok);
  CHECK(idle.ClosedByPeer());
  CHECK(fx.server->idle_closed_count() == 1);
  CHECK(busy.Do(nbd::kCmdRead, 0, 512) == 0);
}

// ---------------------------------------------------------------------------
// Real clients
// ---------------------------------------------------------------------------

struct PosixFixture {
  explicit PosixFixture(uint64_t size = 64 << 20) : env(NewPosixEnv()) {
    REQUIRE(!dir.path().empty());
    path = dir.Join("vol.img");
    FileBlockDevice::Options fo;
    fo.create_size = size;
    auto d = FileBlockDevice::Open(env.get(), path, fo);
    REQUIRE(d.ok());
    dev = *d;
    NbdServerOptions o;
    o.tcp = {"127.0.0.1", 0};
    o.unix_path = dir.Join("nbd.sock");
    server = std::make_unique<NbdServer>(o);
    REQUIRE(server->AddExport("vol", dev, "test volume").ok());
    REQUIRE(server->Start().ok());
    url = "nbd://127.0.0.1:" + std::to_string(server->port()) + "/vol";
  }
  ScratchDir dir;
  std::unique_ptr<Env> env;
  std::string path;
  std::shared_ptr<FileBlockDevice> dev;
  std::unique_ptr<NbdServer> server;
  std::string url;
};

void RequireProgram(const std::string& p) {
  INFO(p << " is not installed (Debian: qemu-utils / libnbd-bin)");
  REQUIRE(testing::HaveProgram(p));
}

TEST_CASE("nbdinfo sees the export and lists it", "[nbd][e2e]") {
  RequireProgram("nbdinfo");
  PosixFixture fx(64 << 20);
  auto r = RunCommand({"nbdinfo", "--size", fx.url}, 30000);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(std::stoull(r.output) == (64ull << 20));
  r = RunCommand({"nbdinfo", "--json", "nbd+unix:///vol?socket=" + fx.dir.Join("nbd.sock")}, 30000);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("\"export-size\": 67108864") != std::string::npos);
  CHECK(r.output.find("\"is_read_only\": false") != std::string::npos);
  CHECK(r.output.find("\"can_flush\": true") != std::string::npos);
  CHECK(r.output.find("\"can_multi_conn\": true") != std::string::npos);
  r = RunCommand({"nbdinfo", "--list", "nbd://127.0.0.1:" + std::to_string(fx.server->port())}, 30000);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("export=\"vol\"") != std::string::npos);
  CHECK(r.output.find("test volume") != std::string::npos);
}

TEST_CASE("qemu-io writes patterns at many offsets and reads them back", "[nbd][e2e]") {
  RequireProgram("qemu-io");
  PosixFixture fx(64 << 20);
  struct W {
    uint64_t off;
    uint64_t len;
    int pat;
  };
  const std::vector<W> ws = {{0, 1 << 20, 0xab},          {1 << 20, 4096, 0x11},
                             {5 << 20, 512, 0x22},        {(17 << 20) + 512, 65536, 0x33},
                             {(32 << 20) - 4096, 8192, 0x44}, {(63 << 20), 1 << 20, 0x55}};
  std::vector<std::string> cmd = {"qemu-io", "-f", "raw", fx.url};
  for (auto& w : ws) {
    cmd.push_back("-c");
    cmd.push_back("write -P " + std::to_string(w.pat) + " " + std::to_string(w.off) + " " + std::to_string(w.len));
  }
  cmd.push_back("-c");
  cmd.push_back("flush");
  for (auto& w : ws) {
    cmd.push_back("-c");
    cmd.push_back("read -P " + std::to_string(w.pat) + " " + std::to_string(w.off) + " " + std::to_string(w.len));
  }
  auto r = RunCommand(cmd, 60000);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("Pattern verification failed") == std::string::npos);
  CHECK(r.output.find("failed") == std::string::npos);
  // The backing file has the patterns.
  auto f = fx.env->Open(fx.path, OpenOptions{});
  REQUIRE(f.ok());
  for (auto& w : ws) {
    Bytes b(w.len);
    REQUIRE((*f)->Read(w.off, w.len, b.data()).ok());
    CHECK(b == Bytes(w.len, uint8_t(w.pat)));
  }
  Bytes gap(4096);
  REQUIRE((*f)->Read(2 << 20, 4096, gap.data()).ok());
  CHECK(gap == Bytes(4096, 0));
  // Zeroing through qemu-io (WRITE_ZEROES) and a read past the end.
  r = RunCommand({"qemu-io", "-f", "raw", fx.url, "-c", "write -z 0 65536", "-c", "read -P 0 0 65536", "-c",
                  "read 67108864 512"},
                 60000);
  INFO(r.output);
  CHECK(r.output.find("Pattern verification failed") == std::string::npos);
  CHECK(r.output.find("read failed") != std::string::npos);  // past the end
  Bytes z(65536);
  REQUIRE((*f)->Read(0, z.size(), z.data()).ok());
  CHECK(z == Bytes(65536, 0));
}

TEST_CASE("nbdcopy a random image in and out", "[nbd][e2e]") {
  RequireProgram("nbdcopy");
  PosixFixture fx(24 << 20);
  const std::string in = fx.dir.Join("in.img"), out = fx.dir.Join("out.img");
  Bytes data = Pattern(24 << 20, 77);
  std::memset(data.data() + (3 << 20), 0, 2 << 20);  // a zero run (sparse on the way in)
  REQUIRE(WriteFileAtomic(fx.env.get(), in, data).ok());
  auto r = RunCommand({"nbdcopy", in, fx.url}, 120000);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  r = RunCommand({"nbdcopy", fx.url, out}, 120000);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  auto back = ReadWholeFile(fx.env.get(), out);
  REQUIRE(back.ok());
  CHECK(back->size() == data.size());
  CHECK(*back == data);
  auto backing = ReadWholeFile(fx.env.get(), fx.path);
  REQUIRE(backing.ok());
  CHECK(*backing == data);
  // nbdcopy opens several connections (CAN_MULTI_CONN).
  CHECK(fx.server->ExportStats("vol")->connections_total >= 2);
  CHECK(fx.server->ExportStats("vol")->errors == 0);
}

TEST_CASE("qemu-io on a read-only export cannot write", "[nbd][e2e]") {
  RequireProgram("qemu-io");
  ScratchDir dir;
  auto env = NewPosixEnv();
  FileBlockDevice::Options fo;
  fo.create_size = 1 << 20;
  REQUIRE(FileBlockDevice::Open(env.get(), dir.Join("ro.img"), fo).ok());
  FileBlockDevice::Options ro;
  ro.read_only = true;
  auto dev = FileBlockDevice::Open(env.get(), dir.Join("ro.img"), ro);
  REQUIRE(dev.ok());
  NbdServerOptions o;
  o.tcp = {"127.0.0.1", 0};
  NbdServer server(o);
  REQUIRE(server.AddExport("ro", *dev).ok());
  REQUIRE(server.Start().ok());
  const std::string url = "nbd://127.0.0.1:" + std::to_string(server.port()) + "/ro";
  // qemu sees NBD_FLAG_READ_ONLY: opening read-write is refused...
  auto r = RunCommand({"qemu-io", "-f", "raw", url, "-c", "write -P 1 0 4096"}, 60000);
  INFO(r.output);
  CHECK(r.exit_code != 0);
  CHECK(r.output.find("Permission denied") != std::string::npos);
  // ...and read-only it reads, and cannot write.
  r = RunCommand({"qemu-io", "-r", "-f", "raw", url, "-c", "read -P 0 0 4096", "-c", "write -P 1 0 4096"}, 60000);
  INFO(r.output);
  CHECK(r.output.find("Pattern verification failed") == std::string::npos);
  CHECK(r.output.find("read 4096/4096") != std::string::npos);
  CHECK(r.output.find("wrote 4096/4096") == std::string::npos);
  Bytes b(4096);
  REQUIRE((*dev)->Read(0, 4096, b.data()).ok());
  CHECK(b == Bytes(4096, 0));
}


// ---------------------------------------------------------------------------
// Structured replies and base:allocation (NBD_CMD_BLOCK_STATUS)
// ---------------------------------------------------------------------------

namespace {

struct Chunk {
  uint16_t flags = 0, type = 0;
  uint64_t handle = 0;
  Bytes payload;
};

bool ReadChunk(RawClient* c, Chunk* out) {
  Bytes h;
  if (!c->Recv(nbd::kStructuredReplyHeaderSize, &h)) return false;
  if (nbd::DecodeBE32(h.data()) != nbd::kStructuredReplyMagic) return false;
  out->flags = nbd::DecodeBE16(h.data() + 4);
  out->type = nbd::DecodeBE16(h.data() + 6);
  out->handle = nbd::DecodeBE64(h.data() + 8);
  const uint32_t len = nbd::DecodeBE32(h.data() + 16);
  out->payload.clear();
  return len == 0 || c->Recv(len, &out->payload);
}

// Every chunk of the reply to `handle`, through the one flagged DONE.
std::vector<Chunk> ReadReplyChunks(RawClient* c, uint64_t handle) {
  std::vector<Chunk> v;
  for (;;) {
    Chunk ch;
    if (!ReadChunk(c, &ch) || ch.handle != handle) return {};
    v.push_back(ch);
    if (ch.flags & nbd::kReplyFlagDone) return v;
  }
}

Bytes MetaData(const std::string& name, const std::vector<std::string>& queries) {
  Bytes b;
  nbd::PutBE32(b, uint32_t(name.size()));
  PutBytes(b, name);
  nbd::PutBE32(b, uint32_t(queries.size()));
  for (const std::string& q : queries) {
    nbd::PutBE32(b, uint32_t(q.size()));
    PutBytes(b, q);
  }
  return b;
}

// The (length, flags) descriptors of one BLOCK_STATUS chunk for context 1.
std::vector<std::pair<uint32_t, uint32_t>> Descriptors(const Chunk& ch) {
  std::vector<std::pair<uint32_t, uint32_t>> d;
  if (ch.type != nbd::kReplyTypeBlockStatus || ch.payload.size() < 12 || (ch.payload.size() - 4) % 8 != 0) return d;
  if (nbd::DecodeBE32(ch.payload.data()) != nbd::kBaseAllocationId) return d;
  for (size_t i = 4; i < ch.payload.size(); i += 8) {
    d.emplace_back(nbd::DecodeBE32(ch.payload.data() + i), nbd::DecodeBE32(ch.payload.data() + i + 4));
  }
  return d;
}

// A 4 MiB sparse file on the real file system: 64 KiB of data at 1 MiB and
// 4 KiB at 3 MiB, holes elsewhere; and a second export "other".
struct SparseFixture {
  SparseFixture() : env(NewPosixEnv()), mem(NewMemEnv()) {
    FileBlockDevice::Options fo;
    fo.create_size = 4 << 20;
    auto d = FileBlockDevice::Open(env.get(), dir.Join("sparse.img"), fo);
    REQUIRE(d.ok());
    dev = *d;
    a = Pattern(64 << 10, 7);
    b = Pattern(4096, 9);
    REQUIRE(dev->Write(1 << 20, a, false).ok());
    REQUIRE(dev->Write(3 << 20, b, false).ok());
    auto o2 = FileBlockDevice::Open(mem.get(), "/other.img", fo);
    REQUIRE(o2.ok());
    NbdServerOptions o;
    o.tcp = {"127.0.0.1", 0};
    server = std::make_unique<NbdServer>(o);
    REQUIRE(server->AddExport("sparse", dev).ok());
    REQUIRE(server->AddExport("other", *o2).ok());
    REQUIRE(server->Start().ok());
  }
  // Handshake, STRUCTURED_REPLY (when asked), SET_META_CONTEXT base:allocation
  // for `meta` (when not empty), GO `name`.
  bool Open(RawClient* c, const std::string& name, bool structured, const std::string& meta) {
    if (!c->ConnectTcp(server->port()) || !c->Handshake()) return false;
    RawClient::OptReply r;
    if (structured) {
      if (!c->SendOption(nbd::kOptStructuredReply, {}) || !c->ReadOptReply(&r) || r.type != nbd::kRepAck) return false;
    }
    if (!meta.empty()) {
      if (!c->SendOption(nbd::kOptSetMetaContext, MetaData(meta, {"base:allocation"}))) return false;
      do {
        if (!c->ReadOptReply(&r)) return false;
      } while (r.type == nbd::kRepMetaContext);
      if (r.type != nbd::kRepAck) return false;
    }
    std::map<uint16_t, Bytes> got;
    return c->InfoOrGo(nbd::kOptGo, name, {}, &got) == nbd::kRepAck;
  }
  ScratchDir dir;
  std::unique_ptr<Env> env, mem;
  std::shared_ptr<FileBlockDevice> dev;
  std::unique_ptr<NbdServer> server;
  Bytes a, b;
};

}  // namespace

TEST_CASE("nbd server: meta contexts need structured replies, LIST and SET offer base:allocation only",
          "[nbd][block-status]") {
  SparseFixture fx;
  RawClient c;
  REQUIRE(c.ConnectTcp(fx.server->port()));
  REQUIRE(c.Handshake());
  RawClient::OptReply r;
  // Before STRUCTURED_REPLY: invalid.
  REQUIRE(c.SendOption(nbd::kOptSetMetaContext, MetaData("sparse", {"base:allocation"})));
  REQUIRE(c.ReadOptReply(&r));
  CHECK(r.type == nbd::kRepErrInvalid);
  REQUIRE(c.SendOption(nbd::kOptStructuredReply, Bytes(1, 0)));  // with data: invalid
  REQUIRE(c.ReadOptReply(&r));
  CHECK(r.type == nbd::kRepErrInvalid);
  REQUIRE(c.SendOption(nbd::kOptStructuredReply, {}));
  REQUIRE(c.ReadOptReply(&r));
  CHECK(r.type == nbd::kRepAck);
  // LIST with no query, with "base:", with an unknown namespace.
  for (const auto& [queries, want] : std::vector<std::pair<std::vector<std::string>, bool>>{
           {{}, true}, {{"base:"}, true}, {{"qemu:dirty-bitmap:x"}, false}, {{"base:allocation"}, true}}) {
    REQUIRE(c.SendOption(nbd::kOptListMetaContext, MetaData("sparse", queries)));
    REQUIRE(c.ReadOptReply(&r));
    if (want) {
      CHECK(r.type == nbd::kRepMetaContext);
      CHECK(r.data == nbd::EncodeMetaContext(0, "base:allocation"));
      REQUIRE(c.ReadOptReply(&r));
    }
    CHECK(r.type == nbd::kRepAck);
  }
  // SET selects it with id 1; an unknown export and a malformed request fail.
  REQUIRE(c.SendOption(nbd::kOptSetMetaContext, MetaData("sparse", {"qemu:x", "base:allocation"})));
  REQUIRE(c.ReadOptReply(&r));
  CHECK(r.type == nbd::kRepMetaContext);
  CHECK(r.data == nbd::EncodeMetaContext(nbd::kBaseAllocationId, "base:allocation"));
  REQUIRE(c.ReadOptReply(&r));
  CHECK(r.type == nbd::kRepAck);
  REQUIRE(c.SendOption(nbd::kOptSetMetaContext, MetaData("nope", {"base:allocation"})));
  REQUIRE(c.ReadOptReply(&r));
  CHECK(r.type == nbd::kRepErrUnknown);
  Bytes bad = MetaData("sparse", {"base:allocation"});
  bad.pop_back();
  REQUIRE(c.SendOption(nbd::kOptSetMetaContext, bad));
  REQUIRE(c.ReadOptReply(&r));
  CHECK(r.type == nbd::kRepErrInvalid);
}

TEST_CASE("nbd server: BLOCK_STATUS reports a sparse file's holes and data, REQ_ONE one extent, structured READs send "
          "holes as OFFSET_HOLE",
          "[nbd][block-status]") {
  SparseFixture fx;
  RawClient c;
  REQUIRE(fx.Open(&c, "sparse", true, "sparse"));
  constexpr uint32_t kHZ = nbd::kStateHole | nbd::kStateZero;
  const std::vector<std::pair<uint32_t, uint32_t>> want = {
      {1 << 20, kHZ}, {64 << 10, 0}, {(2 << 20) - (64 << 10), kHZ}, {4096, 0}, {(1 << 20) - 4096, kHZ}};
  REQUIRE(c.SendRequest(nbd::kCmdBlockStatus, 1, 0, 4 << 20));
  auto chunks = ReadReplyChunks(&c, 1);
  REQUIRE(chunks.size() == 1);
  CHECK(Descriptors(chunks[0]) == want);
  // From the middle of a hole, and REQ_ONE clipped to the request.
  REQUIRE(c.SendRequest(nbd::kCmdBlockStatus, 2, 4096, 8192, nbd::kCmdFlagReqOne));
  chunks = ReadReplyChunks(&c, 2);
  REQUIRE(chunks.size() == 1);
  CHECK(Descriptors(chunks[0]) == std::vector<std::pair<uint32_t, uint32_t>>{{8192, kHZ}});
  REQUIRE(c.SendRequest(nbd::kCmdBlockStatus, 3, 1 << 20, 3 << 20, nbd::kCmdFlagReqOne));
  chunks = ReadReplyChunks(&c, 3);
  REQUIRE(chunks.size() == 1);
  CHECK(Descriptors(chunks[0]) == std::vector<std::pair<uint32_t, uint32_t>>{{64 << 10, 0}});
  CHECK(fx.server->ExportStats("sparse")->block_status_ops == 3);

  // A READ across a hole into data: an OFFSET_HOLE then an OFFSET_DATA chunk.
  const uint64_t off = (1 << 20) - 8192;
  REQUIRE(c.SendRequest(nbd::kCmdRead, 4, off, 16384));
  chunks = ReadReplyChunks(&c, 4);
  REQUIRE(chunks.size() == 2);
  CHECK(chunks[0].type == nbd::kReplyTypeOffsetHole);
  CHECK(chunks[0].flags == 0);
  REQUIRE(chunks[0].payload.size() == 12);
  CHECK(nbd::DecodeBE64(chunks[0].payload.data()) == off);
  CHECK(nbd::DecodeBE32(chunks[0].payload.data() + 8) == 8192);
  CHECK(chunks[1].type == nbd::kReplyTypeOffsetData);
  CHECK(chunks[1].flags == nbd::kReplyFlagDone);
  REQUIRE(chunks[1].payload.size() == 8 + 8192);
  CHECK(nbd::DecodeBE64(chunks[1].payload.data()) == (1u << 20));
  CHECK(Bytes(chunks[1].payload.begin() + 8, chunks[1].payload.end()) == Bytes(fx.a.begin(), fx.a.begin() + 8192));
  // Data only: one OFFSET_DATA chunk. Past the end: one ERROR chunk, EINVAL.
  REQUIRE(c.SendRequest(nbd::kCmdRead, 5, 3 << 20, 4096));
  chunks = ReadReplyChunks(&c, 5);
  REQUIRE(chunks.size() == 1);
  CHECK(chunks[0].type == nbd::kReplyTypeOffsetData);
  CHECK(Bytes(chunks[0].payload.begin() + 8, chunks[0].payload.end()) == fx.b);
  REQUIRE(c.SendRequest(nbd::kCmdRead, 6, 4 << 20, 4096));
  chunks = ReadReplyChunks(&c, 6);
  REQUIRE(chunks.size() == 1);
  CHECK(chunks[0].type == nbd::kReplyTypeError);
  CHECK(chunks[0].flags == nbd::kReplyFlagDone);
  REQUIRE(chunks[0].payload.size() >= 6);
  CHECK(nbd::DecodeBE32(chunks[0].payload.data()) == nbd::kEINVAL);
  // Other commands keep simple replies.
  CHECK(c.Do(nbd::kCmdFlush, 0, 0) == 0);
}

TEST_CASE("nbd server: BLOCK_STATUS is EINVAL without base:allocation for the attached export, and without "
          "structured replies READ stays a simple reply",
          "[nbd][block-status]") {
  SparseFixture fx;
  SECTION("structured replies but no context") {
    RawClient c;
    REQUIRE(fx.Open(&c, "sparse", true, ""));
    REQUIRE(c.SendRequest(nbd::kCmdBlockStatus, 1, 0, 4096));
    auto chunks = ReadReplyChunks(&c, 1);
    REQUIRE(chunks.size() == 1);
    CHECK(chunks[0].type == nbd::kReplyTypeError);
    CHECK(nbd::DecodeBE32(chunks[0].payload.data()) == nbd::kEINVAL);
  }
  SECTION("the context was set for another export") {
    RawClient c;
    REQUIRE(fx.Open(&c, "other", true, "sparse"));
    REQUIRE(c.SendRequest(nbd::kCmdBlockStatus, 1, 0, 4096));
    auto chunks = ReadReplyChunks(&c, 1);
    REQUIRE(chunks.size() == 1);
    CHECK(nbd::DecodeBE32(chunks[0].payload.data()) == nbd::kEINVAL);
  }
  SECTION("simple replies") {
    RawClient c;
    REQUIRE(fx.Open(&c, "sparse", false, ""));
    Bytes got;
    CHECK(c.Do(nbd::kCmdRead, 1 << 20, 4096, 0, {}, &got) == 0);
    CHECK(got == Bytes(fx.a.begin(), fx.a.begin() + 4096));
    CHECK(c.Do(nbd::kCmdBlockStatus, 0, 4096) == nbd::kEINVAL);
  }
}

TEST_CASE("nbdinfo --map, qemu-img map and nbdcopy see a sparse export as nbdkit file does", "[nbd][e2e][block-status]") {
  RequireProgram("nbdinfo");
  RequireProgram("nbdcopy");
  RequireProgram("nbdkit");
  RequireProgram("qemu-img");
  PosixFixture fx(64 << 20);
  // Scattered 1 MiB extents and a few 4 KiB blocks.
  for (uint64_t mib : {3u, 17u, 18u, 40u, 63u}) REQUIRE(fx.dev->Write(mib << 20, Pattern(1 << 20, int(mib)), false).ok());
  for (uint64_t k : {100u, 5000u, 9001u}) REQUIRE(fx.dev->Write(k * 4096, Pattern(4096, int(k)), false).ok());
  REQUIRE(fx.dev->Flush().ok());
  // nbdkit serving the same file (read-only) on a Unix socket of its own.
  const std::string sock = fx.dir.Join("nbdkit.sock");
  SpawnOptions so;
  so.argv = {"nbdkit", "-f", "-r", "-U", sock, "file", fx.path};
  so.output_file = fx.dir.Join("nbdkit.log");
  so.die_with_parent = true;
  auto kit = Subprocess::Spawn(so);
  REQUIRE(kit.ok());
  REQUIRE(WaitUntil([&] { return ::access(sock.c_str(), F_OK) == 0; }, std::chrono::seconds(10)));
  const std::string kit_url = "nbd+unix:///?socket=" + sock;

  auto ours = RunCommand({"nbdinfo", "--map", fx.url}, 30000);
  auto theirs = RunCommand({"nbdinfo", "--map", kit_url}, 30000);
  INFO(ours.output << "\n---- nbdkit:\n" << theirs.output);
  REQUIRE(ours.exit_code == 0);
  REQUIRE(theirs.exit_code == 0);
  CHECK(ours.output == theirs.output);
  CHECK(ours.output.find("hole,zero") != std::string::npos);
  auto qo = RunCommand({"qemu-img", "map", "--output=json", "-f", "raw", fx.url}, 30000);
  auto qt = RunCommand({"qemu-img", "map", "--output=json", "-f", "raw", kit_url}, 30000);
  INFO(qo.output << "\n---- nbdkit:\n" << qt.output);
  REQUIRE(qo.exit_code == 0);
  CHECK(qo.output == qt.output);

  // nbdcopy to a sparse file: byte-equal, and only the data allocated.
  const std::string out = fx.dir.Join("copy.img");
  auto cp = RunCommand({"nbdcopy", fx.url, out}, 60000);
  INFO(cp.output);
  REQUIRE(cp.exit_code == 0);
  CHECK(RunCommand({"cmp", fx.path, out}).exit_code == 0);
  struct stat st {};
  REQUIRE(::stat(out.c_str(), &st) == 0);
  const uint64_t allocated = uint64_t(st.st_blocks) * 512;
  const uint64_t data = 5 * (1 << 20) + 3 * 4096;
  INFO("allocated " << allocated << " data " << data);
  CHECK(allocated >= data);
  CHECK(allocated <= data + (1 << 20));  // nbdcopy's and the file system's rounding
  kit->Stop(SIGTERM, std::chrono::seconds(5));
}

TEST_CASE("nbd server: FAST_ZERO is advertised by a file device, punches the hole, and with NO_HOLE fails at once "
          "with ENOTSUP touching nothing",
          "[nbd][block-status]") {
  SparseFixture fx;
  RawClient c;
  REQUIRE(c.ConnectTcp(fx.server->port()));
  REQUIRE(c.Handshake());
  std::map<uint16_t, Bytes> got;
  REQUIRE(c.InfoOrGo(nbd::kOptGo, "sparse", {}, &got) == nbd::kRepAck);
  REQUIRE(got.count(nbd::kInfoExport));
  CHECK((nbd::DecodeBE16(got[nbd::kInfoExport].data() + 8) & nbd::kFlagSendFastZero) != 0);
  const uint64_t at = 1 << 20;
  CHECK(c.Do(nbd::kCmdWriteZeroes, at, 8192, nbd::kCmdFlagFastZero | nbd::kCmdFlagNoHole) == nbd::kENOTSUP);
  Bytes back;
  REQUIRE(c.Do(nbd::kCmdRead, at, 8192, 0, {}, &back) == 0);
  CHECK(back == Bytes(fx.a.begin(), fx.a.begin() + 8192));  // untouched
  CHECK(c.Do(nbd::kCmdWriteZeroes, at, 8192, nbd::kCmdFlagFastZero) == 0);
  REQUIRE(c.Do(nbd::kCmdRead, at, 8192, 0, {}, &back) == 0);
  CHECK(back == Bytes(8192, 0));
  std::vector<DeviceExtent> ext;
  REQUIRE(fx.dev->Extents(at, 8192, &ext).ok());
  CHECK(ext == std::vector<DeviceExtent>{{8192, true, true}});  // a hole, not written zeros
}

}  // namespace
}  // namespace cdp

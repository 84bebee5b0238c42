// SPDX-License-Identifier: Apache-2.0
// Security at the NBD ports, against the real daemons (loadgen/local_cluster.h)
// with real clients (nbdinfo, libnbd):
//   2. the agent's tap is a Unix socket of mode 0660 that an unprivileged user
//      cannot open; at the MT, tenant B's certificate lists nothing of tenant
//      A, and A's export looks to B exactly like a missing one;
//   3. an NBD client without TLS gets no MT export (TLS required);
//   4. 300 idle NBD clients (silent sockets, and clients that finished the
//      handshake and idle) do not lock out a fresh client.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <openssl/ssl.h>

#include "common/crypto/pki.h"
#include "common/nbd/nbd_proto.h"
#include "common/net/tls_stream.h"
#include "e2e/harness.h"

namespace {

using cdp::e2e::Cluster;
using cdp::testing::CommandResult;
using cdp::testing::RunCommand;
using namespace std::chrono_literals;

void RequireNbdinfo() {
  if (RunCommand({"sh", "-c", "command -v nbdinfo && command -v runuser"}).exit_code != 0) {
    FAIL("nbdinfo (libnbd-bin) and runuser are required");
  }
}

// Writes a little, tags it, waits until it is applied; returns the export
// name of the tag's point (made with cdpctl export).
std::string ExportTag(Cluster& c, const std::string& tag) {
  std::string w = cdp::e2e::RandomWrites(c.nbd_uri(), c.options().volume_size, 7, 1, 10, 0, c.dir());
  INFO(w);
  REQUIRE(w.empty());
  auto t = c.Cdpctl({"tag", tag});
  INFO(t.output);
  REQUIRE(t.exit_code == 0);
  bool drained = c.WaitDrained();
  INFO(c.why());
  REQUIRE(drained);
  const int64_t id = c.TagPointId(tag);
  INFO(c.why());
  REQUIRE(id >= 0);
  auto e = c.CdpctlJson({"export", c.options().volume + "@" + std::to_string(id)});
  INFO(c.why());
  REQUIRE(e.has_value());
  return std::string(e->at("export").as_string());
}

// The NBD client files of `tenant` (libnbd's tls-certificates= directory).
std::string TenantCerts(Cluster& c, const std::string& tenant) {
  const std::string dir = c.pki_dir() + "/nbd-" + tenant;
  cdp::pki::Identity id{cdp::pki::CertRole::kAgent, tenant, tenant + "-nbd-client"};
  cdp::Status s = cdp::loadgen::MakeNbdClientCertificates(c.pki_dir(), id, dir);
  INFO(s.ToString());
  REQUIRE(s.ok());
  return dir;
}

std::string Nbds(Cluster& c, const std::string& path, const std::string& certs) {
  return "nbds://127.0.0.1:" + std::to_string(c.mt_nbd_port()) + "/" + path + "?tls-certificates=" + certs;
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return char(std::tolower(ch)); });
  return s;
}

int ConnectTcp(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// An NBD client that does the whole handshake (STARTTLS with `ctx`, then GO
// of `name`) and then idles in transmission.
class AttachedClient {
 public:
  ~AttachedClient() {
    if (ssl_ != nullptr) SSL_free(ssl_);
    if (fd_ >= 0) ::close(fd_);
  }
  bool Open(uint16_t port, SSL_CTX* ctx, const std::string& name) {
    fd_ = ConnectTcp(port);
    if (fd_ < 0) return false;
    cdp::Bytes g;
    if (!RecvPlain(cdp::nbd::kGreetingSize, &g)) return false;
    cdp::Bytes b;
    cdp::nbd::PutBE32(b, cdp::nbd::kClientFlagFixedNewstyle | cdp::nbd::kClientFlagNoZeroes);
    Option(&b, cdp::nbd::kOptStartTls, {});
    if (::send(fd_, b.data(), b.size(), MSG_NOSIGNAL) != ssize_t(b.size())) return false;
    cdp::Bytes rep;
    if (!RecvPlain(cdp::nbd::kOptReplyHeaderSize, &rep) || cdp::nbd::DecodeBE32(rep.data() + 12) != cdp::nbd::kRepAck)
      return false;
    ssl_ = SSL_new(ctx);
    if (ssl_ == nullptr || SSL_set_fd(ssl_, fd_) != 1 || SSL_connect(ssl_) != 1) return false;
    cdp::Bytes go;
    cdp::nbd::PutBE32(go, uint32_t(name.size()));
    cdp::PutBytes(go, name);
    cdp::nbd::PutBE16(go, 0);
    cdp::Bytes opt;
    Option(&opt, cdp::nbd::kOptGo, go);
    if (SSL_write(ssl_, opt.data(), int(opt.size())) != int(opt.size())) return false;
    for (;;) {  // NBD_REP_INFO replies, then ACK
      uint8_t h[cdp::nbd::kOptReplyHeaderSize];
      if (!RecvTls(h, sizeof h)) return false;
      const uint32_t type = cdp::nbd::DecodeBE32(h + 12), len = cdp::nbd::DecodeBE32(h + 16);
      std::vector<uint8_t> data(len);
      if (len > 0 && !RecvTls(data.data(), len)) return false;
      if (type == cdp::nbd::kRepAck) return true;
      if (type != cdp::nbd::kRepInfo) return false;
    }
  }

 private:
  static void Option(cdp::Bytes* b, uint32_t option, cdp::ByteSpan data) {
    cdp::nbd::PutBE64(*b, cdp::nbd::kIHaveOpt);
    cdp::nbd::PutBE32(*b, option);
    cdp::nbd::PutBE32(*b, uint32_t(data.size()));
    cdp::PutBytes(*b, data);
  }
  bool RecvPlain(size_t n, cdp::Bytes* out) {
    out->resize(n);
    for (size_t done = 0; done < n;) {
      ssize_t r = ::recv(fd_, out->data() + done, n - done, 0);
      if (r <= 0) return false;
      done += size_t(r);
    }
    return true;
  }
  bool RecvTls(uint8_t* p, size_t n) {
    for (size_t done = 0; done < n;) {
      int r = SSL_read(ssl_, p + done, int(n - done));
      if (r <= 0) return false;
      done += size_t(r);
    }
    return true;
  }
  int fd_ = -1;
  SSL* ssl_ = nullptr;
};

}  // namespace

TEST_CASE("nbd: the agent tap is a 0660 Unix socket an unprivileged user cannot open, tenant B sees nothing of A",
          "[e2e][security][nbd]") {
  RequireNbdinfo();
  Cluster c;
  const bool started = c.Start();
  INFO(c.why());
  REQUIRE(started);
  const std::string sock = c.agent_nbd_socket();
  struct stat st {};
  REQUIRE(::stat(sock.c_str(), &st) == 0);
  CHECK(S_ISSOCK(st.st_mode));
  CHECK((st.st_mode & 0777) == 0660);
  // Let anyone walk to the socket, so that only its own mode stands in the way.
  for (std::string d = sock.substr(0, sock.rfind('/')); d.size() > 1 && d != "/tmp"; d = d.substr(0, d.rfind('/'))) {
    struct stat ds {};
    REQUIRE(::stat(d.c_str(), &ds) == 0);
    REQUIRE(::chmod(d.c_str(), (ds.st_mode & 07777) | 0011) == 0);
  }
  CommandResult mine = RunCommand({"nbdinfo", "--size", c.nbd_uri()}, 30000);
  INFO(mine.output);
  CHECK(mine.exit_code == 0);  // root (the socket's owner) opens it
  CommandResult nobody = RunCommand({"runuser", "-u", "nobody", "--", "nbdinfo", "--size", c.nbd_uri()}, 30000);
  INFO(nobody.output);
  CHECK(nobody.exit_code != 0);
  CHECK(Lower(nobody.output).find("permission denied") != std::string::npos);

  // At the MT: tenant acme's export, seen by acme, invisible to beta.
  const std::string name = ExportTag(c, "nbd-sec");
  const std::string acme = c.nbd_client_dir(), beta = TenantCerts(c, "beta");
  CommandResult la = RunCommand({"nbdinfo", "--list", Nbds(c, "", acme)}, 30000);
  INFO(la.output);
  CHECK(la.exit_code == 0);
  CHECK(la.output.find(name) != std::string::npos);
  CommandResult lb = RunCommand({"nbdinfo", "--list", Nbds(c, "", beta)}, 30000);
  INFO(lb.output);
  CHECK(lb.output.find(name) == std::string::npos);
  CHECK(lb.output.find(c.options().tenant + "/") == std::string::npos);
  CHECK(lb.exit_code == 0);
  CHECK(lb.output.find("with TLS") != std::string::npos);  // the TLS session itself worked
  // A's export and a name that does not exist fail alike for beta.
  CommandResult ib = RunCommand({"nbdinfo", Nbds(c, name, beta)}, 30000);
  const std::string ghost = c.options().tenant + "/no-such-volume@1";
  CommandResult ig = RunCommand({"nbdinfo", Nbds(c, ghost, beta)}, 30000);
  INFO(ib.output << "\n" << ig.output);
  CHECK(ib.exit_code != 0);
  CHECK(ig.exit_code != 0);
  std::string ib_text = ib.output, ig_text = ig.output;
  for (auto* p : {&ib_text, &ig_text}) {
    for (const std::string& n : {name, ghost}) {
      for (size_t pos; (pos = p->find(n)) != std::string::npos;) p->replace(pos, n.size(), "NAME");
    }
  }
  CHECK(ib_text == ig_text);
  // And acme itself opens it.
  CommandResult ia = RunCommand({"nbdinfo", "--size", Nbds(c, name, acme)}, 30000);
  INFO(ia.output);
  CHECK(ia.exit_code == 0);
}

TEST_CASE("nbd: a client without TLS gets no MT export", "[e2e][security][nbd]") {
  RequireNbdinfo();
  Cluster c;
  const bool started = c.Start();
  INFO(c.why());
  REQUIRE(started);
  const std::string name = ExportTag(c, "no-tls");
  const std::string plain = "nbd://127.0.0.1:" + std::to_string(c.mt_nbd_port()) + "/" + name;
  CommandResult r = RunCommand({"nbdinfo", plain}, 30000);
  INFO(r.output);
  CHECK(r.exit_code != 0);
  CHECK(Lower(r.output).find("tls") != std::string::npos);
  CommandResult l = RunCommand({"nbdinfo", "--list", "nbd://127.0.0.1:" + std::to_string(c.mt_nbd_port())}, 30000);
  INFO(l.output);
  CHECK(l.output.find(name) == std::string::npos);
  // The same export over TLS with the tenant's certificate is there.
  CommandResult ok = RunCommand({"nbdinfo", "--size", c.mt_export_uri(name)}, 30000);
  INFO(ok.output);
  CHECK(ok.exit_code == 0);
}

TEST_CASE("nbd: 300 idle NBD clients do not lock out a fresh client", "[e2e][security][nbd]") {
  RequireNbdinfo();
  Cluster c;
  const bool started = c.Start();
  INFO(c.why());
  REQUIRE(started);
  const std::string name = ExportTag(c, "idle");
  const std::string certs = c.nbd_client_dir();
  auto ctx = cdp::TlsContext::Load(
      cdp::TlsFiles{certs + "/ca-cert.pem", certs + "/client-cert.pem", certs + "/client-key.pem", ""});
  INFO(ctx.status().ToString());
  REQUIRE(ctx.ok());
  // 40 clients finish the handshake (TLS, GO) and idle in transmission.
  std::vector<std::unique_ptr<AttachedClient>> attached;
  for (int i = 0; i < 40; ++i) {
    auto a = std::make_unique<AttachedClient>();
    REQUIRE(a->Open(c.mt_nbd_port(), (*ctx)->native(), name));
    attached.push_back(std::move(a));
  }
  // 260 connect and send nothing (past the MT's cap of 256 in all).
  std::vector<int> silent;
  for (int i = 0; i < 260; ++i) {
    int fd = ConnectTcp(c.mt_nbd_port());
    REQUIRE(fd >= 0);
    silent.push_back(fd);
  }
  // A fresh client gets in, within a deadline.
  const auto start = std::chrono::steady_clock::now();
  bool in = cdp::e2e::WaitFor(
      [&] { return RunCommand({"nbdinfo", "--size", c.mt_export_uri(name)}, 20000).exit_code == 0; }, 30s);
  WARN("fresh client in after " << std::chrono::duration_cast<std::chrono::milliseconds>(
                                       std::chrono::steady_clock::now() - start)
                                       .count()
                                << " ms");
  CHECK(in);
  // The agent's tap (the Unix socket) under the same siege of silent clients.
  std::vector<int> usilent;
  for (int i = 0; i < 300; ++i) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", c.agent_nbd_socket().c_str());
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    usilent.push_back(fd);
  }
  bool tap = cdp::e2e::WaitFor(
      [&] { return RunCommand({"nbdinfo", "--size", c.nbd_uri()}, 20000).exit_code == 0; }, 30s);
  CHECK(tap);
  for (int fd : silent) ::close(fd);
  for (int fd : usilent) ::close(fd);
}

// SPDX-License-Identifier: Apache-2.0
// The site PKI (common/crypto/pki.h) and TLS as a byte-stream layer
// (common/net/tls_stream.h), over in-process stream pairs and real sockets.
#include <sys/stat.h>

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <thread>

#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include "common/crypto/auth.h"
#include "common/crypto/pki.h"
#include "common/net/stream_filters.h"
#include "common/net/tls_stream.h"
#include "common/wire/channel.h"
#include "test_util.h"

namespace {

using cdp::ByteSpan;
using cdp::ByteStream;
using cdp::pki::CertRole;
using namespace std::chrono_literals;

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

mode_t Mode(const std::string& path) {
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return st.st_mode & 0777;
}

// A CA in dir/<ca> and certificates issued by it, by file stem.
struct Pki {
  explicit Pki(const std::string& dir) : dir(dir) { REQUIRE(cdp::pki::InitCa(dir, {}).ok()); }
  cdp::TlsFiles Issue(const std::string& stem, CertRole role, const std::string& tenant, const std::string& name,
                      int64_t not_after_s = 86400) {
    cdp::pki::IssueOptions io;
    io.identity = cdp::pki::Identity{role, tenant, name};
    io.not_before_s = std::min<int64_t>(-300, not_after_s - 60);
    io.not_after_s = not_after_s;
    cdp::Status s = cdp::pki::Issue(dir, io, dir + "/" + stem + ".key", dir + "/" + stem + ".crt");
    INFO(s.ToString());
    REQUIRE(s.ok());
    return cdp::TlsFiles{dir + "/ca.crt", dir + "/" + stem + ".crt", dir + "/" + stem + ".key", ""};
  }
  std::string dir;
};

std::shared_ptr<const cdp::TlsContext> Load(const cdp::TlsFiles& f) {
  auto c = cdp::TlsContext::Load(f);
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  return *c;
}

// Runs both sides of a TLS handshake over a stream pair.
struct Handshake {
  cdp::Result<std::unique_ptr<ByteStream>> client = cdp::Status::Aborted("not run");
  cdp::Result<std::unique_ptr<ByteStream>> server = cdp::Status::Aborted("not run");
};

Handshake Run(std::shared_ptr<const cdp::TlsContext> client_ctx, std::shared_ptr<const cdp::TlsContext> server_ctx,
              const cdp::StreamWrapper& client_below = {}) {
  auto pair = cdp::MakeStreamPair("tls");
  REQUIRE(pair.ok());
  std::unique_ptr<ByteStream> c = std::move(pair->first);
  if (client_below) {
    auto w = client_below(std::move(c));
    REQUIRE(w.ok());
    c = std::move(*w);
  }
  Handshake h;
  auto server = std::async(std::launch::async, [&] {
    return cdp::StartTls(std::move(pair->second), server_ctx, cdp::TlsSide::kServer, 5000ms);
  });
  h.client = cdp::StartTls(std::move(c), client_ctx, cdp::TlsSide::kClient, 5000ms);
  h.server = server.get();
  return h;
}

cdp::Status WriteAll(ByteStream& s, const std::vector<uint8_t>& data) {
  ByteSpan span(data.data(), data.size());
  return s.WriteAll(std::span<const ByteSpan>(&span, 1), std::chrono::steady_clock::now() + 10s);
}

cdp::Result<std::vector<uint8_t>> ReadExactly(ByteStream& s, size_t n) {
  std::vector<uint8_t> out(n);
  size_t got = 0;
  while (got < n) {
    auto r = s.ReadSome(std::span<uint8_t>(out.data() + got, n - got), std::chrono::steady_clock::now() + 10s);
    if (!r.ok()) return r.status();
    got += *r;
  }
  return out;
}

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t(i * 131 + seed + (i >> 12));
  return v;
}

}  // namespace

TEST_CASE("pki: the CA key is 0600 and a second init never overwrites it", "[pki]") {
  cdp::testing::ScratchDir dir;
  const std::string ca = dir.Join("ca");
  REQUIRE(cdp::pki::InitCa(ca, {}).ok());
  CHECK(Mode(ca + "/ca.key") == 0600);
  CHECK(Mode(ca) == 0700);
  const std::string key = Slurp(ca + "/ca.key");
  cdp::Status again = cdp::pki::InitCa(ca, {});
  CHECK(again.code() == cdp::Code::kAlreadyExists);
  CHECK(Slurp(ca + "/ca.key") == key);
}

TEST_CASE("pki: issued certificates carry exactly the identity, verify against their CA only", "[pki]") {
  cdp::testing::ScratchDir dir;
  Pki a(dir.Join("a"));
  Pki b(dir.Join("b"));
  auto agent = a.Issue("agent", CertRole::kAgent, "acme", "db-host-1");
  auto ps = a.Issue("ps", CertRole::kProcessServer, "acme", "ps-1");
  auto mt = a.Issue("mt", CertRole::kMasterTarget, "", "mt-1");
  CHECK(Mode(agent.key) == 0600);
  auto id = cdp::pki::IdentityOfFile(agent.cert);
  REQUIRE(id.ok());
  CHECK(id->role == CertRole::kAgent);
  CHECK(id->tenant == "acme");
  CHECK(id->name == "db-host-1");
  auto mid = cdp::pki::IdentityOfFile(mt.cert);
  REQUIRE(mid.ok());
  CHECK(mid->role == CertRole::kMasterTarget);
  CHECK(mid->tenant.empty());
  CHECK(cdp::pki::IdentityOfFile(ps.cert)->role == CertRole::kProcessServer);

  // Refused identities.
  cdp::pki::IssueOptions io;
  io.identity = cdp::pki::Identity{CertRole::kMasterTarget, "acme", "mt-2"};
  CHECK(cdp::pki::Issue(a.dir, io, a.dir + "/x.key", a.dir + "/x.crt").code() == cdp::Code::kInvalidArgument);
  io.identity = cdp::pki::Identity{CertRole::kAgent, "", "host"};
  CHECK(cdp::pki::Issue(a.dir, io, a.dir + "/y.key", a.dir + "/y.crt").code() == cdp::Code::kInvalidArgument);
  // An existing key is never overwritten.
  io.identity = cdp::pki::Identity{CertRole::kAgent, "acme", "db-host-1"};
  CHECK(cdp::pki::Issue(a.dir, io, agent.key, agent.cert).code() == cdp::Code::kAlreadyExists);

  // Loading checks the certificate against the configured CA.
  CHECK(cdp::TlsContext::Load(agent).ok());
  auto mixed = cdp::TlsContext::Load(cdp::TlsFiles{b.dir + "/ca.crt", agent.cert, agent.key, ""});
  REQUIRE_FALSE(mixed.ok());
  CHECK(mixed.status().message().find("does not verify against tls_ca") != std::string::npos);
  auto wrong_key = cdp::TlsContext::Load(cdp::TlsFiles{agent.ca, agent.cert, ps.key, ""});
  REQUIRE_FALSE(wrong_key.ok());
  INFO(wrong_key.status().message());
  CHECK(wrong_key.status().message().find("tls_key " + ps.key) == 0);
}

TEST_CASE("tls: both sides learn the other's identity and the same channel binding, bytes cross full duplex",
          "[tls]") {
  cdp::testing::ScratchDir dir;
  Pki p(dir.Join("pki"));
  auto h = Run(Load(p.Issue("agent", CertRole::kAgent, "acme", "host-1")),
               Load(p.Issue("ps", CertRole::kProcessServer, "acme", "ps-1")));
  REQUIRE(h.client.ok());
  REQUIRE(h.server.ok());
  ByteStream& c = **h.client;
  ByteStream& s = **h.server;
  REQUIRE(c.tls_peer() != nullptr);
  REQUIRE(s.tls_peer() != nullptr);
  CHECK(c.tls_peer()->role == "ps");
  CHECK(c.tls_peer()->name == "ps-1");
  CHECK(s.tls_peer()->role == "agent");
  CHECK(s.tls_peer()->tenant == "acme");
  CHECK(s.tls_peer()->name == "host-1");
  CHECK(c.tls_peer()->binding == s.tls_peer()->binding);
  CHECK(c.tls_peer()->binding != std::array<uint8_t, 32>{});

  // 8 MiB each way at the same time: each side writes while it reads.
  const auto up = Pattern(8 << 20, 1), down = Pattern(8 << 20, 2);
  auto cw = std::async(std::launch::async, [&] { return WriteAll(c, up); });
  auto sw = std::async(std::launch::async, [&] { return WriteAll(s, down); });
  auto at_server = ReadExactly(s, up.size());
  auto at_client = ReadExactly(c, down.size());
  CHECK(cw.get().ok());
  CHECK(sw.get().ok());
  REQUIRE(at_server.ok());
  REQUIRE(at_client.ok());
  CHECK(*at_server == up);
  CHECK(*at_client == down);
}

TEST_CASE("tls: a certificate from another CA, an expired certificate and a clear-text peer are refused", "[tls]") {
  cdp::testing::ScratchDir dir;
  Pki site(dir.Join("site"));
  Pki other(dir.Join("other"));
  auto server = Load(site.Issue("ps", CertRole::kProcessServer, "acme", "ps-1"));

  SECTION("another CA") {
    // A client trusting our CA but holding another CA's certificate (loading
    // refuses that mix, so the test swaps the certificate in afterwards).
    auto foreign = other.Issue("agent", CertRole::kAgent, "acme", "host-1");
    auto ctx = Load(site.Issue("agent", CertRole::kAgent, "acme", "host-1"));
    REQUIRE(SSL_CTX_use_certificate_chain_file(ctx->native(), foreign.cert.c_str()) == 1);
    REQUIRE(SSL_CTX_use_PrivateKey_file(ctx->native(), foreign.key.c_str(), SSL_FILETYPE_PEM) == 1);
    auto h = Run(ctx, server);
    REQUIRE_FALSE(h.server.ok());
    CHECK(h.server.status().code() == cdp::Code::kPermissionDenied);
    INFO(h.server.status().message());
    CHECK(h.server.status().message().find("certificate verify: unable to get local issuer certificate") !=
          std::string::npos);
    // A client of another site refuses our server in turn.
    auto h2 = Run(Load(other.Issue("agent2", CertRole::kAgent, "acme", "host-2")), server);
    REQUIRE_FALSE(h2.client.ok());
    CHECK(h2.client.status().code() == cdp::Code::kPermissionDenied);
    REQUIRE_FALSE(h2.server.ok());
  }
  SECTION("expired") {
    // Loading refuses an expired certificate of our own; a peer's is refused at the handshake.
    auto expired = site.Issue("old", CertRole::kAgent, "acme", "host-2", -60);
    auto own = cdp::TlsContext::Load(expired);
    REQUIRE_FALSE(own.ok());
    CHECK(own.status().message().find("certificate has expired") != std::string::npos);
    // A client that skipped that check (an attacker) is refused by the server.
    auto fresh = site.Issue("fresh", CertRole::kAgent, "acme", "host-3");
    auto ctx = Load(fresh);
    REQUIRE(SSL_CTX_use_certificate_chain_file(ctx->native(), expired.cert.c_str()) == 1);
    REQUIRE(SSL_CTX_use_PrivateKey_file(ctx->native(), expired.key.c_str(), SSL_FILETYPE_PEM) == 1);
    auto h = Run(ctx, server);
    REQUIRE_FALSE(h.server.ok());
    CHECK(h.server.status().code() == cdp::Code::kPermissionDenied);
    CHECK(h.server.status().message().find("certificate has expired") != std::string::npos);
  }
  SECTION("clear text") {
    auto pair = cdp::MakeStreamPair("clear");
    REQUIRE(pair.ok());
    auto srv = std::async(std::launch::async, [&] {
      return cdp::StartTls(std::move(pair->second), server, cdp::TlsSide::kServer, 5000ms);
    });
    auto ch = cdp::FrameChannel::Adopt(std::move(pair->first));
    REQUIRE(ch.ok());
    cdp::Status hs = cdp::ClientHandshake(**ch, cdp::proto::Role::kAgent, "acme", "host", "secret", 5000ms);
    CHECK_FALSE(hs.ok());
    auto r = srv.get();
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == cdp::Code::kPermissionDenied);
  }
}

TEST_CASE("tls: a man in the middle flipping one byte breaks the connection, nothing corrupt is read", "[tls][security]") {
  cdp::testing::ScratchDir dir;
  Pki p(dir.Join("pki"));
  auto client_ctx = Load(p.Issue("agent", CertRole::kAgent, "acme", "host-1"));
  auto server_ctx = Load(p.Issue("ps", CertRole::kProcessServer, "acme", "ps-1"));
  // Under the client's TLS: byte 5000 of what it writes is flipped (past the handshake).
  cdp::StreamWrapper mitm = [](std::unique_ptr<ByteStream> s) -> cdp::Result<std::unique_ptr<ByteStream>> {
    cdp::FaultOptions f;
    f.flip_at = 5000;
    return std::unique_ptr<ByteStream>(std::make_unique<cdp::FaultFilter>(std::move(s), f));
  };
  auto h = Run(client_ctx, server_ctx, mitm);
  REQUIRE(h.client.ok());
  REQUIRE(h.server.ok());
  const auto data = Pattern(64 << 10, 7);
  REQUIRE(WriteAll(**h.client, data).ok());
  // The server gets an authentication failure, and before it only bytes that were sent.
  std::vector<uint8_t> got;
  cdp::Status end;
  for (;;) {
    std::vector<uint8_t> buf(16384);
    auto r = (**h.server).ReadSome(std::span<uint8_t>(buf.data(), buf.size()), std::chrono::steady_clock::now() + 5s);
    if (!r.ok()) {
      end = r.status();
      break;
    }
    got.insert(got.end(), buf.begin(), buf.begin() + long(*r));
  }
  CHECK(end.code() == cdp::Code::kCorruption);
  CHECK(end.message().find("bad record mac") != std::string::npos);
  CHECK(got.size() < data.size());
  CHECK(std::equal(got.begin(), got.end(), data.begin()));
}

TEST_CASE("tls: the frame handshake takes tenant and role from the certificates", "[tls][auth][security]") {
  cdp::testing::ScratchDir dir;
  Pki p(dir.Join("pki"));
  auto agent_a = Load(p.Issue("agent-a", CertRole::kAgent, "acme", "host-a"));
  auto agent_b = Load(p.Issue("agent-b", CertRole::kAgent, "beta", "host-b"));
  auto ps = Load(p.Issue("ps", CertRole::kProcessServer, "acme", "ps-1"));
  auto mt = Load(p.Issue("mt", CertRole::kMasterTarget, "", "mt-1"));
  auto secrets = [](const std::string& t) -> std::optional<std::string> {
    if (t == "acme") return std::string("acme-secret");
    if (t == "beta") return std::string("beta-secret");
    return std::nullopt;
  };
  struct Outcome {
    cdp::Status client;
    cdp::Result<std::string> server = cdp::Status::Aborted("not run");
    cdp::PeerIdentity peer;
  };
  auto attempt = [&](std::shared_ptr<const cdp::TlsContext> cctx, std::shared_ptr<const cdp::TlsContext> sctx,
                     cdp::proto::Role role, const std::string& tenant, const std::string& secret) {
    auto h = Run(cctx, sctx);
    REQUIRE(h.client.ok());
    REQUIRE(h.server.ok());
    auto cch = cdp::FrameChannel::Adopt(std::move(*h.client));
    auto sch = cdp::FrameChannel::Adopt(std::move(*h.server));
    REQUIRE(cch.ok());
    REQUIRE(sch.ok());
    Outcome o;
    auto srv = std::async(std::launch::async, [&] { return cdp::ServerHandshake(**sch, secrets, 5000ms, &o.peer); });
    o.client = cdp::ClientHandshake(**cch, role, tenant, "host", secret, 5000ms);
    o.server = srv.get();
    return o;
  };

  auto ok = attempt(agent_a, ps, cdp::proto::Role::kAgent, "acme", "acme-secret");
  CHECK(ok.client.ok());
  REQUIRE(ok.server.ok());
  CHECK(*ok.server == "acme");
  CHECK(ok.peer.tls);
  CHECK(ok.peer.cert_name == "host-a");
  CHECK(ok.peer.role == cdp::proto::Role::kAgent);

  // A tenant-B certificate holding tenant A's secret still cannot be tenant A.
  auto cross = attempt(agent_b, ps, cdp::proto::Role::kAgent, "acme", "acme-secret");
  CHECK(cross.client.code() == cdp::Code::kPermissionDenied);
  REQUIRE_FALSE(cross.server.ok());
  CHECK(cross.server.status().message().find("certificate is tenant 'beta'") != std::string::npos);

  // An agent certificate claiming the process-server role is refused.
  auto role = attempt(agent_a, ps, cdp::proto::Role::kProcessServer, "acme", "acme-secret");
  CHECK(role.client.code() == cdp::Code::kPermissionDenied);
  REQUIRE_FALSE(role.server.ok());

  // An agent talks to a process server, or directly to a master target (whose
  // own policy, direct_agents, decides whether to admit it: not this test's
  // generic server).
  auto direct = attempt(agent_a, mt, cdp::proto::Role::kAgent, "acme", "acme-secret");
  CHECK(direct.client.ok());
  REQUIRE(direct.server.ok());
  CHECK(direct.peer.role == cdp::proto::Role::kAgent);

  // An agent refuses a server whose certificate is another agent's.
  auto wrong_server = attempt(agent_a, agent_b, cdp::proto::Role::kAgent, "acme", "acme-secret");
  CHECK(wrong_server.client.code() == cdp::Code::kPermissionDenied);
  CHECK(wrong_server.client.message().find("has role 'agent', expected 'ps' (or 'mt' for a direct agent)") !=
        std::string::npos);

  // A process server refuses any server but a master target.
  auto ps_to_ps = attempt(ps, ps, cdp::proto::Role::kProcessServer, "acme", "acme-secret");
  CHECK(ps_to_ps.client.code() == cdp::Code::kPermissionDenied);
  CHECK(ps_to_ps.client.message().find("has role 'ps', expected 'mt'") != std::string::npos);
}

TEST_CASE("tls: proofs are bound to the TLS session", "[tls][auth]") {
  std::array<uint8_t, 32> b1{}, b2{};
  b1[0] = 1;
  b2[0] = 2;
  cdp::auth::Nonce n1{}, n2{};
  auto p1 = cdp::auth::ClientProof("secret", n1, n2, "acme", b1);
  auto p2 = cdp::auth::ClientProof("secret", n1, n2, "acme", b2);
  auto p0 = cdp::auth::ClientProof("secret", n1, n2, "acme");
  REQUIRE(p1.ok());
  REQUIRE(p2.ok());
  REQUIRE(p0.ok());
  CHECK_FALSE(cdp::auth::ProofsEqual(*p1, *p2));
  CHECK_FALSE(cdp::auth::ProofsEqual(*p1, *p0));
}

TEST_CASE("tls: a reload takes new certificates for new connections, streams up keep working", "[tls]") {
  cdp::testing::ScratchDir dir;
  Pki p(dir.Join("pki"));
  auto files = p.Issue("agent", CertRole::kAgent, "acme", "host-old");
  auto server = Load(p.Issue("ps", CertRole::kProcessServer, "acme", "ps-1"));
  auto creds = cdp::TlsCredentials::Load(files);
  REQUIRE(creds.ok());
  auto before = Run((*creds)->Current(), server);
  REQUIRE(before.server.ok());
  CHECK((**before.server).tls_peer()->name == "host-old");

  // New files in place (as an operator renews them), then SIGHUP -> Reload().
  REQUIRE(::unlink(files.key.c_str()) == 0);
  p.Issue("agent", CertRole::kAgent, "acme", "host-new");
  REQUIRE((*creds)->Reload().ok());
  CHECK((*creds)->reloads() == 1);
  auto after = Run((*creds)->Current(), server);
  REQUIRE(after.server.ok());
  CHECK((**after.server).tls_peer()->name == "host-new");

  // The old connection still carries data.
  const auto data = Pattern(100000, 3);
  REQUIRE(WriteAll(**before.client, data).ok());
  auto got = ReadExactly(**before.server, data.size());
  REQUIRE(got.ok());
  CHECK(*got == data);

  // A broken file keeps the credentials in force.
  std::ofstream(files.cert) << "not a certificate";
  CHECK_FALSE((*creds)->Reload().ok());
  CHECK((*creds)->Current()->self().name == "host-new");
}

namespace {

// Counts the writes (and their bytes) that reach the stream below it.
class CountingFilter final : public cdp::StreamFilter {
 public:
  CountingFilter(std::unique_ptr<ByteStream> next, std::atomic<int>* writes, std::atomic<uint64_t>* bytes)
      : StreamFilter(std::move(next)), writes_(writes), bytes_(bytes) {}
  cdp::Status WriteAll(std::span<const ByteSpan> bufs, Deadline deadline) override {
    ++*writes_;
    for (ByteSpan b : bufs) *bytes_ += b.size();
    return StreamFilter::WriteAll(bufs, deadline);
  }

 private:
  std::atomic<int>* writes_;
  std::atomic<uint64_t>* bytes_;
};

}  // namespace

TEST_CASE("tls: a gathered write arrives whole and in order, small buffers sharing a write below", "[tls]") {
  cdp::testing::ScratchDir dir;
  Pki p(dir.Join("pki"));
  std::atomic<int> writes{0};
  std::atomic<uint64_t> below{0};
  auto h = Run(Load(p.Issue("agent", CertRole::kAgent, "acme", "host-1")),
               Load(p.Issue("ps", CertRole::kProcessServer, "acme", "ps-1")),
               [&](std::unique_ptr<ByteStream> s) -> cdp::Result<std::unique_ptr<ByteStream>> {
                 return std::unique_ptr<ByteStream>(new CountingFilter(std::move(s), &writes, &below));
               });
  REQUIRE(h.client.ok());
  REQUIRE(h.server.ok());
  // Empty, tiny, around the 256 KiB chunk, and large buffers: 1.5 MiB in all.
  std::vector<std::vector<uint8_t>> parts;
  uint8_t seed = 0;
  for (size_t n : {size_t(24), size_t(0), size_t(62), size_t(1) << 20, size_t(7), size_t(256 << 10) - 1,
                   size_t(256 << 10) + 1, size_t(1), size_t(3000)}) {
    parts.push_back(Pattern(n, ++seed));
  }
  std::vector<ByteSpan> spans;
  std::vector<uint8_t> expect;
  for (const auto& v : parts) {
    spans.emplace_back(v.data(), v.size());
    expect.insert(expect.end(), v.begin(), v.end());
  }
  const int writes_before = writes.load();
  const uint64_t below_before = below.load();
  auto got = std::async(std::launch::async, [&] { return ReadExactly(**h.server, expect.size()); });
  REQUIRE((*h.client)->WriteAll(spans, std::chrono::steady_clock::now() + 10s).ok());
  auto at_server = got.get();
  REQUIRE(at_server.ok());
  const bool same = *at_server == expect;
  CHECK(same);
  // Ciphertext goes down in writes of at least 256 KiB but the last: 1.5 MiB
  // of plaintext in 9 buffers takes at most 7 writes (a write per buffer and
  // chunk, as before, took 12).
  const int n = writes.load() - writes_before;
  CHECK(n >= 2);
  CHECK(n <= int(expect.size() / (256 << 10)) + 1);
  CHECK(below.load() - below_before > expect.size());  // record overhead on top
}

TEST_CASE("tls: a certificate revoked in the CA's list is refused at the handshake once the list is reloaded, and its live stream is named distrusted",
          "[tls][pki][security]") {
  cdp::testing::ScratchDir dir;
  Pki p(dir.Join("pki"));
  const std::string crl = p.dir + "/crl.pem";
  REQUIRE(std::filesystem::exists(crl));  // InitCa writes an empty list
  auto agent = p.Issue("agent", CertRole::kAgent, "acme", "host-1");
  auto other = p.Issue("agent2", CertRole::kAgent, "acme", "host-2");
  auto ps_files = p.Issue("ps", CertRole::kProcessServer, "acme", "ps-1");
  ps_files.crl = crl;
  auto creds = cdp::TlsCredentials::Load(ps_files);
  INFO(creds.status().ToString());
  REQUIRE(creds.ok());
  auto live = Run(Load(agent), (*creds)->Current());
  REQUIRE(live.server.ok());
  const cdp::TlsPeer peer = *(**live.server).tls_peer();
  CHECK(!peer.serial.empty());
  CHECK((*creds)->Distrusted(peer).empty());

  // Revoked: the list changes on disk; nothing changes until the reload.
  REQUIRE(cdp::pki::Revoke(p.dir, agent.cert).ok());
  REQUIRE(cdp::pki::Revoke(p.dir, agent.cert).ok());  // again: no change, no error
  CHECK((*creds)->Distrusted(peer).empty());
  REQUIRE((*creds)->Reload().ok());
  CHECK((*creds)->Distrusted(peer) == "certificate 'host-1' (serial " + peer.serial + ") is revoked");
  auto next = Run(Load(agent), (*creds)->Current());
  REQUIRE_FALSE(next.server.ok());
  CHECK(next.server.status().code() == cdp::Code::kPermissionDenied);
  CHECK(next.server.status().message().find("certificate revoked") != std::string::npos);
  // Another certificate of the same CA still connects.
  auto fine = Run(Load(other), (*creds)->Current());
  REQUIRE(fine.server.ok());
  CHECK((*creds)->Distrusted(*(**fine.server).tls_peer()).empty());

  // A certificate of another CA cannot be revoked here; a list not signed by
  // the trusted CA is refused at load, naming it, and a failed reload keeps
  // the credentials.
  Pki foreign(dir.Join("foreign"));
  auto alien = foreign.Issue("agent", CertRole::kAgent, "acme", "host-9");
  cdp::Status s = cdp::pki::Revoke(p.dir, alien.cert);
  CHECK(s.code() == cdp::Code::kInvalidArgument);
  CHECK(s.message() == alien.cert + " was not issued by the CA of " + p.dir);
  auto wrong = ps_files;
  wrong.crl = foreign.dir + "/crl.pem";
  auto bad = cdp::TlsContext::Load(wrong);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message() == "tls_crl " + wrong.crl + " is not signed by tls_ca " + ps_files.ca);
  REQUIRE(std::filesystem::copy_file(wrong.crl, crl, std::filesystem::copy_options::overwrite_existing));
  CHECK_FALSE((*creds)->Reload().ok());
  CHECK((*creds)->Distrusted(peer) == "certificate 'host-1' (serial " + peer.serial + ") is revoked");
}

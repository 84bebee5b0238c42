// SPDX-License-Identifier: Apache-2.0
// SocketTls (common/net/socket_tls.h): TLS with OpenSSL on the socket, Asio
// waiting for readiness. The server side is a SocketTls on a strand; the
// client is plain blocking OpenSSL on a file descriptor.
#include "common/net/socket_tls.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <future>
#include <random>
#include <thread>

#include "common/crypto/pki.h"
#include "common/net/tls_stream.h"
#include "common/tests/test_util.h"

namespace cdp {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Strand = asio::strand<asio::io_context::executor_type>;
using Socket = asio::basic_stream_socket<tcp, Strand>;
using testing::ScratchDir;
using error_code = boost::system::error_code;

// A site CA with a server and a client certificate, and a client of another CA.
struct Certs {
  Certs() {
    const std::string ca = dir.Join("ca"), other = dir.Join("other");
    REQUIRE(pki::InitCa(ca, pki::CaOptions{}).ok());
    REQUIRE(pki::InitCa(other, pki::CaOptions{}).ok());
    server = Load(ca, pki::CertRole::kMasterTarget, "server");
    client = Load(ca, pki::CertRole::kAgent, "client");
    stranger = Load(other, pki::CertRole::kAgent, "stranger");
  }
  std::shared_ptr<const TlsContext> Load(const std::string& ca, pki::CertRole role, const std::string& name) {
    pki::IssueOptions io;
    io.identity = pki::Identity{role, role == pki::CertRole::kAgent ? "acme" : "", name};
    TlsFiles f{ca + "/ca.crt", dir.Join(name + ".crt"), dir.Join(name + ".key"), ""};
    REQUIRE(pki::Issue(ca, io, f.key, f.cert).ok());
    auto c = TlsContext::Load(f);
    REQUIRE(c.ok());
    return *c;
  }
  ScratchDir dir;
  std::shared_ptr<const TlsContext> server, client, stranger;
};

// One accepted connection served by a SocketTls on its strand, and a
// blocking OpenSSL client connected to it.
struct Pair {
  explicit Pair(const Certs& certs, const TlsContext& client_ctx) : acceptor(io, {asio::ip::address_v4::loopback(), 0}) {
    guard.emplace(io.get_executor());
    thread = std::thread([this] { io.run(); });
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(acceptor.local_endpoint().port());
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    timeval tv{20, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    socket.emplace(asio::make_strand(io));
    acceptor.accept(*socket);
    tls.emplace(*socket, SSL_new(certs.server->native()));
    ssl = SSL_new(client_ctx.native());
    REQUIRE(SSL_set_fd(ssl, fd) == 1);
  }
  ~Pair() {
    asio::post(socket->get_executor(), [this] {
      error_code ig;
      socket->close(ig);
    });
    guard.reset();
    thread.join();
    if (ssl != nullptr) SSL_free(ssl);
    if (fd >= 0) ::close(fd);
  }
  // Runs fn on the connection's strand.
  template <typename Fn>
  void OnStrand(Fn fn) {
    asio::post(socket->get_executor(), std::move(fn));
  }
  // The server's handshake, with the client's running here.
  error_code Handshake(bool* client_ok) {
    std::promise<error_code> done;
    OnStrand([&] { tls->async_handshake(asio::ssl::stream_base::server, [&](const error_code& ec) { done.set_value(ec); }); });
    *client_ok = SSL_connect(ssl) == 1;
    if (!*client_ok) ::shutdown(fd, SHUT_RDWR);  // a server still waiting sees the end
    return done.get_future().get();
  }
  // Both handshakes succeed.
  void HandshakeOk() {
    bool client_ok = false;
    REQUIRE(!Handshake(&client_ok));
    REQUIRE(client_ok);
  }
  bool ClientWrite(const Bytes& b) {
    size_t off = 0;
    while (off < b.size()) {
      size_t n = 0;
      if (SSL_write_ex(ssl, b.data() + off, b.size() - off, &n) != 1) return false;
      off += n;
    }
    return true;
  }
  bool ClientRead(Bytes* b, size_t len) {
    b->resize(len);
    size_t off = 0;
    while (off < len) {
      size_t n = 0;
      if (SSL_read_ex(ssl, b->data() + off, len - off, &n) != 1) return false;
      off += n;
    }
    return true;
  }

  asio::io_context io;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> guard;
  std::thread thread;
  tcp::acceptor acceptor;
  std::optional<Socket> socket;
  std::optional<SocketTls<Socket>> tls;
  int fd = -1;
  SSL* ssl = nullptr;
};

Bytes Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  Bytes b(n);
  for (auto& c : b) c = uint8_t(rng());
  return b;
}

TEST_CASE("socket tls: 16 MiB each way at once, the server's write waiting on a full socket while its read is outstanding",
          "[tls][socket_tls]") {
  Certs certs;
  Pair p(certs, *certs.client);
  p.HandshakeOk();

  const Bytes down = Random(16u << 20, 1), up = Random(16u << 20, 2);
  Bytes got(up.size());
  std::promise<std::pair<error_code, size_t>> wrote, read;
  p.OnStrand([&] {
    // Several buffers, small and large, gathered into records as they fit.
    std::vector<asio::const_buffer> bufs;
    size_t off = 0;
    for (size_t n : {size_t(16), size_t(4096), size_t(100), size_t(1) << 20}) {
      bufs.emplace_back(down.data() + off, n);
      off += n;
    }
    bufs.emplace_back(down.data() + off, down.size() - off);
    asio::async_write(*p.tls, bufs, [&](const error_code& ec, size_t n) { wrote.set_value({ec, n}); });
    asio::async_read(*p.tls, asio::buffer(got), [&](const error_code& ec, size_t n) { read.set_value({ec, n}); });
  });
  // The client writes all of its 16 MiB before it reads anything: the
  // server's socket buffers fill long before, so its write waits for the
  // socket while its read goes on.
  REQUIRE(p.ClientWrite(up));
  Bytes received;
  REQUIRE(p.ClientRead(&received, down.size()));
  auto w = wrote.get_future().get();
  auto r = read.get_future().get();
  CHECK(!w.first);
  CHECK(w.second == down.size());
  CHECK(!r.first);
  CHECK(r.second == up.size());
  CHECK(received == down);
  CHECK(got == up);
}

TEST_CASE("socket tls: the peer's close_notify reads as eof, a connection cut without it as stream_truncated",
          "[tls][socket_tls]") {
  Certs certs;
  for (bool notify : {true, false}) {
    Pair p(certs, *certs.client);
    p.HandshakeOk();
    Bytes buf(64);
    std::promise<std::pair<error_code, size_t>> first, second;
    p.OnStrand([&] {
      asio::async_read(*p.tls, asio::buffer(buf, 5), [&](const error_code& ec, size_t n) {
        first.set_value({ec, n});
        p.tls->async_read_some(asio::buffer(buf), [&](const error_code& ec2, size_t n2) { second.set_value({ec2, n2}); });
      });
    });
    REQUIRE(p.ClientWrite(Bytes{'h', 'e', 'l', 'l', 'o'}));
    auto f = first.get_future().get();
    CHECK(!f.first);
    CHECK(f.second == 5);
    CHECK(std::string(buf.begin(), buf.begin() + 5) == "hello");
    if (notify) SSL_shutdown(p.ssl);
    ::shutdown(p.fd, SHUT_WR);
    auto s = second.get_future().get();
    if (notify) {
      CHECK(s.first == asio::error::eof);
    } else {
      CHECK(s.first == asio::ssl::error::stream_truncated);
    }
    CHECK(s.second == 0);
  }
}

TEST_CASE("socket tls: a client of another CA fails the server's handshake with an ssl error", "[tls][socket_tls]") {
  Certs certs;
  Pair p(certs, *certs.stranger);
  bool client_ok = true;
  const error_code ec = p.Handshake(&client_ok);
  CHECK(!client_ok);
  REQUIRE(ec);
  CHECK(ec.category() == asio::error::get_ssl_category());
}

TEST_CASE("socket tls: a read waiting for data ends with operation_aborted when the socket is closed",
          "[tls][socket_tls]") {
  Certs certs;
  Pair p(certs, *certs.client);
  p.HandshakeOk();
  Bytes buf(16);
  std::promise<error_code> read;
  std::promise<void> started;
  p.OnStrand([&] {
    p.tls->async_read_some(asio::buffer(buf), [&](const error_code& ec, size_t) { read.set_value(ec); });
    started.set_value();
  });
  started.get_future().get();
  p.OnStrand([&] {
    error_code ig;
    p.socket->close(ig);
  });
  CHECK(read.get_future().get() == asio::error::operation_aborted);
}

TEST_CASE("socket tls: an operation begun after the socket is closed fails and never writes to the descriptor's "
          "number, reused meanwhile",
          "[tls][socket_tls]") {
  Certs certs;
  Pair p(certs, *certs.client);
  p.HandshakeOk();
  int pipe_fds[2];
  REQUIRE(::pipe2(pipe_fds, O_NONBLOCK) == 0);
  std::promise<std::pair<error_code, size_t>> wrote, read;
  const Bytes data = Random(4096, 3);
  Bytes buf(16);
  p.OnStrand([&] {
    // As a composed write goes on after a partial write that a close followed:
    // the number is another file's by then (here a pipe's).
    const int number = int(p.socket->native_handle());
    error_code ig;
    p.socket->close(ig);
    REQUIRE(::dup2(pipe_fds[1], number) == number);
    p.tls->async_write_some(asio::buffer(data), [&, number](const error_code& ec, size_t n) {
      p.tls->async_read_some(asio::buffer(buf), [&, number](const error_code& ec2, size_t n2) {
        ::close(number);
        read.set_value({ec2, n2});
      });
      wrote.set_value({ec, n});
    });
  });
  auto w = wrote.get_future().get();
  auto r = read.get_future().get();
  CHECK(w.first == asio::error::bad_descriptor);
  CHECK(w.second == 0);
  CHECK(r.first == asio::error::bad_descriptor);
  CHECK(r.second == 0);
  uint8_t leaked[64];
  CHECK(::read(pipe_fds[0], leaked, sizeof(leaked)) == -1);  // nothing reached the pipe
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
}

}  // namespace
}  // namespace cdp

// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the NBD server's connection state machine
// (common/nbd/nbd_server.cc Connection): the handshake phases (client flags,
// option headers, option data, skipped options), the transmission phase
// (request headers, WRITE payloads read in place or skipped, the worker
// strand, DISC) and the closing paths, on the real asio sockets.
//
// One NbdServer per process (started at the first input, never stopped) on a
// Unix socket in /tmp, with three small exports on a MemEnv: "db1" (64 KiB,
// writable), "ro" (16 KiB, read-only, with a description) and "acme/db2"
// (32 KiB, owned by tenant acme: seen by every Unix client). READ and WRITE
// are capped at 32 KiB, skipped payloads at 64 KiB, so that no input makes the
// server move much data. No TLS (a Unix connection never needs it).
//
// Per input: connect, send the input (what follows the server's greeting),
// shut the write side down and read until the server closes (EOF).
//
// Properties: no crash, leak or sanitizer report in any server thread; the
// server's first bytes are its fixed-newstyle greeting; the server closes a
// connection whose client has closed its side within 20 s.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "common/base/log.h"
#include "common/env/env.h"
#include "common/nbd/block_device.h"
#include "common/nbd/nbd_proto.h"
#include "common/nbd/nbd_server.h"
#include "fuzz/fuzz_util.h"

namespace {

using namespace cdp;
using cdp::fuzz::Check;

std::string g_socket_path;

void RemoveSocket() { ::unlink(g_socket_path.c_str()); }

std::shared_ptr<BlockDevice> Device(Env* env, const std::string& path, uint64_t size, bool read_only) {
  Check(WriteFileAtomic(env, path, Bytes(size, 0x5a)).ok());
  FileBlockDevice::Options o;
  o.read_only = read_only;
  auto dev = FileBlockDevice::Open(env, path, o);
  Check(dev.ok());
  return *dev;
}

// The server, started once; deliberately never stopped (the process exits).
const std::string& ServerPath() {
  static const std::string* path = [] {
    log::Options lo;
    lo.level = "off";
    Check(log::Init(lo).ok());
    g_socket_path = "/tmp/cdp-nbd-fuzz-" + std::to_string(::getpid()) + ".sock";
    static Env* env = NewMemEnv().release();
    NbdServerOptions o;
    o.unix_path = g_socket_path;
    o.unix_mode = 0600;
    o.io_threads = 1;
    o.worker_threads = 1;
    o.max_request_bytes = 32 << 10;
    o.max_skip_bytes = 64 << 10;
    static NbdServer* server = new NbdServer(o);
    Check(server->AddExport("db1", Device(env, "/db1", 64 << 10, false)).ok());
    Check(server->AddExport("ro", Device(env, "/ro", 16 << 10, true), "a read-only export").ok());
    Check(server->AddExport("acme/db2", Device(env, "/db2", 32 << 10, false), "", "acme").ok());
    Check(server->Start().ok());
    std::atexit(RemoveSocket);
    return new std::string(g_socket_path);
  }();
  return *path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = ServerPath();
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  Check(fd >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
  if (rc != 0 && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    Check(::poll(&p, 1, 20000) == 1);
    int err = 0;
    socklen_t len = sizeof err;
    Check(::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0);
    rc = 0;
  }
  Check(rc == 0);

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  size_t sent = 0;
  bool write_open = true;
  if (size == 0) {
    ::shutdown(fd, SHUT_WR);
    write_open = false;
  }
  uint8_t greeting[nbd::kGreetingSize];
  size_t got = 0;
  uint8_t buf[64 << 10];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    Check(left.count() > 0);  // the server must close a connection its client closed
    pollfd p{fd, short(POLLIN | (write_open ? POLLOUT : 0)), 0};
    if (::poll(&p, 1, int(left.count())) < 0) {
      Check(errno == EINTR);
      continue;
    }
    if (write_open && (p.revents & (POLLOUT | POLLERR | POLLHUP)) != 0) {
      ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
      if (n > 0) sent += size_t(n);
      if (n < 0 && errno != EAGAIN && errno != EINTR) sent = size;  // the server closed (EPIPE, ECONNRESET)
      if (sent == size) {
        ::shutdown(fd, SHUT_WR);
        write_open = false;
      }
    }
    if ((p.revents & (POLLIN | POLLERR | POLLHUP)) != 0) {
      ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n == 0) break;
      if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) continue;
        Check(errno == ECONNRESET);
        break;
      }
      if (got < sizeof greeting) {
        const size_t take = std::min(sizeof greeting - got, size_t(n));
        std::memcpy(greeting + got, buf, take);
      }
      got += size_t(n);
    }
  }
  ::close(fd);
  if (got >= sizeof greeting) {
    const Bytes want = nbd::EncodeGreeting(nbd::kFlagFixedNewstyle | nbd::kFlagNoZeroes);
    Check(std::equal(want.begin(), want.end(), greeting));
  }
  return 0;
}

// SPDX-License-Identifier: Apache-2.0
// NbdClient: a small Network Block Device client for load generation, the
// writing side of what common/nbd/nbd_server.h serves (NetworkBlockDevice/nbd
// doc/proto.md; docs/formats/nbd.md lists what our server implements).
//
// Handshake: fixed newstyle only. The client sends FIXED_NEWSTYLE (and
// NO_ZEROES when offered), then NBD_OPT_GO for the export name asking for
// NBD_INFO_BLOCK_SIZE; NBD_REP_INFO replies give the size, transmission flags
// and block sizes; NBD_REP_ACK enters transmission. Any error reply fails
// Connect() with its message. Replies are simple replies (no structured
// replies are negotiated).
//
// Transmission: Write() sends NBD_CMD_WRITE and keeps up to `max_inflight`
// requests outstanding (pipelining); it reads replies only when the window is
// full. Flush() sends NBD_CMD_FLUSH (when the server offers it) and waits for
// every outstanding reply. Close() sends NBD_CMD_DISC after draining.
//
//   connect --greeting--> flags --OPT_GO--> [INFO..] --ACK--> transmission
//   transmission --Write/Flush--> (window full: read replies) --Close--> DISC
//
// Errors: a reply with a non-zero error becomes kIOError naming the NBD error,
// offset and length; a broken protocol (bad magic, unknown handle) is
// kCorruption; socket failures kUnavailable. After any error the client is
// unusable (every further call fails).
//
// Thread safety: not thread-safe; one client per thread.
#pragma once

#include <cstdint>
#include <memory>
#include <map>
#include <utility>
#include <string>

#include "common/base/coding.h"
#include "common/base/result.h"
#include "common/base/status.h"

namespace cdp::loadgen {

// nbd://HOST[:PORT]/EXPORT (PORT defaults to 10809; EXPORT may be empty), or
// nbd+unix:///EXPORT?socket=PATH (a Unix socket, as libnbd writes it; the
// agent's tap listens there by default). No TLS: nbds:// is refused.
struct NbdUri {
  std::string host;
  uint16_t port = 10809;
  std::string socket_path;  // set for nbd+unix
  std::string export_name;
};
// Failure: kInvalidArgument naming the text.
Result<NbdUri> ParseNbdUri(std::string_view uri);

struct NbdClientOptions {
  uint32_t max_inflight = 16;   // pipelined requests (>= 1)
  uint32_t timeout_ms = 30000;  // per socket send/receive
};

class NbdClient {
 public:
  // Connects and negotiates. Success: a client in transmission phase.
  static Result<std::unique_ptr<NbdClient>> Connect(const NbdUri& uri, const NbdClientOptions& opts = {});
  ~NbdClient();  // closes the socket (without DISC if Close() was not called)

  uint64_t size() const { return size_; }
  uint16_t transmission_flags() const { return tflags_; }
  uint32_t max_block() const { return max_block_; }  // largest request the server accepts
  bool can_flush() const;

  // Queues one WRITE of `data` at `offset` (checked against size() and
  // max_block()). Success means sent; the server's answer is checked by a
  // later Write/Flush/Close.
  Status Write(uint64_t offset, ByteSpan data, bool fua = false);
  // Waits for every outstanding reply, then FLUSH (if offered) and its reply.
  Status Flush();
  // Drains, sends DISC and closes. Idempotent.
  Status Close();

 private:
  NbdClient(int fd, const NbdClientOptions& opts) : fd_(fd), opts_(opts) {}
  Status Negotiate(const std::string& export_name);
  Status SendAll(const uint8_t* p, size_t n);
  Status RecvAll(uint8_t* p, size_t n);
  Status ReadOneReply();
  Status Fail(Status s);

  int fd_ = -1;
  NbdClientOptions opts_;
  uint64_t size_ = 0;
  uint16_t tflags_ = 0;
  uint32_t max_block_ = 32u << 20;
  uint64_t next_handle_ = 1;
  std::map<uint64_t, std::pair<uint64_t, uint32_t>> outstanding_;  // handle -> (offset, length)
  Status broken_;
  bool closed_ = false;
};

}  // namespace cdp::loadgen

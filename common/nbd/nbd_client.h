// SPDX-License-Identifier: Apache-2.0
// NbdClient: a small Network Block Device client, the other side of what
// common/nbd/nbd_server.h serves (NetworkBlockDevice/nbd doc/proto.md;
// docs/formats/nbd.md lists what our server implements). Two users:
// cdp-loadgen drives writes through it, and `cdpctl serve` reads and writes a
// sealed volume's stored blocks through it (common/nbd/remote_device.h).
//
// Transport: a ByteStream (common/net/byte_stream.h): TCP or a Unix socket,
// and for nbds:// URIs TLS 1.3 with the tenant's certificate (NBD_OPT_STARTTLS,
// then common/net/tls_stream.h over the same connection).
//
// Handshake: fixed newstyle only. The client sends FIXED_NEWSTYLE (and
// NO_ZEROES when offered); for TLS NBD_OPT_STARTTLS, whose NBD_REP_ACK is
// followed by the TLS handshake; then NBD_OPT_GO for the export name asking
// for NBD_INFO_BLOCK_SIZE. NBD_REP_INFO replies give the size, transmission
// flags and block sizes; NBD_REP_ACK enters transmission. Any error reply
// fails Connect() with its message. Replies are simple replies (no structured
// replies are negotiated).
//
// Transmission: Write() and WriteZeroes() send their request and keep up to
// `max_inflight` requests outstanding (pipelining); replies are read when the
// window is full. Read() first collects every outstanding reply, then sends
// READ and waits for its data. Flush() sends NBD_CMD_FLUSH (when the server
// offers it) and waits for every outstanding reply. Close() sends
// NBD_CMD_DISC after draining.
//
//   connect --greeting--> flags [--STARTTLS--> TLS] --OPT_GO--> [INFO..] --ACK--> transmission
//   transmission --Write/Read/Flush--> (window full: read replies) --Close--> DISC
//
// Errors: a reply with a non-zero error becomes kIOError naming the NBD error,
// offset and length; the text of an option error reply is quoted in the
// status with every byte outside printable ASCII as '?', at most 256 bytes (a
// hostile server writes nothing to the operator's terminal but text); a broken protocol (bad magic, unknown handle, a reply
// longer than asked) is kCorruption; transport failures are the stream's
// (kUnavailable, kBusy for a timeout), a failed TLS handshake
// kPermissionDenied. After any error the client is unusable (every further
// call fails).
//
// Thread safety: not thread-safe; one client per thread (RemoteDevice adds
// the lock).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "common/base/coding.h"
#include "common/base/result.h"
#include "common/base/status.h"

namespace cdp {

class ByteStream;

// nbd://HOST[:PORT]/EXPORT and nbds://HOST[:PORT]/EXPORT[?tls-certificates=DIR]
// (PORT defaults to 10809; EXPORT may be empty), or
// nbd+unix:///EXPORT?socket=PATH (a Unix socket, as libnbd writes it; the
// agent's tap listens there by default). tls-certificates names a directory
// as libnbd reads it: ca-cert.pem, client-cert.pem, client-key.pem.
struct NbdUri {
  std::string host;
  uint16_t port = 10809;
  std::string socket_path;  // set for nbd+unix
  std::string export_name;
  bool tls = false;              // nbds://
  std::string tls_certificates;  // DIR of ?tls-certificates=DIR ("" = none given)
};
// Failure: kInvalidArgument naming the text.
Result<NbdUri> ParseNbdUri(std::string_view uri);

struct NbdClientOptions {
  uint32_t max_inflight = 16;   // pipelined requests (>= 1)
  uint32_t timeout_ms = 30000;  // connect, handshake, and each request's send and reply
};

class NbdClient {
 public:
  // Connects and negotiates. Success: a client in transmission phase. An
  // nbds:// URI needs tls_certificates (kInvalidArgument otherwise); the
  // files must hold a certificate of the site PKI (common/crypto/pki.h).
  static Result<std::unique_ptr<NbdClient>> Connect(const NbdUri& uri, const NbdClientOptions& opts = {});
  // The same over a stream already connected to the server (uri's host,
  // port and socket are not used): Connect's second half, and how the fuzz
  // target (fuzz/nbd_client_fuzz.cc) plays a hostile server.
  static Result<std::unique_ptr<NbdClient>> ConnectOver(std::unique_ptr<ByteStream> stream, const NbdUri& uri,
                                                        const NbdClientOptions& opts = {});
  ~NbdClient();  // closes the connection (without DISC if Close() was not called)

  uint64_t size() const { return size_; }
  uint16_t transmission_flags() const { return tflags_; }
  uint32_t max_block() const { return max_block_; }  // largest request the server accepts
  bool can_flush() const;
  bool read_only() const;
  bool can_write_zeroes() const;

  // Queues one WRITE of `data` at `offset` (checked against size() and
  // max_block()). Success means sent; the server's answer is checked by a
  // later call (or Flush/Close).
  Status Write(uint64_t offset, ByteSpan data, bool fua = false);
  // Queues one WRITE_ZEROES of [offset, offset + len) (len <= max_block());
  // may_trim = false sends NBD_CMD_FLAG_NO_HOLE. kNotSupported when the
  // server does not offer it.
  Status WriteZeroes(uint64_t offset, uint32_t len, bool fua, bool may_trim);
  // Reads [offset, offset + len) (len <= max_block()) into `buf`, after every
  // outstanding reply.
  Status Read(uint64_t offset, uint32_t len, uint8_t* buf);
  // Waits for every outstanding reply: the first error among them, if any.
  Status Drain();
  // Waits for every outstanding reply, then FLUSH (if offered) and its reply.
  Status Flush();
  // Drains, sends DISC and closes. Idempotent.
  Status Close();

 private:
  NbdClient(std::unique_ptr<ByteStream> stream, const NbdClientOptions& opts);
  Status Negotiate(const NbdUri& uri);
  Status StartTls(const std::string& dir);
  Status SendAll(std::initializer_list<ByteSpan> bufs);
  Status RecvAll(uint8_t* p, size_t n);
  Status SendRequest(uint16_t cmd, uint16_t flags, uint64_t offset, uint32_t len, ByteSpan payload);
  Status ReadOneReply();
  Status CheckRange(std::string_view what, uint64_t offset, uint64_t len) const;
  Status Fail(Status s);

  std::unique_ptr<ByteStream> stream_;
  NbdClientOptions opts_;
  uint64_t size_ = 0;
  uint16_t tflags_ = 0;
  uint32_t max_block_ = 32u << 20;
  uint64_t next_handle_ = 1;
  std::map<uint64_t, std::pair<uint64_t, uint32_t>> outstanding_;  // handle -> (offset, length)
  Status broken_;
  bool closed_ = false;
};

}  // namespace cdp

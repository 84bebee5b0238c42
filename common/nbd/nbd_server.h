// SPDX-License-Identifier: Apache-2.0
// NbdServer: serves BlockDevices (common/nbd/block_device.h) over the Network
// Block Device protocol. Connections come from the one Listener
// (common/net/listener.h); the protocol parser is common/nbd/nbd_proto.h.
//
// Used by the agent (the capture tap: every volume is an export whose
// BlockDevice applies and captures writes) and by the master target
// (point-in-time exports of recovery points). Real clients (qemu-io,
// qemu-img, nbdcopy, nbdinfo, nbdfuse, Linux nbd-client) connect to it.
//
// What is implemented (docs/formats/nbd.md has the full list):
//   - fixed newstyle handshake only (NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES);
//   - options EXPORT_NAME, ABORT, LIST, INFO, GO (NBD_INFO_EXPORT, NAME,
//     DESCRIPTION, BLOCK_SIZE), STRUCTURED_REPLY, LIST_META_CONTEXT and
//     SET_META_CONTEXT (the one context base:allocation); anything else is
//     answered NBD_REP_ERR_UNSUP;
//   - commands READ, WRITE (+FUA), FLUSH, TRIM (+FUA), WRITE_ZEROES
//     (+FUA, +NO_HOLE), BLOCK_STATUS (+REQ_ONE), DISC; transmission flags
//     derived from the device.
//   - with structured replies, a READ is answered with OFFSET_HOLE chunks
//     for the runs BlockDevice::Extents reports as zeros and OFFSET_DATA
//     chunks for the rest, and BLOCK_STATUS with the device's extents (holes
//     and zeros): nbdcopy and qemu-img skip what a point never held. Other
//     commands keep simple replies (the spec allows it).
//   - the empty export name "" selects the only export when exactly one exists.
//   - NBD_OPT_STARTTLS (x509, TLS 1.3, our site PKI: common/net/tls_stream.h),
//     with OpenSSL reading and writing the socket itself (common/net/socket_tls.h).
//
// Security at the port (docs/formats/nbd.md, "TLS and tenants"):
//   - tls_mode kRequire: on TCP connections only STARTTLS and ABORT are
//     honoured before TLS is up; other options get NBD_REP_ERR_TLS_REQD and
//     EXPORT_NAME closes. Unix-socket connections are trusted by the socket
//     file's mode and group and never need TLS.
//   - tenants: a client that did STARTTLS is who its certificate says. An
//     export with an owner tenant is visible (LIST, INFO, GO, EXPORT_NAME) only
//     to certificates of that tenant and to tenant-less ones (role mt, the
//     provider); to anyone else it looks exactly like a missing export.
//     Exports without owner, and connections without TLS, see everything.
//   - bounded handshake: handshake_timeout_ms, max_option_bytes, max_options
//     and max_option_reply_bytes per connection; idle_timeout_ms in
//     transmission. At max_connections the oldest connection still in the
//     handshake is closed to admit a new one (the Listener's eviction: a
//     connection counts as authenticated once it reaches transmission).
//
// Connection phases:
//
//   greeting -> client flags -> options --GO/EXPORT_NAME--> transmission
//                  |             |   ^                        (idle timer)
//                  |       STARTTLS  | TLS handshake on the same strand,
//                  |             v   | then options again over TLS
//                  +-- handshake timer (whole option phase, TLS included)
//
// Request pipeline of one connection:
//
//   socket --read header/payload--+--(small READ/WRITE, BLOCK_STATUS; device strand idle)--> BlockDevice
//      ^   (keeps reading while   |                                                          |
//      |    replies go out;       +--(READ: large, or more requests queued)--> read pool --> |
//      |    pauses above          |                (several at once)                         |
//      |    max_inflight_bytes)   +--(the rest)--> device strand --> BlockDevice             |
//      |                                           (one request at a time)                   |
//      +------ async_write <----- [reply queue] <--------------------------------------------+
//
// A small request runs on the socket's strand, on the thread that read it:
// a hand-off to another thread and back costs two thread wake-ups, most of
// the cost of a small read (docs/benchmarks.md, "Export reads without a
// hand-off"). A large one runs on the connection's device strand so that the
// socket strand reads the next request meanwhile. A READ that is large, or
// that has more requests queued behind it (READs on the pool, or bytes
// buffered after it), goes to the read pool (read_threads threads shared by
// every connection), where several READs of one connection are at the
// device at once, as nbdkit runs a connection's requests on several threads:
// a cold disk answers several reads about as fast as one (docs/benchmarks.md,
// "Several READs of one connection at once"). Replies go out as requests
// complete, matched by handle, in any order, as the protocol allows.
//
// Order: a request that changes data (WRITE, WRITE_ZEROES, TRIM, FLUSH)
// reaches the device only after every request before it is done, and before
// any request after it starts; READs and BLOCK_STATUS between two such
// requests may run together (they change nothing, so any order of them
// gives the same answers). The rule is nbd_detail::RequestOrder
// (nbd_request_order.h).
//
// Threads: io_threads + worker_threads threads, each running its own
// io_context, as nbdkit runs a thread per connection (docs/benchmarks.md,
// "An io_context per thread"). Connections take the threads in turn: a
// connection's socket strand is on one thread and its device strand on the
// next, so connections run in parallel and no thread is woken to pick up
// work another thread queued for itself. The price: a device call that
// blocks holds its own thread, so the other connections whose socket strand
// (for small requests) or device strand (for large ones) is on that thread
// wait for it, where one shared pool would have run them on another thread.
//
// Thread safety: every public method of NbdServer is thread-safe. The server
// runs its own pool of threads between Start() and
// Stop(); the destructor calls Stop(). Every socket operation of one
// connection (plain or TLS) runs on that connection's strand, so its SSL
// object is never entered by two threads and has at most one read and one
// write outstanding.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/base/coding.h"
#include "common/base/host_port.h"
#include "common/base/result.h"
#include "common/base/status.h"
#include "common/env/env.h"
#include "common/nbd/block_device.h"

namespace cdp {

class TlsCredentials;

// Counters of one export, cumulative since AddExport. Only successful
// requests count in ops and bytes; failed requests count in `errors`.
struct NbdExportStats {
  uint64_t reads = 0;
  uint64_t writes = 0;         // NBD_CMD_WRITE
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;  // payload bytes of NBD_CMD_WRITE
  uint64_t zero_ops = 0;       // NBD_CMD_WRITE_ZEROES
  uint64_t block_status_ops = 0;  // NBD_CMD_BLOCK_STATUS
  uint64_t bytes_zeroed = 0;
  uint64_t trims = 0;
  uint64_t bytes_trimmed = 0;
  uint64_t flushes = 0;
  uint64_t errors = 0;         // requests answered with a non-zero error
  uint64_t connections = 0;    // connections currently attached
  uint64_t connections_total = 0;
};

struct NbdServerOptions {
  // TCP listener: host and port; port 0 picks an ephemeral port (see
  // NbdServer::port()); off() (the default) disables TCP.
  HostPort tcp;
  // Unix socket path; empty disables it. An existing socket file at the path
  // is replaced; the file is removed by Stop().
  std::string unix_path;
  // io_threads + worker_threads threads, each with its own io_context,
  // running socket I/O and device calls of the connections given to it in
  // turn (see "Threads" above). The split between the two is historical:
  // only their sum counts.
  int io_threads = 1;
  int worker_threads = 2;
  // The read pool: threads shared by every connection that run READs while
  // the connection goes on reading requests, several READs of one connection
  // at once (see "Request pipeline" above), as nbdkit runs a connection's
  // requests on several threads. A read of a cold disk blocks its thread;
  // several in flight keep the disk busy. 0..64; 0 runs every READ on the
  // connection's own threads, one at a time.
  int read_threads = 4;
  // Largest READ/WRITE length accepted (advertised as the maximum block
  // size); larger requests get EINVAL (a too-large WRITE payload is read and
  // discarded when <= max_skip_bytes, otherwise the connection is closed).
  // TRIM and WRITE_ZEROES carry no payload and are not capped.
  uint32_t max_request_bytes = 32u << 20;
  uint64_t max_skip_bytes = 64u << 20;
  // Largest option payload accepted during the handshake (the NBD spec caps
  // strings at 4096 bytes); a larger option closes the connection.
  uint32_t max_option_bytes = 8192;
  // Per connection: stop reading new requests while this many payload bytes
  // (write data + pending read replies) are queued.
  uint64_t max_inflight_bytes = 64u << 20;
  // Live connections at most (the Listener's cap). At the cap, the oldest
  // connection still in the handshake is closed to admit a new one; when
  // every connection is in transmission, new ones are closed at once.
  int max_connections = 256;
  // Connections in transmission at most per tenant (clients whose TLS
  // certificate names a tenant); 0 = no cap. Over it, NBD_OPT_GO gets
  // NBD_REP_ERR_POLICY with a message naming the cap, and
  // NBD_OPT_EXPORT_NAME closes the connection (logged, naming the cap).
  int max_connections_per_tenant = 0;
  // Handshake (every option, the TLS handshake included) must complete within
  // this time or the connection is closed.
  uint32_t handshake_timeout_ms = 30000;
  // Per connection, during the handshake: options at most, and bytes of
  // option replies at most; the option that passes either closes the
  // connection (a client cannot make the server work or buffer without end
  // before it is attached).
  uint32_t max_options = 1024;
  uint64_t max_option_reply_bytes = 4u << 20;
  // A connection in transmission without any request for this long, and no
  // request in progress, is closed. 0 = never.
  uint32_t idle_timeout_ms = 10 * 60 * 1000;
  // Unix socket file permissions (Listener::Options::unix_mode/unix_group).
  uint32_t unix_mode = 0660;
  std::string unix_group;
  // TLS (NBD_OPT_STARTTLS). kRequire needs `tls`; kOff answers STARTTLS with
  // NBD_REP_ERR_UNSUP. `tls` must outlive the server; each STARTTLS uses
  // tls->Current(), so a Reload() applies to later handshakes.
  enum class TlsMode { kOff, kRequire };
  TlsMode tls_mode = TlsMode::kOff;
  const TlsCredentials* tls = nullptr;
};

class NbdServer {
 public:
  // Throws nothing; errors surface from Start().
  explicit NbdServer(NbdServerOptions opts);
  ~NbdServer();
  NbdServer(const NbdServer&) = delete;
  NbdServer& operator=(const NbdServer&) = delete;

  // Adds export `name` (1..256 bytes, no control characters; "" is reserved
  // for the default export). `owner_tenant` ("" = none) limits who sees it
  // over TLS (see above). Fails with kAlreadyExists or kInvalidArgument.
  // Allowed before and after Start().
  Status AddExport(const std::string& name, std::shared_ptr<BlockDevice> device,
                   std::string description = "", std::string owner_tenant = "");
  // Removes the export: new connections no longer see it, connections
  // attached to it are closed (requests being executed finish first; the
  // device is released when the last one does). kNotFound if absent.
  Status RemoveExport(const std::string& name);
  std::vector<std::string> ExportNames() const;
  // Counters of export `name`; kNotFound if absent.
  Result<NbdExportStats> ExportStats(const std::string& name) const;

  // Binds the listeners and starts the threads. Fails (kIOError with the
  // address, kInvalidArgument without any listener) and leaves nothing running.
  // Not restartable after Stop().
  Status Start();
  // Closes the listeners and every connection, waits for device calls in
  // progress, joins every thread. Idempotent. Must not be called from a
  // BlockDevice method (it would wait for itself).
  void Stop();

  // The bound TCP port (valid after a successful Start with TCP), else 0.
  uint16_t port() const { return port_.load(); }
  const std::string& unix_path() const { return opts_.unix_path; }
  // Connections currently open (handshake or transmission).
  size_t connection_count() const;
  // Connections closed to admit a new one at max_connections, and closed
  // for idleness in transmission, since Start().
  uint64_t evicted_count() const;
  uint64_t idle_closed_count() const;

  struct Impl;  // opaque; defined in nbd_server.cc

 private:
  NbdServerOptions opts_;
  std::atomic<uint16_t> port_{0};
  std::unique_ptr<Impl> impl_;
};

}  // namespace cdp

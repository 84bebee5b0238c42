// SPDX-License-Identifier: Apache-2.0
// TLS on the wire: mutual-certificate TLS 1.3 as one more layer of a
// ByteStream stack (common/net/byte_stream.h), between the frame channel and the
// transport (or a filter over it):
//
//   FrameChannel -> TlsStream -> [FaultFilter] -> [ThrottleFilter] -> SocketStream
//
// Everything below the TlsStream carries ciphertext: a throttle charges wire
// bytes, and a fault filter under it plays a man in the middle.
//
// Trust: one site CA (common/crypto/pki.h, `cdpctl pki`). Each side presents its
// certificate and requires the other's, signed by that CA and valid now; the
// peer's role and tenant are read from its certificate (TlsPeer) and enforced
// by the frame handshake (common/wire/channel.h). Only TLS 1.3, no session tickets,
// no resumption: every connection does a full handshake.
//
// Why OpenSSL with memory BIOs and not asio::ssl::stream: a FrameChannel reads
// in one thread while another writes, and one SSL object must never be entered
// by two threads at once. asio's synchronous ssl::stream would have to hold one
// lock across a blocking read, starving the writer. Here the lock covers only
// the SSL calls, which never block: the reader waits for ciphertext with the
// lock released, and the writer encrypts under the lock and sends outside it.
// Bytes that OpenSSL produces while reading (alerts, key updates) wait in the
// outgoing buffer and leave with the next write (heartbeats keep writes coming).
//
// Errors, besides those of the next stream:
//   kPermissionDenied  the handshake failed: no certificate, another CA, an
//                      expired certificate, a certificate without our identity
//                      fields, a protocol older than TLS 1.3
//   kCorruption        a record failed authentication (a flipped byte on the
//                      wire) or the peer sent an alert after the handshake
//   kUnavailable       the peer closed the TLS session
//
// Thread safety: TlsContext and TlsCredentials are thread-safe. A TlsStream has
// the ByteStream contract: one reader and one writer at a time.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "common/base/result.h"
#include "common/base/status.h"
#include "common/net/byte_stream.h"

typedef struct ssl_ctx_st SSL_CTX;

namespace cdp {

// A daemon's TLS files: the site CA to trust, its certificate and its key
// (PEM, as `cdpctl pki` writes them), and optionally the CA's revocation
// list (`tls_crl`, ca_dir/crl.pem of `cdpctl pki revoke`): a peer whose
// certificate it lists is refused at the handshake, and the live sessions of
// one revoked after they began are ended by their owners (Revoked()).
struct TlsFiles {
  std::string ca;
  std::string cert;
  std::string key;
  std::string crl;  // "" = no revocation list
};

// One loaded identity: an SSL_CTX for both sides (every daemon is a TLS server
// to its clients and a client to the next hop). Immutable once loaded.
class TlsContext {
 public:
  // Loads and checks the files: the certificate must carry a valid identity
  // (common/crypto/pki.h), match the key, and verify against the CA now.
  // kInvalidArgument / kIOError naming the file and OpenSSL's reason;
  // kPermissionDenied when group or others may read the key
  // (CheckPrivateFile, common/env/env.h).
  static Result<std::shared_ptr<const TlsContext>> Load(const TlsFiles& files);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  SSL_CTX* native() const { return ctx_; }
  // This daemon's own identity, from its certificate.
  const TlsPeer& self() const { return self_; }
  // True when the loaded revocation list names the certificate serial `serial_hex`
  // (TlsPeer::serial).
  bool Revoked(const std::string& serial_hex) const { return revoked_.count(serial_hex) != 0; }

 private:
  TlsContext() = default;
  Status LoadCrl(const TlsFiles& files);
  SSL_CTX* ctx_ = nullptr;
  TlsPeer self_;
  std::set<std::string> revoked_;  // serials of the CRL (upper-case hex)
};

// The credentials a daemon uses for new connections. Reload() (on SIGHUP)
// loads the files again and swaps them in for connections made after it;
// connections already up keep the context they started with, so the data path
// does not drop. A failed reload keeps the current credentials. Both outcomes
// are logged ("TLS credentials reloaded" / "TLS reload failed").
class TlsCredentials {
 public:
  static Result<std::unique_ptr<TlsCredentials>> Load(TlsFiles files);

  Status Reload();
  std::shared_ptr<const TlsContext> Current() const;
  // "" while `peer`'s certificate is trusted by the current credentials;
  // else why not ("certificate 'NAME' (serial S) is revoked"). For owners of
  // live sessions to end those of a certificate revoked since (a Reload() on
  // SIGHUP loads a new list); cheap: a set lookup.
  std::string Distrusted(const TlsPeer& peer) const;
  uint64_t reloads() const { return reloads_.load(std::memory_order_relaxed); }

 private:
  explicit TlsCredentials(TlsFiles files) : files_(std::move(files)) {}
  const TlsFiles files_;
  mutable std::mutex mu_;
  std::shared_ptr<const TlsContext> current_;  // guarded by mu_
  std::atomic<uint64_t> reloads_{0};
};

enum class TlsSide { kClient, kServer };

// Runs the TLS handshake over `next` as `side`, all within `timeout`, and
// returns the stream that encrypts over it; tls_peer() then tells who the peer
// is. On failure `next` is shut down and destroyed.
Result<std::unique_ptr<ByteStream>> StartTls(std::unique_ptr<ByteStream> next,
                                             std::shared_ptr<const TlsContext> context, TlsSide side,
                                             std::chrono::milliseconds timeout);

// A StreamWrapper (common/net/byte_stream.h) that first stacks `below` (may be empty:
// e.g. a throttle) on the transport and then TLS with creds->Current().
// `creds` must outlive every call of the wrapper.
StreamWrapper TlsWrapper(const TlsCredentials* creds, TlsSide side, std::chrono::milliseconds timeout,
                         StreamWrapper below = {});

}  // namespace cdp

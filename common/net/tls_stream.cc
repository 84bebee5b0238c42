// SPDX-License-Identifier: Apache-2.0
#include "common/net/tls_stream.h"

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/base/log.h"
#include "common/env/env.h"
#include "common/crypto/pki.h"

namespace cdp {

using SteadyClock = std::chrono::steady_clock;

namespace {

constexpr char kExporterLabel[] = "EXPORTER-opencdp-auth";
// Before the handshake is done, a peer can make us buffer at most this much
// certificate chain (OpenSSL's default is 100 KiB).
constexpr long kMaxCertList = 32 * 1024;
// Ciphertext read from the next stream at a time: one record and its header
// while unauthenticated (a peer cannot make us buffer more), then many.
constexpr size_t kHandshakeReadChunk = 16 * 1024 + 512;
constexpr size_t kReadChunk = 256 * 1024;
// Plaintext encrypted per lock hold while writing.
constexpr size_t kWriteChunk = 256 * 1024;

Result<TlsPeer> PeerOf(SSL* ssl) {
  X509* cert = SSL_get0_peer_certificate(ssl);
  if (cert == nullptr) return Status::PermissionDenied("peer presented no certificate");
  CDP_ASSIGN_OR_RETURN(pki::Identity id, pki::IdentityOf(cert));
  TlsPeer p;
  p.role = std::string(pki::RoleName(id.role));
  p.tenant = id.tenant;
  p.name = id.name;
  p.serial = pki::SerialHex(cert);
  if (SSL_export_keying_material(ssl, p.binding.data(), p.binding.size(), kExporterLabel,
                                 sizeof(kExporterLabel) - 1, nullptr, 0, 0) != 1) {
    return Status::IOError("TLS exporter failed: " + pki::OpenSslErrors());
  }
  return p;
}

// The BIOs under an SSL: ciphertext in from `in` (filled by the reader),
// ciphertext out to `pending` (taken by the writer). A memory BIO would copy
// every byte once more each way, in and out of its own buffer. Guarded by the
// stream's mutex, as OpenSSL only calls these from SSL calls made under it,
// except the bytes of `in` at and after `in_end`, which Feed() fills without
// it (nobody else touches them).
struct Pipe {
  std::vector<uint8_t> in;
  size_t in_start = 0;  // [in_start, in_end): received, not yet taken by OpenSSL
  size_t in_end = 0;
  std::vector<uint8_t> pending;
};

int PipeWrite(BIO* b, const char* data, int len) {
  BIO_clear_retry_flags(b);
  if (len <= 0) return 0;
  auto* p = static_cast<Pipe*>(BIO_get_data(b));
  // As bytes (uint8_t, the vector's own type), so that this is one memmove:
  // from char, libstdc++ copies element by element.
  const auto* bytes = reinterpret_cast<const uint8_t*>(data);
  p->pending.insert(p->pending.end(), bytes, bytes + len);
  return len;
}

int PipeRead(BIO* b, char* out, int len) {
  BIO_clear_retry_flags(b);
  auto* p = static_cast<Pipe*>(BIO_get_data(b));
  const size_t avail = p->in_end - p->in_start;
  if (avail == 0) {  // "wait for more", not end of stream
    BIO_set_retry_read(b);
    return -1;
  }
  const size_t n = std::min(avail, size_t(std::max(len, 0)));
  std::memcpy(out, p->in.data() + p->in_start, n);
  p->in_start += n;
  return int(n);
}

long PipeCtrl(BIO* b, int cmd, long, void*) {
  auto* p = static_cast<Pipe*>(BIO_get_data(b));
  switch (cmd) {
    case BIO_CTRL_FLUSH:
      return 1;
    case BIO_CTRL_PENDING:
      return long(p->in_end - p->in_start);
    case BIO_CTRL_WPENDING:
      return long(p->pending.size());
    default:
      return 0;
  }
}

int PipeCreate(BIO* b) {
  BIO_set_init(b, 1);
  return 1;
}

const BIO_METHOD* PipeMethod() {
  static BIO_METHOD* const method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "opencdp-tls-pipe");
    if (m == nullptr) return m;
    BIO_meth_set_write(m, PipeWrite);
    BIO_meth_set_read(m, PipeRead);
    BIO_meth_set_ctrl(m, PipeCtrl);
    BIO_meth_set_create(m, PipeCreate);
    return m;
  }();
  return method;
}

class TlsStream final : public ByteStream {
 public:
  TlsStream(std::unique_ptr<ByteStream> next, std::shared_ptr<const TlsContext> context)
      : next_(std::move(next)), context_(std::move(context)) {
    pipe_.in.resize(kHandshakeReadChunk);
  }

  ~TlsStream() override {
    if (ssl_ != nullptr) SSL_free(ssl_);  // frees both BIOs
  }

  Status Init(TlsSide side) {
    ssl_ = SSL_new(context_->native());
    if (ssl_ == nullptr) return Status::IOError("SSL_new: " + pki::OpenSslErrors());
    const BIO_METHOD* method = PipeMethod();
    BIO* rbio = method != nullptr ? BIO_new(method) : nullptr;
    BIO* wbio = method != nullptr ? BIO_new(method) : nullptr;
    if (rbio == nullptr || wbio == nullptr) {
      BIO_free(rbio);
      BIO_free(wbio);
      return Status::IOError("BIO_new: " + pki::OpenSslErrors());
    }
    BIO_set_data(rbio, &pipe_);
    BIO_set_data(wbio, &pipe_);
    SSL_set_bio(ssl_, rbio, wbio);
    if (side == TlsSide::kClient) SSL_set_connect_state(ssl_);
    else SSL_set_accept_state(ssl_);
    return Status::OK();
  }

  // Single-threaded: runs before the stream is handed out.
  Status Handshake(Deadline deadline) {
    for (;;) {
      int r;
      std::string errors;
      {
        std::lock_guard<std::mutex> lock(mu_);
        ERR_clear_error();
        r = SSL_do_handshake(ssl_);
        if (r != 1) {
          int e = SSL_get_error(ssl_, r);
          if (e != SSL_ERROR_WANT_READ) errors = Describe(e);
        }
        TakeOutput();
      }
      // Whatever the outcome, our flight (or our alert) goes out first.
      if (!out_.empty()) {
        ByteSpan span(out_.data(), out_.size());
        Status s = next_->WriteAll(std::span<const ByteSpan>(&span, 1), deadline);
        out_.clear();
        if (!s.ok() && errors.empty()) return HandshakeStatus(s);
      }
      if (r == 1) break;
      if (!errors.empty()) return Status::PermissionDenied("TLS handshake with " + peer() + " failed: " + errors);
      Status s = Feed(deadline);
      if (!s.ok()) return HandshakeStatus(s);
    }
    Result<TlsPeer> who = PeerOf(ssl_);
    if (!who.ok()) return who.status().WithContext("TLS handshake with " + peer());
    peer_id_ = std::move(*who);
    pipe_.in.resize(kReadChunk);  // keeps what arrived after the handshake
    return Status::OK();
  }

  Result<size_t> ReadSome(std::span<uint8_t> buf, Deadline deadline) override {
    if (buf.empty()) return size_t(0);
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        ERR_clear_error();
        size_t got = 0;
        int r = SSL_read_ex(ssl_, buf.data(), buf.size(), &got);
        if (r == 1) return got;
        int e = SSL_get_error(ssl_, r);
        if (e == SSL_ERROR_ZERO_RETURN) return Status::Unavailable(peer() + ": peer closed the TLS session");
        if (e != SSL_ERROR_WANT_READ) return Status::Corruption(peer() + ": TLS: " + Describe(e));
      }
      Status s = Feed(deadline);
      if (!s.ok()) return s;
    }
  }

  // Encrypts the buffers in chunks of at most kWriteChunk; the ciphertext goes
  // down once kWriteChunk of it gathered (small buffers share a write) and at
  // the end.
  Status WriteAll(std::span<const ByteSpan> bufs, Deadline deadline) override {
    auto flush = [&] {
      ByteSpan span(out_.data(), out_.size());
      Status s = next_->WriteAll(std::span<const ByteSpan>(&span, 1), deadline);
      out_.clear();
      return s;
    };
    for (ByteSpan b : bufs) {
      size_t off = 0;
      while (off < b.size()) {
        const size_t n = std::min(kWriteChunk, b.size() - off);
        {
          std::lock_guard<std::mutex> lock(mu_);
          ERR_clear_error();
          // OpenSSL appends to what gathered (after anything the reader's
          // SSL calls left), not to a buffer copied onto it afterwards.
          TakeOutput();
          pipe_.pending.swap(out_);
          size_t written = 0;
          const bool ok = SSL_write_ex(ssl_, b.data() + off, n, &written) == 1 && written == n;
          out_.swap(pipe_.pending);
          if (!ok) {
            int e = SSL_get_error(ssl_, 0);
            out_.clear();
            return Status::IOError(peer() + ": TLS write: " + Describe(e));
          }
        }
        off += n;
        if (out_.size() >= kWriteChunk) CDP_RETURN_IF_ERROR(flush());
      }
    }
    return out_.empty() ? Status::OK() : flush();
  }

  void Shutdown() override { next_->Shutdown(); }
  const std::string& peer() const override { return next_->peer(); }
  const TlsPeer* tls_peer() const override { return &peer_id_; }

 private:
  // Moves what OpenSSL wrote to out_ (no copy when out_ is empty, as it is
  // between sends). Caller holds mu_ and is the writer (or the handshake).
  void TakeOutput() {
    if (out_.empty()) {
      out_.swap(pipe_.pending);
    } else {
      out_.insert(out_.end(), pipe_.pending.begin(), pipe_.pending.end());
      pipe_.pending.clear();
    }
  }

  // Reads ciphertext from the next stream (without the lock) into the free
  // end of the input buffer, where OpenSSL reads it. Reader only (or the
  // handshake). OpenSSL asks for more only once it took what was there but
  // part of one record (at most kHandshakeReadChunk), so after the taken
  // bytes are dropped there is always room.
  Status Feed(Deadline deadline) {
    size_t at = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (pipe_.in_start > 0) {
        std::memmove(pipe_.in.data(), pipe_.in.data() + pipe_.in_start, pipe_.in_end - pipe_.in_start);
        pipe_.in_end -= pipe_.in_start;
        pipe_.in_start = 0;
      }
      at = pipe_.in_end;
      if (at == pipe_.in.size()) return Status::IOError(peer() + ": TLS: input buffer full");
    }
    Result<size_t> got = next_->ReadSome(std::span<uint8_t>(pipe_.in.data() + at, pipe_.in.size() - at), deadline);
    if (!got.ok()) return got.status();
    std::lock_guard<std::mutex> lock(mu_);
    pipe_.in_end += *got;
    return Status::OK();
  }

  std::string Describe(int ssl_error) {
    std::string text = ERR_peek_error() != 0 ? pki::OpenSslErrors() : std::string();
    const long verify = SSL_get_verify_result(ssl_);
    if (verify != X509_V_OK) {
      text += std::string(text.empty() ? "" : "; ") + "certificate verify: " +
              X509_verify_cert_error_string(verify);
    }
    if (text.empty()) text = "SSL error " + std::to_string(ssl_error);
    return text;
  }

  Status HandshakeStatus(const Status& s) {
    if (s.IsBusy()) return Status::Unavailable("TLS handshake with " + peer() + " timed out");
    return s.WithContext("TLS handshake");
  }

  const std::unique_ptr<ByteStream> next_;
  const std::shared_ptr<const TlsContext> context_;
  std::mutex mu_;  // guards ssl_ and pipe_; never held across a blocking call
  SSL* ssl_ = nullptr;
  Pipe pipe_;                  // under ssl_'s BIOs (see Pipe)
  std::vector<uint8_t> out_;   // writer only
  TlsPeer peer_id_;            // set by Handshake(), then constant
};

}  // namespace

// ---- TlsContext ----

TlsContext::~TlsContext() {
  if (ctx_ != nullptr) SSL_CTX_free(ctx_);
}

Result<std::shared_ptr<const TlsContext>> TlsContext::Load(const TlsFiles& files) {
  if (files.ca.empty() || files.cert.empty() || files.key.empty()) {
    return Status::InvalidArgument("TLS needs tls_ca, tls_cert and tls_key (or tls = off)");
  }
  CDP_RETURN_IF_ERROR(CheckPrivateFile(DefaultEnv(), files.key, "tls_key"));
  std::shared_ptr<TlsContext> c(new TlsContext());
  ERR_clear_error();
  c->ctx_ = SSL_CTX_new(TLS_method());
  if (c->ctx_ == nullptr) return Status::IOError("SSL_CTX_new: " + pki::OpenSslErrors());
  SSL_CTX* ctx = c->ctx_;
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  // AES-128-GCM first: as safe for our use and faster than AES-256 (AES-NI).
  if (SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256") != 1) {
    return Status::IOError("TLS cipher suites: " + pki::OpenSslErrors());
  }
  SSL_CTX_set_num_tickets(ctx, 0);
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET);
  SSL_CTX_set_max_cert_list(ctx, kMaxCertList);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  SSL_CTX_set_verify_depth(ctx, 2);
  if (SSL_CTX_load_verify_locations(ctx, files.ca.c_str(), nullptr) != 1) {
    return Status::InvalidArgument("tls_ca " + files.ca + ": " + pki::OpenSslErrors());
  }
  if (SSL_CTX_use_certificate_chain_file(ctx, files.cert.c_str()) != 1) {
    return Status::InvalidArgument("tls_cert " + files.cert + ": " + pki::OpenSslErrors());
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, files.key.c_str(), SSL_FILETYPE_PEM) != 1) {
    return Status::InvalidArgument("tls_key " + files.key + ": " + pki::OpenSslErrors());
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    return Status::InvalidArgument("tls_key " + files.key + " does not match tls_cert " + files.cert);
  }
  X509* own = SSL_CTX_get0_certificate(ctx);
  Result<pki::Identity> id = pki::IdentityOf(own);
  if (!id.ok()) return id.status().WithContext("tls_cert " + files.cert);
  c->self_.role = std::string(pki::RoleName(id->role));
  c->self_.tenant = id->tenant;
  c->self_.name = id->name;
  // Our own certificate must verify against the CA we trust (catches a CA/cert
  // mix-up and an expired certificate at start-up instead of at every peer).
  X509_STORE* store = SSL_CTX_get_cert_store(ctx);
  std::unique_ptr<X509_STORE_CTX, void (*)(X509_STORE_CTX*)> vctx(X509_STORE_CTX_new(), X509_STORE_CTX_free);
  if (!vctx || X509_STORE_CTX_init(vctx.get(), store, own, nullptr) != 1) {
    return Status::IOError("X509_STORE_CTX: " + pki::OpenSslErrors());
  }
  if (X509_verify_cert(vctx.get()) != 1) {
    return Status::InvalidArgument("tls_cert " + files.cert + " does not verify against tls_ca " + files.ca + ": " +
                                   X509_verify_cert_error_string(X509_STORE_CTX_get_error(vctx.get())));
  }
  if (!files.crl.empty()) CDP_RETURN_IF_ERROR(c->LoadCrl(files));
  return std::shared_ptr<const TlsContext>(std::move(c));
}

Status TlsContext::LoadCrl(const TlsFiles& files) {
  ERR_clear_error();
  std::unique_ptr<BIO, void (*)(BIO*)> bio(BIO_new_file(files.crl.c_str(), "r"), BIO_free_all);
  if (!bio) return Status::InvalidArgument("tls_crl " + files.crl + ": " + pki::OpenSslErrors());
  std::unique_ptr<X509_CRL, void (*)(X509_CRL*)> crl(PEM_read_bio_X509_CRL(bio.get(), nullptr, nullptr, nullptr),
                                                     X509_CRL_free);
  if (!crl) return Status::InvalidArgument("tls_crl " + files.crl + ": not a PEM CRL: " + pki::OpenSslErrors());
  // It must be the site CA's: signed by it, and not past its next update.
  X509_STORE* store = SSL_CTX_get_cert_store(ctx_);
  X509* ca = nullptr;
  {
    std::unique_ptr<BIO, void (*)(BIO*)> cabio(BIO_new_file(files.ca.c_str(), "r"), BIO_free_all);
    if (cabio) ca = PEM_read_bio_X509(cabio.get(), nullptr, nullptr, nullptr);
  }
  std::unique_ptr<X509, void (*)(X509*)> ca_owner(ca, X509_free);
  if (ca == nullptr || X509_CRL_verify(crl.get(), X509_get0_pubkey(ca)) != 1) {
    ERR_clear_error();
    return Status::InvalidArgument("tls_crl " + files.crl + " is not signed by tls_ca " + files.ca);
  }
  const ASN1_TIME* next = X509_CRL_get0_nextUpdate(crl.get());
  if (next != nullptr && X509_cmp_current_time(next) < 0)
    return Status::InvalidArgument("tls_crl " + files.crl + " is past its next update (make a new one: cdpctl pki revoke)");
  STACK_OF(X509_REVOKED)* revoked = X509_CRL_get_REVOKED(crl.get());
  for (int i = 0; i < sk_X509_REVOKED_num(revoked); ++i) {
    const ASN1_INTEGER* serial = X509_REVOKED_get0_serialNumber(sk_X509_REVOKED_value(revoked, i));
    std::unique_ptr<BIGNUM, void (*)(BIGNUM*)> bn(ASN1_INTEGER_to_BN(serial, nullptr), BN_free);
    if (!bn) continue;
    char* hex = BN_bn2hex(bn.get());
    if (hex != nullptr) revoked_.insert(hex);
    OPENSSL_free(hex);
  }
  // The handshake checks the peer's certificate (the leaf) against the list.
  if (X509_STORE_add_crl(store, crl.get()) != 1) return Status::IOError("tls_crl: " + pki::OpenSslErrors());
  X509_STORE_set_flags(store, X509_V_FLAG_CRL_CHECK);
  return Status::OK();
}

// ---- TlsCredentials ----

Result<std::unique_ptr<TlsCredentials>> TlsCredentials::Load(TlsFiles files) {
  std::unique_ptr<TlsCredentials> creds(new TlsCredentials(std::move(files)));
  CDP_ASSIGN_OR_RETURN(creds->current_, TlsContext::Load(creds->files_));
  return creds;
}

Status TlsCredentials::Reload() {
  Result<std::shared_ptr<const TlsContext>> fresh = TlsContext::Load(files_);
  if (!fresh.ok()) {
    log::Get("tls")->error("TLS reload failed, keeping the current credentials: {}", fresh.status().ToString());
    return fresh.status();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    current_ = std::move(*fresh);
  }
  reloads_.fetch_add(1, std::memory_order_relaxed);
  log::Get("tls")->info("TLS credentials reloaded: certificate '{}' for new connections", Current()->self().name);
  return Status::OK();
}

std::string TlsCredentials::Distrusted(const TlsPeer& peer) const {
  if (peer.serial.empty() || !Current()->Revoked(peer.serial)) return "";
  return "certificate '" + peer.name + "' (serial " + peer.serial + ") is revoked";
}

std::shared_ptr<const TlsContext> TlsCredentials::Current() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_;
}

// ---- StartTls ----

Result<std::unique_ptr<ByteStream>> StartTls(std::unique_ptr<ByteStream> next,
                                             std::shared_ptr<const TlsContext> context, TlsSide side,
                                             std::chrono::milliseconds timeout) {
  if (!context) return Status::InvalidArgument("StartTls: no TLS context");
  auto stream = std::make_unique<TlsStream>(std::move(next), std::move(context));
  Status s = stream->Init(side);
  if (s.ok()) s = stream->Handshake(SteadyClock::now() + timeout);
  if (!s.ok()) {
    stream->Shutdown();
    return s;
  }
  return std::unique_ptr<ByteStream>(std::move(stream));
}

StreamWrapper TlsWrapper(const TlsCredentials* creds, TlsSide side, std::chrono::milliseconds timeout,
                         StreamWrapper below) {
  return [creds, side, timeout, below = std::move(below)](
             std::unique_ptr<ByteStream> transport) -> Result<std::unique_ptr<ByteStream>> {
    std::unique_ptr<ByteStream> s = std::move(transport);
    if (below) {
      CDP_ASSIGN_OR_RETURN(s, below(std::move(s)));
    }
    return StartTls(std::move(s), creds->Current(), side, timeout);
  };
}

}  // namespace cdp

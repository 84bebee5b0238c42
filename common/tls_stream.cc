#include "common/tls_stream.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <algorithm>
#include <vector>

#include "common/log.h"
#include "common/pki.h"

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
  if (SSL_export_keying_material(ssl, p.binding.data(), p.binding.size(), kExporterLabel,
                                 sizeof(kExporterLabel) - 1, nullptr, 0, 0) != 1) {
    return Status::IOError("TLS exporter failed: " + pki::OpenSslErrors());
  }
  return p;
}

class TlsStream final : public ByteStream {
 public:
  TlsStream(std::unique_ptr<ByteStream> next, std::shared_ptr<const TlsContext> context)
      : next_(std::move(next)), context_(std::move(context)), rbuf_(kHandshakeReadChunk) {}

  ~TlsStream() override {
    if (ssl_ != nullptr) SSL_free(ssl_);  // frees both BIOs
  }

  Status Init(TlsSide side) {
    ssl_ = SSL_new(context_->native());
    if (ssl_ == nullptr) return Status::IOError("SSL_new: " + pki::OpenSslErrors());
    BIO* rbio = BIO_new(BIO_s_mem());
    BIO* wbio = BIO_new(BIO_s_mem());
    if (rbio == nullptr || wbio == nullptr) {
      BIO_free(rbio);
      BIO_free(wbio);
      return Status::IOError("BIO_new: " + pki::OpenSslErrors());
    }
    // An empty input BIO means "wait for more", not end of stream.
    BIO_set_mem_eof_return(rbio, -1);
    BIO_set_mem_eof_return(wbio, -1);
    SSL_set_bio(ssl_, rbio, wbio);
    rbio_ = rbio;
    wbio_ = wbio;
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
    rbuf_.resize(kReadChunk);
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

  Status WriteAll(std::span<const ByteSpan> bufs, Deadline deadline) override {
    for (ByteSpan b : bufs) {
      size_t off = 0;
      while (off < b.size()) {
        const size_t n = std::min(kWriteChunk, b.size() - off);
        {
          std::lock_guard<std::mutex> lock(mu_);
          ERR_clear_error();
          size_t written = 0;
          if (SSL_write_ex(ssl_, b.data() + off, n, &written) != 1 || written != n) {
            int e = SSL_get_error(ssl_, 0);
            return Status::IOError(peer() + ": TLS write: " + Describe(e));
          }
          TakeOutput();
        }
        off += n;
        ByteSpan span(out_.data(), out_.size());
        Status s = next_->WriteAll(std::span<const ByteSpan>(&span, 1), deadline);
        out_.clear();
        if (!s.ok()) return s;
      }
    }
    return Status::OK();
  }

  void Shutdown() override { next_->Shutdown(); }
  const std::string& peer() const override { return next_->peer(); }
  const TlsPeer* tls_peer() const override { return &peer_id_; }

 private:
  // Appends what OpenSSL wrote to the outgoing BIO to out_. Caller holds mu_
  // and is the writer (or the handshake).
  void TakeOutput() {
    const size_t pending = BIO_ctrl_pending(wbio_);
    if (pending == 0) return;
    const size_t at = out_.size();
    out_.resize(at + pending);
    const int got = BIO_read(wbio_, out_.data() + at, int(pending));
    out_.resize(at + size_t(std::max(got, 0)));
  }

  // Reads ciphertext from the next stream (without the lock) and hands it to
  // OpenSSL. Reader only (or the handshake).
  Status Feed(Deadline deadline) {
    Result<size_t> got = next_->ReadSome(std::span<uint8_t>(rbuf_.data(), rbuf_.size()), deadline);
    if (!got.ok()) return got.status();
    std::lock_guard<std::mutex> lock(mu_);
    if (BIO_write(rbio_, rbuf_.data(), int(*got)) != int(*got)) {
      return Status::IOError(peer() + ": TLS: buffering input failed");
    }
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
  std::mutex mu_;  // guards ssl_ and its BIOs; never held across a blocking call
  SSL* ssl_ = nullptr;
  BIO* rbio_ = nullptr;  // owned by ssl_
  BIO* wbio_ = nullptr;  // owned by ssl_
  std::vector<uint8_t> rbuf_;  // reader only
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
  return std::shared_ptr<const TlsContext>(std::move(c));
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

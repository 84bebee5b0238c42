// SPDX-License-Identifier: Apache-2.0
// One NBD client connection (the pipeline diagram of nbd_server.h) and how
// the listener's sockets become connections. Internals: nbd_server_impl.h.
#include "common/nbd/nbd_server_impl.h"
#include "common/net/socket_tls.h"

namespace cdp {

using nbd_detail::kInputBufferSize;
using nbd_detail::kMaxGather;
using nbd_detail::kMaxOptionSkip;
using nbd_detail::kRequestOverhead;
using nbd_detail::PendingRequest;
using nbd_detail::RequestContext;
using nbd_detail::RequestOrder;
using Out = nbd_detail::Reply;

namespace {

// One client connection; see the pipeline diagram in nbd_server.h.
// Every member is touched only on the socket's strand, but for what a device
// call reads (dev_, export_, structured_, known_data_): Dispatch makes the
// call here or on dstrand_, never both at once (order_), or on the read
// pool, which reads dev_, export_ and structured_ (fixed once attached) and
// not known_data_.
template <typename Socket>
class Connection final : public ConnectionBase {
 public:
  Connection(NbdServer::Impl* impl, Socket socket, asio::io_context& device_io, uint64_t id, std::string peer)
      : impl_(impl),
        live_(impl),
        socket_(std::move(socket)),
        timer_(socket_.get_executor()),
        dstrand_(asio::make_strand(device_io)),
        id_(id),
        peer_(std::move(peer)),
        in_(std::max<size_t>(kInputBufferSize, size_t(impl->opts.max_option_bytes) + 64)) {}

  void Start() {
    asio::dispatch(socket_.get_executor(), [self = Self()] { self->DoStart(); });
  }
  void Close(std::string reason) override {
    asio::post(socket_.get_executor(), [self = Self(), reason = std::move(reason)] { self->DoClose(reason); });
  }

 private:
  enum class Phase {
    kClientFlags,
    kOptionHeader,
    kOptionData,
    kOptionSkip,
    kTlsHandshake,  // STARTTLS acknowledged: reply drained, then the TLS handshake
    kTransmission,  // from here on the handshake timer no longer applies
    kPayload,
    kPayloadSkip,
    kDone,
  };
  // TLS after STARTTLS: OpenSSL on the socket itself (common/net/socket_tls.h).
  using TlsLayer = SocketTls<Socket>;
  static constexpr bool kTcp = std::is_same_v<Socket, TcpSocket>;

  std::shared_ptr<Connection> Self() { return std::static_pointer_cast<Connection>(shared_from_this()); }

  // Runs fn on the stream that carries NBD: the socket, or TLS over it.
  template <typename Fn>
  void WithStream(Fn&& fn) {
    if (tls_) {
      fn(*tls_);
    } else {
      fn(socket_);
    }
  }
  bool TlsRequired() const {
    return kTcp && impl_->opts.tls_mode == NbdServerOptions::TlsMode::kRequire && !tls_;
  }

  void DoStart() {
    if constexpr (std::is_same_v<Socket, TcpSocket>) {
      boost::system::error_code ec;
      socket_.set_option(tcp::no_delay(true), ec);
    }
    timer_.expires_after(std::chrono::milliseconds(impl_->opts.handshake_timeout_ms));
    timer_.async_wait([self = Self()](const boost::system::error_code& ec) {
      if (!ec && self->phase_ < Phase::kTransmission) self->DoClose("handshake timed out");
    });
    Enqueue(nbd::EncodeGreeting(nbd::kFlagFixedNewstyle | nbd::kFlagNoZeroes), 0);
    Drive();
  }

  ByteSpan Available() const { return ByteSpan(in_.data() + in_begin_, in_end_ - in_begin_); }
  void Consume(size_t n) { in_begin_ += n; }
  bool Paused() const { return inflight_ >= impl_->opts.max_inflight_bytes; }

  // Parses what is buffered and acts on it until more input is needed.
  void Drive() {
    while (!closed_) {
      ByteSpan avail = Available();
      switch (phase_) {
        case Phase::kClientFlags: {
          uint32_t f = 0;
          auto r = nbd::ParseClientFlags(avail, /*server_offered_no_zeroes=*/true, &f);
          if (r == nbd::ParseResult::kBad) return DoClose("unsupported client flags");
          if (r == nbd::ParseResult::kNeedMore) return ReadMore();
          Consume(nbd::kClientFlagsSize);
          client_flags_ = f;
          phase_ = Phase::kOptionHeader;
          break;
        }
        case Phase::kOptionHeader: {
          auto r = nbd::ParseOptionHeader(avail, &opt_);
          if (r == nbd::ParseResult::kBad) return DoClose("bad option magic");
          if (r == nbd::ParseResult::kNeedMore) return ReadMore();
          Consume(nbd::kOptionHeaderSize);
          if (++options_ > impl_->opts.max_options) {
            return DoClose("more than " + std::to_string(impl_->opts.max_options) + " options");
          }
          if (opt_.length <= impl_->opts.max_option_bytes) {
            phase_ = Phase::kOptionData;
          } else if (opt_.option == nbd::kOptExportName || opt_.length > kMaxOptionSkip) {
            // EXPORT_NAME cannot be answered with an error; a huge option is a DoS.
            return DoClose("option data of " + std::to_string(opt_.length) + " bytes");
          } else {
            skip_left_ = opt_.length;
            phase_ = Phase::kOptionSkip;
          }
          break;
        }
        case Phase::kOptionData: {
          if (avail.size() < opt_.length) return ReadMore();
          HandleOption(avail.first(opt_.length));
          Consume(opt_.length);
          break;
        }
        case Phase::kOptionSkip:
        case Phase::kPayloadSkip: {
          const size_t n = size_t(std::min<uint64_t>(avail.size(), skip_left_));
          Consume(n);
          skip_left_ -= n;
          if (skip_left_ > 0) return ReadMore();
          if (phase_ == Phase::kOptionSkip) {
            OptionReply(nbd::kRepErrTooBig, "option data too long");
            phase_ = Phase::kOptionHeader;
          } else {
            phase_ = Phase::kTransmission;
          }
          break;
        }
        case Phase::kTlsHandshake:
          // The client starts TLS only after our reply: nothing may follow
          // STARTTLS in the clear.
          if (!avail.empty()) return DoClose("data after NBD_OPT_STARTTLS before the TLS handshake");
          if (!tls_ && !writing_ && out_.empty()) StartTls();
          return;  // the write completion, then the handshake completion, come back here
        case Phase::kTransmission:
          if (disc_ || Paused()) return;
          if (!NextRequest(avail)) return;
          break;
        case Phase::kPayload:
        case Phase::kDone:
          return;
      }
    }
  }

  // Handles one request header if buffered. Returns false when Drive must stop.
  bool NextRequest(ByteSpan avail) {
    nbd::Request r;
    auto res = nbd::ParseRequest(avail, &r);
    if (res == nbd::ParseResult::kBad) {
      DoClose("bad request magic");
      return false;
    }
    if (res == nbd::ParseResult::kNeedMore) {
      ReadMore();
      return false;
    }
    last_activity_ = std::chrono::steady_clock::now();
    Consume(nbd::kRequestHeaderSize);
    if (r.type == nbd::kCmdDisc) {
      disc_ = true;
      OnDisc();
      return false;
    }
    const uint32_t err = nbd::CheckRequest(r, limits_);
    if (r.type != nbd::kCmdWrite) {
      RunRequest(r, {}, err);
      return true;
    }
    // A WRITE's payload follows its header whatever we think of the request.
    if (r.length > impl_->opts.max_skip_bytes) {
      DoClose("WRITE payload of " + std::to_string(r.length) + " bytes");
      return false;
    }
    if (err != 0) {
      RunRequest(r, {}, err);
      skip_left_ = r.length;
      phase_ = Phase::kPayloadSkip;
      return true;
    }
    // Only what is not buffered yet is zero-filled (by resize) before it is read.
    ByteSpan rest = Available();
    const size_t have = std::min<size_t>(rest.size(), r.length);
    Bytes payload;
    payload.reserve(r.length);
    payload.assign(rest.begin(), rest.begin() + long(have));
    payload.resize(r.length);
    Consume(have);
    if (have == r.length) {
      RunRequest(r, std::move(payload), 0);
      return true;
    }
    // Read the remainder straight into the payload buffer.
    phase_ = Phase::kPayload;
    pending_ = r;
    payload_ = std::move(payload);
    reading_ = true;
    uint8_t* dst = payload_.data() + have;
    auto done = [self = Self()](const boost::system::error_code& ec, size_t) {
      self->reading_ = false;
      if (self->closed_) return;
      if (ec) return self->OnReadError(ec);
      self->phase_ = Phase::kTransmission;
      self->RunRequest(self->pending_, std::move(self->payload_), 0);
      self->Drive();
    };
    WithStream([&](auto& stream) { asio::async_read(stream, asio::buffer(dst, r.length - have), done); });
    return false;
  }

  void ReadMore() {
    if (reading_ || closed_) return;
    if (in_begin_ > 0) {
      std::memmove(in_.data(), in_.data() + in_begin_, in_end_ - in_begin_);
      in_end_ -= in_begin_;
      in_begin_ = 0;
    }
    if (in_end_ == in_.size()) return DoClose("input buffer overflow");
    reading_ = true;
    auto done = [self = Self()](const boost::system::error_code& ec, size_t n) {
      self->reading_ = false;
      if (self->closed_) return;
      if (ec) return self->OnReadError(ec);
      self->in_end_ += n;
      self->Drive();
    };
    WithStream([&](auto& stream) {
      stream.async_read_some(asio::buffer(in_.data() + in_end_, in_.size() - in_end_), done);
    });
  }

  void OnReadError(const boost::system::error_code& ec) {
    if (ec == asio::error::eof || ec == asio::ssl::error::stream_truncated) {
      DoClose(phase_ < Phase::kTransmission ? "client closed during the handshake"
                                            : "client closed the connection");
    } else {
      DoClose(FromAsioError(ec, "read").ToString());
    }
  }

  // ---- Handshake -----------------------------------------------------------

  void OptionReply(uint32_t type, ByteSpan data = {}) {
    Enqueue(nbd::EncodeOptionReply(opt_.option, type, data), 0);
  }
  void OptionReply(uint32_t type, std::string_view text) {
    Enqueue(nbd::EncodeOptionReply(opt_.option, type, text), 0);
  }

  void HandleOption(ByteSpan data) {
    phase_ = Phase::kOptionHeader;  // unless the option ends the handshake
    if (TlsRequired() && opt_.option != nbd::kOptStartTls && opt_.option != nbd::kOptAbort) {
      if (opt_.option == nbd::kOptExportName) {
        return DoClose("NBD_OPT_EXPORT_NAME without TLS (TLS is required: NBD_OPT_STARTTLS first)");
      }
      return OptionReply(nbd::kRepErrTlsReqd, "TLS is required: send NBD_OPT_STARTTLS first");
    }
    switch (opt_.option) {
      case nbd::kOptStartTls:
        if (impl_->opts.tls == nullptr) return OptionReply(nbd::kRepErrUnsup, "TLS is not configured");
        if (tls_) return OptionReply(nbd::kRepErrInvalid, "TLS is already on");
        if (!data.empty()) return OptionReply(nbd::kRepErrInvalid, "NBD_OPT_STARTTLS takes no data");
        OptionReply(nbd::kRepAck);
        phase_ = Phase::kTlsHandshake;
        return;
      case nbd::kOptExportName: {
        std::string name(reinterpret_cast<const char*>(data.data()), data.size());
        auto e = nbd::ValidWireName(name) ? impl_->Find(name, scope_) : nullptr;
        // This option cannot be answered with an error: the spec says close.
        if (!e) return DoClose("NBD_OPT_EXPORT_NAME: no export '" + name + "'");
        if (std::string cap = TakeTenantPlace(); !cap.empty()) return DoClose("NBD_OPT_EXPORT_NAME: " + cap);
        const bool no_zeroes = (client_flags_ & nbd::kClientFlagNoZeroes) != 0;
        Enqueue(nbd::EncodeExportNameReply(e->device->size(), e->tflags, no_zeroes), 0);
        return Attach(e);
      }
      case nbd::kOptAbort:
        OptionReply(nbd::kRepAck);
        phase_ = Phase::kDone;
        close_after_drain_ = true;
        MaybeFinish();
        return;
      case nbd::kOptList: {
        if (!data.empty()) return OptionReply(nbd::kRepErrInvalid, "NBD_OPT_LIST takes no data");
        for (const auto& e : impl_->Snapshot(scope_)) {
          OptionReply(nbd::kRepServer, nbd::EncodeServerReplyData(e->name, e->description));
        }
        return OptionReply(nbd::kRepAck);
      }
      case nbd::kOptInfo:
      case nbd::kOptGo:
        return HandleInfo(data, opt_.option == nbd::kOptGo);
      case nbd::kOptStructuredReply:
        if (!data.empty()) return OptionReply(nbd::kRepErrInvalid, "NBD_OPT_STRUCTURED_REPLY takes no data");
        structured_ = true;
        return OptionReply(nbd::kRepAck);
      case nbd::kOptListMetaContext:
      case nbd::kOptSetMetaContext:
        return HandleMetaContext(data, opt_.option == nbd::kOptSetMetaContext);
      default:
        return OptionReply(nbd::kRepErrUnsup, "option " + std::to_string(opt_.option) + " not supported");
    }
  }

  // LIST / SET_META_CONTEXT: the one context we serve is base:allocation.
  // SET replaces the selection even when it fails; it selects base:allocation
  // for the export named, and NBD_CMD_BLOCK_STATUS is valid only if the
  // client then attaches to that same export.
  void HandleMetaContext(ByteSpan data, bool set) {
    if (set) meta_export_.reset();
    if (!structured_) return OptionReply(nbd::kRepErrInvalid, "negotiate NBD_OPT_STRUCTURED_REPLY first");
    nbd::MetaContextRequest req;
    Status s = nbd::ParseMetaContextRequest(data, &req);
    if (!s.ok()) return OptionReply(nbd::kRepErrInvalid, s.message());
    auto e = impl_->Find(req.name, scope_);
    if (!e) return OptionReply(nbd::kRepErrUnknown, "no export '" + req.name + "'");
    bool match = !set && req.queries.empty();  // LIST without queries: every context; SET: none
    for (const std::string& q : req.queries) {
      if (q == nbd::kBaseAllocation || (!set && q == "base:")) match = true;
    }
    if (match) {
      OptionReply(nbd::kRepMetaContext, nbd::EncodeMetaContext(set ? nbd::kBaseAllocationId : 0, nbd::kBaseAllocation));
      if (set) meta_export_ = e;
    }
    OptionReply(nbd::kRepAck);
  }

  void HandleInfo(ByteSpan data, bool go) {
    nbd::InfoRequest req;
    Status s = nbd::ParseInfoRequest(data, &req);
    if (!s.ok()) return OptionReply(nbd::kRepErrInvalid, s.message());
    auto e = impl_->Find(req.name, scope_);
    if (!e) {
      return OptionReply(nbd::kRepErrUnknown, req.name.empty() ? "no default export (the server has "
                                                                     "zero or several exports)"
                                                               : "no export '" + req.name + "'");
    }
    if (go) {
      if (std::string cap = TakeTenantPlace(); !cap.empty()) {
        impl_->log->warn("{} NBD_OPT_GO refused: {}", log::Where{e->name, peer_, 0}, cap);
        return OptionReply(nbd::kRepErrPolicy, cap);
      }
    }
    OptionReply(nbd::kRepInfo, nbd::EncodeInfoExport(e->device->size(), e->tflags));
    bool sent_name = false, sent_desc = false;
    for (uint16_t info : req.infos) {
      if (info == nbd::kInfoName && !sent_name) {
        OptionReply(nbd::kRepInfo, nbd::EncodeInfoString(nbd::kInfoName, e->name));
        sent_name = true;
      } else if (info == nbd::kInfoDescription && !sent_desc && !e->description.empty()) {
        OptionReply(nbd::kRepInfo, nbd::EncodeInfoString(nbd::kInfoDescription, e->description));
        sent_desc = true;
      }
    }
    // Always sent: minimum 1 (any alignment), the device's preferred size,
    // and the READ/WRITE cap.
    OptionReply(nbd::kRepInfo, nbd::EncodeInfoBlockSize(1, e->device->preferred_block_size(),
                                                        impl_->opts.max_request_bytes));
    OptionReply(nbd::kRepAck);
    if (go) Attach(e);
  }

  // The TLS handshake over the socket, on the connection's strand; the
  // handshake timer still runs. SSL_new takes a reference on the context, so
  // a reload of the credentials meanwhile does not matter.
  void StartTls() {
    SSL* ssl = SSL_new(impl_->opts.tls->Current()->native());
    if (ssl == nullptr) return DoClose("SSL_new: " + pki::OpenSslErrors());
    tls_ = std::make_unique<TlsLayer>(socket_, ssl);
    tls_->async_handshake(asio::ssl::stream_base::server, [self = Self()](const boost::system::error_code& ec) {
      if (self->closed_) return;
      if (ec) return self->DoClose("TLS handshake failed: " + ec.message());
      self->OnTlsUp();
    });
  }

  void OnTlsUp() {
    // What was negotiated in the clear is negotiated again inside TLS.
    structured_ = false;
    meta_export_.reset();
    X509* cert = SSL_get0_peer_certificate(tls_->native_handle());
    if (cert == nullptr) return DoClose("TLS: no client certificate");
    Result<pki::Identity> id = pki::IdentityOf(cert);
    if (!id.ok()) return DoClose("TLS: " + id.status().ToString());
    scope_.all = id->tenant.empty();
    scope_.tenant = id->tenant;
    impl_->log->debug("{} NBD TLS up: certificate '{}' (role {}, tenant '{}')", log::Where{"", peer_, 0}, id->name,
                      pki::RoleName(id->role), id->tenant);
    phase_ = Phase::kOptionHeader;
    Drive();
  }

  void Attach(const std::shared_ptr<ExportEntry>& e) {
    if (closed_) return;
    export_ = e;
    dev_ = e->device;
    limits_.size = dev_->size();
    limits_.transmission_flags = e->tflags;
    limits_.max_payload = impl_->opts.max_request_bytes;
    limits_.block_status = structured_ && meta_export_ == e;
    meta_export_.reset();
    e->connections++;
    e->connections_total++;
    attached.store(e.get());
    slot.MarkAuthenticated();
    phase_ = Phase::kTransmission;
    timer_.cancel();
    last_activity_ = std::chrono::steady_clock::now();
    ArmIdleTimer();
    impl_->log->info("{} NBD client attached (flags 0x{:x})", log::Where{e->name, peer_, 0}, e->tflags);
    // Pairs with RemoveExport: it sets `removed` then looks at `attached`.
    if (e->removed.load()) DoClose("export removed");
  }

  // ---- Transmission --------------------------------------------------------

  // Idle: no request received for idle_timeout_ms and nothing in progress.
  void ArmIdleTimer() {
    if (impl_->opts.idle_timeout_ms == 0 || closed_) return;
    timer_.expires_at(last_activity_ + std::chrono::milliseconds(impl_->opts.idle_timeout_ms));
    timer_.async_wait([self = Self()](const boost::system::error_code& ec) {
      if (ec || self->closed_) return;
      const auto now = std::chrono::steady_clock::now();
      if (self->inflight_ > 0) self->last_activity_ = now;  // requests or replies in progress
      if (now < self->last_activity_ + std::chrono::milliseconds(self->impl_->opts.idle_timeout_ms)) {
        return self->ArmIdleTimer();
      }
      self->impl_->idle_closed++;
      self->DoClose("idle for " + std::to_string(self->impl_->opts.idle_timeout_ms) + " ms");
    });
  }

  void RunRequest(const nbd::Request& r, Bytes payload, uint32_t err) {
    uint64_t charge = kRequestOverhead;
    if (err == 0 && (r.type == nbd::kCmdRead || r.type == nbd::kCmdWrite)) charge += r.length;
    inflight_ += charge;
    Dispatch(PendingRequest{r, std::move(payload), err, charge});
  }

  // Runs one request where the order says (nbd_request_order.h).
  void Dispatch(PendingRequest p) {
    using Where = RequestOrder::Where;
    switch (order_.Dispatch(&p, impl_->read_io != nullptr, !Available().empty())) {
      case Where::kHeld:
        return;
      case Where::kHere:
        return Enqueue(Execute(p, &known_data_, false));
      case Where::kReadPool: {
        // Not known_data_ there (a BLOCK_STATUS may replace it): whether the READ lies in it is decided now, in order.
        const bool in_known = structured_ && known_data_.Covers(p.r.offset, p.r.length);
        return RunOn(*impl_->read_io, std::move(p), nullptr, in_known, [](Connection& c, Out reply) {
          c.Enqueue(std::move(reply));
          c.OnPoolReadDone();
        });
      }
      case Where::kDeviceStrand:
        return RunOn(dstrand_, std::move(p), &known_data_, false, [](Connection& c, Out reply) {
          c.order_.DeviceDone();
          c.Enqueue(std::move(reply));
        });
    }
  }

  // Executes `p` on `where` (Execute's `known`, `in_known`); `done` gets the reply on the socket's executor.
  template <typename Executor>
  void RunOn(Executor& where, PendingRequest p, nbd::KnownData* known, bool in_known, void (*done)(Connection&, Out)) {
    asio::post(where, [self = Self(), p = std::move(p), known, in_known, done]() mutable {
      Out reply = self->Execute(p, known, in_known);
      asio::post(self->socket_.get_executor(),
                 [self, reply = std::move(reply), done]() mutable { done(*self, std::move(reply)); });
    });
  }

  // After the last pool READ the requests held behind it go on, in order,
  // and a DISC waiting for them closes.
  void OnPoolReadDone() {
    std::deque<PendingRequest> q = order_.PoolReadDone();
    if (closed_) return;
    for (PendingRequest& p : q) Dispatch(std::move(p));
    if (order_.DiscReady()) OnDisc();
  }

  // The device call of one request. `known`: the connection's last
  // BLOCK_STATUS (null on the read pool, with `in_known` decided at dispatch).
  Out Execute(PendingRequest& p, nbd::KnownData* known, bool in_known) {
    RequestContext ctx{*export_, *dev_, *impl_->log, peer_, structured_, known, in_known};
    Out reply = ExecuteRequest(ctx, p.r, std::move(p.payload), p.err);
    reply.charge = p.charge;
    return reply;
  }

  // Every request before the DISC has run and queued its reply: the
  // connection closes once the replies are out.
  void OnDisc() {
    switch (order_.OnDisc()) {
      case RequestOrder::Disc::kWait:
        return;  // OnPoolReadDone comes back here
      case RequestOrder::Disc::kBehindDeviceStrand:
        asio::post(dstrand_, [self = Self()] {
          asio::post(self->socket_.get_executor(), [self] { self->OnDisc(); });
        });
        return;
      case RequestOrder::Disc::kClose:
        close_after_drain_ = true;
        MaybeFinish();
        return;
    }
  }

  // ---- Output ----------------------------------------------------------------

  void Enqueue(Bytes data, uint64_t charge) { Enqueue(Out::Of(std::move(data), charge)); }
  void Enqueue(Out o) {
    if (closed_) return;
    if (phase_ < Phase::kTransmission) {
      reply_bytes_ += o.Buffer().size();
      if (reply_bytes_ > impl_->opts.max_option_reply_bytes) {
        return DoClose("option replies passed " + std::to_string(impl_->opts.max_option_reply_bytes) + " bytes");
      }
    }
    out_.push_back(std::move(o));
    StartWrite();
  }

  void StartWrite() {
    if (writing_ || out_.empty() || closed_) return;
    writing_ = true;
    const size_t n = std::min(out_.size(), kMaxGather);
    std::vector<asio::const_buffer> bufs;
    bufs.reserve(n);
    for (size_t i = 0; i < n; ++i) bufs.emplace_back(out_[i].Buffer());
    auto done = [self = Self(), n](const boost::system::error_code& ec, size_t) {
      self->writing_ = false;
      if (self->closed_) {
        self->out_.clear();  // kept by DoClose until this write let go of them
        return;
      }
      if (ec) return self->DoClose(FromAsioError(ec, "write").ToString());
      const bool was_paused = self->Paused();
      for (size_t i = 0; i < n; ++i) {
        self->inflight_ -= self->out_.front().charge;
        self->out_.pop_front();
      }
      if (self->MaybeFinish()) return;
      self->StartWrite();
      if ((was_paused && !self->Paused()) || (self->phase_ == Phase::kTlsHandshake && !self->tls_)) self->Drive();
    };
    WithStream([&](auto& stream) { asio::async_write(stream, bufs, done); });
  }

  // Closes once everything queued is written, if a close was requested.
  bool MaybeFinish() {
    if (close_after_drain_ && out_.empty() && !writing_) {
      DoClose(disc_ ? "client disconnected (NBD_CMD_DISC)" : "client aborted the handshake");
      return true;
    }
    return false;
  }

  // A client of a tenant (by its certificate) takes one of the tenant's
  // places before it attaches. Returns "" (taken, or no tenant) or why not,
  // naming the cap.
  std::string TakeTenantPlace() {
    if (scope_.all || holds_tenant_place_) return "";
    if (!impl_->TakeTenantPlace(scope_.tenant)) {
      return "tenant '" + scope_.tenant + "' already has " + std::to_string(impl_->opts.max_connections_per_tenant) +
             " NBD connections (the cap nbd_max_connections_per_tenant)";
    }
    holds_tenant_place_ = true;
    return "";
  }

  void DoClose(const std::string& reason) {
    if (closed_) return;
    closed_ = true;
    if (holds_tenant_place_) impl_->GiveTenantPlace(scope_.tenant);
    holds_tenant_place_ = false;
    phase_ = Phase::kDone;
    boost::system::error_code ig;
    timer_.cancel();
    socket_.shutdown(asio::socket_base::shutdown_both, ig);
    socket_.close(ig);
    // A write in flight still reads its replies' buffers (TLS may go on
    // encrypting them after the close): they go when its handler runs.
    if (!writing_) out_.clear();
    if (export_) {
      export_->connections--;
      impl_->log->info("{} NBD connection closed: {}", log::Where{export_->name, peer_, 0}, reason);
    } else {
      impl_->log->debug("{} NBD connection closed during the handshake: {}", log::Where{"", peer_, 0},
                        reason);
    }
    impl_->Unregister(id_);
  }

  NbdServer::Impl* impl_;
  // Counts this connection among the server's live ones until every member
  // after it (the socket, the timer, the strands: parts of the server's
  // io_contexts) is gone; NbdServer::Stop waits for that.
  NbdServer::Impl::Live live_;
  Socket socket_;
  std::unique_ptr<TlsLayer> tls_;  // after STARTTLS; on socket_
  Scope scope_;                    // narrowed by the client certificate
  asio::steady_timer timer_;       // handshake deadline, then idle timeout
  Strand dstrand_;                 // the device strand (RunRequest), on the same pool
  const uint64_t id_;
  const std::string peer_;

  Bytes in_;
  size_t in_begin_ = 0, in_end_ = 0;
  bool reading_ = false;
  Phase phase_ = Phase::kClientFlags;
  uint32_t client_flags_ = 0;
  nbd::OptionHeader opt_;
  uint32_t options_ = 0;      // options received
  uint64_t reply_bytes_ = 0;  // bytes queued during the handshake
  uint64_t skip_left_ = 0;
  std::chrono::steady_clock::time_point last_activity_;
  nbd::Request pending_;
  Bytes payload_;

  std::shared_ptr<ExportEntry> export_;
  std::shared_ptr<BlockDevice> dev_;
  // Negotiated: structured replies (NBD_OPT_STRUCTURED_REPLY), and the export
  // for which base:allocation was selected (SET_META_CONTEXT; until attach).
  bool structured_ = false;
  std::shared_ptr<ExportEntry> meta_export_;
  // The data extents of the last BLOCK_STATUS.
  nbd::KnownData known_data_;
  nbd::ExportLimits limits_;

  std::deque<Out> out_;
  bool writing_ = false;
  uint64_t inflight_ = 0;
  RequestOrder order_;  // where each request runs (Dispatch)
  bool disc_ = false;
  bool close_after_drain_ = false;
  bool closed_ = false;
  bool holds_tenant_place_ = false;
};

}  // namespace

template <typename Socket>
void NbdServer::Impl::NewConnection(Socket socket, asio::io_context& device_io, std::string peer,
                                    Listener::Slot slot) {
  std::shared_ptr<Connection<Socket>> c;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (stopping) {
      boost::system::error_code ig;
      socket.close(ig);
      log->warn("{} NBD connection refused: {}", log::Where{"", peer, 0},
                "server stopping");
      return;
    }
    const uint64_t id = next_conn_id++;
    c = std::make_shared<Connection<Socket>>(this, std::move(socket), device_io, id, std::move(peer));
    c->slot = std::move(slot);
    conns[id] = c;
  }
  c->Start();
}

void NbdServer::Impl::OnConnection(Listener::Connection c) {
  // Connections take the threads in turn; the device strand is on the next
  // thread, so that a large request overlaps reading the next one.
  const size_t k = next_io.fetch_add(1) % ios.size();
  asio::io_context& io = *ios[k];
  asio::io_context& device_io = *ios[(k + 1) % ios.size()];
  Status st;
  if (c.family == AF_UNIX) {
    UnixSocket s(asio::make_strand(io));
    if (st = AssignTo(c, s); st.ok()) NewConnection(std::move(s), device_io, std::move(c.peer), std::move(c.slot));
  } else {
    TcpSocket s(asio::make_strand(io));
    if (st = AssignTo(c, s); st.ok()) NewConnection(std::move(s), device_io, std::move(c.peer), std::move(c.slot));
  }
  if (!st.ok()) log->warn("NBD accept: {}", st.ToString());
}

}  // namespace cdp

// SPDX-License-Identifier: Apache-2.0
#include "common/nbd/nbd_server.h"

#include "common/nbd/nbd_server_impl.h"

namespace cdp {

using nbd_detail::ComputeTransmissionFlags;
using nbd_detail::ValidExportName;

// ============================================================================
// NbdServer
// ============================================================================

NbdServer::NbdServer(NbdServerOptions opts) : opts_(std::move(opts)), impl_(std::make_unique<Impl>(opts_)) {}

NbdServer::~NbdServer() { Stop(); }

Status NbdServer::AddExport(const std::string& name, std::shared_ptr<BlockDevice> device,
                            std::string description, std::string owner_tenant) {
  if (!ValidExportName(name)) {
    return Status::InvalidArgument("NBD export name must be 1..256 bytes without control characters");
  }
  if (!device) return Status::InvalidArgument("NBD export '" + name + "': no device");
  if (device->size() == 0) return Status::InvalidArgument("NBD export '" + name + "': device of size 0");
  if (!ValidBlockSize(device->preferred_block_size())) {
    return Status::InvalidArgument("NBD export '" + name + "': bad preferred block size");
  }
  if (description.size() > nbd::kMaxStringLength || !nbd::ValidWireName(description)) {
    return Status::InvalidArgument("NBD export '" + name + "': description too long or holds NUL");
  }
  auto e = std::make_shared<ExportEntry>();
  e->name = name;
  e->description = std::move(description);
  e->owner = std::move(owner_tenant);
  e->tflags = ComputeTransmissionFlags(*device);
  e->device = std::move(device);
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (!impl_->exports.emplace(name, e).second) {
    return Status::AlreadyExists("NBD export '" + name + "' exists");
  }
  return Status::OK();
}

Status NbdServer::RemoveExport(const std::string& name) {
  std::shared_ptr<ExportEntry> e;
  std::vector<std::shared_ptr<ConnectionBase>> attached;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto it = impl_->exports.find(name);
    if (it == impl_->exports.end()) return Status::NotFound("NBD export '" + name + "'");
    e = it->second;
    impl_->exports.erase(it);
    e->removed.store(true);
    for (auto& [id, w] : impl_->conns) {
      if (auto c = w.lock(); c && c->attached.load() == e.get()) attached.push_back(c);
    }
  }
  for (auto& c : attached) c->Close("export removed");
  return Status::OK();
}

std::vector<std::string> NbdServer::ExportNames() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<std::string> v;
  for (auto& [n, e] : impl_->exports) v.push_back(n);
  return v;
}

Result<NbdExportStats> NbdServer::ExportStats(const std::string& name) const {
  std::shared_ptr<ExportEntry> e;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto it = impl_->exports.find(name);
    if (it == impl_->exports.end()) return Status::NotFound("NBD export '" + name + "'");
    e = it->second;
  }
  NbdExportStats s;
  s.reads = e->reads;
  s.writes = e->writes;
  s.bytes_read = e->bytes_read;
  s.bytes_written = e->bytes_written;
  s.zero_ops = e->zero_ops;
  s.block_status_ops = e->block_status_ops;
  s.bytes_zeroed = e->bytes_zeroed;
  s.trims = e->trims;
  s.bytes_trimmed = e->bytes_trimmed;
  s.flushes = e->flushes;
  s.errors = e->errors;
  s.connections = e->connections;
  s.connections_total = e->connections_total;
  return s;
}

size_t NbdServer::connection_count() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->conns.size();
}

uint64_t NbdServer::evicted_count() const {
  return impl_->listener ? impl_->listener->stats().evicted : 0;
}
uint64_t NbdServer::idle_closed_count() const { return impl_->idle_closed.load(); }

Status NbdServer::Start() {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (m.started || m.stopping) return Status::InvalidArgument("NbdServer::Start called twice");
  }
  if (opts_.tcp.off() && opts_.unix_path.empty()) {
    return Status::InvalidArgument("NBD server: neither a TCP port nor a Unix socket path");
  }
  if (opts_.io_threads < 1 || opts_.worker_threads < 1) {
    return Status::InvalidArgument("NBD server: io_threads and worker_threads must be >= 1");
  }
  if (opts_.max_request_bytes == 0 || opts_.max_skip_bytes < opts_.max_request_bytes) {
    return Status::InvalidArgument("NBD server: max_skip_bytes must be >= max_request_bytes > 0");
  }
  if (opts_.max_connections < 1) return Status::InvalidArgument("NBD server: max_connections must be >= 1");
  if (opts_.tls_mode == NbdServerOptions::TlsMode::kRequire && opts_.tls == nullptr) {
    return Status::InvalidArgument("NBD server: TLS required but no TLS credentials");
  }
  if (opts_.max_options < 1) return Status::InvalidArgument("NBD server: max_options must be >= 1");
  if (opts_.read_threads < 0 || opts_.read_threads > 64) {
    return Status::InvalidArgument("NBD server: read_threads must be 0..64");
  }
  // One io_context per thread, made before the listener can hand over a
  // socket (nbd_server.h, "Threads").
  const int n = opts_.io_threads + opts_.worker_threads;
  for (int i = 0; i < n; ++i) {
    m.ios.push_back(std::make_unique<asio::io_context>(1));  // run by one thread: no hand-offs
    m.guards.push_back(asio::make_work_guard(*m.ios.back()));
  }
  if (opts_.read_threads > 0) {
    m.read_io = std::make_unique<asio::io_context>(opts_.read_threads);
    m.guards.push_back(asio::make_work_guard(*m.read_io));
  }
  Listener::Options lo;
  lo.name = "nbd";
  lo.tcp = opts_.tcp;
  lo.unix_path = opts_.unix_path;
  lo.max_connections = size_t(opts_.max_connections);
  lo.unix_mode = opts_.unix_mode;
  lo.unix_group = opts_.unix_group;
  m.listener = std::make_unique<Listener>(lo, [&m](Listener::Connection c) { m.OnConnection(std::move(c)); });
  if (Status s = m.listener->Start(); !s.ok()) return s.WithContext("NBD server");
  port_ = m.listener->tcp_port();
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.started = true;
  }
  // Each thread runs its own io_context: the socket I/O and device calls of
  // the connections given to it (nbd_server.h, "Threads").
  for (int i = 0; i < n; ++i) m.threads.emplace_back([&m, i] { m.ios[size_t(i)]->run(); });
  for (int i = 0; i < opts_.read_threads; ++i) m.threads.emplace_back([&m] { m.read_io->run(); });
  m.log->info("NBD server listening on {}{}{}{}",
              opts_.tcp.off() ? std::string() : HostPort{opts_.tcp.host, port_.load()}.ToString(),
              !opts_.tcp.off() && !opts_.unix_path.empty() ? " and " : "",
              opts_.unix_path.empty() ? std::string() : "unix:" + opts_.unix_path,
              opts_.tls_mode == NbdServerOptions::TlsMode::kRequire ? " (TLS required on TCP)"
              : opts_.tls != nullptr                                 ? " (TLS offered)"
                                                                     : "");
  return Status::OK();
}

void NbdServer::Stop() {
  Impl& m = *impl_;
  std::vector<std::shared_ptr<ConnectionBase>> conns;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (m.stopping) return;
    m.stopping = true;
    if (!m.started) return;
    for (auto& [id, w] : m.conns) {
      if (auto c = w.lock()) conns.push_back(c);
    }
  }
  m.listener->Stop();  // no new connection from here on; the Unix socket file is removed
  for (auto& c : conns) c->Close("server stopping");
  conns.clear();
  // Device calls running finish; their replies go nowhere. Every connection
  // is gone before a thread may leave its io_context (Impl::Live).
  {
    std::unique_lock<std::mutex> lock(m.live_mu);
    m.live_cv.wait(lock, [&m] { return m.live == 0; });
  }
  for (auto& g : m.guards) g.reset();
  for (auto& t : m.threads) t.join();
  m.threads.clear();
  m.log->info("NBD server stopped");
}

}  // namespace cdp

// SPDX-License-Identifier: Apache-2.0
// The NBD server's internals, shared by its two files and no one else:
// the export table entry, the connection base the server tracks, a
// client's export scope, and NbdServer::Impl (exports, connections,
// listener, threads). nbd_server.cc runs the server and its export table;
// nbd_connection.cc is one client connection (the pipeline of
// nbd_server.h) and how the listener hands sockets to it.
//
// Thread safety: as NbdServer::Impl's members say.
#pragma once

#include "common/nbd/nbd_server.h"

#include <openssl/ssl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <optional>
#include <thread>
#include <type_traits>

#include "common/base/asio_status.h"
#include "common/base/log.h"
#include "common/crypto/pki.h"
#include "common/nbd/nbd_proto.h"
#include "common/nbd/nbd_replies.h"
#include "common/nbd/nbd_request_order.h"
#include "common/net/listener.h"
#include "common/net/tls_stream.h"


namespace cdp {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using unix_proto = asio::local::stream_protocol;

// ============================================================================
// Server internals
// ============================================================================

namespace nbd_detail {

using Strand = asio::strand<asio::io_context::executor_type>;
using TcpSocket = asio::basic_stream_socket<tcp, Strand>;
using UnixSocket = asio::basic_stream_socket<unix_proto, Strand>;

constexpr size_t kInputBufferSize = 128u << 10;
constexpr uint64_t kMaxOptionSkip = 1u << 20;  // over-long options beyond this close the connection
constexpr uint64_t kRequestOverhead = 4096;    // in-flight charge of a request without data
constexpr size_t kMaxGather = 64;              // replies written by one gather write

}  // namespace nbd_detail

namespace nbd_detail {

struct ExportEntry {
  std::string name;
  std::string description;
  std::string owner;  // tenant; "" = every client
  std::shared_ptr<BlockDevice> device;
  uint16_t tflags = 0;
  std::atomic<bool> removed{false};

  std::atomic<uint64_t> reads{0}, writes{0}, bytes_read{0}, bytes_written{0};
  std::atomic<uint64_t> zero_ops{0}, bytes_zeroed{0}, trims{0}, bytes_trimmed{0};
  std::atomic<uint64_t> flushes{0}, errors{0}, connections{0}, connections_total{0};
  std::atomic<uint64_t> block_status_ops{0};
};

// A queued reply. A READ reply (header + data) lives in `block`, allocated
// without being zero-filled first: the device overwrites every data byte,
// and a failed read sends the header alone. `charge` is what it counts
// against the connection's in-flight cap until written.
struct Reply {
  Bytes data;
  uint64_t charge = 0;
  std::unique_ptr<uint8_t[]> block;
  size_t block_size = 0;
  asio::const_buffer Buffer() const { return block ? asio::buffer(block.get(), block_size) : asio::buffer(data); }
  static Reply Of(Bytes bytes, uint64_t charge = 0) {
    Reply r;
    r.data = std::move(bytes);
    r.charge = charge;
    return r;
  }
};

// What a request runs against: the attached export and its device, and what
// the connection negotiated. On the connection's strand only.
struct RequestContext {
  ExportEntry& export_entry;
  BlockDevice& device;
  spdlog::logger& log;
  const std::string& peer;
  bool structured;           // NBD_OPT_STRUCTURED_REPLY: READ and BLOCK_STATUS answer in chunks
  // The data ranges of this connection's last BLOCK_STATUS, which BLOCK_STATUS
  // replaces and a structured READ consults; null for a READ on the read
  // pool, which must not touch it (another BLOCK_STATUS may run meanwhile):
  // then `read_in_known_data` says whether the READ lay in them when it was
  // dispatched.
  nbd::KnownData* known;
  bool read_in_known_data = false;
};

// Runs one transmission request (not DISC) on the export and counts it in
// its stats: the reply to send, simple or structured. `err` != 0: the
// request was refused (nbd::CheckRequest) with that errno and is not run.
// A device failure is logged and answered with its errno. nbd_requests.cc.
Reply ExecuteRequest(const RequestContext& ctx, const nbd::Request& r, Bytes payload, uint32_t err);

class ConnectionBase : public std::enable_shared_from_this<ConnectionBase> {
 public:
  virtual ~ConnectionBase() = default;
  // Closes the connection from any thread (posted to its strand).
  virtual void Close(std::string reason) = 0;
  std::atomic<const ExportEntry*> attached{nullptr};
  // The connection's place under the listener's caps; marked authenticated
  // when the client reaches transmission (until then the listener may evict it).
  Listener::Slot slot;
};

}  // namespace nbd_detail

using nbd_detail::ConnectionBase;
using nbd_detail::ExportEntry;
using nbd_detail::Strand;
using nbd_detail::TcpSocket;
using nbd_detail::UnixSocket;

namespace nbd_detail {

inline uint16_t ComputeTransmissionFlags(const BlockDevice& dev) {
  const BlockDeviceFeatures f = dev.features();
  const bool ro = dev.read_only();
  uint16_t t = nbd::kFlagHasFlags;
  if (ro) t |= nbd::kFlagReadOnly;
  if (f.flush) t |= nbd::kFlagSendFlush;
  if (f.fua) t |= nbd::kFlagSendFua;
  if (f.trim && !ro) t |= nbd::kFlagSendTrim;
  if (f.write_zeroes && !ro) t |= nbd::kFlagSendWriteZeroes;
  if (f.multi_conn) t |= nbd::kFlagCanMultiConn;
  if (f.fast_zero && f.write_zeroes && !ro) t |= nbd::kFlagSendFastZero;
  return t;
}

// Which exports a connection may see: all (no TLS, or a certificate without
// tenant), or those without owner and those of `tenant`.
struct Scope {
  bool all = true;
  std::string tenant;
  bool Sees(const ExportEntry& e) const { return all || e.owner.empty() || e.owner == tenant; }
};

inline bool ValidExportName(const std::string& name) {
  if (name.empty() || name.size() > 256) return false;
  for (unsigned char c : name) {
    if (c < 0x20 || c == 0x7f) return false;
  }
  return true;
}

}  // namespace nbd_detail

using nbd_detail::Scope;


struct NbdServer::Impl {
  explicit Impl(const NbdServerOptions& o) : opts(o), log(log::Get("nbd")) {}

  NbdServerOptions opts;
  std::shared_ptr<spdlog::logger> log;
  // One io_context per thread (nbd_server.h, "Threads"): a
  // connection's socket strand lives on one, its device strand on the next.
  std::vector<std::unique_ptr<asio::io_context>> ios;
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> guards;
  std::atomic<size_t> next_io{0};
  std::vector<std::thread> threads;
  // The read pool (nbd_server.h, "Request pipeline"): opts.read_threads
  // threads sharing one io_context, running READs that may block on the
  // disk; null when read_threads is 0.
  std::unique_ptr<asio::io_context> read_io;
  std::unique_ptr<Listener> listener;

  mutable std::mutex mu;
  std::map<std::string, std::shared_ptr<ExportEntry>> exports;
  std::map<uint64_t, std::weak_ptr<ConnectionBase>> conns;
  uint64_t next_conn_id = 1;
  std::map<std::string, size_t> tenant_conns;  // connections in transmission per tenant
  bool started = false;
  bool stopping = false;

  std::atomic<uint64_t> idle_closed{0};

  // Connection objects alive. A connection's strands may be on two threads'
  // io_contexts, so a thread must not leave its run() while a connection
  // could still queue work on it: Stop waits for none to be left before it
  // lets the threads go. A Live is a member of each connection.
  std::mutex live_mu;
  std::condition_variable live_cv;
  size_t live = 0;
  class Live {
   public:
    explicit Live(Impl* m) : m_(m) {
      std::lock_guard<std::mutex> lock(m_->live_mu);
      ++m_->live;
    }
    ~Live() {
      std::lock_guard<std::mutex> lock(m_->live_mu);
      if (--m_->live == 0) m_->live_cv.notify_all();
    }
    Live(const Live&) = delete;
    Live& operator=(const Live&) = delete;

   private:
    Impl* m_;
  };

  // The export a client asked for, among those it may see; "" is the only
  // one when there is exactly one. An export it may not see is not found.
  std::shared_ptr<ExportEntry> Find(const std::string& name, const Scope& scope) const {
    std::lock_guard<std::mutex> lock(mu);
    if (name.empty()) {
      std::shared_ptr<ExportEntry> only;
      for (auto& [n, e] : exports) {
        if (!scope.Sees(*e)) continue;
        if (only) return nullptr;
        only = e;
      }
      return only;
    }
    auto it = exports.find(name);
    return it == exports.end() || !scope.Sees(*it->second) ? nullptr : it->second;
  }
  std::vector<std::shared_ptr<ExportEntry>> Snapshot(const Scope& scope) const {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<std::shared_ptr<ExportEntry>> v;
    for (auto& [n, e] : exports) {
      if (scope.Sees(*e)) v.push_back(e);
    }
    return v;
  }
  // Per-tenant cap (NbdServerOptions::max_connections_per_tenant): takes one
  // of `tenant`'s places among connections in transmission, or returns false
  // at the cap. GiveTenantPlace returns one taken.
  bool TakeTenantPlace(const std::string& tenant) {
    std::lock_guard<std::mutex> lock(mu);
    size_t& n = tenant_conns[tenant];
    if (opts.max_connections_per_tenant > 0 && n >= size_t(opts.max_connections_per_tenant)) {
      if (n == 0) tenant_conns.erase(tenant);
      return false;
    }
    ++n;
    return true;
  }
  void GiveTenantPlace(const std::string& tenant) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = tenant_conns.find(tenant);
    if (it != tenant_conns.end() && --it->second == 0) tenant_conns.erase(it);
  }
  void Unregister(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu);
    conns.erase(id);
  }

  template <typename Socket>
  void NewConnection(Socket socket, asio::io_context& device_io, std::string peer, Listener::Slot slot);
  void OnConnection(Listener::Connection c);
};

}  // namespace cdp

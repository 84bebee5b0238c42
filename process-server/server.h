// ProcessServer: the enterprise-site daemon between agents and the master target.
//
// ===================== Agent-facing contract (protocol v1) =====================
// Transport: TCP to `listen` (default port 7400), frames of common/protocol.h,
// one thread per agent connection (common/channel.h).
//  1. ServerHandshake: the agent says Hello{role = kAgent, tenant, client_id};
//     secrets are the per-tenant secrets of the config. Any other role, or a
//     failed proof, closes the connection.
//  2. VolumeOpen{name, size, block_size, uuid, generation}: the PS opens (or
//     creates) the tenant's spool for that volume, forwards the open to the
//     master target (it waits at most `mt_open_wait` for the MT's answer) and
//     replies VolumeOpenReply{volume_id, durable_seq}, where durable_seq is the
//     highest sequence durable in the spool, or the MT's applied sequence if that
//     is higher. volume_id is valid on this connection only. An invalid name ->
//     Nack{kBadRecord}; a generation different from the one the spool was made
//     for -> Nack{kWrongGeneration}; I/O failure -> Nack{kInternal}.
//  3. WriteBatch{volume_id, records}: contiguous sequences. Records with
//     seq <= durable are duplicates and skipped; a first new record past
//     durable+1 -> Nack{kGap, expected_seq = durable+1}. Accepted records are
//     appended to the spool and group-committed (one fdatasync covers every
//     batch waiting); then Ack{volume_id, durable_seq} (cumulative: everything
//     <= durable_seq is durable). Spool over quota -> Nack{kBusy} (nothing of the
//     batch is kept; retry later / fall back to bitmap mode); the spool accepts
//     again once shipping has drained it below the resume mark. Unknown
//     volume_id -> Nack{kUnknownVolume}. Bad record shape -> Nack{kBadRecord}.
//     All-zero data records are stored and shipped as kZero. Batches the
//     agent pipelined (sent without waiting) that are already received and
//     contiguous are appended together (one fdatasync) and each still gets
//     its own reply, in order.
//  4. HashRequest{volume_id, request_id, ...}: forwarded to the MT; its
//     HashResponse is relayed back with the agent's volume_id and request_id
//     (resync). MT unreachable or not answering within `hash_timeout` ->
//     Nack{kInternal, message "master target unavailable"}.
//  5. Heartbeat{sent_us}: answered with Heartbeat{now, echo_us = sent_us}.
//  A malformed frame (bad CRC, bad payload, wrong frame sequence) or an
//  unexpected message type closes that connection with a logged reason;
//  nothing of it is spooled.
// ==============================================================================
//
// Master-target side: for every tenant, `connections` TCP connections to the
// MT (role kProcessServer, the tenant's secret); each volume is shipped on one
// of them (chosen by a hash of its name), so its frames stay in order. Each
// connection has compress_threads/connections sender threads (the compression
// pool: FrameChannel::Send compresses in the sending thread); a volume is
// always shipped by one of them. See mt_link.h for the shipping state machine.
//
// Control (common/http_server.h, default port 9101):
//   GET  /metrics, /status
//   GET  /v1/volumes               every volume: spool backlog, ages, rates, ratio, link state
//   GET  /v1/throttle              the throttle's state
//   POST /v1/throttle              {"mbps": N, "schedule": "20@08:00-18:00"} replaces it
//
// Spool layout: <spool_dir>/<tenant>/<volume>/ (spool.h) plus volume.meta
// (docs/formats/spool.md). At start every existing spool is reopened and its
// backlog is shipped before any agent connects.
//
// Thread safety: Start()/Stop() from one owning thread; everything else is
// internally synchronized.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <boost/json/value.hpp>

#include "common/clock.h"
#include "common/env.h"
#include "common/protocol.h"
#include "common/status.h"
#include "common/throttle.h"

namespace cdp::metrics {
class Registry;
}

namespace cdp::ps {

class Volume;
class MtLink;

struct ProcessServerOptions {
  Env* env = nullptr;          // files; must outlive the server
  Clock* clock = nullptr;      // time; must outlive the server
  std::string listen_host = "0.0.0.0";
  uint16_t listen_port = 7400;  // 0 = ephemeral (tests); see agent_port()
  std::string control_host = "127.0.0.1";
  uint16_t control_port = 9101;  // 0 = ephemeral
  bool control_enabled = true;
  std::string mt_host = "127.0.0.1";
  uint16_t mt_port = 7500;
  std::string client_id = "process-server";
  std::map<std::string, std::string> tenants;  // tenant -> secret
  std::string spool_dir = "/var/lib/opencdp/ps/spool";
  uint64_t quota_bytes = 0;           // per volume backlog; 0 = unlimited
  uint64_t segment_bytes = 64u << 20;
  proto::Codec codec = proto::Codec::kZstd;
  int level = 1;
  std::map<std::string, std::pair<proto::Codec, int>> volume_codecs;  // "tenant/volume" -> codec, level
  uint64_t frame_bytes = 1u << 20;    // raw record bytes per shipped frame
  int max_inflight = 8;               // frames per volume not yet acknowledged
  int connections = 1;                // MT connections per tenant
  int compress_threads = 0;           // compression pool per tenant; 0 = CPU cores
  ThrottleOptions throttle;
  uint64_t backoff_min_ms = 100;
  uint64_t backoff_max_ms = 30'000;
  uint64_t mt_open_wait_ms = 5'000;
  uint64_t hash_timeout_ms = 60'000;
  uint64_t ack_timeout_ms = 120'000;  // no MT progress with frames in flight: reconnect
  metrics::Registry* registry = nullptr;  // optional; must outlive the server
};

class ProcessServer {
 public:
  explicit ProcessServer(ProcessServerOptions options);
  ~ProcessServer();  // Stop()s
  ProcessServer(const ProcessServer&) = delete;
  ProcessServer& operator=(const ProcessServer&) = delete;

  // Reopens existing spools, starts the MT links, the agent listener and the
  // control server. Failure: the listener or control port cannot be bound, or
  // a spool cannot be opened (the message names it).
  Status Start();
  // Stops accepting, closes every connection and joins every thread.
  // Whatever was acknowledged stays in the spool. Idempotent.
  void Stop();

  uint16_t agent_port() const { return agent_port_; }
  uint16_t control_port() const { return control_port_; }

  // JSON of every volume (the /v1/volumes body).
  boost::json::value VolumesJson();
  boost::json::value StatusJson();

  // Test and tool hooks.
  Throttle& throttle() { return *throttle_; }
  // Spool stats of one volume; kNotFound if it is not open.
  Result<uint64_t> MtAckedSeq(const std::string& tenant, const std::string& volume);

 private:
  struct Impl;
  ProcessServerOptions opt_;
  std::unique_ptr<Throttle> throttle_;
  std::unique_ptr<Impl> impl_;
  uint16_t agent_port_ = 0;
  uint16_t control_port_ = 0;
};

}  // namespace cdp::ps

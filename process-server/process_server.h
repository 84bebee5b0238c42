// SPDX-License-Identifier: Apache-2.0
// ProcessServer: the enterprise-site daemon between agents and the master target.
//
// The agent-facing protocol is in process-server/agent_session.h, the control
// API in process-server/ps_control_api.h.
//
// Master-target side: for every tenant, `connections` TCP connections to the
// MT (role kProcessServer, the tenant's secret); each volume is shipped on one
// of them (chosen by a hash of its name), so its frames stay in order. Each
// connection has compress_threads/connections sender threads (the compression
// pool: FrameChannel::Send compresses in the sending thread); a volume is
// always shipped by one of them. See mt_link.h for the shipping state machine.
//
// Copies: with more master targets (`more_mts`), every MT gets its own set of
// links (per tenant, `connections` each, its own sender threads), and a volume
// with N copies (`copies`, `volume_copies`; default every MT) is shipped to
// the first N MTs in parallel, each from its own cursor in the one spool
// (spooled_volume.h: a record is released when every copy acknowledged it,
// so quota and back-pressure follow the slowest copy; one MT down or slow
// never holds back the others' shipping). Copy 0, the primary (`mt`), also
// answers what is not replication: the agent's VolumeOpen wait, hash
// requests (resync, verify) and the failback relay (FailbackPlan, Pull).
// Every copy receives the same records with the same sequences, so recovery
// points (tags) have the same sequence at every MT. The throttle is shared:
// it caps the sum of every copy's shipping.
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

#include "common/base/clock.h"
#include "common/base/host_port.h"
#include "common/base/status.h"
#include "common/daemon/daemon.h"
#include "common/env/env.h"
#include "common/env/file_cache_env.h"
#include "common/http/control_token.h"
#include "common/net/throttle.h"
#include "common/wire/protocol.h"
#include "common/wire/replication_sender.h"

namespace cdp::metrics {
class Registry;
}

namespace cdp::ps {

class SpooledVolume;
class MtLink;

// One copy of a volume (ProcessServer::Copies, /v1/volumes "copies").
struct CopyStatus {
  size_t copy = 0;
  std::string mt;               // host:port
  uint64_t acked_seq = 0;       // its cursor
  uint64_t lag_records = 0;     // spooled records above it
  uint64_t lag_bytes = 0;
  double lag_seconds = 0;       // age of the oldest record it has not acknowledged (0: none)
  bool lost = false;            // the spool cannot serve it (resync needed)
  bool undeliverable = false;   // stalled at records the spool cannot give it (CopyState)
  std::string link;             // its link's state
  std::string stalled;
  std::string fenced;
};

// A link to a master target as the PS ships it: 1 MiB frames, 32 in flight,
// heartbeats every 10 s, 120 s without progress: reconnect.
inline repl::LinkOptions PsLinkDefaults() {
  repl::LinkOptions l;
  l.peer = HostPort{"127.0.0.1", 7500};
  l.client_id = "process-server";
  l.frame_bytes = 1u << 20;
  l.max_inflight = 32;
  l.heartbeat_ms = 10'000;
  l.dead_peer_ms = 120'000;
  return l;
}

struct ProcessServerOptions {
  Env* env = nullptr;          // files; must outlive the server
  Clock* clock = nullptr;      // time; must outlive the server
  // Addresses: port 0 = ephemeral (tests; see agent_port()), off() = none.
  HostPort listen{"0.0.0.0", 7400};    // agents
  HostPort control{"127.0.0.1", 9101};  // control API and /metrics; may be off
  HostPort mt{"127.0.0.1", 7500};       // the master target (the primary: copy 0)
  std::vector<HostPort> more_mts;       // more master targets: copy 1, 2, ... (config: further `mt` keys)
  int copies = 0;                       // copies per volume, primary first; 0 = every MT
  std::map<std::string, int> volume_copies;  // "tenant/volume" -> copies (1..MTs)
  uint64_t cursor_sync_ms = 1000;       // copy cursors persisted at most this often (spooled_volume.h)
  std::map<std::string, std::string> tenants;  // tenant -> secret
  std::string spool_dir = "/var/lib/opencdp/ps/spool";
  uint64_t quota_bytes = 0;           // per volume backlog; 0 = unlimited
  uint64_t segment_bytes = 64u << 20;
  proto::Codec codec = proto::Codec::kZstd;
  int level = 1;
  std::map<std::string, std::pair<proto::Codec, int>> volume_codecs;  // "tenant/volume" -> codec, level
  // Every link to a master target: who we are (client_id), raw record bytes
  // per shipped frame, frames per volume not yet acknowledged, back-off, and
  // dead_peer_ms (no MT progress with frames in flight: reconnect). Each link
  // gets its own peer (mt, more_mts), tenant and secret (tenants) and its
  // share of compress_threads as workers.
  repl::LinkOptions mt_link = PsLinkDefaults();
  std::map<std::string, int> volume_inflight;  // "tenant/volume" -> its own max_inflight (LoRS threads)
  int connections = 1;                // MT connections per tenant
  ConnectionCaps connection_caps;     // agent connections (the data listener)
  // TLS to agents and to the MT (common/net/tls_stream.h). The config's default is
  // on; options built by hand (in-process tests) are clear unless they set it.
  TlsSettings tls = TlsSettings::Off();
  // Tokens of the control API (common/http/control_token.h); the admin token file
  // defaults to <spool_dir>/control.token. The config's default is on;
  // options built by hand are open unless they set it.
  ControlAuthSettings control_auth = ControlAuthSettings::Off();
  int compress_threads = 0;           // compression pool per tenant; 0 = CPU cores
  // Spool files open at once, whatever the number of volumes
  // (common/env/file_cache_env.h); 0: no bound (one open segment per volume).
  size_t max_open_files = 1000;
  ThrottleOptions throttle;
  uint64_t mt_open_wait_ms = 5'000;
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

  // Loads the TLS files again (SIGHUP) for new agent and MT connections; the
  // ones up keep theirs. On failure the current credentials stay. OK with TLS off.
  Status ReloadTls();

  uint16_t agent_port() const { return agent_port_; }
  uint16_t control_port() const { return control_port_; }

  // JSON of every volume (the /v1/volumes body).
  boost::json::value VolumesJson();
  boost::json::value StatusJson();

  // An operator's re-protect (cdpctl reprotect, POST /v1/reprotect): the
  // volume's next generation may replace its spool once the spool has
  // nothing left to deliver (GetVolume in process_server_impl.h). Once,
  // until the daemon restarts, like the master target's. `tenant` "" finds
  // the volume by name in any tenant (kInvalidArgument when two have it).
  // Returns the generation allowed; kNotFound when no spool of the volume is
  // open here (it does not replicate through this PS).
  struct ReprotectArm {
    std::string tenant;
    uint64_t generation = 0;
    uint64_t undelivered_records = 0;  // still to deliver before the switch
  };
  Result<ReprotectArm> ArmReprotect(const std::string& tenant, const std::string& volume);

  // Test and tool hooks.
  Throttle& throttle() { return *throttle_; }
  // Spool stats of one volume; kNotFound if it is not open.
  Result<uint64_t> MtAckedSeq(const std::string& tenant, const std::string& volume);
  // Every copy of one volume (its MT, cursor, stall); kNotFound if not open.
  Result<std::vector<CopyStatus>> Copies(const std::string& tenant, const std::string& volume);

  struct Impl;  // process-server/process_server_impl.h

 private:
  // Binds the control server and adds its routes (control_api.cc).
  Status StartControl();
  ProcessServerOptions opt_;
  std::unique_ptr<FileCacheEnv> files_;  // over the given env when max_open_files > 0; opt_.env then points here
  std::unique_ptr<FileLock> spool_lock_;  // <spool_dir>/LOCK: one daemon per spool
  std::unique_ptr<Throttle> throttle_;
  std::unique_ptr<Impl> impl_;
  uint16_t agent_port_ = 0;
  uint16_t control_port_ = 0;
};

}  // namespace cdp::ps

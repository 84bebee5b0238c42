// SPDX-License-Identifier: Apache-2.0
// MasterTarget: the provider-side daemon core — accepts process servers over
// TCP, applies their write batches to per-tenant replica volumes (ReplicaVolume), and
// serves the control API and point-in-time NBD exports.
//
// The process-server protocol is in master-target/ps_session.h, the control
// API in master-target/mt_control_api.h.
//
// Files: <data_dir>/tenants/<tenant>/volumes/<volume>/{replica.img, index.db, journal/}
//        <data_dir>/tenants/<tenant>/volumes/<volume>/failover.{cow,bitmap}
//             (the promoted failover's persistent overlay, master-target/export.h)
//        <data_dir>/tenants/<tenant>/exports/<n>.cow  (test export overlays,
//             removed at start)
// Every path is built from validated names (ValidName) under the
// tenant's directory; one tenant's volumes are never reachable by another.
//
// Lifecycle: construct -> Start() (opens every volume: crash recovery first,
// then the promoted failover exports are served again, then listeners) ->
// Stop() (idempotent; the destructor calls it).
//
// Thread safety: Start/Stop from the owning thread; everything else is
// internal (one thread per connection, the HTTP and NBD servers' threads, one
// retention thread).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/base/clock.h"
#include "common/base/host_port.h"
#include "common/base/result.h"
#include "common/base/status.h"
#include "common/crypto/seal.h"
#include "common/daemon/daemon.h"
#include "common/daemon/metrics.h"
#include "common/env/env.h"
#include "common/http/control_token.h"
#include "master-target/replica_volume.h"

namespace cdp {
class FrameChannel;
class NbdServer;
namespace http {
class Server;
}
}  // namespace cdp

namespace cdp::mt {

class PointInTimeDevice;

struct MasterTargetOptions {
  Env* env = nullptr;               // POSIX env in the daemon; must outlive the MasterTarget
  const Clock* clock = nullptr;     // must outlive the MasterTarget
  std::string data_dir;             // real directory (sqlite lives there too)
  // Where volumes are kept — replica, undo journal, index, digest store and a
  // failover's overlay — the storage backend: nullptr = `env` under data_dir
  // (local files). Otherwise that Env under store_dir, the index through an
  // sqlite::EnvVfs over it: a storage::CephEnv keeps every volume in a Ceph
  // pool (docs/operations.md), and data_dir keeps only this daemon's own
  // files (its control token, writable export overlays). Another master
  // target given the same store serves the same volumes (a takeover).
  std::shared_ptr<Env> store;
  std::string store_dir;
  // What the store is, for the log and /status ("ceph", "ceph pool rbd ...").
  std::string store_kind = "local";
  std::string store_description;
  std::map<std::string, std::string> tenants;  // name -> secret
  // name -> bytes a tenant may use (sum of its volumes' sizes and journals);
  // absent or 0 = unlimited.
  std::map<std::string, uint64_t> tenant_quota_bytes;
  // Addresses: port 0 = ephemeral (tests), off() = none.
  HostPort listen{"0.0.0.0", 7500};     // process servers
  HostPort control{"127.0.0.1", 9102};  // control API and /metrics; may be off
  HostPort nbd{"127.0.0.1", 10810};     // point-in-time exports; may be off
  ConnectionCaps connection_caps;  // process server connections (the data listener)
  size_t max_volumes_per_tenant = 256;  // a VolumeOpen creating one more is refused
  // Ranged work one WriteBatch may ask (bytes read into the undo journal);
  // more -> Nack kBadRecord. Below proto::kMaxBatchWork, batches that sources
  // legitimately cut at that size are refused too (their volume stalls).
  uint64_t max_batch_work = proto::kMaxBatchWork;
  // Undo-journal bytes all of a tenant's volumes may hold; once reached, its
  // batches get Nack kBusy until retention frees journal (0 = unlimited). The
  // journal passes the cap by at most one batch.
  uint64_t max_journal_bytes_per_tenant = 0;
  uint64_t segment_bytes = 64ull << 20;
  // zstd level of the old data in undo journals (0: stored as it is), and
  // per tenant where it differs.
  int journal_zstd_level = 1;
  std::map<std::string, int> tenant_journal_zstd_level;
  // VolumeOptions::replica_direct_io of every volume (config: replica_io).
  bool replica_direct_io = true;
  // The local store (no `store`): at most this many of its files open at
  // once (common/env/file_cache_env.h), whatever the number of volumes; the
  // index then goes through the same Env (sqlite::EnvVfs). 0: no bound, a
  // volume keeps its ~9 files open and sqlite opens the index itself.
  size_t max_open_files = 1000;
  uint64_t point_interval_us = 5'000'000;
  bool points_require_flush = false;  // VolumeOptions::points_require_flush
  // The history lock (retention.lock_us, master-target/history_lock.h) is
  // 24 h unless the admin configures it.
  RetentionPolicy retention{0, 0, kDefaultHistoryLockUs};
  static constexpr uint64_t kDefaultHistoryLockUs = 24ull * 3600 * 1'000'000;
  // Per volume ("TENANT/VOLUME"): the oldest point kept, in place of
  // retention.max_age_us (LoRS's "duration"; volume_retention in the config).
  std::map<std::string, uint64_t> volume_max_age_us;
  // The history lock per tenant ("TENANT") and per volume ("TENANT/VOLUME"),
  // in place of retention.lock_us (tenant_retention_lock,
  // volume_retention_lock); the volume's wins.
  std::map<std::string, uint64_t> tenant_lock_us;
  std::map<std::string, uint64_t> volume_lock_us;
  // An anomaly's suspect-clean point is kept at least this long unless the
  // admin acknowledges it (anomaly_hold).
  uint64_t anomaly_hold_us = 7ull * 86'400'000'000;
  uint64_t retention_check_us = 10'000'000;
  uint32_t handshake_timeout_ms = 10'000;
  // TLS on the data listener (common/net/tls_stream.h). The config's default is
  // on (common/daemon/daemon.h); options built by hand (in-process tests) are clear
  // unless they set it.
  TlsSettings tls = TlsSettings::Off();
  // Tokens of the control API (common/http/control_token.h): the admin token
  // defaults to <data_dir>/control.token, tenant tokens live in
  // <data_dir>/tenant_tokens. The config's default is on; options built by
  // hand are open unless they set it.
  ControlAuthSettings control_auth = ControlAuthSettings::Off();
  // NBD exports: TLS required (NBD_OPT_STARTTLS with the credentials above;
  // a client sees only its certificate's tenant's exports, a tenant-less mt
  // certificate sees all). Needs tls.enabled. The config's default is on;
  // options built by hand are clear unless they set it.
  bool nbd_tls = false;
  uint32_t nbd_idle_timeout_ms = 10 * 60 * 1000;  // attached client without requests
  int nbd_max_connections = 256;
  // NbdServerOptions::read_threads: the exports' read pool.
  int nbd_read_threads = 4;
  // Per tenant (0 = no cap): NBD connections in transmission
  // (NbdServerOptions::max_connections_per_tenant), and exports StartExport
  // keeps at once (a failover's export is not counted).
  int nbd_max_connections_per_tenant = 0;
  int max_exports_per_tenant = 0;
  // The WAN link's capacity (Mbit/s; 0 = not known), for each volume's share
  // of it on the dashboard (GET /v1/lag).
  double link_mbit = 0;
  // Tenants whose agents may connect straight to the MT (role "agent" over
  // TLS, or the agent role in clear text). Everyone else must be a process server.
  std::set<std::string> direct_agent_tenants;
};

class MasterTarget {
 public:
  explicit MasterTarget(MasterTargetOptions opts);
  ~MasterTarget();
  MasterTarget(const MasterTarget&) = delete;
  MasterTarget& operator=(const MasterTarget&) = delete;

  // Opens every existing volume (crash recovery), then binds the listeners and
  // starts the threads. Failure: the first error; nothing is left running.
  Status Start();
  void Stop();

  // Loads the TLS files again (SIGHUP): new connections use them, the ones up
  // keep theirs. On failure the current credentials stay. OK (nothing to do)
  // with TLS off.
  Status ReloadTls();

  uint16_t port() const { return port_.load(); }          // data listener
  uint16_t control_port() const;
  uint16_t nbd_port() const;
  metrics::Registry& registry() { return registry_; }

  // The volume `name` of `tenant`, if open. For tests and the control API.
  std::shared_ptr<ReplicaVolume> FindVolume(const std::string& tenant, const std::string& name);

  // Starts an NBD export of the volume at `point_seq`; returns its name.
  // kOutOfRange for an unreachable point, kNotFound for an unknown volume.
  // A sealed volume's export serves its stored space: the stored
  // (encrypted) blocks, then their MACs (DeviceSize() bytes). The master
  // target never takes the keys; the tenant decrypts at its own site
  // (`cdpctl serve`, common/nbd/sealed_device.h).
  // kBusy naming the cap (max_exports_per_tenant) when the tenant already
  // has that many exports.
  Result<std::string> StartExport(const std::string& tenant, const std::string& volume, uint64_t point_seq,
                                  bool writable);
  Status StopExport(const std::string& name);

  // Failover (`cdpctl failover`; states in master-target/replica_volume.h).
  // Promotes the volume's image at `point_seq` as the persistent read-write
  // NBD export PromotedExportName(): its overlay is created and synced, then
  // the volume's failed-over state is committed, then the export is served.
  // Idempotent: failed over at that point already -> ok, changed = false (and
  // the export served again if it was not). kAlreadyExists for another point;
  // kNotFound, kOutOfRange, kNotSupported (no NBD) as StartExport.
  // A sealed volume's promoted export is the overlay of its whole stored
  // space (blocks, then MACs): the tenant's `cdpctl serve VOLUME@failover`
  // decrypts it for the recovered machine and writes sealed blocks and their
  // MACs into it, so the provider never holds the keys, and failback and
  // re-protect move ciphertext.
  struct FailoverOutcome {
    std::string export_name;
    bool changed = false;
  };
  Result<FailoverOutcome> Failover(const std::string& tenant, const std::string& volume, uint64_t point_seq,
                                   int64_t point_id);
  // Stops the promoted export, returns the volume to protecting and removes the
  // overlay. True: changed; false: it was protecting. kAlreadyExists once committed.
  Result<bool> UndoFailover(const std::string& tenant, const std::string& volume);
  // True: changed; false: committed already. kInvalidArgument if not failed over.
  Result<bool> CommitFailover(const std::string& tenant, const std::string& volume);

  // Failback (`cdpctl failback`; states in master-target/replica_volume.h;
  // code in master_target_failback.cc). Every step is idempotent.
  //  StartFailback   failed-over -> failing-back (the failover is committed;
  //                  the promoted export keeps serving the application)
  //  FailbackPlan    (the agent's request, through its PS) the blocks the
  //                  MT side changed after the point: the journal after it
  //                  and the provider's writes to the promoted export, merged
  //  Pull            (ditto) the promoted image's blocks whose digest differs
  //                  from the agent's
  //  QuiesceFailback the promoted export refuses writes from now on (the
  //                  final pass sees a still image)
  //  FinishFailback  quiesced: the promoted image's content of every block of
  //                  the plan is applied to the replica as new history (a
  //                  tag "failback" marks the end), the export stops, its
  //                  overlay goes, and the volume is failed-back: the old
  //                  generation fenced until `cdpctl reprotect`.
  // kNotFound for an unknown volume; kInvalidArgument in the wrong state.
  Result<bool> StartFailback(const std::string& tenant, const std::string& volume);
  Result<bool> QuiesceFailback(const std::string& tenant, const std::string& volume);
  proto::FailbackPlan FailbackPlan(const std::string& tenant, const proto::FailbackPlanRequest& req);
  proto::PullResponse Pull(const std::string& tenant, const proto::PullRequest& req, proto::Codec codec, int level);
  struct FinishOutcome {
    bool changed = false;
    uint64_t blocks = 0;   // blocks written to the replica
    uint64_t seq = 0;      // the history sequence of the "failback" tag
  };
  Result<FinishOutcome> FinishFailback(const std::string& tenant, const std::string& volume);

  // The promoted export's device while one is served (tests, diagnostics); null otherwise.
  std::shared_ptr<PointInTimeDevice> PromotedDevice(const std::string& tenant, const std::string& volume);

  // "<tenant>/<volume>@failover".
  static std::string PromotedExportName(const std::string& tenant, const std::string& volume);

  struct Impl;

 private:
  MasterTargetOptions o_;
  metrics::Registry registry_;
  std::atomic<uint16_t> port_{0};
  std::unique_ptr<Impl> impl_;
};

// The per-volume files directory: <data_dir>/tenants/<tenant>/volumes/<volume>.
// Both names must be valid (ValidName); returns "" otherwise.
std::string VolumeDir(const std::string& data_dir, const std::string& tenant, const std::string& volume);

}  // namespace cdp::mt

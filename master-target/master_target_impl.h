// SPDX-License-Identifier: Apache-2.0
// The master target daemon's shared state (MasterTarget::Impl), internal to
// master-target/: the open volumes by tenant, the NBD exports, the listener,
// the HTTP server, the retention thread and the metrics. Its members are
// defined across server.cc (the core: volumes, quota, retention, lifecycle),
// ps_session.cc (one process-server connection, ps_session.h) and
// control_api.cc (the HTTP routes, control_api.h).
//
// Thread safety: `volumes` is guarded by vol_mu, `exports` and
// export_counter by export_mu; a VolEntry's ReplicaVolume is itself thread-safe.
// The listener, http and nbd pointers are set in Start() before their threads
// run and reset in Stop() after they are joined.
#pragma once

#include <boost/json.hpp>
#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "common/base/log.h"
#include "common/env/file_cache_env.h"
#include "common/http/http_server.h"
#include "common/nbd/nbd_server.h"
#include "common/net/listener.h"
#include "common/net/tls_stream.h"
#include "common/store/sqlite_vfs.h"
#include "common/wire/channel.h"
#include "common/wire/group_coordinator.h"
#include "common/wire/replication_receiver.h"
#include "master-target/export.h"
#include "master-target/lag_history.h"
#include "master-target/master_target.h"

namespace cdp::mt {

namespace json = boost::json;

struct VolEntry {
  std::string tenant, name;
  std::shared_ptr<ReplicaVolume> volume;
  LagHistory lag;  // the batches' apply lag over the last hour (ps_session.cc records it)
};

struct ExportEntry {
  std::string tenant, volume;
  uint64_t seq = 0;
  bool writable = false;
  bool promoted = false;  // a failover's export: only `failover --undo` removes it
  std::shared_ptr<PointInTimeDevice> device;  // what NBD serves (a sealed volume: its stored blocks and MACs)
};

struct MasterTarget::Impl {
  explicit Impl(MasterTarget* owner) : mt(owner), o(owner->o_), log(log::Get("mt")) {}

  MasterTarget* mt;
  MasterTargetOptions& o;
  std::shared_ptr<spdlog::logger> log;

  // The storage backend (MasterTargetOptions::store): where volumes live.
  // Declared before anything holding a volume: the VFS of the volumes'
  // indexes must outlive them.
  std::unique_ptr<FileLock> data_dir_lock;  // <data_dir>/LOCK: one daemon per data_dir
  std::unique_ptr<FileCacheEnv> local_files;  // the local store's files, at most max_open_files open
  Env* store = nullptr;
  std::string store_root;                     // volumes are under store_root/tenants/T/volumes/V
  std::unique_ptr<sqlite::EnvVfs> store_vfs;  // the index through `store`; null: sqlite's own files

  std::mutex vol_mu;
  std::map<std::string, std::shared_ptr<VolEntry>> volumes;  // "tenant/name"
  // Volumes on this MT's storage that it could not open, and why (issue 38
  // F7: an MT the Ceph lock refused looked healthy, with no volumes). Shown
  // in /status, cdpctl status and cdp_mt_volume_refused{cause}; cleared when
  // the volume opens. Under vol_mu.
  struct Refusal {
    std::string tenant, volume;
    std::string cause;    // "locked" (another MT holds it), "error"
    std::string message;
  };
  std::map<std::string, Refusal> refused;  // "tenant/name"
  void NoteRefusedLocked(const std::string& tenant, const std::string& name, const Status& why);
  void ClearRefusedLocked(const std::string& tenant, const std::string& name);

  std::unique_ptr<TlsCredentials> tls;  // null with tls = off
  std::unique_ptr<Listener> listener;  // process servers, one thread each
  std::atomic<bool> stopping{false};

  std::shared_ptr<ControlTokens> control_tokens;  // null with control_auth off
  std::unique_ptr<http::Server> http;
  // Groups whose members ship through several process servers (their rounds
  // relayed by each PS); sessions attach to it (ps_session.cc).
  std::unique_ptr<GroupCoordinator> groups;
  std::unique_ptr<NbdServer> nbd;
  std::mutex export_mu;
  std::map<std::string, ExportEntry> exports;
  uint64_t export_counter = 0;
  std::mutex failover_mu;  // serialises failover, undo and commit (taken before export_mu)

  // The promoted failover's overlay files of a volume.
  std::string OverlayData(const std::string& tenant, const std::string& volume) const;
  std::string OverlayBitmap(const std::string& tenant, const std::string& volume) const;
  // Serves the promoted export of a failed-over volume unless it is served
  // (create: new overlay files). failover_mu held. A sealed volume's
  // overlay covers its stored blocks and MACs (the keys stay at the tenant).
  Result<std::shared_ptr<PointInTimeDevice>> ServePromoted(const std::string& tenant, const std::string& volume,
                                                           const std::shared_ptr<ReplicaVolume>& v, uint64_t seq,
                                                           bool create);
  // At Start: serves every failed-over volume's export again; removes the
  // overlay files a volume that is not failed over left behind.
  void RestorePromoted();

  std::mutex ret_mu;
  std::condition_variable ret_cv;
  std::thread retention_thread;

  std::shared_ptr<metrics::Gauge> connections;
  std::shared_ptr<metrics::Counter> nacks;
  std::shared_ptr<metrics::Gauge> received_queued;    // bytes received from PSs, not yet applied
  std::shared_ptr<metrics::Counter> batches_grouped;  // applied in one group commit with an earlier batch
  repl::ReceiveStages receive_stages;                 // the PS sessions' stage costs (common/wire/stage_metrics.h)

  static std::string Key(const std::string& t, const std::string& n) { return t + "/" + n; }

  uint64_t Quota(const std::string& tenant) const;
  // Bytes a tenant uses: its volumes' sizes plus their journals. vol_mu held.
  uint64_t UsageLocked(const std::string& tenant);
  bool OverQuota(const std::string& tenant);
  // Undo-journal bytes of all the tenant's volumes.
  uint64_t JournalBytes(const std::string& tenant);

  VolumeOptions VolOpts(const std::string& tenant, const std::string& name);

  Status LoadVolumes();

  // VolumeOpen from `from`: find or create, then check identity and upstream
  // (ReplicaVolume::CheckOpen).
  Result<std::pair<std::shared_ptr<VolEntry>, ApplyOutcome>> OpenVolume(const std::string& tenant,
                                                                         const proto::VolumeOpen& m,
                                                                         const Upstream& from);

  // The receiver of process servers' (and direct agents') connections, with
  // this daemon's volumes as its sink (ps_session.cc).
  std::unique_ptr<repl::ReplicationReceiver> MakeReceiver();
  std::unique_ptr<repl::ReplicationReceiver> receiver;

  void RetentionLoop();

  // Applies the retention policy to every volume (of `tenant` only when non-empty).
  json::array RunRetention(const std::string& tenant = "");

  // Finds a volume from "tenant" + "volume" (tenant optional when unique) as
  // `caller` may see it: a tenant caller finds only its own tenant's volumes,
  // and any other volume is "no volume NAME", exactly like a missing one.
  Result<std::shared_ptr<VolEntry>> Resolve(const http::Caller& caller, const std::string& tenant,
                                            const std::string& volume);

  json::object VolumeJson(const VolEntry& e);
  // The "failover" member of VolumeJson: null unless failed over by Failover().
  json::value FailoverJson(const VolEntry& e, const VolumeStatus& st);
  // The "stall" member of VolumeJson: null unless apply is stalled
  // ({"cause": "no space" | "I/O error", "message", "since_us", "failures"}).
  static json::value StallJson(const VolumeStatus& st);

  json::value StatusJson();

  // The volume named by a request's "tenant" and "volume" parameters.
  Result<std::shared_ptr<VolEntry>> ResolveParams(const http::Request& r, const http::Params& p);
  // The sequence named by "point" (an id), "tag" (a tag point's name) or
  // "seq"; *id gets the point's id (0 for "seq") when not null.
  Result<uint64_t> PointSeq(const VolEntry& e, const http::Params& p, int64_t* id = nullptr);

  void AddRoutes();
};

}  // namespace cdp::mt

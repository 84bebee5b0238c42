// SPDX-License-Identifier: Apache-2.0
// The process server's shared state (ProcessServer::Impl), internal to
// process-server/: the open volumes (spool + counters) by tenant, the MT links
// per tenant, the agent listener, the HTTP server and the computed metric
// series. Its members are defined across server.cc (the core: volumes, links,
// spools, metrics, lifecycle) and agent_session.cc (one agent connection,
// agent_session.h); control_api.cc reads it for the routes.
//
// Thread safety: `volumes`, `links` and `series` are guarded by mu (links and
// series are filled in Start() before any connection runs); a SpooledVolume's
// counters are atomics and its spool is thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/base/log.h"
#include "common/daemon/metrics.h"
#include "common/http/http_server.h"
#include "common/net/listener.h"
#include "common/net/tls_stream.h"
#include "common/wire/channel.h"
#include "common/wire/replication_receiver.h"
#include "common/wire/group_coordinator.h"
#include "process-server/mt_link.h"
#include "process-server/process_server.h"
#include "process-server/spooled_volume.h"

namespace cdp::ps {

struct ProcessServer::Impl {
  ProcessServer* self = nullptr;
  ProcessServerOptions* opt = nullptr;
  std::shared_ptr<spdlog::logger> log = log::Get("ps");

  std::mutex mu;
  std::map<std::string, std::unique_ptr<SpooledVolume>> volumes;           // "tenant/volume"
  // Volumes whose spool was retired by a generation switch: kept alive for
  // the sessions and links that may still hold them; nothing ships them.
  std::vector<std::unique_ptr<SpooledVolume>> retired;
  // "tenant/volume" -> the generation an operator allowed (ArmReprotect).
  std::map<std::string, uint64_t> reprotect_armed;
  // [copy][tenant] -> the tenant's links to that copy's MT (copy 0: the primary).
  std::vector<std::map<std::string, std::vector<std::unique_ptr<MtLink>>>> links;
  std::vector<std::pair<std::string, metrics::Labels>> series;       // registered computed metrics

  std::unique_ptr<TlsCredentials> tls;  // null with tls = off; outlives links and listener
  std::unique_ptr<Listener> listener;  // agents, one thread each

  std::atomic<bool> stopping{false};
  // Writes each volume's copy cursors once cursor_sync_ms after they last
  // moved (spooled_volume.h), so a kill -9 forgets at most that much.
  std::thread cursor_flusher;
  std::condition_variable flusher_cv;  // with mu: stopping
  void FlushCursors();

  std::shared_ptr<ControlTokens> control_tokens;  // null with control_auth off
  std::unique_ptr<http::Server> http;

  // The link that ships `volume` to copy `copy`'s MT (null: none).
  MtLink* LinkFor(const std::string& tenant, const std::string& volume, size_t copy = 0);
  // Every MT in copy order: opt->mt, then opt->more_mts.
  std::vector<HostPort> Targets() const;
  // How many copies the volume ("tenant/volume") has: its volume_copies
  // entry, else `copies`, else every MT.
  size_t CopiesFor(const std::string& key) const;
  // New durable records: wakes the volume's link of every copy.
  void NotifyLinks(SpooledVolume* v);
  // Where the volume stands at every copy's master target (waiting at most
  // `mt_open_wait` for each): the highest durable sequence among them;
  // kUnavailable with the reason when a copy has not answered, or has none.
  Result<uint64_t> LearnPosition(SpooledVolume* v);

  std::pair<proto::Codec, int> CodecFor(const std::string& key);

  SpoolOptions SpoolOpts(const std::string& tenant, const std::string& volume);

  void RegisterMetrics(SpooledVolume* v);
  std::vector<CopyStatus> CopyStatuses(SpooledVolume* v);

  // Opens or finds the volume; ok also for a reopen by the agent. A higher
  // generation than the spool's, while the MT fences that spool, or the next
  // generation an operator armed (ProcessServer::ArmReprotect) once the spool
  // has nothing left to deliver (SpooledVolume::NothingToDeliver), retires it
  // first (RetireSpoolLocked) and creates the new generation's spool;
  // otherwise another generation is kInvalidArgument ("wrong generation").
  Result<SpooledVolume*> GetVolume(const std::string& tenant, const proto::VolumeOpen* open, const std::string& name);

  // The generation switch (agent_session.h "Re-protect"), `mu` held: takes
  // the volume's stream out of its MT link, closes the spool, renames its
  // directory to "<dir>.gen<G>.retired-<unix seconds>", syncs the parent and
  // moves the volume from `volumes` to `retired`. Nothing is deleted. On
  // failure the volume stays in `volumes` (closed) and the next open retries.
  Status RetireSpoolLocked(const std::string& key, const std::string& fence);

  // The blocks (volume block_size units), from `from_block` on, of every
  // data/zero/trim record of the volume's spool above the MT's acknowledged
  // sequence: what the original site wrote and the MT never applied. Sorted,
  // disjoint; empty when the PS has no spool of that name. Reads the spool
  // once per state of it (first, durable and acknowledged sequences): the
  // pages of one plan, with the volume fenced, share one read (unshipped_cache).
  Result<std::vector<proto::BlockExtent>> UnshippedBlocks(const std::string& tenant, const std::string& volume,
                                                          uint64_t from_block);
  struct UnshippedCache {
    const SpooledVolume* volume = nullptr;
    uint64_t first_seq = 0, durable_seq = 0, from_seq = 0;
    std::vector<proto::BlockExtent> blocks;  // all of them, from block 0
  };
  std::mutex unshipped_mu;
  std::map<std::string, UnshippedCache> unshipped_cache;  // by "tenant/volume"; unshipped_mu

  // The receiver of the agents' connections, with the spools as its sink
  // (agent_session.cc).
  std::unique_ptr<repl::ReplicationReceiver> MakeReceiver();
  repl::ReceiveStages receive_stages;  // the agent sessions' stage costs (common/wire/stage_metrics.h)
  std::unique_ptr<repl::ReplicationReceiver> receiver;
  // Consistency groups of agents shipping here (docs/groups.md); made in
  // Start before the listener, stopped after it.
  std::unique_ptr<GroupCoordinator> groups;
};

}  // namespace cdp::ps

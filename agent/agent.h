// SPDX-License-Identifier: Apache-2.0
// Agent: the cdp-agent daemon as a library. It owns, for every protected
// volume, a CaptureDevice (exported through one shared NbdServer) and a
// Sender to the process server; plus the control/metrics HTTP server, every
// route behind the agent's admin token (common/http/control_token.h; /metrics
// public only with metrics_public), so the freeze hook (run as the agent's
// user) and the whole-device hashes answer only the operator:
//
//   GET  /metrics, /status        Prometheus text / JSON status of every volume
//   POST /v1/tag {"name": "N"}    one kTag record in every volume at the same
//                                 point of the write order (consistency group),
//                                 around the optional freeze hook
//   GET  /v1/volumes              the same per-volume JSON as /status
//   GET  /v1/hashes?volume=V&region_size=&first=&count=&max_retries=
//                                 region digests of the source, each at the
//                                 sequence it describes (online verify; see
//                                 CaptureDevice::DigestAtQuietPoint)
//   POST /v1/repair {"volume", "offset", "length"}   queues the current
//                                 content of a range as resync records
//                                 (online verify's --repair)
//
// docs/agent.md ("Verify") gives the JSON of both.
//
// Tags: the freeze command (if any) runs first, bounded by freeze_timeout; then
// every volume's capture lock is taken (in configuration order), each volume
// gets its tag, the locks are released; the thaw command then always runs (also
// after a failed or timed-out freeze, or a refused tag). A tag is refused (409)
// while any volume cannot promise a consistent point (metadata/bitmap mode or a
// resync pending): a tag there would name a state the replica cannot reproduce.
//
// Thread safety: Start/Stop from the owning thread; Tag, StatusJson from any.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <boost/json/value.hpp>

#include "agent/branch_device.h"
#include "agent/branch_store.h"
#include "agent/capture_device.h"
#include "agent/failback.h"
#include "agent/group_hold.h"
#include "agent/sender.h"
#include "agent/site_state.h"
#include "common/base/clock.h"
#include "common/base/host_port.h"
#include "common/daemon/daemon.h"
#include "common/daemon/metrics.h"
#include "common/env/env.h"
#include "common/env/file_cache_env.h"
#include "common/http/control_token.h"
#include "common/http/http_server.h"
#include "common/nbd/nbd_server.h"
#include "common/net/tls_stream.h"

namespace cdp::agent {

struct VolumeConfig {
  std::string name;          // volume name (ValidName)
  std::string backing_path;  // backing file or block device
  std::string export_name;   // NBD export name ("" = the volume name)
  // Tenant-side encryption (common/crypto/seal.h): every block is sealed before it
  // leaves this host, with keys derived from AgentOptions::key_file.
  bool encrypted = false;
  // Record bytes per frame this volume ships (LoRS's "bs"); 0: batch_bytes.
  uint64_t frame_bytes = 0;
};

struct AgentOptions {
  Env* env = nullptr;            // must outlive the agent
  const Clock* clock = nullptr;  // must outlive the agent
  std::vector<VolumeConfig> volumes;
  NbdServerOptions nbd;          // listeners (tcp / unix_path)
  std::string bitmap_dir = "/var/lib/opencdp/agent";
  uint64_t budget = 64ull << 20;   // per volume
  // Ransomware detection on every volume (agent/anomaly_detector.h; the
  // config's anomaly.* keys).
  AnomalyOptions anomaly;
  uint32_t region_size = 1u << 20;
  SenderOptions sender;          // PS address, tenant, secret, batching
  // Connections to the process server, at most: the volumes are spread over
  // them (volume i on link i % n), each link one connection carrying many
  // volumes' streams, so the agent's and the PS's threads and sockets do not
  // grow per volume. A volume with its own frame_bytes has a link of its own.
  int ps_connections = 4;
  // Files (backing files, bitmaps, branch stores) open at once, whatever
  // the number of volumes (common/env/file_cache_env.h); 0: no bound.
  size_t max_open_files = 1000;
  std::string key_file;          // the tenant key file (cdpctl keys init): required by encrypted volumes
  bool sender_enabled = true;    // false: capture only (benchmarks of the tap alone)
  HostPort control{"127.0.0.1", 9100};  // HTTP server; port 0 = ephemeral, off() = none
  std::string freeze_command;    // run through /bin/sh -c before a tag ("" = none)
  std::string thaw_command;      // run after a tag, always
  uint64_t freeze_timeout_ms = 10'000;
  // The longest hold of writes a group point's coordinator may ask
  // (agent/group_hold.h); a longer one is refused. 0: every hold is refused.
  // What a compromised process server can cost the application per hold.
  uint64_t group_hold_max_ms = 200;
  // A group tag's freeze (the freeze hook, asked by the coordinator) sooner
  // than this after the last one began is refused: a compromised process
  // server cannot keep the application frozen.
  uint64_t group_freeze_min_interval_ms = 30'000;
  // TLS to the process server (common/net/tls_stream.h). The config's default is
  // on; options built by hand (in-process tests) are clear unless they set it.
  TlsSettings tls = TlsSettings::Off();
  // Tokens of the control API (common/http/control_token.h); the admin token file
  // defaults to <bitmap_dir>/control.token. The config's default is on;
  // options built by hand are open unless they set it.
  ControlAuthSettings control_auth = ControlAuthSettings::Off();
};

struct RepairResult {
  std::vector<uint64_t> seqs;  // one resync record per piece, in order
  uint64_t bytes = 0;
};

struct TagResult {
  std::vector<std::pair<std::string, uint64_t>> seqs;  // volume -> tag sequence
};

class Agent {
 public:
  explicit Agent(AgentOptions opts);
  ~Agent();  // Stop()s
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Opens every volume, starts the NBD listeners, the senders and the HTTP
  // server. Failure leaves nothing running; the message names the volume or address.
  Status Start();
  void Stop();

  // Loads the TLS files again (SIGHUP): later connections to the PS use them,
  // the ones up keep theirs. On failure the current credentials stay.
  Status ReloadTls();

  // Inserts tag `name` in every volume (see above). kInvalidArgument for a bad
  // name, kBusy when a volume is not consistent, kAborted when the freeze hook
  // failed or timed out.
  Result<TagResult> Tag(const std::string& name);

  // Queues the current content of [offset, offset+length) of `volume` as
  // resync records (CaptureDevice::ShipRange, pieces of at most
  // proto::kMaxRecordLength), retrying a piece while the queue has no room,
  // for at most `timeout_ms` in all. kNotFound (no such volume),
  // kInvalidArgument (offset or length not 4 KiB aligned, except a length
  // ending at the end of the volume; empty; past the end), kBusy (no room in
  // time: the pieces queued so far stay queued), or the read error.
  Result<RepairResult> Repair(const std::string& volume, uint64_t offset, uint64_t length,
                              uint64_t timeout_ms = 20'000);

  // Failback at the original site (`cdpctl failback`; agent/failback.h,
  // phases in agent/site_state.h; code in agent_failback.cc). Each step is
  // idempotent and persisted before it returns:
  //   BeginFailback  protecting -> failing-back: the tap refuses writes, the
  //                  branch <bitmap_dir>/<volume>.branch-g<G> is opened and
  //                  exported read-only as "<export>@branch-g<G>"
  //   FailbackPass   one pass (RunFailbackPass), failing-back only
  //   EndFailback    failing-back -> failed-back (the source equals the
  //                  provider's image; writes still refused)
  //   Reprotect(G)   to generation G (the one the master target armed; a
  //                  no-op when the volume is at G already, kInvalidArgument
  //                  unless G is the next one): failed-back -> protecting,
  //                  queue and bitmap empty (no resync). From protecting
  //                  (after a rollback at the master target): every region is
  //                  compared again.
  // kNotFound for an unknown volume; kInvalidArgument in the wrong phase.
  Result<SiteState> BeginFailback(const std::string& volume);
  Result<FailbackPassStats> FailbackPass(const std::string& volume);
  Result<SiteState> EndFailback(const std::string& volume);
  Result<SiteState> Reprotect(const std::string& volume, uint64_t generation);
  Result<SiteState> Site(const std::string& volume) const;

  boost::json::value StatusJson() const;
  uint16_t nbd_port() const { return nbd_ ? nbd_->port() : 0; }
  uint16_t control_port() const { return http_ ? http_->port() : 0; }
  metrics::Registry& registry() { return registry_; }
  CaptureDevice* device(size_t i) { return devices_.at(i).get(); }
  Sender* sender(size_t i) { return senders_.empty() ? nullptr : senders_.at(i).get(); }
  GroupHolds* group_holds() { return group_holds_.get(); }

 private:
  Status StartParts();  // Start without the clean-up
  void DropParts();     // what StartParts built, after a failure
  void RegisterMetrics(size_t i);
  CaptureDevice* FindDevice(const std::string& volume) const;
  // Per volume: the site state and, while one exists, the failback branch.
  struct VolumeSite {
    std::mutex mu;  // serialises failback steps of the volume (held through a pass)
    SiteState state;
    // `state`, readable without `mu` (/status during a pass).
    std::atomic<uint64_t> shown_generation{1};
    std::atomic<int> shown_phase{0};
    void Set(const SiteState& s) {
      state = s;
      shown_generation.store(s.generation);
      shown_phase.store(int(s.phase));
    }
    struct Branch {
      std::shared_ptr<BranchStore> store;
      std::string export_name;  // "" when not exported
    };
    std::map<uint64_t, Branch> branches;  // by the generation that failed back
    // Failback passes since the agent started, summed (/status "failback",
    // cdp_agent_failback_*): what was compared, pulled and sent.
    std::atomic<uint64_t> fb_passes{0}, fb_compared_bytes{0}, fb_pulled_bytes{0}, fb_wire_in{0}, fb_wire_out{0};
  };
  Result<size_t> VolumeIndex(const std::string& volume) const;
  std::string SitePath(size_t i) const;
  std::string BranchPrefix(size_t i, uint64_t generation) const;
  // Opens (creating it when `create`) and exports the branch of generation
  // `gen`; site mu held.
  Result<BranchStore*> OpenBranch(size_t i, uint64_t gen, bool create);
  void RegisterControlRoutes();   // agent_control_api.cc
  void RegisterFailbackRoutes();  // agent_failback.cc
  http::Response HashesRoute(const http::Request& r);
  http::Response RepairRoute(const http::Request& r);

  AgentOptions opts_;
  std::unique_ptr<FileCacheEnv> files_;  // over the given env when max_open_files > 0; opts_.env then points here
  metrics::Registry registry_;
  std::vector<std::shared_ptr<CaptureDevice>> devices_;
  std::unique_ptr<TlsCredentials> tls_;  // null with tls off; outlives the senders
  // Shared links to the PS (AgentOptions::ps_connections); outlive the senders,
  // stopped before them.
  std::vector<std::unique_ptr<repl::ReplicationSender>> links_;
  // Runs every volume's resync (one thread per link, not per volume); stopped
  // after the links, before the senders.
  std::unique_ptr<ResyncDriver> resync_driver_;
  // Group holds asked by the process server (docs/groups.md); outlives the
  // links, stopped after them.
  std::unique_ptr<GroupHolds> group_holds_;
  std::vector<std::unique_ptr<Sender>> senders_;
  std::vector<std::unique_ptr<VolumeSite>> sites_;  // one per volume
  std::unique_ptr<NbdServer> nbd_;
  std::shared_ptr<ControlTokens> control_tokens_;  // null with control_auth off
  std::unique_ptr<http::Server> http_;
  std::mutex tag_mu_;
  bool started_ = false;
  // Random per process: a sequence from /v1/hashes is only meaningful with
  // the instance (and numbering) it came from; a restarted agent may reuse it.
  const uint64_t instance_;
};

// Runs `command` through /bin/sh -c, waiting at most `timeout_ms`; on timeout
// the command is killed. OK iff it exited 0 in time.
Status RunHook(const std::string& command, uint64_t timeout_ms);

}  // namespace cdp::agent

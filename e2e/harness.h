// SPDX-License-Identifier: Apache-2.0
// E2E harness: runs the real daemon binaries (cdp-master-target,
// cdp-process-server, cdp-agent) on 127.0.0.1 with free ports and a scratch
// directory, drives them with cdpctl and real NBD clients, and waits on
// conditions with deadlines. Every daemon it starts is killed (SIGKILL) and
// reaped when its Daemon object dies; the scratch directory is removed.
//
//   Cluster c(opts)  -> Start()  ->  MT, PS, agent running, each /status answering
//                                    (config files written under <dir>/etc/)
//      writes through c.nbd_uri() (the agent's tap: nbd+unix:///<volume>?socket=...)
//      c.WaitDrained()          agent queue empty, every captured record acked by
//                               the PS and applied by the MT
//      c.Cdpctl({...})          runs the cdpctl binary against the three daemons
//      c.Kill9(Which) / c.Restart(Which)
//
// Binaries come from compile definitions (CDP_AGENT_BIN, ...), set by
// e2e/CMakeLists.txt with $<TARGET_FILE:...>.
//
// Thread safety: none; one test thread drives a Cluster.
#pragma once

#include <sys/types.h>

#include <boost/json/value.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/env/subprocess.h"
#include "common/tests/test_util.h"
#include "loadgen/local_cluster.h"

namespace cdp::e2e {

// A TCP port on 127.0.0.1 that was free a moment ago (common/tests/test_util.h).
using testing::FreePort;

// Calls `cond` until it returns true or `timeout` passes; between calls it
// waits `poll` (the wait is the polling period of a condition, never the
// synchronization itself). True iff `cond` became true in time.
bool WaitFor(const std::function<bool()>& cond, std::chrono::milliseconds timeout,
             std::chrono::milliseconds poll = std::chrono::milliseconds(50));

// How to call a control port of the cluster made last in this process (e2e
// test cases run one cluster at a time; a second master target shares its
// PKI): `token` as the bearer token, and HTTPS with that cluster's site CA,
// as every daemon's control port speaks it.
http::ClientOptions ControlClient(const std::string& token);

// One control request to 127.0.0.1:port with control token `token`
// (ControlClient): the HTTP status and body, or status 0 and the transport
// error as the body.
struct Answer {
  int status = 0;
  std::string body;
};
Answer Call(uint16_t port, const std::string& method, const std::string& target, const std::string& token,
            const std::string& body = "");

// GET https://127.0.0.1:port/target as JSON with control token `token`;
// nullopt when unreachable, not 200 or not JSON.
std::optional<boost::json::value> GetJson(uint16_t port, const std::string& target, const std::string& token);
// The same with explicit client options (a daemon of a site PKI of the test's own).
std::optional<boost::json::value> GetJson(uint16_t port, const std::string& target, const http::ClientOptions& co);

// SHA-256 of a file's contents as hex ("" on error), via sha256sum.
std::string Sha256File(const std::string& path);

// Creates a sparse file of `size` bytes. False on error.
bool MakeSparseFile(const std::string& path, uint64_t size);

// Copies a file byte for byte (cp --sparse=always). False on error.
bool CopyFile(const std::string& from, const std::string& to);

// A child process (common/env/subprocess.h) with its stdout and stderr appended
// to `log`; it dies with the test process. The destructor SIGKILLs and reaps
// it if it still runs.
class Daemon {
 public:
  // Starts argv[0] (a path) with `argv`. False if it could not be started.
  bool Start(const std::vector<std::string>& argv, const std::string& log);
  // Sends `sig`, then (for SIGKILL/SIGTERM) waits up to 20 s for the exit.
  // Returns the raw wait status, or -1 if it was not running / did not exit.
  int Stop(int sig);
  // True while the process has not exited (reaps it if it has).
  bool Running() { return p_.Running(); }
  pid_t pid() const { return p_.pid(); }
  const std::string& log() const { return log_; }

 private:
  Subprocess p_;
  std::string log_;
};

struct ClusterOptions {
  std::string volume = "vol1";
  uint64_t volume_size = 32ull << 20;
  std::string tenant = "acme";
  std::string secret = "e2e-secret-0123456789";
  std::string codec = "zstd";     // PS codec
  std::string agent_budget = "64MiB";
  std::string point_interval = "1s";  // MT crash-consistent point interval
  std::string mt_extra_config, ps_extra_config, agent_extra_config;  // more config lines (loadgen/local_cluster.h)
  bool direct_agent = false;  // the agent ships straight to the MT (loadgen/local_cluster.h)
  bool control_plain = false;  // control_tls = off: plain HTTP control ports on loopback (INSECURE)
  // 2: a second master target (Which::kMasterTargetB) and the PS ships a copy to each.
  int master_targets = 1;
};

using Which = loadgen::Role;
using loadgen::Name;

// The local cluster (loadgen/local_cluster.h) in a scratch directory, with
// what the tests check on it.
class Cluster {
 public:
  explicit Cluster(ClusterOptions o = {});
  ~Cluster();  // kills every daemon, removes the scratch directory

  // Writes the config files, creates the source volume, starts MT, PS, agent,
  // waits until each answers /status and the agent, connected, has finished
  // the volume's initial sync (tags are accepted). False (why()) on failure.
  bool Start();
  bool StartOne(Which w);
  // kill -9 of one daemon; returns once it is dead (Restart starts it again).
  bool Kill9(Which w);
  bool Restart(Which w) { return StartOne(w); }
  // SIGTERM to one daemon; returns once it exited cleanly.
  bool Stop(Which w);
  // Points the agent at the MT (true) or at the PS (false) from its next
  // start, and the MT lets the tenant's agents in from its next start
  // (LocalCluster::SetDirectAgent).
  bool SetDirectAgent(bool direct);
  // The master target's extra config lines from its next start on.
  bool SetMtExtraConfig(const std::string& lines);
  // Graceful stop (SIGTERM) of every daemon, agent first.
  void StopAll() { c_.StopAll(std::chrono::seconds(20)); }

  // Waits until the agent's queue is empty, it has no dirty or resync regions,
  // and every record it captured is acknowledged by the PS and applied by the
  // MT (MT applied_seq == agent's last sequence). False on timeout (why() says
  // what was last seen).
  bool WaitDrained(std::chrono::milliseconds timeout = std::chrono::seconds(90));

  // Runs cdpctl with the three control endpoints and their token files plus `args`.
  testing::CommandResult Cdpctl(const std::vector<std::string>& args, int timeout_ms = 60000);
  // That command line.
  std::vector<std::string> CdpctlArgv(const std::vector<std::string>& args) const;
  // Runs cdpctl --json ... and parses stdout; nullopt on a non-zero exit or bad JSON.
  std::optional<boost::json::value> CdpctlJson(const std::vector<std::string>& args);

  // `cdpctl serve SPEC --key-file KEY` (a sealed volume decrypted at the
  // tenant, common/nbd/sealed_device.h) in the background, with the tenant's
  // NBD certificates, on a Unix socket in the test's directory. Returns once
  // its socket exists (nullopt and why() if it exited or did not get there in
  // 30 s).
  struct Served {
    Subprocess process;
    std::string uri;  // nbd+unix:///VOLUME?socket=PATH
    std::string log;  // its stdout and stderr
    // SIGTERM, then its exit code (-1 if it had to be killed).
    int Stop();
  };
  std::optional<Served> Serve(const std::string& spec, const std::string& key_file);

  // Exports the recovery point `point` (an id, or "seq:N") through cdpctl,
  // copies it with nbdcopy into `dest`, and removes the export. False (why()) on error.
  bool CopyExport(const std::string& point, const std::string& dest);

  // The id of the tag point named `tag` in `cdpctl points`, or -1.
  int64_t TagPointId(const std::string& tag);

  const ClusterOptions& options() const { return o_; }
  const std::string& dir() const { return scratch_.path(); }
  std::string Path(const std::string& name) const { return scratch_.Join(name); }
  std::string source_path() const { return c_.source_path(); }
  std::string replica_path() const { return c_.replica_path(); }
  std::string nbd_uri() const { return c_.nbd_uri(); }  // the agent's tap (Unix socket)
  std::string agent_nbd_socket() const { return c_.agent_nbd_socket(); }
  // A point-in-time export as the cluster's tenant opens it (nbds:// with its
  // certificate when TLS is on).
  std::string mt_export_uri(const std::string& name) const { return c_.mt_export_uri(name); }
  std::string nbd_client_dir() const { return c_.nbd_client_dir(); }
  uint16_t mt_nbd_port() const { return c_.mt_nbd_port(); }
  uint16_t agent_control() const { return c_.control_port(Which::kAgent); }
  uint16_t ps_control() const { return c_.control_port(Which::kProcessServer); }
  uint16_t mt_control() const { return c_.control_port(Which::kMasterTarget); }
  // The second master target (master_targets = 2): its ports and its replica of the volume.
  uint16_t mtb_control() const { return c_.control_port(Which::kMasterTargetB); }
  uint16_t mtb_data_port() const { return c_.mtb_data_port(); }
  uint16_t mtb_nbd_port() const { return c_.mtb_nbd_port(); }
  std::string mtb_replica_path() const { return c_.mtb_replica_path(); }
  // A daemon's admin control token and its file (the daemon made it at first start).
  std::string token(Which w) const { return c_.token(w); }
  std::string token_path(Which w) const { return c_.token_path(w); }
  // GET /status of a daemon with its admin token; nullopt as GetJson.
  std::optional<boost::json::value> StatusOf(Which w) const;
  // A number of the test volume in the agent's /status (0 when not answered).
  uint64_t AgentU64(const char* key) const;
  uint16_t ps_data_port() const { return c_.ps_data_port(); }
  uint16_t mt_data_port() const { return c_.mt_data_port(); }
  // The site PKI of the cluster: ca.{crt,key}, {mt,ps,agent}.{crt,key}.
  std::string pki_dir() const { return c_.pki_dir(); }
  pid_t pid(Which w) { return c_.process(w).pid(); }
  const std::string& why() const { return why_; }
  // The tail of every daemon log, for failure messages.
  std::string Logs(size_t tail_bytes = 3000) const { return c_.Logs(tail_bytes); }

 private:
  ClusterOptions o_;
  testing::ScratchDir scratch_;
  loadgen::LocalCluster c_;
  std::string why_;
};

// Random writes through qemu-io ("write -P pattern off len") and nbdcopy (a
// random file copied over a region) on `uri`, deterministic from `seed`:
// `rounds` qemu-io invocations of `writes_per_round` writes each, plus one
// nbdcopy of `nbdcopy_bytes` at a random offset every round. Returns "" on
// success, else the failing command's output.
std::string RandomWrites(const std::string& uri, uint64_t volume_size, uint32_t seed, int rounds,
                         int writes_per_round, uint64_t nbdcopy_bytes, const std::string& scratch);

}  // namespace cdp::e2e

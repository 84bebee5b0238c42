// SPDX-License-Identifier: Apache-2.0
// LocalCluster: the whole product on loopback -- a real cdp-master-target,
// cdp-process-server and cdp-agent protecting one sparse volume, in one
// directory, on free ports. The one local-cluster harness: the e2e tests
// (e2e/harness.h), `cdp-loadgen sweep --local` and `cdp-loadgen cluster`
// (which `make demo` runs) all start the product through it.
//
//   <dir>/etc/{master-target,process-server,agent}.conf, etc/agent.secret
//   <dir>/etc/master-target-b.conf    with master_targets = 2 (a second MT, data in <dir>/mtb/)
//   <dir>/pki/ca.{crt,key}, {mt,ps,agent}.{crt,key}   the site CA and the daemons'
//                                     certificates (TLS on; made if missing)
//   <dir>/pki/nbd-<tenant>/           the tenant's NBD client certificate, as
//                                     libnbd's tls-certificates= wants it
//   <dir>/agent/nbd.sock              the agent's tap (Unix socket, mode 0660)
//   <dir>/source.img                  the protected volume (sparse)
//   <dir>/mt/  <dir>/ps/spool/  <dir>/agent/     the daemons' data (and each
//                                     one's control.token, made at its first start)
//   <dir>/{master-target,process-server,agent}.log   their output
//
// Start() picks free ports, writes the configs and starts MT (and MT B), PS
// and agent in that order (the agent only with start_agent), each answering
// GET /status before the next starts; a port taken between the pick and the
// bind is retried on new ports (three attempts). Daemons are started through
// common/env/subprocess.h; the destructor SIGKILLs every one still running.
//
// The benchmarks (bench/lib.sh) drive it through `cdp-loadgen cluster
// --commands` (docs/loadgen.md): start without the agent, then start, stop and
// restart single daemons with more flags (SetArgs), another volume image
// (SetVolume) or more config lines (SetExtraConfig).
//
// Thread safety: one thread drives a LocalCluster.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <sys/types.h>

#include "common/base/result.h"
#include "common/base/status.h"
#include "common/crypto/pki.h"
#include "common/env/subprocess.h"
#include "common/http/http_client.h"

namespace cdp::loadgen {

struct LocalClusterOptions {
  std::string agent_bin, ps_bin, mt_bin;  // paths of the three daemons
  std::string dir;                        // created if missing
  std::string volume = "vol";
  uint64_t volume_bytes = 1ull << 30;     // sparse source volume (kept if it exists)
  std::string tenant = "local";
  std::string secret = "local-secret-0123456789abcdef";
  std::string codec = "none";             // PS codec: none | lz4 | zstd
  int level = 1;
  int compress_threads = 0;               // 0 = the PS's default
  std::string agent_budget;               // "" = the agent's default
  std::string point_interval;             // "" = the MT's default
  std::string client_id = "local-agent";
  std::string log_level = "info";
  bool die_with_parent = false;           // daemons die with this process (tests)
  // TLS on every data link (the product's default). The certificates in
  // pki_dir ("" = <dir>/pki) are used as they are; missing ones are made
  // with common/crypto/pki.h (`cdpctl pki` does the same from the command line).
  bool tls = true;
  std::string pki_dir;
  // With tls: the control ports speak plain HTTP on loopback anyway
  // (control_tls = off, which the daemons log as INSECURE). Off by default.
  bool control_plain = false;
  // Control tokens (the product's default): each daemon makes its admin token
  // at first start in its state directory (token_path()); token() reads it.
  bool control_auth = true;
  // The agent ships straight to the master target (its `ps` is the MT's data
  // port; the MT lists the tenant in `direct_agents`). The process server
  // still starts, and stays idle.
  bool direct_agent = false;
  // More config lines ("key = value\n"...) for one daemon, e.g. a second
  // tenant at the MT or a freeze_command at the agent (tests). Both master
  // targets read mt_extra_config.
  std::string mt_extra_config, ps_extra_config, agent_extra_config;
  // More command-line flags for one daemon, after `--config FILE`: a flag
  // overrides the file's line of the same key, a multi-valued option (the
  // agent's `volume`) adds to it (common/daemon/config.h). Both master
  // targets get mt_args.
  std::vector<std::string> mt_args, ps_args, agent_args;
  // A command prefix for the master targets, e.g. {"valgrind", "--tool=callgrind"}.
  std::vector<std::string> mt_wrapper;
  // The address every listener binds (data, control, NBD), and where the
  // harness reaches them: loopback, or the address of a network namespace
  // the whole cluster runs in (`ip netns exec NS cdp-loadgen cluster --host ...`).
  std::string host = "127.0.0.1";
  // The master targets' address ("" = host): across `cdp-loadgen wanem`, the
  // harness runs in one namespace and the MTs (mt_wrapper "ip netns exec
  // NS-b") listen on the other side's address (loadgen/wan_deploy.sh).
  std::string mt_host;
  // The protected volume's file ("" = <dir>/source.img); made sparse with
  // volume_bytes when missing, kept when it exists.
  std::string volume_image;
  // 1, or 2: a second master target (Role::kMasterTargetB, <dir>/mtb/) and
  // the PS ships a copy of every volume to each (its two `mt` keys, copies = 2).
  int master_targets = 1;
  // Start() starts the agent too; false: MT and PS only (StartOne(kAgent) later).
  bool start_agent = true;
  // The agent ships to this HOST:PORT instead (a test peer such as
  // agent/tests/agent_sink, for bench/agent_bench.sh); Start() then starts
  // neither MT nor PS.
  std::string agent_ps;
};

// Makes `dir` (0700) with the NBD client files libnbd's nbds:// URIs read
// (tls-certificates=DIR): ca-cert.pem (a copy of ca_dir/ca.crt),
// client-cert.pem and client-key.pem (0600) issued by the CA of `ca_dir` for
// `id`. Files already there are kept. Failure: the pki:: errors.
Status MakeNbdClientCertificates(const std::string& ca_dir, const pki::Identity& id, const std::string& dir);

// Options for the daemons of a build tree (BUILD/agent/cdp-agent, ...) in `dir`.
LocalClusterOptions LocalClusterOptionsFor(const std::string& build_dir, const std::string& dir);

enum class Role { kMasterTarget, kProcessServer, kAgent, kMasterTargetB };
const char* Name(Role r);  // "master-target", "process-server", "agent", "master-target-b"

class LocalCluster {
 public:
  explicit LocalCluster(LocalClusterOptions o);
  ~LocalCluster();  // SIGKILLs every daemon still running
  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;

  // Creates the directories and the volume, picks ports, writes the configs
  // and starts the daemons (the agent only with start_agent). Failure: which
  // daemon, and the tail of the logs.
  Status Start();
  // Starts one daemon (with the existing configs and its args) and waits
  // (30 s) until it answers /status. kAlreadyExists if it is running;
  // kInvalidArgument for kMasterTargetB without master_targets = 2.
  Status StartOne(Role r);
  // StartOne again on the ports it had: while another socket still holds one
  // ("Address already in use"), tries again, for up to 30 s.
  Status Restart(Role r);
  // kill -9, and waits for the death.
  Status Kill9(Role r);
  // SIGTERM to one daemon (SIGKILL after `grace`): a graceful stop.
  Status Stop(Role r, std::chrono::milliseconds grace = std::chrono::seconds(10));
  // Points the agent at the MT (true) or the PS (false) from its next start:
  // rewrites the configs (the MT's lists the tenant in `direct_agents` when
  // true, from the MT's next start). Running daemons are not touched.
  Status SetDirectAgent(bool direct);
  // Replaces the master target's extra config lines (the next start reads them).
  Status SetMtExtraConfig(std::string lines);
  // Replaces one daemon's extra config lines (kMasterTargetB: the MTs' shared
  // ones) and rewrites the configs; the next start reads them.
  Status SetExtraConfig(Role r, std::string lines);
  // Replaces one daemon's extra command-line flags, from its next start.
  void SetArgs(Role r, std::vector<std::string> args);
  // Protects `image` as volume `name` from the agent's next start (rewrites
  // the configs; the file must exist). Running daemons are not touched.
  Status SetVolume(std::string name, std::string image);
  // SIGTERM, agent first, then PS and MT; SIGKILL after `grace` each.
  void StopAll(std::chrono::milliseconds grace = std::chrono::seconds(10));
  bool Running(Role r);
  Subprocess& process(Role r);

  const LocalClusterOptions& options() const { return o_; }
  std::string Path(const std::string& name) const { return o_.dir + "/" + name; }
  std::string source_path() const { return o_.volume_image.empty() ? Path("source.img") : o_.volume_image; }
  std::string replica_path() const;
  std::string log_path(Role r) const { return Path(std::string(Name(r)) + ".log"); }
  // The agent's tap: nbd+unix:///volume?socket=<dir>/agent/nbd.sock
  std::string nbd_uri() const;
  std::string agent_nbd_socket() const { return Path("agent/nbd.sock"); }
  // A point-in-time export of the MT as the tenant reaches it: with TLS
  // nbds://HOST:port/NAME?tls-certificates=<nbd_client_dir()>, else nbd://.
  std::string mt_export_uri(const std::string& export_name) const;
  std::string nbd_client_dir() const { return pki_dir() + "/nbd-" + o_.tenant; }
  std::string pki_dir() const { return o_.pki_dir.empty() ? Path("pki") : o_.pki_dir; }
  uint16_t control_port(Role r) const;
  // Where a daemon listens: the MTs on mt_host (when given), the others on host.
  const std::string& mt_host() const { return o_.mt_host.empty() ? o_.host : o_.mt_host; }
  // The daemon's admin token file: <dir>/mt/control.token,
  // <dir>/ps/spool/control.token, <dir>/agent/control.token, <dir>/mtb/control.token.
  std::string token_path(Role r) const;
  // The token in it ("" with control_auth off or before the daemon made it).
  std::string token(Role r) const;
  // How to call daemon `r`'s control API: its admin token, and HTTPS with
  // the site CA when TLS is on (every control port then speaks HTTPS).
  http::ClientOptions ControlClient(Role r) const;
  // The CA file the HTTPS control ports verify against; "" when they speak plain HTTP.
  std::string control_ca() const { return o_.tls && !o_.control_plain ? pki_dir() + "/ca.crt" : std::string(); }
  uint16_t mt_data_port() const { return mt_data_; }
  uint16_t mt_nbd_port() const { return mt_nbd_; }
  uint16_t ps_data_port() const { return ps_data_; }
  uint16_t mtb_data_port() const { return mtb_data_; }
  uint16_t mtb_nbd_port() const { return mtb_nbd_; }
  // The volume's replica at the second master target.
  std::string mtb_replica_path() const;
  // The daemon's process id while it runs, else 0.
  pid_t pid(Role r);
  // The tail of every daemon log, for failure messages.
  std::string Logs(size_t tail_bytes = 3000) const;

 private:
  Status WriteConfigs();
  Status MakeCertificates();
  std::string TlsKeys(const std::string& who) const;
  std::string MtConfig(uint16_t data, uint16_t ctl, uint16_t nbd, const std::string& data_dir) const;
  std::string Addr(uint16_t port) const { return o_.host + ":" + std::to_string(port); }
  std::string MtAddr(uint16_t port) const { return mt_host() + ":" + std::to_string(port); }
  Status WaitReady(Role r, std::chrono::milliseconds timeout);

  LocalClusterOptions o_;
  uint16_t mt_data_ = 0, mt_ctl_ = 0, mt_nbd_ = 0;
  uint16_t ps_data_ = 0, ps_ctl_ = 0;
  uint16_t agent_ctl_ = 0;
  uint16_t mtb_data_ = 0, mtb_ctl_ = 0, mtb_nbd_ = 0;
  Subprocess mt_, ps_, agent_, mtb_;
};

}  // namespace cdp::loadgen

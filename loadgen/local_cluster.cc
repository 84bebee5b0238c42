// SPDX-License-Identifier: Apache-2.0
#include "loadgen/local_cluster.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <thread>

#include "common/base/host_port.h"
#include "common/crypto/pki.h"
#include "common/env/env.h"
#include "common/http/control_token.h"
#include "common/http/http_client.h"

namespace cdp::loadgen {
namespace {

using Millis = std::chrono::milliseconds;

// A daemon failed to start because another socket holds one of its ports.
bool PortTaken(const Status& s) { return s.message().find("Address already in use") != std::string::npos; }

Status WriteText(const std::string& path, const std::string& text) {
  return WriteFileAtomic(DefaultEnv(), path, ByteSpan(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

std::string Tail(const std::string& path, size_t bytes) {
  auto b = ReadWholeFile(DefaultEnv(), path);
  if (!b.ok()) return "(no log)\n";
  std::string s(b->begin(), b->end());
  return s.size() > bytes ? "..." + s.substr(s.size() - bytes) : s;
}

}  // namespace

LocalClusterOptions LocalClusterOptionsFor(const std::string& build_dir, const std::string& dir) {
  LocalClusterOptions o;
  o.agent_bin = JoinPath(build_dir, "agent/cdp-agent");
  o.ps_bin = JoinPath(build_dir, "process-server/cdp-process-server");
  o.mt_bin = JoinPath(build_dir, "master-target/cdp-master-target");
  o.dir = dir;
  return o;
}

const char* Name(Role r) {
  switch (r) {
    case Role::kMasterTarget: return "master-target";
    case Role::kProcessServer: return "process-server";
    case Role::kAgent: return "agent";
    case Role::kMasterTargetB: return "master-target-b";
  }
  return "?";
}

LocalCluster::LocalCluster(LocalClusterOptions o) : o_(std::move(o)) {}

LocalCluster::~LocalCluster() {
  // SIGKILL: nothing to keep, and a wedged daemon must not hang the caller.
  for (Role r : {Role::kAgent, Role::kProcessServer, Role::kMasterTarget, Role::kMasterTargetB})
    process(r).Stop(SIGKILL, Millis(0));
}

Subprocess& LocalCluster::process(Role r) {
  switch (r) {
    case Role::kMasterTarget: return mt_;
    case Role::kProcessServer: return ps_;
    case Role::kAgent: return agent_;
    case Role::kMasterTargetB: return mtb_;
  }
  return agent_;
}

bool LocalCluster::Running(Role r) { return process(r).Running(); }

pid_t LocalCluster::pid(Role r) { return Running(r) ? process(r).pid() : 0; }

uint16_t LocalCluster::control_port(Role r) const {
  switch (r) {
    case Role::kMasterTarget: return mt_ctl_;
    case Role::kProcessServer: return ps_ctl_;
    case Role::kAgent: return agent_ctl_;
    case Role::kMasterTargetB: return mtb_ctl_;
  }
  return 0;
}

std::string LocalCluster::token_path(Role r) const {
  switch (r) {
    case Role::kMasterTarget: return Path("mt/control.token");
    case Role::kProcessServer: return Path("ps/spool/control.token");
    case Role::kAgent: return Path("agent/control.token");
    case Role::kMasterTargetB: return Path("mtb/control.token");
  }
  return "";
}

std::string LocalCluster::token(Role r) const {
  if (!o_.control_auth) return "";
  auto t = ReadTokenFile(DefaultEnv(), token_path(r));
  return t.ok() ? *t : "";
}

std::string LocalCluster::replica_path() const {
  return Path("mt/tenants/" + o_.tenant + "/volumes/" + o_.volume + "/replica.img");
}

std::string LocalCluster::mtb_replica_path() const {
  return Path("mtb/tenants/" + o_.tenant + "/volumes/" + o_.volume + "/replica.img");
}

std::string LocalCluster::nbd_uri() const { return "nbd+unix:///" + o_.volume + "?socket=" + agent_nbd_socket(); }

std::string LocalCluster::mt_export_uri(const std::string& export_name) const {
  if (!o_.tls) return "nbd://" + MtAddr(mt_nbd_) + "/" + export_name;
  return "nbds://" + MtAddr(mt_nbd_) + "/" + export_name + "?tls-certificates=" + nbd_client_dir();
}

Status MakeNbdClientCertificates(const std::string& ca_dir, const pki::Identity& id, const std::string& dir) {
  Env* env = DefaultEnv();
  CDP_RETURN_IF_ERROR(env->CreateDirs(dir));
  if (::chmod(dir.c_str(), 0700) != 0) return Status::FromErrno(errno, "chmod " + dir);
  CDP_ASSIGN_OR_RETURN(Bytes ca, ReadWholeFile(env, ca_dir + "/ca.crt"));
  CDP_RETURN_IF_ERROR(WriteText(dir + "/ca-cert.pem", std::string(ca.begin(), ca.end())));
  if (env->Exists(dir + "/client-key.pem")) return Status::OK();
  pki::IssueOptions io;
  io.identity = id;
  return pki::Issue(ca_dir, io, dir + "/client-key.pem", dir + "/client-cert.pem");
}

Status LocalCluster::MakeCertificates() {
  const std::string dir = pki_dir();
  if (!DefaultEnv()->Exists(dir + "/ca.key")) CDP_RETURN_IF_ERROR(pki::InitCa(dir, pki::CaOptions{}));
  CDP_RETURN_IF_ERROR(pki::EnsureCrl(dir));  // every daemon loads it (tls_crl): `cdpctl pki revoke` + SIGHUP
  const struct {
    const char* file;
    pki::CertRole role;
    std::string name;
  } certs[] = {{"mt", pki::CertRole::kMasterTarget, "local-mt"},
               {"ps", pki::CertRole::kProcessServer, "local-ps"},
               {"agent", pki::CertRole::kAgent, o_.client_id}};
  for (const auto& c : certs) {
    const std::string key = dir + "/" + c.file + ".key";
    if (DefaultEnv()->Exists(key)) continue;
    pki::IssueOptions io;
    io.identity.role = c.role;
    io.identity.name = c.name;
    if (c.role != pki::CertRole::kMasterTarget) io.identity.tenant = o_.tenant;
    // Every daemon serves HTTPS on its control port: clients that check the
    // host name (curl, Chromium) reach it on loopback.
    if (c.role != pki::CertRole::kMasterTarget) io.hosts = {"localhost", "127.0.0.1", "::1"};
    // An MT in another network namespace (--mt-host) is reached there: its
    // certificate names that address too, beside pki's defaults for an MT.
    if (c.role == pki::CertRole::kMasterTarget && mt_host() != "127.0.0.1" && mt_host() != o_.host)
      io.hosts = {"localhost", "127.0.0.1", "::1", c.name, mt_host()};
    CDP_RETURN_IF_ERROR(pki::Issue(dir, io, key, dir + "/" + c.file + ".crt"));
  }
  pki::Identity nbd_client;
  nbd_client.role = pki::CertRole::kAgent;
  nbd_client.tenant = o_.tenant;
  nbd_client.name = o_.tenant + "-nbd-client";
  return MakeNbdClientCertificates(dir, nbd_client, nbd_client_dir());
}

http::ClientOptions LocalCluster::ControlClient(Role r) const {
  http::ClientOptions co;
  co.bearer_token = token(r);
  co.tls_ca = control_ca();
  return co;
}

std::string LocalCluster::TlsKeys(const std::string& who) const {
  if (!o_.tls) return "tls = off\n";
  const std::string dir = pki_dir();
  return "tls_ca = " + dir + "/ca.crt\ntls_cert = " + dir + "/" + who + ".crt\ntls_key = " + dir + "/" + who +
         ".key\ntls_crl = " + dir + "/crl.pem\n" +
         (o_.control_plain ? "control_tls = off\n" : "");
}

std::string LocalCluster::MtConfig(uint16_t data, uint16_t ctl, uint16_t nbd, const std::string& data_dir) const {
  std::string mt = "# written by the local cluster (loadgen/local_cluster.h)\nlisten = " + MtAddr(data) +
                   "\ncontrol = " + MtAddr(ctl) + "\nnbd = " + MtAddr(nbd) + "\ndata_dir = " + data_dir +
                   "\ntenant = " + o_.tenant + ":" + o_.secret + "\n" + TlsKeys("mt") +
                   (o_.tls ? "" : "nbd_tls = off\n") + (o_.control_auth ? "" : "control_auth = off\n");
  if (!o_.point_interval.empty()) mt += "point_interval = " + o_.point_interval + "\n";
  if (o_.direct_agent) mt += "direct_agents = " + o_.tenant + "\n";
  return mt + o_.mt_extra_config + "[log]\nlevel = " + o_.log_level + "\n";
}

Status LocalCluster::WriteConfigs() {
  const std::string mt = MtConfig(mt_data_, mt_ctl_, mt_nbd_, Path("mt"));
  std::string ps = "# written by the local cluster (loadgen/local_cluster.h)\nlisten = " + Addr(ps_data_) +
                   "\ncontrol = " + Addr(ps_ctl_) + "\nmt = " + MtAddr(mt_data_) + "\ntenant = " + o_.tenant +
                   ":" + o_.secret + "\nspool_dir = " + Path("ps/spool") + "\ncodec = " + o_.codec +
                   "\nlevel = " + std::to_string(o_.level) + "\n" + TlsKeys("ps") + (o_.control_auth ? "" : "control_auth = off\n");
  if (o_.master_targets == 2) ps += "mt = " + MtAddr(mtb_data_) + "\ncopies = 2\n";
  if (o_.compress_threads > 0) ps += "compress_threads = " + std::to_string(o_.compress_threads) + "\n";
  ps += o_.ps_extra_config + "[log]\nlevel = " + o_.log_level + "\n";
  const std::string agent_to = !o_.agent_ps.empty() ? o_.agent_ps : o_.direct_agent ? MtAddr(mt_data_) : Addr(ps_data_);
  std::string ag = "# written by the local cluster (loadgen/local_cluster.h)\nvolume = " + o_.volume + "=" +
                   source_path() + "\nnbd_listen = none\nnbd_unix = " + agent_nbd_socket() + "\nps = " + agent_to +
                   "\ntenant = " + o_.tenant + "\nsecret_file = " + Path("etc/agent.secret") +
                   "\nclient_id = " + o_.client_id + "\nbitmap_dir = " + Path("agent") +
                   "\ncontrol = " + Addr(agent_ctl_) + "\n" + TlsKeys("agent") + (o_.control_auth ? "" : "control_auth = off\n");
  if (!o_.agent_budget.empty()) ag += "budget = " + o_.agent_budget + "\n";
  ag += o_.agent_extra_config + "[log]\nlevel = " + o_.log_level + "\n";
  CDP_RETURN_IF_ERROR(WriteText(Path("etc/master-target.conf"), mt));
  if (o_.master_targets == 2) {
    CDP_RETURN_IF_ERROR(WriteText(Path("etc/master-target-b.conf"), MtConfig(mtb_data_, mtb_ctl_, mtb_nbd_, Path("mtb"))));
    if (::chmod(Path("etc/master-target-b.conf").c_str(), 0600) != 0)
      return Status::FromErrno(errno, "chmod " + Path("etc/master-target-b.conf"));
  }
  CDP_RETURN_IF_ERROR(WriteText(Path("etc/process-server.conf"), ps));
  CDP_RETURN_IF_ERROR(WriteText(Path("etc/agent.secret"), o_.secret + "\n"));
  // The configs hold the tenant's secret too: owner only.
  for (const char* f : {"etc/agent.secret", "etc/master-target.conf", "etc/process-server.conf"}) {
    if (::chmod(Path(f).c_str(), 0600) != 0) return Status::FromErrno(errno, "chmod " + Path(f));
  }
  return WriteText(Path("etc/agent.conf"), ag);
}

Status LocalCluster::Start() {
  if (o_.master_targets != 1 && o_.master_targets != 2)
    return Status::InvalidArgument("master_targets must be 1 or 2");
  Env* env = DefaultEnv();
  for (const char* sub : {"etc", "mt", "ps/spool", "agent"}) CDP_RETURN_IF_ERROR(env->CreateDirs(Path(sub)));
  if (o_.master_targets == 2) CDP_RETURN_IF_ERROR(env->CreateDirs(Path("mtb")));
  if (o_.tls) CDP_RETURN_IF_ERROR(MakeCertificates().WithContext("certificates in " + pki_dir()));
  if (!env->Exists(source_path())) {
    OpenOptions oo;
    oo.create = true;
    CDP_ASSIGN_OR_RETURN(auto f, env->Open(source_path(), oo));
    CDP_RETURN_IF_ERROR(f->Truncate(o_.volume_bytes));
  }
  // A port found free can be taken (by another test's outgoing connection)
  // before the daemon binds it: then start again on other ports.
  for (int attempt = 0;; ++attempt) {
    for (uint16_t* p : {&mt_data_, &mt_ctl_, &mt_nbd_, &ps_data_, &ps_ctl_, &agent_ctl_, &mtb_data_, &mtb_ctl_, &mtb_nbd_}) {
      CDP_ASSIGN_OR_RETURN(*p, FreeLoopbackPort());
    }
    CDP_RETURN_IF_ERROR(WriteConfigs());
    const bool servers = o_.agent_ps.empty();
    Status s;
    if (servers) s = StartOne(Role::kMasterTarget);
    if (s.ok() && servers && o_.master_targets == 2) s = StartOne(Role::kMasterTargetB);
    if (s.ok() && servers) s = StartOne(Role::kProcessServer);
    if (s.ok() && o_.start_agent) s = StartOne(Role::kAgent);
    if (s.ok()) return s;
    if (attempt == 2 || !PortTaken(s)) return s;
    for (Role r : {Role::kAgent, Role::kProcessServer, Role::kMasterTargetB, Role::kMasterTarget})
      process(r).Stop(SIGKILL, Millis(0));
  }
}

Status LocalCluster::StartOne(Role r) {
  if (r == Role::kMasterTargetB && o_.master_targets != 2)
    return Status::InvalidArgument("no master-target-b: master_targets is 1");
  const bool mt = r == Role::kMasterTarget || r == Role::kMasterTargetB;
  if (process(r).Running()) return Status::AlreadyExists(std::string(Name(r)) + " is running");
  SpawnOptions so;
  if (mt) so.argv = o_.mt_wrapper;
  so.argv.push_back(mt ? o_.mt_bin : r == Role::kProcessServer ? o_.ps_bin : o_.agent_bin);
  for (const std::string& a : {std::string("--config"), Path("etc/" + std::string(Name(r)) + ".conf")}) so.argv.push_back(a);
  const auto& args = mt ? o_.mt_args : r == Role::kProcessServer ? o_.ps_args : o_.agent_args;
  so.argv.insert(so.argv.end(), args.begin(), args.end());
  so.output_file = log_path(r);
  so.die_with_parent = o_.die_with_parent;
  CDP_ASSIGN_OR_RETURN(process(r), Subprocess::Spawn(so));
  return WaitReady(r, std::chrono::seconds(30));
}

Status LocalCluster::Restart(Role r) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (;;) {
    Status s = StartOne(r);
    if (s.ok() || !PortTaken(s) || std::chrono::steady_clock::now() >= deadline) return s;
    // The polling period of a condition with a deadline (the port is freed).
    std::this_thread::sleep_for(Millis(100));
  }
}

Status LocalCluster::WaitReady(Role r, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (!process(r).Running()) return Status::Unavailable(std::string(Name(r)) + " exited at start\n" + Logs());
    http::ClientOptions co = ControlClient(r);  // the daemon writes its token before it serves /status
    const bool mt = r == Role::kMasterTarget || r == Role::kMasterTargetB;
    auto resp = http::HttpRequest(mt ? mt_host() : o_.host, control_port(r), "GET", "/status", {}, Millis(1000), co);
    if (resp.ok() && resp->status == 200) return Status::OK();
    if (std::chrono::steady_clock::now() >= deadline)
      return Status::Unavailable(std::string(Name(r)) + " did not answer /status\n" + Logs());
    // The polling period of a condition with a deadline.
    std::this_thread::sleep_for(Millis(50));
  }
}

Status LocalCluster::Kill9(Role r) {
  if (!process(r).Running()) return Status::NotFound(std::string(Name(r)) + " is not running");
  const int st = process(r).Stop(SIGKILL, Millis(0));
  if (!(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL))
    return Status::Aborted(std::string(Name(r)) + " did not die of SIGKILL");
  return Status::OK();
}

Status LocalCluster::Stop(Role r, std::chrono::milliseconds grace) {
  if (!process(r).Running()) return Status::NotFound(std::string(Name(r)) + " is not running");
  const int st = process(r).Stop(SIGTERM, grace);
  if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0))
    return Status::Aborted(std::string(Name(r)) + " did not exit cleanly on SIGTERM (status " + std::to_string(st) + ")");
  return Status::OK();
}

Status LocalCluster::SetDirectAgent(bool direct) {
  o_.direct_agent = direct;
  return WriteConfigs();
}

Status LocalCluster::SetMtExtraConfig(std::string lines) { return SetExtraConfig(Role::kMasterTarget, std::move(lines)); }

Status LocalCluster::SetExtraConfig(Role r, std::string lines) {
  switch (r) {
    case Role::kMasterTarget:
    case Role::kMasterTargetB: o_.mt_extra_config = std::move(lines); break;
    case Role::kProcessServer: o_.ps_extra_config = std::move(lines); break;
    case Role::kAgent: o_.agent_extra_config = std::move(lines); break;
  }
  return WriteConfigs();
}

void LocalCluster::SetArgs(Role r, std::vector<std::string> args) {
  switch (r) {
    case Role::kMasterTarget:
    case Role::kMasterTargetB: o_.mt_args = std::move(args); break;
    case Role::kProcessServer: o_.ps_args = std::move(args); break;
    case Role::kAgent: o_.agent_args = std::move(args); break;
  }
}

Status LocalCluster::SetVolume(std::string name, std::string image) {
  if (name.empty() || image.empty()) return Status::InvalidArgument("a volume needs a name and an image");
  if (!DefaultEnv()->Exists(image)) return Status::NotFound("no volume image " + image);
  o_.volume = std::move(name);
  o_.volume_image = std::move(image);
  return WriteConfigs();
}

void LocalCluster::StopAll(std::chrono::milliseconds grace) {
  for (Role r : {Role::kAgent, Role::kProcessServer, Role::kMasterTargetB, Role::kMasterTarget})
    process(r).Stop(SIGTERM, grace);
}

std::string LocalCluster::Logs(size_t tail_bytes) const {
  std::string out;
  for (Role r : {Role::kMasterTarget, Role::kMasterTargetB, Role::kProcessServer, Role::kAgent}) {
    if (r == Role::kMasterTargetB && o_.master_targets != 2) continue;
    out += std::string("---- ") + Name(r) + ".log\n" + Tail(log_path(r), tail_bytes);
  }
  return out;
}

}  // namespace cdp::loadgen

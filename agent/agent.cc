// SPDX-License-Identifier: Apache-2.0
#include "agent/agent.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/json.hpp>
#include <charconv>
#include <chrono>
#include <optional>
#include <random>
#include <thread>

#include "common/base/log.h"
#include "common/crypto/seal.h"
#include "common/env/subprocess.h"
#include "common/wire/hash.h"
#include "common/wire/stage_metrics.h"

namespace cdp::agent {

namespace json = boost::json;

Status RunHook(const std::string& command, uint64_t timeout_ms) {
  // A process group of its own: a timeout kills the whole hook.
  CDP_ASSIGN_OR_RETURN(CommandResult r, RunCommand({"/bin/sh", "-c", command}, std::chrono::milliseconds(timeout_ms)));
  if (r.timed_out) return Status::Aborted("hook '" + command + "' timed out after " + std::to_string(timeout_ms) + " ms");
  if (r.exit_code == 0) return Status::OK();
  return Status::Aborted("hook '" + command + "' failed (exit " + std::to_string(r.exit_code) + ")" +
                         (r.output.empty() ? "" : ": " + r.output));
}

namespace {
uint64_t RandomInstance() {
  std::random_device rd;
  return (uint64_t(rd()) << 32 | rd()) & ((1ull << 53) - 1);  // exact in a JSON double too
}
}  // namespace

Agent::Agent(AgentOptions opts) : opts_(std::move(opts)), instance_(RandomInstance()) {
  if (opts_.clock == nullptr) opts_.clock = SystemClock::Get();
  if (opts_.env == nullptr) opts_.env = DefaultEnv();
  if (opts_.max_open_files > 0) {
    files_ = std::make_unique<FileCacheEnv>(opts_.env, opts_.max_open_files);
    opts_.env = files_.get();
  }
  opts_.sender.clock = opts_.clock;
}

Agent::~Agent() { Stop(); }

Status Agent::Start() {
  if (started_) return Status::InvalidArgument("agent already started");
  Status s = StartParts();
  if (!s.ok()) DropParts();
  return s;
}

// What Start builds, in order; on an error Start drops whatever was built.
Status Agent::StartParts() {
  if (opts_.volumes.empty()) return Status::InvalidArgument("no volume configured");
  CDP_RETURN_IF_ERROR(opts_.env->CreateDirs(opts_.bitmap_dir));
  sites_.clear();
  std::optional<seal::TenantKey> key;
  for (const auto& v : opts_.volumes) {
    if (!v.encrypted || key) continue;
    if (opts_.key_file.empty())
      return Status::InvalidArgument("volume " + v.name + " is encrypted: key_file (cdpctl keys init) is required");
    CDP_ASSIGN_OR_RETURN(key, seal::LoadTenantKey(opts_.env, opts_.key_file));
    log::Get("agent")->info("tenant key {} loaded from {}", key->Fingerprint(), opts_.key_file);
  }
  for (const auto& v : opts_.volumes) {
    CaptureDevice::Options o;
    if (v.encrypted) {
      CDP_ASSIGN_OR_RETURN(seal::VolumeKeys keys, seal::DeriveVolumeKeys(*key, v.name));
      CDP_ASSIGN_OR_RETURN(o.sealer, seal::BlockSealer::Create(keys));
    }
    o.volume = v.name;
    o.env = opts_.env;
    o.clock = opts_.clock;
    o.backing_path = v.backing_path;
    o.bitmap_path = JoinPath(opts_.bitmap_dir, v.name + ".bitmap");
    o.budget = opts_.budget;
    o.region_size = opts_.region_size;
    o.anomaly = opts_.anomaly;
    auto dev = CaptureDevice::Open(o);
    if (!dev.ok()) {
      return dev.status().WithContext("volume " + v.name);
    }
    devices_.push_back(*dev);
    auto site = std::make_unique<VolumeSite>();
    auto st = LoadSiteState(opts_.env, SitePath(devices_.size() - 1));
    if (!st.ok()) {
      sites_.clear();
      return st.status().WithContext("volume " + v.name);
    }
    site->Set(*st);
    if (site->state.phase != SitePhase::kProtecting) {
      (*dev)->SetWriteFence(v.name + " is " + std::string(SitePhaseName(site->state.phase)) +
                            ": writes are refused until cdpctl reprotect");
    }
    sites_.push_back(std::move(site));
  }
  if (opts_.tls.enabled) {
    auto creds = TlsCredentials::Load(TlsFiles{opts_.tls.ca, opts_.tls.cert, opts_.tls.key, opts_.tls.crl});
    if (!creds.ok()) {
      return creds.status().WithContext("TLS");
    }
    tls_ = std::move(*creds);
    const TlsPeer& self = tls_->Current()->self();
    log::Get("agent")->info("TLS on: certificate '{}' (role {}, tenant {})", self.name, self.role, self.tenant);
  }
  // The tap reads and writes the production volumes: over TCP only with TLS
  // (the client's certificate must be of this agent's tenant, or tenant-less);
  // the Unix socket is guarded by its mode and group.
  std::string owner;
  if (!opts_.nbd.tcp.off()) {
    if (!tls_) {
      return Status::InvalidArgument("NBD over TCP requires TLS (tls = on), or use the Unix socket only");
    }
    opts_.nbd.tls = tls_.get();
    opts_.nbd.tls_mode = NbdServerOptions::TlsMode::kRequire;
    owner = tls_->Current()->self().tenant;
  }
  nbd_ = std::make_unique<NbdServer>(opts_.nbd);
  for (size_t i = 0; i < devices_.size(); ++i) {
    const auto& v = opts_.volumes[i];
    Status s = nbd_->AddExport(v.export_name.empty() ? v.name : v.export_name, devices_[i],
                               "OpenCDP capture tap of " + v.name, owner);
    if (!s.ok()) {
      return s.WithContext("export of volume " + v.name);
    }
    // Every failback branch of the volume is served again (listed by cdpctl branches).
    std::lock_guard lk(sites_[i]->mu);
    for (uint64_t gen = 1; gen <= sites_[i]->state.generation; ++gen) {
      if (auto b = OpenBranch(i, gen, false); !b.ok()) {
        return b.status().WithContext("branch of volume " + v.name);
      }
    }
  }
  if (opts_.sender_enabled) {
    if (tls_) {
      opts_.sender.tls = tls_.get();
    } else {
      log::Get("agent")->warn("tls = off: writes reach the process server in clear text");
    }
    // A group tag's freeze (docs/groups.md) runs the same hooks as a local
    // tag, and excludes one as Tag excludes another: the freeze takes tag_mu_
    // and the thaw, on the same thread, lets it go.
    GroupHolds::Hooks hooks;
    hooks.max_freeze_ms = opts_.freeze_timeout_ms;
    hooks.min_interval_ms = opts_.group_freeze_min_interval_ms;
    hooks.freeze = [this](uint64_t timeout_ms) {
      tag_mu_.lock();
      return opts_.freeze_command.empty() ? Status::OK() : RunHook(opts_.freeze_command, timeout_ms);
    };
    hooks.thaw = [this] {
      if (!opts_.thaw_command.empty()) {
        if (Status s = RunHook(opts_.thaw_command, opts_.freeze_timeout_ms); !s.ok())
          log::Get("agent")->error("group tag: thaw hook: {}", s.ToString());
      }
      tag_mu_.unlock();
    };
    group_holds_ = std::make_unique<GroupHolds>([this](const std::string& v) { return FindDevice(v); },
                                                opts_.group_hold_max_ms, std::move(hooks));
    opts_.sender.on_peer_request = [h = group_holds_.get()](repl::ReplicationSender& link, proto::Message m) {
      h->OnRequest(std::move(m), [&link](const proto::Message& answer) { return link.Send(answer); });
    };
    size_t shared = 0;  // volumes on the shared links
    for (const auto& v : opts_.volumes) shared += v.frame_bytes == 0 ? 1 : 0;
    const size_t links = std::min(shared, size_t(std::max(1, opts_.ps_connections)));
    for (size_t l = 0; l < links; ++l) links_.push_back(NewPsLink(opts_.sender));
    resync_driver_ = std::make_unique<ResyncDriver>(int(std::max<size_t>(1, links)));
    size_t next_link = 0;
    for (size_t i = 0; i < devices_.size(); ++i) {
      SenderOptions so = opts_.sender;
      so.generation = sites_[i]->state.generation;
      repl::ReplicationSender* link = nullptr;
      if (opts_.volumes[i].frame_bytes != 0) {
        so.link.frame_bytes = opts_.volumes[i].frame_bytes;
      } else {
        link = links_[next_link++ % links].get();
      }
      senders_.push_back(std::make_unique<Sender>(devices_[i].get(), so, link, resync_driver_.get()));
      resync_driver_->Add(senders_.back().get());
    }
  }
  for (size_t i = 0; i < devices_.size(); ++i) RegisterMetrics(i);
  if (group_holds_) {
    auto fs = [h = group_holds_.get()] { return h->freeze_stats(); };
    registry_.AddComputed("cdp_agent_group_freezes_total", "Group tags' freezes answered (application frozen)",
                          metrics::Type::kCounter, [fs] { return double(fs().frozen); });
    registry_.AddComputed("cdp_agent_group_freezes_refused_total",
                          "Group tags' freezes refused (hook failed, another on, over freeze_timeout)",
                          metrics::Type::kCounter, [fs] { return double(fs().refused); });
    registry_.AddComputed("cdp_agent_group_thaws_at_timeout_total",
                          "Group tags' freezes ended by their window, with no release from the coordinator",
                          metrics::Type::kCounter, [fs] { return double(fs().thawed_at_timeout); });
  }
  // The stage costs per link to the PS (a shared link carries several volumes).
  std::vector<const repl::ReplicationSender*> shipping;
  for (const auto& s : senders_)
    if (std::find(shipping.begin(), shipping.end(), s->link()) == shipping.end()) shipping.push_back(s->link());
  for (size_t l = 0; l < shipping.size(); ++l)
    repl::RegisterShipStages(registry_, "cdp_agent", [link = shipping[l]] { return link->Stats().stages; },
                             metrics::Labels{{"link", std::to_string(l)}});
  metrics::RegisterProcessMetrics(registry_, opts_.env, opts_.clock);
  if (!opts_.control.off()) {
    http::ServerOptions ho;
    ho.host = opts_.control.host;
    ho.port = opts_.control.port;
    ho.registry = &registry_;
    ho.status = [this] { return StatusJson(); };
    auto tokens = ApplyControlAuth(opts_.control_auth, JoinPath(opts_.bitmap_dir, "control.token"), "", "agent", &ho,
                                   tls_.get());
    if (!tokens.ok()) {
      return tokens.status();
    }
    control_tokens_ = *tokens;
    http_ = std::make_unique<http::Server>(ho);
    RegisterControlRoutes();
    Status s = http_->Start();
    if (!s.ok()) {
      return s.WithContext("control server");
    }
  }
  Status s = nbd_->Start();
  if (!s.ok()) {
    return s.WithContext("NBD server");
  }
  for (auto& s : senders_) s->Start();
  for (auto& l : links_) l->Start();
  if (resync_driver_) resync_driver_->Start();
  started_ = true;
  log::Get("agent")->info("agent started: {} volume(s), NBD port {} unix '{}', control port {}", devices_.size(),
                          nbd_->port(), opts_.nbd.unix_path, control_port());
  return Status::OK();
}

void Agent::DropParts() {
  if (http_) http_->Stop();
  http_.reset();
  nbd_.reset();
  senders_.clear();
  links_.clear();
  group_holds_.reset();
  resync_driver_.reset();
  devices_.clear();
}

Status Agent::ReloadTls() {
  if (!tls_) return Status::OK();
  return tls_->Reload();
}

void Agent::Stop() {
  if (nbd_) nbd_->Stop();
  for (auto& l : links_) l->Stop();  // fails the pending hash requests of every volume
  if (resync_driver_) resync_driver_->Stop();
  for (auto& s : senders_) s->Stop();
  if (group_holds_) group_holds_->Stop();
  if (http_) http_->Stop();
  for (auto& d : devices_) {
    auto r = d->bitmap().Checkpoint();
    (void)r;
  }
  started_ = false;
}

Result<TagResult> Agent::Tag(const std::string& name) {
  if (!ValidName(name)) return Status::InvalidArgument("bad tag name '" + name + "'");
  std::lock_guard tl(tag_mu_);
  auto lg = log::Get("agent");
  auto start = std::chrono::steady_clock::now();
  Status freeze;
  if (!opts_.freeze_command.empty()) freeze = RunHook(opts_.freeze_command, opts_.freeze_timeout_ms);
  Result<TagResult> result = Status::Aborted("freeze hook failed");
  if (freeze.ok()) {
    std::vector<std::unique_lock<std::mutex>> locks;
    for (auto& d : devices_) locks.push_back(d->queue().Lock());
    bool consistent = true;
    std::string why;
    for (auto& d : devices_) {
      if (!d->ConsistentLocked()) {
        consistent = false;
        why = d->volume();
        break;
      }
    }
    if (!consistent) {
      result = Status::Busy("volume " + why + " cannot promise a consistent point now (mode " +
                            std::string(ModeName(devices_[0]->queue().ModeLocked())) + " or resync pending)");
    } else if (std::chrono::steady_clock::now() - start > std::chrono::milliseconds(opts_.freeze_timeout_ms)) {
      result = Status::Aborted("freeze window exceeded the timeout");
    } else {
      TagResult tr;
      for (auto& d : devices_) tr.seqs.emplace_back(d->volume(), d->queue().AppendTagLocked(name));
      result = std::move(tr);
    }
  } else {
    lg->error("tag {}: freeze hook: {}", name, freeze.ToString());
    result = freeze;
  }
  if (!opts_.thaw_command.empty()) {
    Status thaw = RunHook(opts_.thaw_command, opts_.freeze_timeout_ms);
    if (!thaw.ok()) lg->error("tag {}: thaw hook: {}", name, thaw.ToString());
  }
  if (result.ok()) {
    for (auto& [vol, seq] : result->seqs) lg->info("{} tag '{}' inserted", log::Where{vol, "", seq}, name);
  }
  return result;
}

CaptureDevice* Agent::FindDevice(const std::string& volume) const {
  for (auto& d : devices_) {
    if (d->volume() == volume) return d.get();
  }
  return nullptr;
}

Result<RepairResult> Agent::Repair(const std::string& volume, uint64_t offset, uint64_t length, uint64_t timeout_ms) {
  CaptureDevice* dev = FindDevice(volume);
  if (!dev) return Status::NotFound("no volume " + volume);
  if (length == 0) return Status::InvalidArgument("length must be > 0");
  if (offset >= dev->size() || length > dev->size() - offset) {
    return Status::InvalidArgument("range " + std::to_string(offset) + "+" + std::to_string(length) +
                                   " is outside the volume (" + std::to_string(dev->size()) + " bytes)");
  }
  if (offset % kLeafSize != 0 || (length % kLeafSize != 0 && offset + length != dev->size())) {
    return Status::InvalidArgument("offset and length must be multiples of 4096 (the length may end at the end of the volume)");
  }
  // Real time: the handler really waits (opts_.clock may be a test's manual clock).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  RepairResult out;
  for (uint64_t done = 0; done < length;) {
    const uint32_t n = uint32_t(std::min<uint64_t>(proto::kMaxRecordLength, length - done));
    CDP_ASSIGN_OR_RETURN(uint64_t seq, dev->ShipRange(offset + done, n));
    if (seq == 0) {
      // No room in the queue (or not data mode): acknowledgements make room.
      if (std::chrono::steady_clock::now() >= deadline) {
        return Status::Busy("capture queue of " + volume + " had no room for " + std::to_string(n) + " bytes within " +
                            std::to_string(timeout_ms) + " ms (" + std::to_string(out.seqs.size()) +
                            " piece(s) queued)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    out.seqs.push_back(seq);
    out.bytes += n;
    done += n;
  }
  log::Get("agent")->info("{} repair of {}+{} queued ({} record(s))", log::Where{volume, "", out.seqs.back()}, offset,
                          length, out.seqs.size());
  return out;
}

boost::json::value Agent::StatusJson() const {
  json::array vols;
  for (size_t i = 0; i < devices_.size(); ++i) {
    auto& d = devices_[i];
    auto qs = d->queue().Stats();
    json::object v;
    v["name"] = d->volume();
    v["size"] = d->size();
    v["mode"] = std::string(ModeName(qs.mode));
    v["next_seq"] = qs.next_seq;
    v["acked_seq"] = qs.acked_seq;
    v["queue_bytes"] = qs.memory_bytes;
    v["queue_records"] = qs.records;
    v["captured_ops"] = qs.captured_ops;
    v["captured_bytes"] = qs.captured_bytes;
    v["to_metadata"] = qs.to_metadata;
    v["to_bitmap"] = qs.to_bitmap;
    v["to_data"] = qs.to_data;
    v["anomalies"] = qs.anomalies;  // possible ransomware seen (agent/anomaly_detector.h)
    v["group_holds"] = qs.holds;  // group points' holds (docs/groups.md), and those that lapsed
    v["group_holds_lapsed"] = qs.holds_lapsed;
    v["last_anomaly"] = qs.last_anomaly;
    v["anomaly_windows"] = d->anomaly_counters().windows;  // detection windows closed
    v["dirty_regions"] = d->bitmap().DirtyCount();
    v["region_count"] = d->bitmap().region_count();
    if (i < sites_.size()) {
      v["generation"] = sites_[i]->shown_generation.load();
      v["phase"] = std::string(SitePhaseName(SitePhase(sites_[i]->shown_phase.load())));
      const VolumeSite& st = *sites_[i];
      v["failback"] = json::object{{"passes", st.fb_passes.load()},
                                   {"compared_bytes", st.fb_compared_bytes.load()},
                                   {"pulled_bytes", st.fb_pulled_bytes.load()},
                                   {"wire_bytes_in", st.fb_wire_in.load()},
                                   {"wire_bytes_out", st.fb_wire_out.load()}};
    }
    v["write_fence"] = d->write_fence();
    v["encrypted"] = d->sealer() != nullptr;  // tenant-side encryption: blocks leave sealed
    if (i < senders_.size()) {
      auto ss = senders_[i]->Stats();
      v["connected"] = ss.link.connected;
      v["confirmed"] = ss.confirmed;  // false: not heard from the PS since the start; not known drained
      v["rpo_lag_seconds"] = double(ss.rpo_lag_us) / 1e6;
      v["bytes_sent"] = ss.bytes_sent;
      v["resync_remaining"] = ss.resync_remaining;
      v["resync_total_bytes"] = ss.resync.total_bytes;
      v["resync_done_bytes"] = ss.resync.done_bytes;
      v["resync_remaining_bytes"] = ss.resync.remaining_bytes;
      v["resync_eta_seconds"] = ss.resync.eta_seconds;
      v["resync_shipped_bytes"] = ss.resync.shipped_bytes;
      v["resync_shipped_blocks"] = ss.resync.shipped_blocks;
      v["resync_read_bytes"] = ss.resync.read_bytes;
      v["resync_inflight_bytes"] = ss.resync.inflight_bytes;
      v["resync_fill_window_bytes"] = ss.resync.fill_window_bytes;
      v["last_error"] = ss.link.last_error;
      v["fenced"] = ss.fenced;
      // times the server's resume point showed it lost acknowledged records (a full resync each)
      v["history_lost"] = ss.history_lost;
    } else {
      v["connected"] = false;
      v["confirmed"] = false;
      v["resync_remaining"] = d->bitmap().ResyncCount();
    }
    vols.push_back(std::move(v));
  }
  json::object out;
  out["daemon"] = "cdp-agent";
  out["volumes"] = std::move(vols);
  return out;
}

void Agent::RegisterMetrics(size_t i) {
  CaptureDevice* d = devices_[i].get();
  metrics::Labels l{{"volume", d->volume()}};
  using metrics::Type;
  auto q = [d] { return d->queue().Stats(); };
  registry_.AddComputed("cdp_agent_captured_ops_total", "Writes, zero-writes and trims captured", Type::kCounter,
                        [q] { return double(q().captured_ops); }, l);
  registry_.AddComputed("cdp_agent_captured_bytes_total", "Bytes captured", Type::kCounter,
                        [q] { return double(q().captured_bytes); }, l);
  registry_.AddComputed("cdp_agent_mode", "Capture mode: 0 data, 1 metadata, 2 bitmap", Type::kGauge,
                        [q] { return double(int(q().mode)); }, l);
  registry_.AddComputed("cdp_agent_queue_bytes", "Capture queue memory (data + overheads)", Type::kGauge,
                        [q] { return double(q().memory_bytes); }, l);
  registry_.AddComputed("cdp_agent_queue_records", "Records queued, not yet acknowledged", Type::kGauge,
                        [q] { return double(q().records); }, l);
  registry_.AddComputed("cdp_agent_flushes_suppressed_total", "FLUSHes with no recovery point (degraded modes)",
                        Type::kCounter, [q] { return double(q().flushes_suppressed); }, l);
  registry_.AddComputed("cdp_agent_anomalies_total",
                        "Possible ransomware: jumps in change rate made of incompressible writes (anomaly records sent)",
                        Type::kCounter, [q] { return double(q().anomalies); }, l);
  for (auto [to, pick] : std::vector<std::pair<std::string, int>>{{"metadata", 1}, {"bitmap", 2}, {"data", 0}}) {
    metrics::Labels lt = l;
    lt.emplace_back("to", to);
    registry_.AddComputed("cdp_agent_mode_transitions_total", "Capture mode transitions", Type::kCounter,
                          [q, pick] {
                            auto s = q();
                            return double(pick == 1 ? s.to_metadata : pick == 2 ? s.to_bitmap : s.to_data);
                          },
                          lt);
  }
  // Group points (docs/groups.md): the time writes waited for a hold, and the holds.
  d->queue().SetHoldWaits(registry_.GetHistogram(
      "cdp_agent_group_hold_seconds", "Time application writes waited for a group point's hold",
      {0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.25, 0.5}, l));
  registry_.AddComputed("cdp_agent_group_holds_total", "Group holds put on (one per group round)", Type::kCounter,
                        [q] { return double(q().holds); }, l);
  registry_.AddComputed("cdp_agent_group_holds_lapsed_total",
                        "Group holds that ended at their timeout, not released by their coordinator", Type::kCounter,
                        [q] { return double(q().holds_lapsed); }, l);
  registry_.AddComputed("cdp_agent_dirty_regions", "Regions dirty in the persistent bitmap", Type::kGauge,
                        [d] { return double(d->bitmap().DirtyCount()); }, l);
  registry_.AddComputed("cdp_agent_resync_remaining_regions", "Regions waiting for a resync", Type::kGauge,
                        [d] { return double(d->bitmap().ResyncCount()); }, l);
  registry_.AddComputed("cdp_agent_bitmap_persists_total", "Dirty bitmap writes (each one sync)", Type::kCounter,
                        [d] { return double(d->bitmap().persist_count()); }, l);
  if (i < sites_.size()) {
    const VolumeSite* site = sites_[i].get();
    registry_.AddComputed("cdp_agent_failback_passes_total", "Failback passes run", Type::kCounter,
                          [site] { return double(site->fb_passes.load()); }, l);
    registry_.AddComputed("cdp_agent_failback_compared_bytes_total",
                          "Bytes compared by failback (digested here against the provider's image)", Type::kCounter,
                          [site] { return double(site->fb_compared_bytes.load()); }, l);
    registry_.AddComputed("cdp_agent_failback_pulled_bytes_total", "Bytes that differed and were pulled by failback",
                          Type::kCounter, [site] { return double(site->fb_pulled_bytes.load()); }, l);
    for (auto [dir, in] : std::vector<std::pair<std::string, bool>>{{"in", true}, {"out", false}}) {
      metrics::Labels ld = l;
      ld.emplace_back("direction", dir);
      registry_.AddComputed("cdp_agent_failback_wire_bytes_total",
                            "Failback frames on the wire: in = pulled from the PS, out = digests sent",
                            Type::kCounter,
                            [site, in] { return double(in ? site->fb_wire_in.load() : site->fb_wire_out.load()); },
                            ld);
    }
  }
  if (!opts_.sender_enabled) return;
  Sender* snd = senders_.at(i).get();
  auto s = [snd] { return snd->Stats(); };
  registry_.AddComputed("cdp_agent_connected", "1 when connected to the process server", Type::kGauge,
                        [s] { return s().link.connected ? 1.0 : 0.0; }, l);
  registry_.AddComputed("cdp_agent_sent_bytes_total", "Record data bytes sent", Type::kCounter,
                        [s] { return double(s().bytes_sent); }, l);
  registry_.AddComputed("cdp_agent_reread_bytes_total", "Metadata-mode bytes re-read from the backing store",
                        Type::kCounter, [s] { return double(s().reread_bytes); }, l);
  registry_.AddComputed("cdp_agent_acked_seq", "Highest sequence durable at the process server", Type::kGauge,
                        [s] { return double(s().acked_seq); }, l);
  registry_.AddComputed("cdp_agent_rpo_lag_seconds", "Age of the oldest unacknowledged record", Type::kGauge,
                        [s] { return double(s().rpo_lag_us) / 1e6; }, l);
  registry_.AddComputed("cdp_agent_resync_total_bytes", "Bytes flagged when the current resync pass started",
                        Type::kGauge, [s] { return double(s().resync.total_bytes); }, l);
  registry_.AddComputed("cdp_agent_resync_done_bytes", "Bytes of the current resync pass finished", Type::kGauge,
                        [s] { return double(s().resync.done_bytes); }, l);
  registry_.AddComputed("cdp_agent_resync_shipped_bytes_total", "Bytes shipped by resync (differing blocks)",
                        Type::kCounter, [s] { return double(s().resync.shipped_bytes); }, l);
  registry_.AddComputed("cdp_agent_resync_shipped_blocks_total", "4 KiB blocks shipped by resync", Type::kCounter,
                        [s] { return double(s().resync.shipped_blocks); }, l);
  registry_.AddComputed("cdp_agent_resync_read_bytes_total", "Bytes read from the volume to compare it",
                        Type::kCounter, [s] { return double(s().resync.read_bytes); }, l);
  registry_.AddComputed("cdp_agent_resync_hash_requests_total", "Hash requests sent by resync", Type::kCounter,
                        [s] { return double(s().resync.hash_requests); }, l);
  registry_.AddComputed("cdp_agent_resync_eta_seconds", "Estimated time to finish the resync", Type::kGauge,
                        [s] { return s().resync.eta_seconds; }, l);
  registry_.AddComputed("cdp_agent_reconnects_total", "Sessions with the process server opened", Type::kCounter,
                        [s] { return double(s().link.connects); }, l);
}

}  // namespace cdp::agent

// SPDX-License-Identifier: Apache-2.0
// Agent's failback steps (contract in agent.h; phases in site_state.h; the
// pass in failback.h).
#include <boost/json.hpp>

#include "agent/agent.h"
#include "common/base/log.h"

namespace cdp::agent {

namespace json = boost::json;

Result<size_t> Agent::VolumeIndex(const std::string& volume) const {
  for (size_t i = 0; i < opts_.volumes.size() && i < sites_.size(); ++i) {
    if (opts_.volumes[i].name == volume) return i;
  }
  return Status::NotFound("no volume " + volume);
}

std::string Agent::SitePath(size_t i) const { return JoinPath(opts_.bitmap_dir, opts_.volumes[i].name + ".site"); }

std::string Agent::BranchPrefix(size_t i, uint64_t generation) const {
  return JoinPath(opts_.bitmap_dir, opts_.volumes[i].name + ".branch-g" + std::to_string(generation));
}

Result<BranchStore*> Agent::OpenBranch(size_t i, uint64_t gen, bool create) {
  VolumeSite& s = *sites_[i];
  if (auto it = s.branches.find(gen); it != s.branches.end()) return it->second.store.get();
  const std::string prefix = BranchPrefix(i, gen);
  if (!create && !opts_.env->Exists(prefix + ".idx")) return nullptr;
  BranchStore::Options bo;
  bo.env = opts_.env;
  bo.prefix = prefix;
  bo.volume_size = devices_[i]->size();
  bo.block_size = devices_[i]->preferred_block_size();
  bo.uuid = VolumeUuid(opts_.volumes[i].name);
  bo.time_us = opts_.clock->WallMicros();
  CDP_ASSIGN_OR_RETURN(std::unique_ptr<BranchStore> store, BranchStore::Open(bo));
  VolumeSite::Branch b;
  b.store = std::move(store);
  if (nbd_) {
    const VolumeConfig& v = opts_.volumes[i];
    const std::string name = (v.export_name.empty() ? v.name : v.export_name) + "@branch-g" + std::to_string(gen);
    CDP_ASSIGN_OR_RETURN(auto dev, BranchDevice::Open(b.store, devices_[i]));
    std::string owner = tls_ ? tls_->Current()->self().tenant : "";
    CDP_RETURN_IF_ERROR(nbd_->AddExport(
        name, dev, "OpenCDP failback branch of " + v.name + " (generation " + std::to_string(gen) + ")", owner));
    b.export_name = name;
  }
  BranchStore* raw = b.store.get();
  s.branches[gen] = std::move(b);
  return raw;
}

Result<SiteState> Agent::Site(const std::string& volume) const {
  CDP_ASSIGN_OR_RETURN(size_t i, VolumeIndex(volume));
  std::lock_guard lk(sites_[i]->mu);
  return sites_[i]->state;
}

Result<SiteState> Agent::BeginFailback(const std::string& volume) {
  CDP_ASSIGN_OR_RETURN(size_t i, VolumeIndex(volume));
  VolumeSite& s = *sites_[i];
  std::lock_guard lk(s.mu);
  if (s.state.phase == SitePhase::kFailedBack)
    return Status::InvalidArgument(volume + " is failed back already: cdpctl reprotect resumes replication");
  // The fence first: from here on nothing the pass reads can change under it.
  devices_[i]->SetWriteFence(volume + " is failing back: writes are refused until cdpctl reprotect");
  if (s.state.phase == SitePhase::kProtecting) {
    SiteState next = s.state;
    next.phase = SitePhase::kFailingBack;
    if (Status w = SaveSiteState(opts_.env, SitePath(i), next); !w.ok()) {
      devices_[i]->SetWriteFence("");
      return w;
    }
    s.Set(next);
    log::Get("agent")->warn("{} failing back: the tap refuses writes; what the original site wrote and the "
                            "provider overwrites goes to the branch {}",
                            log::Where{volume, "", 0}, BranchPrefix(i, s.state.generation) + ".{img,idx}");
  }
  CDP_RETURN_IF_ERROR(OpenBranch(i, s.state.generation, true).status());
  return s.state;
}

Result<FailbackPassStats> Agent::FailbackPass(const std::string& volume) {
  CDP_ASSIGN_OR_RETURN(size_t i, VolumeIndex(volume));
  VolumeSite& s = *sites_[i];
  std::lock_guard lk(s.mu);
  if (s.state.phase != SitePhase::kFailingBack)
    return Status::InvalidArgument(volume + " is " + std::string(SitePhaseName(s.state.phase)) +
                                   ", not failing back (cdpctl failback begins it)");
  CDP_ASSIGN_OR_RETURN(BranchStore * branch, OpenBranch(i, s.state.generation, true));
  if (senders_.empty())
    return Status::Unavailable(volume + ": failback needs the link to the process server (the sender is off)");
  FailbackOptions fo;
  fo.call = [sender = senders_[i].get()](proto::Message m, repl::ReplicationSender::CallCallback done,
                                         std::shared_ptr<repl::CallBytes> bytes) {
    sender->CallAsync(std::move(m), std::move(done), std::move(bytes));
  };
  fo.peer = opts_.sender.link.peer.ToString();
  // A link that is reconnecting (the process server restarted) is waited for,
  // as long as a connection attempt and a back-off take.
  const auto wait = std::chrono::milliseconds(opts_.sender.link.connect_timeout_ms + opts_.sender.link.backoff_max_ms);
  if (!senders_[i]->WaitConnected(wait))
    return Status::Unavailable(volume + ": not connected to the process server at " + fo.peer + " (waited " +
                               std::to_string(wait.count()) + " ms)");
  CDP_ASSIGN_OR_RETURN(FailbackPassStats st, RunFailbackPass(*devices_[i], *branch, fo));
  s.fb_passes.fetch_add(1);
  s.fb_compared_bytes.fetch_add(st.compared_blocks * devices_[i]->preferred_block_size());
  s.fb_pulled_bytes.fetch_add(st.pulled_bytes);
  s.fb_wire_in.fetch_add(st.wire_bytes_in);
  s.fb_wire_out.fetch_add(st.wire_bytes_out);
  return st;
}

Result<SiteState> Agent::EndFailback(const std::string& volume) {
  CDP_ASSIGN_OR_RETURN(size_t i, VolumeIndex(volume));
  VolumeSite& s = *sites_[i];
  std::lock_guard lk(s.mu);
  if (s.state.phase == SitePhase::kFailedBack) return s.state;
  if (s.state.phase != SitePhase::kFailingBack)
    return Status::InvalidArgument(volume + " is protecting: there is no failback to end");
  SiteState next = s.state;
  next.phase = SitePhase::kFailedBack;
  CDP_RETURN_IF_ERROR(SaveSiteState(opts_.env, SitePath(i), next));
  s.Set(next);
  log::Get("agent")->warn("{} failed back: the source equals the provider's image ({} blocks of the original site "
                          "saved in the branch); cdpctl reprotect resumes replication",
                          log::Where{volume, "", 0},
                          s.branches.count(s.state.generation) ? s.branches[s.state.generation].store->saved_blocks()
                                                               : 0);
  return s.state;
}

Result<SiteState> Agent::Reprotect(const std::string& volume, uint64_t generation) {
  CDP_ASSIGN_OR_RETURN(size_t i, VolumeIndex(volume));
  VolumeSite& s = *sites_[i];
  std::lock_guard lk(s.mu);
  if (generation <= s.state.generation && s.state.phase == SitePhase::kProtecting) return s.state;
  if (generation != s.state.generation + 1)
    return Status::InvalidArgument(volume + " is at generation " + std::to_string(s.state.generation) +
                                   "; re-protect moves to the next one only, not " + std::to_string(generation));
  if (s.state.phase == SitePhase::kFailingBack)
    return Status::InvalidArgument(volume + " is failing back: finish it first (cdpctl failback " + volume + ")");
  const bool equal = s.state.phase == SitePhase::kFailedBack;
  SiteState next{s.state.generation + 1, SitePhase::kProtecting};
  // The new generation is durable first: a crash before the sender follows
  // opens it at the restart, with the regions dirty then compared (safe).
  CDP_RETURN_IF_ERROR(SaveSiteState(opts_.env, SitePath(i), next));
  s.Set(next);
  if (!senders_.empty()) {
    if (equal) {
      CDP_RETURN_IF_ERROR(senders_[i]->StartGeneration(next.generation, /*equal=*/true));
    } else {
      CDP_RETURN_IF_ERROR(senders_[i]->StartGeneration(next.generation, /*equal=*/false));
    }
  }
  devices_[i]->SetWriteFence("");
  log::Get("agent")->warn("{} re-protected: generation {}{}", log::Where{volume, "", 0}, next.generation,
                          equal ? "" : " (every region is compared with the replica)");
  return s.state;
}

void Agent::RegisterFailbackRoutes() {
  auto step = [this](const char* path, auto fn) {
    http_->Route("POST", path, [this, fn](const http::Request& r) {
      auto p = http::Params::Of(r, {"volume"});
      if (!p.ok()) return http::ErrorResponse(p.status());
      auto v = p->String("volume");
      if (!v.ok()) return http::ErrorResponse(v.status());
      if (!*v) return http::Response::Error(400, "body must be {\"volume\": \"NAME\"}");
      Result<json::object> out = fn(**v);
      if (!out.ok()) return http::ErrorResponse(out.status());
      return http::Response::Json(200, *out);
    });
  };
  auto site_json = [](const std::string& volume, const SiteState& s) {
    return json::object{{"volume", volume},
                        {"generation", s.generation},
                        {"phase", std::string(SitePhaseName(s.phase))}};
  };
  step("/v1/failback/begin", [this, site_json](const std::string& v) -> Result<json::object> {
    CDP_ASSIGN_OR_RETURN(SiteState s, BeginFailback(v));
    return site_json(v, s);
  });
  step("/v1/failback/pass", [this](const std::string& v) -> Result<json::object> {
    CDP_ASSIGN_OR_RETURN(FailbackPassStats st, FailbackPass(v));
    return json::object{{"volume", v},
                        {"plan_blocks", st.plan_blocks},
                        {"local_blocks", st.local_blocks},
                        {"compared_blocks", st.compared_blocks},
                        {"pulled_blocks", st.pulled_blocks},
                        {"pulled_bytes", st.pulled_bytes},
                        {"saved_blocks", st.saved_blocks},
                        {"requests", st.requests},
                        {"wire_bytes_in", st.wire_bytes_in},
                        {"wire_bytes_out", st.wire_bytes_out},
                        {"seconds", st.seconds}};
  });
  step("/v1/failback/end", [this, site_json](const std::string& v) -> Result<json::object> {
    CDP_ASSIGN_OR_RETURN(SiteState s, EndFailback(v));
    return site_json(v, s);
  });
  http_->Route("POST", "/v1/reprotect", [this, site_json](const http::Request& r) {
    auto p = http::Params::Of(r, {"volume", "generation"});
    if (!p.ok()) return http::ErrorResponse(p.status());
    auto v = p->String("volume");
    auto g = p->Uint("generation");
    if (!v.ok()) return http::ErrorResponse(v.status());
    if (!g.ok()) return http::ErrorResponse(g.status());
    if (!*v || !*g) return http::Response::Error(400, "body must be {\"volume\": \"NAME\", \"generation\": N}");
    auto s = Reprotect(**v, **g);
    if (!s.ok()) return http::ErrorResponse(s.status());
    return http::Response::Json(200, site_json(**v, *s));
  });
  http_->Route("GET", "/v1/branches", [this](const http::Request&) {
    json::array out;
    for (size_t i = 0; i < sites_.size(); ++i) {
      VolumeSite& s = *sites_[i];
      std::lock_guard lk(s.mu);
      for (const auto& [gen, b] : s.branches) {
        out.push_back(json::object{{"volume", opts_.volumes[i].name},
                                   {"generation", gen},
                                   {"path", BranchPrefix(i, gen)},
                                   {"export", b.export_name},
                                   {"saved_blocks", b.store->saved_blocks()},
                                   {"saved_bytes", b.store->saved_blocks() * b.store->block_size()},
                                   {"created_us", b.store->created_us()}});
      }
    }
    return http::Response::Json(200, json::object{{"branches", out}});
  });
}

}  // namespace cdp::agent

// SPDX-License-Identifier: Apache-2.0
#include "master-target/ps_session.h"

#include <algorithm>
#include <variant>

namespace cdp::mt {

namespace {

// Work (proto::BatchWork) of the WriteBatches applied as one group commit.
constexpr uint64_t kMaxGroupWork = 32u << 20;

// A volume as one session opened it. The wire numbers a generation's records
// from 1, the volume its whole history: every sequence crosses between the
// two here, through the volume's Numbering.
class SessionVolume : public repl::ReceiverVolume {
 public:
  SessionVolume(MasterTarget::Impl& m, const repl::Session& s, std::shared_ptr<VolEntry> e, uint64_t generation)
      : m_(m), s_(s), e_(std::move(e)), key_(e_->name), generation_(generation) {}

  const std::string& key() const override { return key_; }
  std::string Fence() override { return e_->volume->fence().Fence(); }

  repl::Verdict Append(std::vector<proto::Record> records, int, uint64_t wire_bytes) override {
    // The group crossed the link whatever becomes of it here (a refused
    // batch is sent again, and crosses it again).
    e_->lag.AddWireBytes(m_.o.clock->WallMicros(), wire_bytes);
    ReplicaVolume& vol = *e_->volume;
    if (vol.fence().generation() != generation_)
      return repl::Verdict::Refuse(proto::NackReason::kWrongGeneration,
                                   "volume re-protected under generation " + std::to_string(vol.fence().generation()));
    const Numbering n = vol.fence().numbering();
    for (proto::Record& rec : records) rec.seq = n.History(rec.seq);
    const bool news = !records.empty() && records.back().seq > vol.applied_seq();
    const uint64_t expected = n.Wire(vol.applied_seq() + 1);
    if (news && m_.OverQuota(s_.tenant))
      return repl::Verdict::Refuse(proto::NackReason::kBusy, "tenant quota exceeded; retry after retention", expected);
    const uint64_t cap = m_.o.max_journal_bytes_per_tenant;
    if (uint64_t journal = 0; news && cap != 0 && (journal = m_.JournalBytes(s_.tenant)) >= cap) {
      m_.log->warn("{} batch held: tenant {} journal cap reached ({} bytes)", Where(expected), s_.tenant, journal);
      vol.NoteTenantCapHold("tenant journal cap " + std::to_string(cap) + " bytes reached");
      return repl::Verdict::Refuse(proto::NackReason::kBusy,
                                   "tenant journal cap reached: " + std::to_string(journal) +
                                       " bytes of undo journal >= " + std::to_string(cap) +
                                       " (max_journal_bytes_per_tenant); retry after retention",
                                   expected);
    }
    auto r = vol.ApplyBatch(records);
    if (!r.ok()) return repl::Verdict::Refuse(proto::NackReason::kInternal, r.status().ToString());
    if (!r->ack) {
      m_.log->warn("{} batch refused: {}", Where(records.empty() ? 0 : n.Wire(records.front().seq)), r->message);
      return repl::Verdict::Refuse(r->reason, r->message, n.Wire(r->expected_seq));
    }
    if (r->applied > 0 && records.back().timestamp_us != 0) {
      const uint64_t now = m_.o.clock->WallMicros(), ts = records.back().timestamp_us;
      e_->lag.Record(now, now > ts ? double(now - ts) / 1e6 : 0.0);
    }
    return repl::Verdict::Accept(n.Wire(r->durable_seq));
  }

  void Digests(const proto::HashRequest& h, repl::Reply reply) override {
    ReplicaVolume& vol = *e_->volume;
    const Numbering n = vol.fence().numbering();
    auto r = vol.Digests({h.region_size, h.first_region, h.count, n.History(h.min_seq), n.History(h.at_seq)});
    if (!r.ok()) {
      m_.log->warn("{} hash request refused: {}", Where(0), r.status().ToString());
      return reply(repl::FailedAnswer(h));
    }
    proto::HashResponse resp;
    resp.volume_id = h.volume_id;
    resp.request_id = h.request_id;
    resp.region_size = h.region_size;
    resp.first_region = h.first_region;
    resp.status = r->status;
    resp.seq = n.Wire(r->seq);
    resp.hashes = std::move(r->digests);
    reply(std::move(resp));
  }

 private:
  log::Where Where(uint64_t seq) const { return log::Where{key_, s_.address, seq}; }

  MasterTarget::Impl& m_;
  const repl::Session& s_;
  const std::shared_ptr<VolEntry> e_;
  const std::string key_;
  const uint64_t generation_;  // the one this session opened
};

class SessionSink : public repl::ReceiverSink {
 public:
  SessionSink(MasterTarget::Impl& m, const repl::Session& s)
      : m_(m),
        s_(s),
        // Who the volumes opened here replicate through: the certificate's
        // name (authenticated) with TLS, the client_id without.
        upstream_{s.peer.role == proto::Role::kProcessServer ? "ps" : "agent",
                  s.peer.tls ? s.peer.cert_name : s.peer.client_id} {}

  repl::Opened Open(const proto::VolumeOpen& open) override {
    repl::Opened out;
    auto r = m_.OpenVolume(s_.tenant, open, upstream_);
    const log::Where where{open.name, s_.address, 0};
    if (!r.ok()) {
      m_.log->error("{} volume open failed: {}", where, r.status().ToString());
      out.verdict = repl::Verdict::Refuse(proto::NackReason::kInternal, r.status().ToString());
      return out;
    }
    if (r->first) out.volume = std::make_shared<SessionVolume>(m_, s_, r->first, open.generation);
    if (!r->second.ack) {
      m_.log->warn("{} volume open refused: {}", where, r->second.message);
      out.verdict = repl::Verdict::Refuse(r->second.reason, r->second.message);
      return out;
    }
    // The groups coordinated here reach this volume through this peer (known
    // as its volumes are: by its certificate's name, or its client_id).
    if (m_.groups) m_.groups->Opened(s_.tenant, open.name, upstream_.name);
    out.verdict = repl::Verdict::Accept(r->second.durable_seq);
    return out;
  }

  // Group rounds (common/wire/group_coordinator.h) reach the peer through `push`.
  void Attach(repl::Reply push) override {
    if (m_.groups) group_handle_ = m_.groups->Attach(s_.tenant, upstream_.name, std::move(push));
  }
  void Answered(proto::Message answer) override {
    if (auto* h = std::get_if<proto::GroupHeld>(&answer); h != nullptr && m_.groups && group_handle_ != 0)
      m_.groups->Answered(group_handle_, *h);
  }
  ~SessionSink() override {
    if (m_.groups && group_handle_ != 0) m_.groups->Detach(group_handle_);
  }

  // Failback requests name the volume in this session's tenant (an unknown
  // one answers kNotFailingBack, like a volume that is not failing back).
  void Call(proto::Message request, repl::Reply reply) override {
    if (auto* fp = std::get_if<proto::FailbackPlanRequest>(&request)) return reply(m_.mt->FailbackPlan(s_.tenant, *fp));
    if (auto* pr = std::get_if<proto::PullRequest>(&request))
      return reply(m_.mt->Pull(s_.tenant, *pr, proto::Codec::kZstd, 1));
    reply(repl::FailedAnswer(request));
  }

 private:
  MasterTarget::Impl& m_;
  const repl::Session& s_;
  const Upstream upstream_;
  uint64_t group_handle_ = 0;  // GroupCoordinator::Attach's, 0: none
};

}  // namespace

std::unique_ptr<repl::ReplicationReceiver> MasterTarget::Impl::MakeReceiver() {
  repl::ReceiverOptions r;
  r.log_name = "mt";
  r.secret = [this](const std::string& t) -> std::optional<std::string> {
    auto it = o.tenants.find(t);
    if (it == o.tenants.end()) return std::nullopt;
    return it->second;
  };
  r.handshake_timeout = std::chrono::milliseconds(o.handshake_timeout_ms);
  // Only process servers, unless the tenant lets its agents connect directly.
  r.admit = [this](const std::string& tenant, const PeerIdentity& peer) -> std::string {
    if (peer.role == proto::Role::kProcessServer) return "";
    if (peer.role == proto::Role::kAgent && o.direct_agent_tenants.count(tenant) > 0) return "";
    return "role " + std::to_string(int(peer.role)) +
           " may not connect to the master target: connect through a process server" +
           (peer.role == proto::Role::kAgent ? " (the tenant allows no direct agents)" : "");
  };
  // A certificate revoked since its session began (tls_crl, reloaded on
  // SIGHUP) ends the session.
  if (tls) r.distrusted = [creds = tls.get()](const TlsPeer& peer) { return creds->Distrusted(peer); };
  r.make_sink = [this](const repl::Session& s) { return std::make_unique<SessionSink>(*this, s); };
  r.clock = o.clock;
  r.stopping = &stopping;
  r.group_work = std::min(kMaxGroupWork, o.max_batch_work);
  r.connections = connections.get();
  r.nacks = nacks.get();
  r.queued_bytes = received_queued.get();
  r.batches_grouped = batches_grouped.get();
  r.stages = &receive_stages;
  return std::make_unique<repl::ReplicationReceiver>(std::move(r));
}

}  // namespace cdp::mt

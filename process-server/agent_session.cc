// SPDX-License-Identifier: Apache-2.0
#include "process-server/agent_session.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <variant>

#include "common/wire/codec.h"

namespace cdp::ps {

namespace {

using Millis = std::chrono::milliseconds;

// A write record lies inside the volume, and is sealed exactly when the
// volume is (a sealed volume's blocks never travel in the clear).
bool RecordInVolume(const proto::Record& r, const proto::VolumeOpen& v) {
  if (!proto::IsWriteKind(r.kind))
    return r.kind == proto::RecordKind::kFlush || r.kind == proto::RecordKind::kTag ||
           r.kind == proto::RecordKind::kAnomaly;
  const bool sealed = r.kind == proto::RecordKind::kSealed || r.kind == proto::RecordKind::kSealedZero;
  return sealed == v.sealed && r.length > 0 && r.length <= proto::kMaxRecordLength && r.offset <= v.size &&
         r.length <= v.size - r.offset;
}

// Adds `unshipped` (the spool's blocks, >= from_block) to an MT plan page
// [from_block, next_block) — [from_block, end) when next_block is 0 — and
// keeps the page within kMaxExtents (cut, next_block set, if merging made it
// longer).
void AddUnshipped(proto::FailbackPlan* plan, uint64_t from_block, const std::vector<proto::BlockExtent>& unshipped) {
  if (unshipped.empty()) return;
  const uint64_t end = plan->next_block == 0 ? UINT64_MAX : plan->next_block;
  std::vector<proto::BlockExtent> all = plan->extents;
  for (const proto::BlockExtent& e : unshipped) {
    const uint64_t first = std::max(e.first_block, from_block);
    const uint64_t last = std::min(e.first_block + e.count, end);
    if (last > first) all.push_back(proto::BlockExtent{first, uint32_t(last - first)});
  }
  all = proto::MergeExtents(std::move(all));
  if (all.size() > proto::kMaxExtents) {
    plan->next_block = all[proto::kMaxExtents].first_block;
    all.resize(proto::kMaxExtents);
  }
  plan->extents = std::move(all);
}

// A spooled volume as one agent session opened it.
class SessionVolume : public repl::ReceiverVolume {
 public:
  SessionVolume(ProcessServer::Impl& ps, const repl::Session& s, SpooledVolume* v)
      : ps_(ps), s_(s), v_(v), key_(v->key()) {}

  const std::string& key() const override { return key_; }
  std::string Fence() override { return v_->fenced(); }

  repl::Verdict Append(std::vector<proto::Record> records, int batches, uint64_t) override {
    if (std::string fence = v_->fenced(); !fence.empty())
      return repl::Verdict::Refuse(proto::NackReason::kWrongGeneration, fence);
    for (const auto& r : records) {
      if (!RecordInVolume(r, v_->open_message()))
        return repl::Verdict::Refuse(proto::NackReason::kBadRecord,
                                     "record seq " + std::to_string(r.seq) + " outside the volume");
    }
    if (uint64_t work = proto::BatchWork(records); work > proto::kMaxBatchWork) {
      return repl::Verdict::Refuse(proto::NackReason::kBadRecord,
                                   "batch asks " + std::to_string(work) + " bytes of work, over the cap of " +
                                       std::to_string(proto::kMaxBatchWork));
    }
    uint64_t bytes = 0;  // of records that are not duplicates
    const uint64_t before = v_->spool().durable_seq();
    for (const auto& r : records)
      if (r.seq > before) bytes += r.data.size();
    AppendResult ar = v_->spool().Append(std::move(records));
    if (ar.status.ok()) {
      VolumeCounters& c = v_->counters();
      if (ar.appended > 0) {
        c.bytes_in.fetch_add(bytes);
        c.records_in.fetch_add(ar.appended);
        c.batches_in.fetch_add(uint64_t(batches));
        ps_.NotifyLinks(v_);  // every copy's link
      }
      return repl::Verdict::Accept(ar.durable_seq);
    }
    const std::string& why = ar.status.message();
    switch (ar.status.code()) {
      case Code::kBusy:
        v_->counters().busy_nacks.fetch_add(uint64_t(batches));
        return repl::Verdict::Refuse(proto::NackReason::kBusy, why, ar.expected_seq);
      case Code::kOutOfRange:
        return repl::Verdict::Refuse(proto::NackReason::kGap, why, ar.expected_seq);
      case Code::kInvalidArgument:
        return repl::Verdict::Refuse(proto::NackReason::kBadRecord, why, ar.expected_seq);
      default:
        ps_.log->error("{} spool append failed: {}", log::Where{v_->key(), s_.address, ar.expected_seq},
                       ar.status.ToString());
        return repl::Verdict::Refuse(proto::NackReason::kInternal, why, ar.expected_seq);
    }
  }

  // Forwarded to the master target without waiting: the agent's batches keep
  // flowing while it hashes.
  void Digests(const proto::HashRequest& h, repl::Reply reply) override {
    MtLink* link = ps_.LinkFor(s_.tenant, v_->name());
    if (link == nullptr) return reply(repl::FailedAnswer(h));
    link->HashAsync(v_, h, [reply = std::move(reply), h, log = ps_.log, key = v_->key()](
                               Result<proto::HashResponse> r) {
      if (!r.ok()) {
        log->info("{} hash request {} not answered: {}", log::Where{key, "", 0}, h.request_id, r.status().ToString());
        return reply(repl::FailedAnswer(h));
      }
      r->volume_id = h.volume_id;
      r->request_id = h.request_id;
      reply(std::move(*r));
    });
  }

 private:
  ProcessServer::Impl& ps_;
  const repl::Session& s_;
  SpooledVolume* const v_;
  const std::string key_;
};

class SessionSink : public repl::ReceiverSink {
 public:
  SessionSink(ProcessServer::Impl& ps, const repl::Session& s) : ps_(ps), s_(s) {}

  repl::Opened Open(const proto::VolumeOpen& o) override {
    using repl::Verdict;
    repl::Opened out;
    if (!ValidName(o.name)) {
      out.verdict = Verdict::Refuse(proto::NackReason::kBadRecord, "invalid volume name");
      return out;
    }
    if (IsRetiredSpoolName(o.name)) {
      out.verdict = Verdict::Refuse(proto::NackReason::kBadRecord,
                                    "volume names containing \"" + std::string(kRetiredMark) + "\" are reserved");
      return out;
    }
    auto v = ps_.GetVolume(s_.tenant, &o, o.name);
    if (!v.ok()) {
      proto::NackReason reason = v.status().message().rfind("wrong generation", 0) == 0
                                     ? proto::NackReason::kWrongGeneration
                                     : proto::NackReason::kInternal;
      ps_.log->error("{} open failed: {}", log::Where{s_.tenant + "/" + o.name, s_.address, 0}, v.status().ToString());
      out.verdict = Verdict::Refuse(reason, v.status().message());
      return out;
    }
    SpooledVolume* vol = *v;
    out.volume = std::make_shared<SessionVolume>(ps_, s_, vol);
    const uint64_t durable = Position(vol, o);
    if (std::string fence = vol->fenced(); !fence.empty()) {
      // The MT failed the volume over: the old primary is fenced here too.
      ps_.log->warn("{} open refused: {}", log::Where{vol->key(), s_.address, durable}, fence);
      out.verdict = Verdict::Refuse(proto::NackReason::kWrongGeneration, fence);
      return out;
    }
    if (durable == kDeferred) {
      out.verdict = Verdict::Refuse(proto::NackReason::kBusy, deferred_);
      return out;
    }
    ps_.log->info("{} opened by agent, durable {}", log::Where{vol->key(), s_.address, durable}, durable);
    // The master target's group rounds reach this volume through its agent.
    if (ps_.groups) ps_.groups->Opened(s_.tenant, o.name, s_.peer.client_id);
    out.verdict = Verdict::Accept(durable);
    return out;
  }

  void Call(proto::Message request, repl::Reply reply) override;

  // Group rounds (common/wire/group_coordinator.h) reach the agent through `push`.
  void Attach(repl::Reply push) override {
    if (ps_.groups) group_handle_ = ps_.groups->Attach(s_.tenant, s_.peer.client_id, std::move(push));
  }
  void Answered(proto::Message answer) override {
    if (auto* h = std::get_if<proto::GroupHeld>(&answer); h != nullptr && ps_.groups && group_handle_ != 0)
      ps_.groups->Answered(group_handle_, *h);
  }
  ~SessionSink() override {
    if (ps_.groups && group_handle_ != 0) ps_.groups->Detach(group_handle_);
  }

 private:
  static constexpr uint64_t kDeferred = UINT64_MAX;
  uint64_t group_handle_ = 0;  // GroupCoordinator::Attach's, 0: none

  // Where the agent resumes: the spool's durable sequence, or the master
  // targets' when they hold more; kDeferred (why in deferred_) while that is
  // not known and must be.
  uint64_t Position(SpooledVolume* vol, const proto::VolumeOpen& o) {
    uint64_t durable = vol->spool().durable_seq();
    if (o.acked_seq > durable) {
      // The agent was acknowledged more than this spool holds: it lost records
      // (its disk replaced, a damaged segment dropped at recovery). The master
      // targets may hold some of them, numbered; the agent numbers its next
      // records after the answer, so it waits until every copy has said where
      // it stands: answered with less, the agent would number writes the MT
      // has already applied under those numbers, and the MT would skip them.
      Result<uint64_t> top = ps_.LearnPosition(vol);
      if (!top.ok() && vol->fenced().empty()) {  // a fence is answered as such
        deferred_ = "the process server holds volume " + o.name + " up to seq " + std::to_string(durable) +
                    " but acknowledged up to " + std::to_string(o.acked_seq) +
                    " (its spool lost records); it answers once every master target has said where the volume "
                    "stands, so that no sequence is used twice: " + top.status().message();
        ps_.log->error("{} open deferred: {}", log::Where{vol->key(), s_.address, durable}, deferred_);
        return kDeferred;
      }
      if (top.ok()) {
        if (*top > durable) vol->spool().SetFloor(*top);
        // Nothing is numbered at or below the floor from now on.
        if (Status cleared = vol->ClearBeyond(); !cleared.ok())
          ps_.log->error("{} {}: the copies stay refused after a restart of the process server (cdpctl reprotect)",
                         log::Where{vol->key(), s_.address, *top}, cleared.ToString());
        durable = vol->spool().durable_seq();
        ps_.log->warn("{} the spool lost records it had acknowledged (up to {}); the master targets stand at {}: the "
                      "agent resumes after {}",
                      log::Where{vol->key(), s_.address, durable}, o.acked_seq, *top, durable);
      }
    } else if (MtLink* link = ps_.LinkFor(s_.tenant, o.name)) {
      auto mt = link->WaitOpened(vol, Millis(ps_.opt->mt_open_wait_ms));
      if (mt.ok() && *mt > durable && vol->spool().stats().backlog_records > 0) {
        // Ahead of records it never received: a lie (or a replaced MT); the
        // spool keeps them and the link refuses the session (mt_link.cc).
        ps_.log->error("{} master target claims sequence {} beyond the spool's unshipped records; answering with "
                       "the spool's durable seq",
                       log::Where{vol->key(), s_.address, durable}, *mt);
      } else if (mt.ok() && *mt > durable) {
        vol->spool().SetFloor(*mt);
        durable = vol->spool().durable_seq();
      } else if (!mt.ok()) {
        ps_.log->warn("{} master target: {}; answering with the spool's durable seq",
                      log::Where{vol->key(), s_.address, durable}, mt.status().ToString());
      }
    }
    return durable;
  }

  ProcessServer::Impl& ps_;
  const repl::Session& s_;
  std::string deferred_;
};

// Relayed to the tenant's MT link for the volume without waiting (a
// FailbackPlan gets the spool's never-delivered blocks added, a
// PullResponse the hop's codec); never fails the connection for the MT's
// sake: kFailed instead.
void SessionSink::Call(proto::Message m, repl::Reply reply) {
  const bool is_plan = std::holds_alternative<proto::FailbackPlanRequest>(m);
  const uint64_t agent_id = is_plan ? std::get<proto::FailbackPlanRequest>(m).request_id
                                    : std::get<proto::PullRequest>(m).request_id;
  const uint64_t from_block = is_plan ? std::get<proto::FailbackPlanRequest>(m).from_block : 0;
  const std::string volume = is_plan ? std::get<proto::FailbackPlanRequest>(m).volume
                                     : std::get<proto::PullRequest>(m).volume;
  const char* what = is_plan ? "failback plan" : "pull";
  proto::Message failed = repl::FailedAnswer(m);
  if (!ValidName(volume)) {  // the parser checked it; the name becomes a path and a key below
    ps_.log->warn("{} tenant {}: {} request {} refused: invalid volume name", log::Where{"", s_.address, 0},
                  s_.tenant, what, agent_id);
    return reply(std::move(failed));
  }
  const std::string key = s_.tenant + "/" + volume;
  MtLink* link = ps_.LinkFor(s_.tenant, volume);
  if (link == nullptr) {
    ps_.log->warn("{} {} request {} refused: no master target link for the volume", log::Where{key, s_.address, 0},
                  what, agent_id);
    return reply(std::move(failed));
  }
  // The spool's never-delivered blocks, read here (the session's thread),
  // not in the link's reader when the answer comes.
  std::vector<proto::BlockExtent> unshipped;
  if (is_plan) {
    auto r = ps_.UnshippedBlocks(s_.tenant, volume, from_block);
    if (!r.ok()) {
      ps_.log->error("{} failback plan request {}: reading the spool: {}", log::Where{key, s_.address, 0}, agent_id,
                     r.status().ToString());
      return reply(std::move(failed));
    }
    unshipped = std::move(*r);
  }
  auto [codec, level] = ps_.CodecFor(key);
  link->CallAsync(std::move(m), [reply = std::move(reply), failed = std::move(failed), agent_id, from_block,
                                 unshipped = std::move(unshipped), codec = codec, level = level, what, key,
                                 log = ps_.log](Result<proto::Message> r) mutable {
    if (!r.ok()) {
      log->info("{} {} request {} not answered by the master target: {}", log::Where{key, "", 0}, what, agent_id,
                r.status().ToString());
      return reply(std::move(failed));
    }
    if (auto* plan = std::get_if<proto::FailbackPlan>(&*r)) {
      plan->request_id = agent_id;
      if (plan->status == proto::FailbackStatus::kOk) AddUnshipped(plan, from_block, unshipped);
      return reply(std::move(*r));
    }
    if (auto* pull = std::get_if<proto::PullResponse>(&*r)) {
      pull->request_id = agent_id;
      // Compressed like any stream of the volume on this hop.
      pull->codec = codec;
      pull->level = level;
      return reply(std::move(*r));
    }
    reply(std::move(failed));
  });
}

}  // namespace

std::unique_ptr<repl::ReplicationReceiver> ProcessServer::Impl::MakeReceiver() {
  repl::ReceiverOptions r;
  r.log_name = "ps";
  r.secret = [this](const std::string& t) -> std::optional<std::string> {
    auto it = opt->tenants.find(t);
    if (it == opt->tenants.end()) return std::nullopt;
    return it->second;
  };
  r.admit = [](const std::string&, const PeerIdentity& peer) -> std::string {
    return peer.role == proto::Role::kAgent ? "" : "role " + std::to_string(int(peer.role)) + " is not an agent";
  };
  // A certificate revoked since its session began (tls_crl, reloaded on
  // SIGHUP) ends the session.
  if (tls) r.distrusted = [creds = tls.get()](const TlsPeer& peer) { return creds->Distrusted(peer); };
  r.make_sink = [this](const repl::Session& s) { return std::make_unique<SessionSink>(*this, s); };
  r.clock = opt->clock;
  r.stopping = &stopping;
  r.stages = &receive_stages;
  return std::make_unique<repl::ReplicationReceiver>(std::move(r));
}

}  // namespace cdp::ps

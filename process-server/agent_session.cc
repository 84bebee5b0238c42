// SPDX-License-Identifier: Apache-2.0
#include "process-server/agent_session.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <future>
#include <list>
#include <optional>
#include <set>
#include <system_error>
#include <thread>
#include <variant>

#include "common/wire/codec.h"

namespace cdp::ps {

namespace {

using Millis = std::chrono::milliseconds;

// A WriteBatch of at least this much data is appended on a thread of its own
// while the session receives the next (see Serve).
constexpr uint64_t kOverlapBytes = 1u << 20;

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

proto::Nack MakeNack(uint32_t id, proto::NackReason reason, uint64_t expected, std::string msg) {
  proto::Nack n;
  n.volume_id = id;
  n.reason = reason;
  n.expected_seq = expected;
  n.message = std::move(msg);
  return n;
}

}  // namespace

void ProcessServer::Impl::Serve(FrameChannel& ch) {
  PeerIdentity peer;
  auto tenant_r = ServerHandshake(
      ch,
      [this](const std::string& t) -> std::optional<std::string> {
        auto it = opt->tenants.find(t);
        if (it == opt->tenants.end()) return std::nullopt;
        return it->second;
      },
      Millis(10000), &peer);
  if (!tenant_r.ok()) {
    log->warn("peer={} handshake failed: {}", ch.peer(), tenant_r.status().ToString());
    return;
  }
  std::string tenant = *tenant_r;
  if (peer.role != proto::Role::kAgent) {
    log->warn("peer={} tenant={} refused: role {} is not an agent", ch.peer(), tenant, int(peer.role));
    return;
  }
  log->info("peer={} tenant={} agent {} connected{}", ch.peer(), tenant, peer.client_id,
            peer.tls ? " (certificate '" + peer.cert_name + "')" : std::string(" (clear text)"));
  std::map<uint32_t, SpooledVolume*> handles;
  std::set<SpooledVolume*> fenced_here;  // volumes this session refused as fenced
  uint32_t next_id = 1;
  auto relays = std::make_shared<Relays>();
  relays->ch = &ch;
  struct Disarm {  // answers arriving after the connection ended go nowhere
    std::shared_ptr<Relays> r;
    FrameChannel* ch;
    ~Disarm() {
      {
        std::lock_guard<std::mutex> l(r->mu);
        r->ch = nullptr;
        r->closing = true;
      }
      r->cv.notify_all();
      if (r->replier.joinable()) {
        ch->Close();  // a send to an agent that stopped reading returns
        r->replier.join();
      }
    }
  } disarm{relays, &ch};
  std::optional<proto::Message> carry;  // received while coalescing, handled next
  Status pending;                       // a receive error met while coalescing
  // A large WriteBatch is appended and answered on a thread of its own while
  // the next one is received: receiving (decrypting, decoding) overlaps the
  // spool's write and fdatasync. One at a time, and every other message
  // waits for it, so replies keep their order. Declared after everything it
  // uses: on any return its future's destructor waits for it.
  using Appended = std::pair<Status, std::set<SpooledVolume*>>;  // and the volumes it found fenced
  std::future<Appended> appending;
  auto finish_append = [&]() -> Status {
    if (!appending.valid()) return Status::OK();
    Appended a = appending.get();
    fenced_here.insert(a.second.begin(), a.second.end());
    return a.first;
  };
  while (!stopping.load()) {
    if (appending.valid() && appending.wait_for(Millis(0)) == std::future_status::ready) {
      if (Status s = finish_append(); !s.ok()) {
        log->warn("peer={} tenant={} closing connection: {}", ch.peer(), tenant, s.ToString());
        return;
      }
    }
    // A fence learned after the agent opened the volume (the MT answered
    // the link's open later than this session's): told to the agent now, as
    // a batch would be refused, so that an agent with nothing queued shows
    // FENCED too. `handles` is the append task's while one runs.
    if (!appending.valid()) {
      for (const auto& [id, v] : handles) {
        if (fenced_here.count(v)) continue;
        if (std::string fence = v->fenced(); !fence.empty()) {
          log->warn("{} fenced while open: {}", log::Where{v->key(), ch.peer(), 0}, fence);
          fenced_here.insert(v);
          if (Status sent = ch.Send(MakeNack(id, proto::NackReason::kWrongGeneration, 0, fence)); !sent.ok()) {
            log->warn("peer={} tenant={} closing connection: {}", ch.peer(), tenant, sent.ToString());
            return;
          }
        }
      }
    }
    // A fence lifted (the MT's failover undone): close, so that the agent
    // reopens the volume at once instead of at its next connection.
    for (SpooledVolume* v : fenced_here) {
      if (v->fenced().empty()) {
        log->info("{} no longer fenced: closing the connection so that the agent reopens it",
                  log::Where{v->key(), ch.peer(), 0});
        return;
      }
    }
    proto::Message msg;
    if (carry) {
      msg = std::move(*carry);
      carry.reset();
    } else {
      if (!pending.ok()) {
        log->warn("peer={} tenant={} closing connection: {}", ch.peer(), tenant, pending.ToString());
        return;
      }
      auto m = ch.Receive(Millis(1000));
      if (!m.ok()) {
        if (m.status().IsBusy() && !ch.broken()) continue;
        if (m.status().code() == Code::kUnavailable || stopping.load())
          log->info("peer={} tenant={} agent disconnected: {}", ch.peer(), tenant, m.status().ToString());
        else
          log->warn("peer={} tenant={} closing connection: {}", ch.peer(), tenant, m.status().ToString());
        return;
      }
      msg = std::move(*m);
    }
    int replies = 1;
    uint64_t bytes = 0;  // of a WriteBatch's records, coalesced
    if (auto* b = std::get_if<proto::WriteBatch>(&msg)) {
      // Batches the agent pipelined and that are already here, contiguous
      // with this one, go into the same spool append (one fdatasync); each
      // still gets its own reply.
      for (const auto& r : b->records) bytes += r.data.size();
      while (replies < 64 && !b->records.empty() && bytes < (32u << 20)) {
        auto r = ch.Receive(Millis(0));
        if (!r.ok()) {
          if (!r.status().IsBusy() || ch.broken()) pending = r.status();
          break;
        }
        auto* nb = std::get_if<proto::WriteBatch>(&*r);
        if (nb == nullptr || nb->volume_id != b->volume_id || nb->records.empty() ||
            nb->records.front().seq != b->records.back().seq + 1 ||
            b->records.size() + nb->records.size() > proto::kMaxRecords) {
          carry = std::move(*r);
          break;
        }
        for (auto& rec : nb->records) {
          bytes += rec.data.size();
          b->records.push_back(std::move(rec));
        }
        replies++;
      }
    }
    Status s = finish_append();
    // (A small batch is appended here: a thread per batch would cost more
    // than the overlap gains when there are thousands a second.)
    if (s.ok() && bytes >= kOverlapBytes) {
      auto batch = std::make_shared<proto::Message>(std::move(msg));
      auto task = [this, &ch, &tenant, &handles, &next_id, relays, replies, batch] {
        Appended a;
        a.first = Handle(ch, tenant, handles, next_id, relays, *batch, replies, &a.second);
        return a;
      };
      try {
        appending = std::async(std::launch::async, task);
        continue;
      } catch (const std::system_error&) {
        msg = std::move(*batch);  // no thread to be had: appended here, as below
      }
    }
    if (s.ok()) s = Handle(ch, tenant, handles, next_id, relays, msg, replies, &fenced_here);
    if (!s.ok()) {
      log->warn("peer={} tenant={} closing connection: {}", ch.peer(), tenant, s.ToString());
      return;
    }
  }
}

Status ProcessServer::Impl::Handle(FrameChannel& ch, const std::string& tenant, std::map<uint32_t, SpooledVolume*>& handles,
                                   uint32_t& next_id, const std::shared_ptr<Relays>& relays,
                                   proto::Message& m, int replies, std::set<SpooledVolume*>* fenced_here) {
  if (auto* o = std::get_if<proto::VolumeOpen>(&m)) {
    if (!ValidName(o->name)) return ch.Send(MakeNack(0, proto::NackReason::kBadRecord, 0, "invalid volume name"));
    if (IsRetiredSpoolName(o->name))
      return ch.Send(MakeNack(0, proto::NackReason::kBadRecord, 0,
                              "volume names containing \"" + std::string(kRetiredMark) + "\" are reserved"));
    auto v = GetVolume(tenant, o, o->name);
    if (!v.ok()) {
      proto::NackReason reason = v.status().message().rfind("wrong generation", 0) == 0
                                     ? proto::NackReason::kWrongGeneration
                                     : proto::NackReason::kInternal;
      log->error("{} open failed: {}", log::Where{tenant + "/" + o->name, ch.peer(), 0}, v.status().ToString());
      return ch.Send(MakeNack(0, reason, 0, v.status().message()));
    }
    SpooledVolume* vol = *v;
    uint64_t durable = vol->spool().durable_seq();
    if (o->acked_seq > durable) {
      // The agent was acknowledged more than this spool holds: it lost records
      // (its disk replaced, a damaged segment dropped at recovery). The master
      // targets may hold some of them, numbered; the agent numbers its next
      // records after the answer, so it waits until every copy has said where
      // it stands: answered with less, the agent would number writes the MT
      // has already applied under those numbers, and the MT would skip them.
      Result<uint64_t> top = LearnPosition(vol);
      if (!top.ok() && vol->fenced().empty()) {  // a fence is answered as such below
        const std::string why = "the process server holds volume " + o->name + " up to seq " +
                                std::to_string(durable) + " but acknowledged up to " + std::to_string(o->acked_seq) +
                                " (its spool lost records); it answers once every master target has said where the "
                                "volume stands, so that no sequence is used twice: " + top.status().message();
        log->error("{} open deferred: {}", log::Where{vol->key(), ch.peer(), durable}, why);
        return ch.Send(MakeNack(0, proto::NackReason::kBusy, 0, why));
      }
      if (top.ok()) {
        if (*top > durable) vol->spool().SetFloor(*top);
        // Nothing is numbered at or below the floor from now on.
        if (Status cleared = vol->ClearBeyond(); !cleared.ok())
          log->error("{} {}: the copies stay refused after a restart of the process server (cdpctl reprotect)",
                     log::Where{vol->key(), ch.peer(), *top}, cleared.ToString());
        durable = vol->spool().durable_seq();
        log->warn("{} the spool lost records it had acknowledged (up to {}); the master targets stand at {}: the "
                  "agent resumes after {}",
                  log::Where{vol->key(), ch.peer(), durable}, o->acked_seq, *top, durable);
      }
    } else if (MtLink* link = LinkFor(tenant, o->name)) {
      auto mt = link->WaitOpened(vol, Millis(opt->mt_open_wait_ms));
      if (mt.ok() && *mt > durable && vol->spool().stats().backlog_records > 0) {
        // Ahead of records it never received: a lie (or a replaced MT); the
        // spool keeps them and the link refuses the session (mt_link.cc).
        log->error("{} master target claims sequence {} beyond the spool's unshipped records; answering with the "
                   "spool's durable seq",
                   log::Where{vol->key(), ch.peer(), durable}, *mt);
      } else if (mt.ok() && *mt > durable) {
        vol->spool().SetFloor(*mt);
        durable = vol->spool().durable_seq();
      } else if (!mt.ok()) {
        log->warn("{} master target: {}; answering with the spool's durable seq",
                  log::Where{vol->key(), ch.peer(), durable}, mt.status().ToString());
      }
    }
    if (std::string fence = vol->fenced(); !fence.empty()) {
      // The MT failed the volume over: the old primary is fenced here too.
      log->warn("{} open refused: {}", log::Where{vol->key(), ch.peer(), durable}, fence);
      fenced_here->insert(vol);
      return ch.Send(MakeNack(0, proto::NackReason::kWrongGeneration, 0, fence));
    }
    uint32_t id = next_id++;
    handles[id] = vol;
    proto::VolumeOpenReply r;
    r.volume_id = id;
    r.durable_seq = durable;
    log->info("{} opened by agent, volume_id {}, durable {}", log::Where{vol->key(), ch.peer(), durable}, id, durable);
    return ch.Send(r);
  }
  if (auto* b = std::get_if<proto::WriteBatch>(&m)) {
    auto it = handles.find(b->volume_id);
    if (it == handles.end())
      return Reply(ch, replies, MakeNack(b->volume_id, proto::NackReason::kUnknownVolume, 0, "volume not open on this connection"));
    SpooledVolume* v = it->second;
    if (std::string fence = v->fenced(); !fence.empty()) {
      fenced_here->insert(v);
      return Reply(ch, replies, MakeNack(b->volume_id, proto::NackReason::kWrongGeneration, 0, fence));
    }
    for (const auto& r : b->records) {
      if (!RecordInVolume(r, v->open_message()))
        return Reply(ch, replies, MakeNack(b->volume_id, proto::NackReason::kBadRecord, 0,
                                "record seq " + std::to_string(r.seq) + " outside the volume"));
    }
    if (uint64_t work = proto::BatchWork(b->records); work > proto::kMaxBatchWork) {
      return Reply(ch, replies, MakeNack(b->volume_id, proto::NackReason::kBadRecord, 0,
                                         "batch asks " + std::to_string(work) + " bytes of work, over the cap of " +
                                             std::to_string(proto::kMaxBatchWork)));
    }
    uint64_t bytes = 0;  // of records that are not duplicates
    uint64_t before = v->spool().durable_seq();
    for (const auto& r : b->records)
      if (r.seq > before) bytes += r.data.size();
    AppendResult ar = v->spool().Append(std::move(b->records));
    if (ar.status.ok()) {
      VolumeCounters& c = v->counters();
      if (ar.appended > 0) {
        c.bytes_in.fetch_add(bytes);
        c.records_in.fetch_add(ar.appended);
        c.batches_in.fetch_add(uint64_t(replies));
        NotifyLinks(v);  // every copy's link
      }
      proto::Ack a;
      a.volume_id = b->volume_id;
      a.durable_seq = ar.durable_seq;
      return Reply(ch, replies, a);
    }
    switch (ar.status.code()) {
      case Code::kBusy:
        v->counters().busy_nacks.fetch_add(uint64_t(replies));
        return Reply(ch, replies, MakeNack(b->volume_id, proto::NackReason::kBusy, ar.expected_seq, ar.status.message()));
      case Code::kOutOfRange:
        return Reply(ch, replies, MakeNack(b->volume_id, proto::NackReason::kGap, ar.expected_seq, ar.status.message()));
      case Code::kInvalidArgument:
        return Reply(ch, replies, MakeNack(b->volume_id, proto::NackReason::kBadRecord, ar.expected_seq, ar.status.message()));
      default:
        log->error("{} spool append failed: {}", log::Where{v->key(), ch.peer(), ar.expected_seq},
                   ar.status.ToString());
        return Reply(ch, replies, MakeNack(b->volume_id, proto::NackReason::kInternal, ar.expected_seq, ar.status.message()));
    }
  }
  if (auto* h = std::get_if<proto::HashRequest>(&m)) {
    auto it = handles.find(h->volume_id);
    if (it == handles.end())
      return ch.Send(MakeNack(h->volume_id, proto::NackReason::kUnknownVolume, 0, "volume not open on this connection"));
    proto::HashResponse failed;
    failed.volume_id = h->volume_id;
    failed.request_id = h->request_id;
    failed.region_size = h->region_size;
    failed.first_region = h->first_region;
    failed.status = proto::HashStatus::kFailed;
    MtLink* link = LinkFor(tenant, it->second->name());
    if (link == nullptr) return ch.Send(failed);
    // Forwarded without waiting: the agent's batches keep flowing while the
    // master target hashes, and many requests may be outstanding (capped).
    {
      std::lock_guard<std::mutex> l(relays->mu);
      // The cap grows with the volumes open here: an agent carries many volumes
      // on one connection, each resyncing with its own requests in flight.
      const int cap = kMaxHashesInFlight * int(std::max<size_t>(1, handles.size()));
      if (relays->outstanding >= cap) {
        log->warn("{} more than {} hash requests outstanding: refused", log::Where{it->second->key(), ch.peer(), 0},
                  cap);
        return ch.Send(failed);
      }
      ++relays->outstanding;
    }
    link->HashAsync(it->second, *h, [relays, failed, self = this, key = it->second->key()](
                                        Result<proto::HashResponse> r) mutable {
      proto::HashResponse out;
      if (r.ok()) {
        out = std::move(*r);
        out.volume_id = failed.volume_id;
        out.request_id = failed.request_id;
      } else {
        self->log->info("{} hash request {} not answered: {}", log::Where{key, "", 0}, failed.request_id,
                        r.status().ToString());
        out = failed;
      }
      std::lock_guard<std::mutex> l(relays->mu);
      --relays->outstanding;
      if (relays->ch != nullptr) (void)relays->ch->Send(out);
    });
    return Status::OK();
  }
  if (std::holds_alternative<proto::FailbackPlanRequest>(m) || std::holds_alternative<proto::PullRequest>(m))
    return RelayFailback(ch, tenant, relays, m);
  if (auto* hb = std::get_if<proto::Heartbeat>(&m)) {
    if (hb->echo_us != 0) return Status::OK();
    proto::Heartbeat reply;
    reply.sent_us = opt->clock->WallMicros();
    reply.echo_us = hb->sent_us;
    return ch.Send(reply);
  }
  if (std::holds_alternative<proto::Stats>(m)) return Status::OK();
  return Status::InvalidArgument("unexpected message type " + std::to_string(int(proto::TypeOf(m))) +
                                 " from an agent");
}

namespace {

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

}  // namespace

Status ProcessServer::Impl::RelayFailback(FrameChannel& ch, const std::string& tenant,
                                          const std::shared_ptr<Relays>& relays, proto::Message& m) {
  const bool is_plan = std::holds_alternative<proto::FailbackPlanRequest>(m);
  uint64_t agent_id = 0, from_block = 0;
  std::string volume;
  if (is_plan) {
    const auto& r = std::get<proto::FailbackPlanRequest>(m);
    agent_id = r.request_id;
    from_block = r.from_block;
    volume = r.volume;
  } else {
    const auto& r = std::get<proto::PullRequest>(m);
    agent_id = r.request_id;
    volume = r.volume;
  }
  // The answer when the MT cannot give one: kFailed, never a Nack (a Nack
  // would stop the agent's streams).
  proto::Message failed;
  if (is_plan) {
    proto::FailbackPlan p;
    p.request_id = agent_id;
    p.status = proto::FailbackStatus::kFailed;
    failed = std::move(p);
  } else {
    proto::PullResponse p;
    p.request_id = agent_id;
    p.status = proto::FailbackStatus::kFailed;
    failed = std::move(p);
  }
  const char* what = is_plan ? "failback plan" : "pull";
  if (!ValidName(volume)) {  // the parser checked it; the name becomes a path and a key below
    log->warn("peer={} tenant={} {} request {} refused: invalid volume name", ch.peer(), tenant, what, agent_id);
    return ch.Send(failed);
  }
  const std::string key = tenant + "/" + volume;
  MtLink* link = LinkFor(tenant, volume);
  if (link == nullptr) {
    log->warn("{} {} request {} refused: no master target link for the volume", log::Where{key, ch.peer(), 0}, what,
              agent_id);
    return ch.Send(failed);
  }
  {
    // A request holds its slot until its answer is sent (or dropped): an
    // agent that does not read its answers cannot pile them up here.
    std::lock_guard<std::mutex> l(relays->mu);
    if (relays->failback_outstanding >= kMaxFailbackInFlight) {
      log->warn("{} more than {} failback requests outstanding: {} request {} refused",
                log::Where{key, ch.peer(), 0}, kMaxFailbackInFlight, what, agent_id);
      return ch.Send(failed);
    }
    ++relays->failback_outstanding;
    if (!relays->replier.joinable()) {
      relays->replier = std::thread([r = relays.get()] {
        std::unique_lock<std::mutex> l(r->mu);
        for (;;) {
          r->cv.wait(l, [&] { return r->closing || !r->outbox.empty(); });
          if (r->closing) return;  // the connection ended: the answers go nowhere
          proto::Message out = std::move(r->outbox.front());
          r->outbox.pop_front();
          FrameChannel* c = r->ch;
          l.unlock();
          if (c != nullptr) (void)c->Send(out);  // compresses a pull answer here
          l.lock();
          --r->failback_outstanding;
        }
      });
    }
  }
  // The spool's never-delivered blocks, read here (this agent's thread), not
  // in the link's reader when the answer comes.
  std::vector<proto::BlockExtent> unshipped;
  if (is_plan) {
    auto r = UnshippedBlocks(tenant, volume, from_block);
    if (!r.ok()) {
      log->error("{} failback plan request {}: reading the spool: {}", log::Where{key, ch.peer(), 0}, agent_id,
                 r.status().ToString());
      {
        std::lock_guard<std::mutex> l(relays->mu);
        --relays->failback_outstanding;
      }
      return ch.Send(failed);
    }
    unshipped = std::move(*r);
  }
  auto [codec, level] = CodecFor(key);
  link->CallAsync(std::move(m), [relays, failed = std::move(failed), agent_id, from_block,
                                 unshipped = std::move(unshipped), codec = codec, level = level, what, key,
                                 self = this](Result<proto::Message> r) mutable {
    proto::Message out = std::move(failed);
    if (!r.ok()) {
      self->log->info("{} {} request {} not answered by the master target: {}", log::Where{key, "", 0}, what,
                      agent_id, r.status().ToString());
    } else if (auto* plan = std::get_if<proto::FailbackPlan>(&*r)) {
      plan->request_id = agent_id;
      if (plan->status == proto::FailbackStatus::kOk) AddUnshipped(plan, from_block, unshipped);
      out = std::move(*r);
    } else if (auto* pull = std::get_if<proto::PullResponse>(&*r)) {
      pull->request_id = agent_id;
      // Compressed like any stream of the volume on this hop.
      pull->codec = codec;
      pull->level = level;
      out = std::move(*r);
    }
    {
      std::lock_guard<std::mutex> l(relays->mu);
      if (relays->closing) return;  // the slot goes with the connection
      relays->outbox.push_back(std::move(out));  // the replier frees the slot once sent
    }
    relays->cv.notify_all();
  });
  return Status::OK();
}

}  // namespace cdp::ps

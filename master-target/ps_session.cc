// SPDX-License-Identifier: Apache-2.0
#include "master-target/ps_session.h"

#include <algorithm>
#include <variant>

#include "common/wire/frame_inbox.h"

namespace cdp::mt {

namespace {

// Messages received ahead of the one being worked on (bounds the session's memory).
constexpr uint64_t kInboxBytes = 32u << 20;
// Work (proto::BatchWork) of the WriteBatches applied as one group commit.
constexpr uint64_t kMaxGroupWork = 32u << 20;

}  // namespace

void MasterTarget::Impl::Serve(FrameChannel& ch) {
  const std::string peer_addr = ch.peer();
  PeerIdentity peer;
  auto tenant = ServerHandshake(
      ch,
      [this](const std::string& t) -> std::optional<std::string> {
        auto it = o.tenants.find(t);
        if (it == o.tenants.end()) return std::nullopt;
        return it->second;
      },
      std::chrono::milliseconds(o.handshake_timeout_ms), &peer);
  if (!tenant.ok()) {
    log->warn("{} handshake failed: {}", log::Where{"", peer_addr, 0}, tenant.status().ToString());
    return;
  }
  // Only process servers, unless the tenant lets its agents connect directly.
  if (peer.role != proto::Role::kProcessServer &&
      !(peer.role == proto::Role::kAgent && o.direct_agent_tenants.count(*tenant) > 0)) {
    log->warn("{} tenant {} refused: role {} may not connect to the master target{}", log::Where{"", peer_addr, 0},
              *tenant, int(peer.role), peer.role == proto::Role::kAgent ? " (the tenant allows no direct agents)" : "");
    (void)ch.Send(proto::Nack{0, proto::NackReason::kPermissionDenied, 0,
                              "role not allowed at the master target: connect through a process server"});
    return;
  }
  connections->Add(1);
  log->info("{} tenant {} connected ({})", log::Where{"", peer_addr, 0}, *tenant, peer.client_id);
  // Who the volumes opened here replicate through: the certificate's name
  // (authenticated) with TLS, the client_id without.
  const Upstream upstream{peer.role == proto::Role::kProcessServer ? "ps" : "agent",
                          peer.tls ? peer.cert_name : peer.client_id};
  std::map<uint32_t, std::shared_ptr<VolEntry>> handles;
  std::map<uint32_t, uint64_t> opened_generation;  // volume id -> the generation this session opened
  uint32_t next_id = 1;
  // Volumes this session refused as failed over. The peer stalls such a
  // stream until its next connection; when an undo lifts the fence, the
  // session is closed so that the peer reopens it at once.
  std::vector<std::shared_ptr<VolEntry>> fenced_here;
  auto nack = [&](uint32_t vid, proto::NackReason r, std::string msg, uint64_t expected = 0) {
    nacks->Inc();
    proto::Nack n;
    n.volume_id = vid;
    n.reason = r;
    n.expected_seq = expected;
    n.message = std::move(msg);
    return ch.Send(n);
  };
  FrameInbox inbox(ch, kInboxBytes, received_queued.get());
  while (!stopping.load()) {
    auto lifted = std::find_if(fenced_here.begin(), fenced_here.end(),
                               [](const std::shared_ptr<VolEntry>& e) {
                                 return !e->volume->failover() && e->volume->state() != VolumeState::kFailedBack;
                               });
    if (lifted != fenced_here.end()) {
      log->info("{} no longer failed over: closing the connection so that the peer reopens it",
                log::Where{(*lifted)->name, peer_addr, 0});
      break;
    }
    // A volume failed over (or back) while open here: the peer is told now,
    // not at its next batch, so that a PS (and its agent) with nothing
    // queued shows the fence too (issue 38 F1).
    Status told;
    for (const auto& [vid, e] : handles) {
      if (!told.ok()) break;
      if (std::find(fenced_here.begin(), fenced_here.end(), e) != fenced_here.end()) continue;
      if (std::string fence = e->volume->Fence(); !fence.empty()) {
        log->warn("{} fenced while open: {}", log::Where{e->name, peer_addr, 0}, fence);
        fenced_here.push_back(e);
        told = nack(vid, proto::NackReason::kWrongGeneration, fence);
      }
    }
    if (!told.ok()) {
      log->info("{} send failed: {}", log::Where{"", peer_addr, 0}, told.ToString());
      break;
    }
    auto m = inbox.Pop(std::chrono::milliseconds(500));
    if (!m.ok()) {
      if (m.status().IsBusy()) continue;
      if (!stopping.load())
        log->info("{} connection ended: {}", log::Where{"", peer_addr, 0}, m.status().ToString());
      break;
    }
    Status s;
    if (auto* vo = std::get_if<proto::VolumeOpen>(&*m)) {
      auto r = OpenVolume(*tenant, *vo, upstream);
      if (!r.ok()) {
        log->error("{} volume open failed: {}", log::Where{vo->name, peer_addr, 0}, r.status().ToString());
        s = nack(0, proto::NackReason::kInternal, r.status().ToString());
      } else if (!r->second.ack) {
        log->warn("{} volume open refused: {}", log::Where{vo->name, peer_addr, 0}, r->second.message);
        s = nack(0, r->second.reason, r->second.message);
        if (r->first && proto::IsFailedOverNack(proto::Nack{0, r->second.reason, 0, r->second.message}))
          fenced_here.push_back(r->first);
      } else {
        uint32_t vid = next_id++;
        // Opened here (a re-protect's next generation): no reason to close this session for it.
        std::erase(fenced_here, r->first);
        handles[vid] = r->first;
        opened_generation[vid] = vo->generation;
        s = ch.Send(proto::VolumeOpenReply{vid, r->second.durable_seq});
      }
    } else if (auto* wb = std::get_if<proto::WriteBatch>(&*m)) {
      auto it = handles.find(wb->volume_id);
      if (it == handles.end()) {
        s = nack(wb->volume_id, proto::NackReason::kUnknownVolume, "unknown volume id");
      } else if (it->second->volume->generation() != opened_generation[wb->volume_id]) {
        s = nack(wb->volume_id, proto::NackReason::kWrongGeneration,
                 "volume re-protected under generation " + std::to_string(it->second->volume->generation()));
      } else {
        // Group commit: the volume's batches that follow this one and are
        // already here are applied with it; each batch still gets its reply
        // (the group's outcome).
        int replies = 1;
        const uint64_t group_cap = std::min(kMaxGroupWork, o.max_batch_work);
        for (uint64_t work = proto::BatchWork(wb->records); !wb->records.empty() && work < group_cap; ++replies) {
          auto more = inbox.PopBatchFor(wb->volume_id, wb->records.back().seq + 1, group_cap - work);
          if (!more) break;
          work += proto::BatchWork(more->records);
          batches_grouped->Inc();
          wb->records.insert(wb->records.end(), std::make_move_iterator(more->records.begin()),
                             std::make_move_iterator(more->records.end()));
        }
        auto reply = [&](const auto& send) {
          Status st;
          for (int i = 0; i < replies && st.ok(); ++i) st = send();
          return st;
        };
        // The wire numbers the generation's records from 1; the volume its whole history.
        ReplicaVolume& vol = *it->second->volume;
        const uint64_t base = vol.seq_base();
        for (proto::Record& rec : wb->records) rec.seq += base;
        const bool news = !wb->records.empty() && wb->records.back().seq > vol.applied_seq();
        uint64_t journal = 0;
        if (news && OverQuota(*tenant)) {
          s = reply([&] {
            return nack(wb->volume_id, proto::NackReason::kBusy, "tenant quota exceeded; retry after retention",
                        vol.applied_seq() + 1 - base);
          });
        } else if (news && o.max_journal_bytes_per_tenant != 0 &&
                   (journal = JournalBytes(*tenant)) >= o.max_journal_bytes_per_tenant) {
          log->warn("{} batch held: tenant {} journal cap reached ({} bytes)",
                    log::Where{it->second->name, peer_addr, vol.applied_seq() + 1 - base}, *tenant, journal);
          vol.NoteTenantCapHold("tenant journal cap " + std::to_string(o.max_journal_bytes_per_tenant) + " bytes reached");
          s = reply([&] {
            return nack(wb->volume_id, proto::NackReason::kBusy,
                        "tenant journal cap reached: " + std::to_string(journal) + " bytes of undo journal >= " +
                            std::to_string(o.max_journal_bytes_per_tenant) +
                            " (max_journal_bytes_per_tenant); retry after retention",
                        vol.applied_seq() + 1 - base);
          });
        } else {
          auto r = vol.ApplyBatch(wb->records);
          uint64_t first = wb->records.empty() ? 0 : wb->records.front().seq;
          if (!r.ok()) {
            s = reply([&] { return nack(wb->volume_id, proto::NackReason::kInternal, r.status().ToString()); });
          } else if (!r->ack) {
            log->warn("{} batch refused: {}", log::Where{it->second->name, peer_addr, first}, r->message);
            s = reply([&] {
              return nack(wb->volume_id, r->reason, r->message, r->expected_seq > base ? r->expected_seq - base : 0);
            });
            if (proto::IsFailedOverNack(proto::Nack{0, r->reason, 0, r->message})) fenced_here.push_back(it->second);
          } else {
            if (r->applied > 0 && wb->records.back().timestamp_us != 0) {
              const uint64_t now = o.clock->WallMicros(), ts = wb->records.back().timestamp_us;
              it->second->lag.Record(now, now > ts ? double(now - ts) / 1e6 : 0.0);
            }
            s = reply([&] { return ch.Send(proto::Ack{wb->volume_id, r->durable_seq - base}); });
          }
        }
      }
    } else if (auto* hr = std::get_if<proto::HashRequest>(&*m)) {
      auto it = handles.find(hr->volume_id);
      if (it == handles.end()) {
        s = nack(hr->volume_id, proto::NackReason::kUnknownVolume, "unknown volume id");
      } else {
        // The wire speaks the generation's sequences (see ApplyBatch above).
        ReplicaVolume& vol = *it->second->volume;
        const uint64_t base = vol.seq_base();
        auto r = vol.Digests({hr->region_size, hr->first_region, hr->count, hr->min_seq + base,
                              hr->at_seq == 0 ? 0 : hr->at_seq + base});
        proto::HashResponse resp;
        resp.volume_id = hr->volume_id;
        resp.request_id = hr->request_id;
        resp.region_size = hr->region_size;
        resp.first_region = hr->first_region;
        if (!r.ok()) {
          // Answered, not nacked: a nack would stop the volume's stream at the PS.
          log->warn("{} hash request refused: {}", log::Where{it->second->name, peer_addr, 0}, r.status().ToString());
          resp.status = proto::HashStatus::kFailed;
        } else {
          resp.status = r->status;
          resp.seq = r->seq > base ? r->seq - base : 0;
          resp.hashes = std::move(r->digests);
        }
        s = ch.Send(resp);
      }
    } else if (auto* fp = std::get_if<proto::FailbackPlanRequest>(&*m)) {
      // Failback requests name the volume in this link's tenant (an unknown
      // one answers kNotFailingBack, like a volume that is not failing back).
      s = ch.Send(mt->FailbackPlan(*tenant, *fp));
    } else if (auto* pr = std::get_if<proto::PullRequest>(&*m)) {
      s = ch.Send(mt->Pull(*tenant, *pr, proto::Codec::kZstd, 1));
    } else if (auto* hb = std::get_if<proto::Heartbeat>(&*m)) {
      if (hb->echo_us == 0) s = ch.Send(proto::Heartbeat{o.clock->WallMicros(), hb->sent_us});
    } else if (std::holds_alternative<proto::Stats>(*m)) {
      // Counters from the peer are not used by the master target.
    } else {
      log->warn("{} unexpected message type {}; closing", log::Where{"", peer_addr, 0}, int(proto::TypeOf(*m)));
      break;
    }
    if (!s.ok()) {
      log->info("{} send failed: {}", log::Where{"", peer_addr, 0}, s.ToString());
      break;
    }
  }
  connections->Add(-1);
}

}  // namespace cdp::mt

// SPDX-License-Identifier: Apache-2.0
#include "common/wire/replication_receiver.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <variant>

#include "common/base/log.h"
#include "common/wire/frame_inbox.h"

namespace cdp::repl {

namespace {

using Millis = std::chrono::milliseconds;

// How often the session looks at its fences (busy or idle).
constexpr Millis kFenceCheck{500};
// How long a session's replier thread waits for another answer to send.
constexpr Millis kReplierIdle{1000};

// The session's answers to requests: sent at once from the session thread,
// through the replier thread from any other; a slot per request in flight.
// Close() must come before the destructor.
class Outlet {
 public:
  enum class Slot { kNone, kHash, kCall };

  Outlet(FrameChannel& ch, std::thread::id session, std::shared_ptr<spdlog::logger> log)
      : ch_(&ch), session_(session), log_(std::move(log)) {}

  // Takes a slot of `kind` if fewer than `cap` are in use.
  bool Take(Slot kind, int cap) {
    std::lock_guard<std::mutex> l(mu_);
    int& n = kind == Slot::kHash ? hashes_ : calls_;
    if (n >= cap) return false;
    ++n;
    return true;
  }

  // Frees the slot of `kind` that the request held, then sends `m`. Freed
  // first: a peer that sends its next request once it has this answer must
  // find the slot free (freed after the send, it could be refused over the
  // cap; the receiver test saw it under load). At most the one answer being
  // sent is beyond the cap.
  void Post(proto::Message m, Slot kind) {
    std::unique_lock<std::mutex> l(mu_);
    if (closing_) return;  // the slot goes with the connection
    if (std::this_thread::get_id() == session_) {
      Free(kind);
      FrameChannel* ch = ch_;
      l.unlock();
      if (Status sent = ch->Send(m); !sent.ok()) NotSent(m, sent);
      return;
    }
    outbox_.push_back({std::move(m), kind});
    if (!replier_running_) {
      // The last replier has returned, or is about to (it touches nothing
      // after it cleared replier_running_): joining it does not wait.
      if (replier_.joinable()) replier_.join();
      replier_running_ = true;
      replier_ = std::thread([this] { Replier(); });
    }
    l.unlock();
    cv_.notify_all();
  }

  // Answers posted from now on go nowhere; joins the replier (the channel
  // must be closed first, so that a send blocked on the peer returns).
  void Close() {
    std::thread replier;
    {
      std::lock_guard<std::mutex> l(mu_);
      closing_ = true;
      replier = std::move(replier_);  // no Post starts another from now on
    }
    cv_.notify_all();
    if (replier.joinable()) replier.join();
  }

 private:
  void NotSent(const proto::Message& m, const Status& why) {
    log_->warn("answer (message type {}) not sent: {}", int(proto::TypeOf(m)), why.ToString());
  }

  void Free(Slot kind) {
    if (kind == Slot::kHash) --hashes_;
    if (kind == Slot::kCall) --calls_;
  }

  // Sends what is posted; returns when the connection closes or after
  // kReplierIdle with nothing to send (an idle session keeps no thread).
  void Replier() {
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      if (!cv_.wait_for(l, kReplierIdle, [&] { return closing_ || !outbox_.empty(); })) {
        replier_running_ = false;
        return;
      }
      if (closing_) return;
      auto [m, kind] = std::move(outbox_.front());
      outbox_.pop_front();
      Free(kind);  // before the send, as in Post
      l.unlock();
      // Compresses a pull answer here, not on the relay's thread. A failure
      // ends the session at its next send or receive.
      if (Status sent = ch_->Send(m); !sent.ok()) NotSent(m, sent);
      l.lock();
    }
  }

  FrameChannel* const ch_;
  const std::thread::id session_;
  const std::shared_ptr<spdlog::logger> log_;
  std::mutex mu_;
  std::condition_variable cv_;  // outbox filled or closing
  std::deque<std::pair<proto::Message, Slot>> outbox_;
  int hashes_ = 0, calls_ = 0;
  bool closing_ = false;
  bool replier_running_ = false;
  std::thread replier_;  // started by an answer from another thread, ends when idle
};

// One connection after its handshake.
class SessionLoop {
 public:
  SessionLoop(const ReceiverOptions& o, FrameChannel& ch, const Session& s, ReceiverSink& sink)
      : o_(o),
        ch_(ch),
        s_(s),
        sink_(sink),
        log_(log::Get(o.log_name)),
        clock_(o.clock != nullptr ? o.clock : SystemClock::Get()),
        outlet_(std::make_shared<Outlet>(ch, std::this_thread::get_id(), log_)) {}

  void Run() {
    sink_.Attach([o = outlet_](proto::Message m) { o->Post(std::move(m), Outlet::Slot::kNone); });
    {
      // A GroupHeld goes to the sink from the reader: it must not wait
      // behind the batches queued before it (their syncs).
      FrameInbox inbox(ch_, o_.inbox_bytes, o_.queued_bytes, o_.stages != nullptr ? &o_.stages->inbox : nullptr,
                       [this](proto::Message& m) {
                         if (!std::holds_alternative<proto::GroupHeld>(m)) return false;
                         sink_.Answered(std::move(m));
                         return true;
                       });
      const Status end = Loop(inbox);
      const bool quiet = end.code() == Code::kUnavailable || (o_.stopping != nullptr && o_.stopping->load());
      if (!end.ok() && quiet) {
        log_->info("{} tenant {}: {} disconnected: {}", Where(""), s_.tenant, s_.peer.client_id, end.ToString());
      } else if (!end.ok()) {
        log_->warn("{} tenant {}: closing the connection: {}", Where(""), s_.tenant, end.ToString());
      }
    }  // the inbox closes the channel
    outlet_->Close();
  }

 private:
  log::Where Where(std::string_view volume) const { return log::Where{volume, s_.address, 0}; }

  Status Send(const proto::Message& m) {
    if (o_.nacks != nullptr && std::holds_alternative<proto::Nack>(m)) o_.nacks->Inc();
    return ch_.Send(m);
  }

  Status Nack(uint32_t handle, proto::NackReason reason, std::string message, uint64_t expected = 0) {
    return Send(proto::Nack{handle, reason, expected, std::move(message)});
  }

  // Tells the peer of fences that came up since its volumes were opened;
  // false (with *end) when the session should end: a fence it met lifted.
  bool CheckFences(Status* end) {
    for (const auto& [key, v] : fenced_) {
      if (v->Fence().empty()) {
        log_->info("{} no longer fenced: closing the connection so that the peer reopens it", Where(key));
        *end = Status::OK();
        return false;
      }
    }
    for (const auto& [handle, v] : handles_) {
      if (fenced_.count(v->key())) continue;
      if (std::string fence = v->Fence(); !fence.empty()) {
        log_->warn("{} fenced while open: {}", Where(v->key()), fence);
        fenced_[v->key()] = v;
        if (*end = Nack(handle, proto::NackReason::kWrongGeneration, fence); !end->ok()) return false;
      }
    }
    return true;
  }

  Status Loop(FrameInbox& inbox) {
    Status end;
    // Fences are looked at every kFenceCheck, not at every message: a
    // session with many volumes open would otherwise ask each of them at
    // every batch. A batch for a fenced volume is refused by its sink anyway.
    auto next_check = std::chrono::steady_clock::time_point::min();
    while (o_.stopping == nullptr || !o_.stopping->load()) {
      if (const auto now = std::chrono::steady_clock::now(); now >= next_check) {
        if (o_.distrusted && ch_.tls_peer() != nullptr) {
          if (std::string why = o_.distrusted(*ch_.tls_peer()); !why.empty()) {
            log_->warn("{} {}: the session ends", Where(""), why);
            return Status::PermissionDenied(why);
          }
        }
        if (!CheckFences(&end)) return end;
        next_check = now + kFenceCheck;
      }
      uint64_t wire = 0;
      auto m = inbox.Pop(kFenceCheck, &wire);
      if (!m.ok()) {
        if (m.status().IsBusy()) continue;
        return m.status();
      }
      if (auto* open = std::get_if<proto::VolumeOpen>(&*m)) {
        end = Open(*open);
      } else if (auto* wb = std::get_if<proto::WriteBatch>(&*m)) {
        end = Append(inbox, *wb, wire);
      } else if (auto* hr = std::get_if<proto::HashRequest>(&*m)) {
        end = Digests(*hr);
      } else if (std::holds_alternative<proto::FailbackPlanRequest>(*m) ||
                 std::holds_alternative<proto::PullRequest>(*m)) {
        end = Call(std::move(*m));
      } else if (auto* hb = std::get_if<proto::Heartbeat>(&*m)) {
        if (hb->echo_us == 0) end = Send(proto::Heartbeat{o_.clock->WallMicros(), hb->sent_us});
      } else if (std::holds_alternative<proto::Stats>(*m)) {
        // The peer's counters are not used here.
      } else {
        log_->warn("{} tenant {}: unexpected message type {}; closing", Where(""), s_.tenant, int(proto::TypeOf(*m)));
        return Status::OK();
      }
      if (!end.ok()) return end;
    }
    return Status::OK();
  }

  Status Open(const proto::VolumeOpen& open) {
    Opened r = sink_.Open(open);
    if (r.verdict.nack) {
      r.verdict.nack->volume_id = 0;
      if (r.volume && proto::IsFailedOverNack(*r.verdict.nack)) fenced_[r.volume->key()] = r.volume;
      return Send(*r.verdict.nack);
    }
    const uint32_t handle = next_handle_++;
    fenced_.erase(r.volume->key());  // opened here: no reason to close the session for it
    handles_[handle] = r.volume;
    return Send(proto::VolumeOpenReply{handle, r.verdict.durable_seq});
  }

  Status Append(FrameInbox& inbox, proto::WriteBatch& wb, uint64_t wire) {
    const uint32_t handle = wb.volume_id;
    // Group commit: the volume's batches that continue this one and are
    // already here join it; each is answered with the group's outcome.
    int batches = 1;
    uint64_t work = proto::BatchWork(wb.records);
    while (!wb.records.empty() && work < o_.group_work) {
      uint64_t more_wire = 0;
      auto more = inbox.PopBatchFor(handle, wb.records.back().seq + 1, o_.group_work - work,
                                    proto::kMaxRecords - wb.records.size(), &more_wire);
      if (!more) break;
      wire += more_wire;
      work += proto::BatchWork(more->records);
      ++batches;
      if (o_.batches_grouped != nullptr) o_.batches_grouped->Inc();
      wb.records.insert(wb.records.end(), std::make_move_iterator(more->records.begin()),
                        std::make_move_iterator(more->records.end()));
    }
    proto::Message answer;
    auto it = handles_.find(handle);
    if (it == handles_.end()) {
      answer = proto::Nack{handle, proto::NackReason::kUnknownVolume, 0, "volume not open on this connection"};
    } else {
      const uint64_t t0 = clock_->NowMicros();
      Verdict v = it->second->Append(std::move(wb.records), batches, wire);
      if (o_.stages != nullptr) {
        o_.stages->apply_us += clock_->NowMicros() - t0;
        ++o_.stages->groups;
      }
      if (v.nack) {
        v.nack->volume_id = handle;
        if (proto::IsFailedOverNack(*v.nack)) fenced_[it->second->key()] = it->second;
        answer = std::move(*v.nack);
      } else {
        answer = proto::Ack{handle, v.durable_seq};
      }
    }
    const uint64_t t0 = clock_->NowMicros();
    for (int i = 0; i < batches; ++i) CDP_RETURN_IF_ERROR(Send(answer));
    if (o_.stages != nullptr) o_.stages->answer_us += clock_->NowMicros() - t0;
    return Status::OK();
  }

  Reply ReplyFor(Outlet::Slot kind) {
    return [outlet = outlet_, kind](proto::Message m) { outlet->Post(std::move(m), kind); };
  }

  Status Digests(const proto::HashRequest& request) {
    auto it = handles_.find(request.volume_id);
    if (it == handles_.end())
      return Nack(request.volume_id, proto::NackReason::kUnknownVolume, "volume not open on this connection");
    // The cap grows with the volumes open: a peer carries many volumes on
    // one connection, each resyncing with its own requests in flight.
    const int cap = o_.hashes_per_volume * int(std::max<size_t>(1, handles_.size()));
    if (!outlet_->Take(Outlet::Slot::kHash, cap)) {
      log_->warn("{} more than {} hash requests in flight: refused", Where(it->second->key()), cap);
      return Send(FailedAnswer(request));
    }
    it->second->Digests(request, ReplyFor(Outlet::Slot::kHash));
    return Status::OK();
  }

  Status Call(proto::Message request) {
    if (!outlet_->Take(Outlet::Slot::kCall, o_.calls)) {
      log_->warn("{} tenant {}: more than {} failback requests in flight: refused", Where(""), s_.tenant, o_.calls);
      return Send(FailedAnswer(request));
    }
    sink_.Call(std::move(request), ReplyFor(Outlet::Slot::kCall));
    return Status::OK();
  }

  const ReceiverOptions& o_;
  FrameChannel& ch_;
  const Session& s_;
  ReceiverSink& sink_;
  std::shared_ptr<spdlog::logger> log_;
  const Clock* const clock_;  // the stage times
  std::shared_ptr<Outlet> outlet_;
  std::map<uint32_t, std::shared_ptr<ReceiverVolume>> handles_;
  uint32_t next_handle_ = 1;
  // Volumes this session refused as fenced, by key: the peer stalls their
  // streams until its next connection, which comes when a fence lifts.
  std::map<std::string, std::shared_ptr<ReceiverVolume>> fenced_;
};

}  // namespace

proto::Message FailedAnswer(const proto::Message& request) {
  if (const auto* h = std::get_if<proto::HashRequest>(&request)) {
    proto::HashResponse r;
    r.volume_id = h->volume_id;
    r.request_id = h->request_id;
    r.region_size = h->region_size;
    r.first_region = h->first_region;
    r.status = proto::HashStatus::kFailed;
    return r;
  }
  if (const auto* p = std::get_if<proto::FailbackPlanRequest>(&request)) {
    proto::FailbackPlan r;
    r.request_id = p->request_id;
    r.status = proto::FailbackStatus::kFailed;
    return r;
  }
  if (const auto* p = std::get_if<proto::PullRequest>(&request)) {
    proto::PullResponse r;
    r.request_id = p->request_id;
    r.status = proto::FailbackStatus::kFailed;
    return r;
  }
  return proto::Heartbeat{};
}

ReplicationReceiver::ReplicationReceiver(ReceiverOptions options) : o_(std::move(options)) {}

void ReplicationReceiver::Serve(FrameChannel& ch, Listener::Slot* slot) {
  auto log = log::Get(o_.log_name);
  Session s;
  s.address = ch.peer();
  auto tenant = ServerHandshake(ch, o_.secret, o_.handshake_timeout, &s.peer);
  if (!tenant.ok()) {
    log->warn("{} handshake failed: {}", log::Where{"", s.address, 0}, tenant.status().ToString());
    return;
  }
  s.tenant = *tenant;
  if (std::string refused = o_.admit ? o_.admit(s.tenant, s.peer) : ""; !refused.empty()) {
    log->warn("{} tenant {} refused: {}", log::Where{"", s.address, 0}, s.tenant, refused);
    if (o_.nacks != nullptr) o_.nacks->Inc();
    (void)ch.Send(proto::Nack{0, proto::NackReason::kPermissionDenied, 0, refused});
    return;
  }
  if (slot != nullptr) slot->MarkAuthenticated();
  log->info("{} tenant {} {} connected{}", log::Where{"", s.address, 0}, s.tenant, s.peer.client_id,
            s.peer.tls ? " (certificate '" + s.peer.cert_name + "')" : std::string(" (clear text)"));
  std::unique_ptr<ReceiverSink> sink = o_.make_sink(s);
  if (o_.connections != nullptr) o_.connections->Add(1);
  SessionLoop(o_, ch, s, *sink).Run();
  if (o_.connections != nullptr) o_.connections->Add(-1);
}

}  // namespace cdp::repl

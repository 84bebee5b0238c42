// SPDX-License-Identifier: Apache-2.0
// The receiving half of ReplicationSender: the reader thread (ReadLoop,
// Handle), WaitOpened and the calls (replication_sender.h, "Calls").
#include "common/wire/replication_sender.h"

#include "common/wire/replication_sender_state.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <random>
#include <variant>

#include "common/base/log.h"


namespace cdp::repl {

namespace {

// The request_id of a message that answers a call; nullopt for any other.
std::optional<uint64_t> AnswerId(const proto::Message& m) {
  if (auto* h = std::get_if<proto::HashResponse>(&m)) return h->request_id;
  if (auto* p = std::get_if<proto::FailbackPlan>(&m)) return p->request_id;
  if (auto* r = std::get_if<proto::PullResponse>(&m)) return r->request_id;
  return std::nullopt;
}

}  // namespace

void ReplicationSender::ReadLoop(Session& s) {
  while (!stop_.load()) {
    uint64_t frame_bytes = 0;
    auto m = s.ch->Receive(Millis(500), &frame_bytes);
    if (!m.ok()) {
      if (m.status().IsBusy() && !s.ch->broken()) continue;
      {
        std::lock_guard<std::mutex> l(mu_);
        if (s.epoch == epoch_ && session_error_.ok()) session_error_ = m.status();
        ++notifies_;
      }
      cv_.notify_all();
      return;
    }
    s.last_rx_us = opt_.clock->NowMicros();
    Handle(s, *m, frame_bytes);
  }
}

// Runs in the reader thread. Sources are called outside mu_ (`after`).
void ReplicationSender::Handle(Session& s, proto::Message& m, uint64_t frame_bytes) {
  const std::string& peer = s.ch->peer();
  std::vector<std::function<void()>> after;
  std::unique_lock<std::mutex> l(mu_);
  const uint64_t now = opt_.clock->NowMicros();
  auto stream_of = [&](uint32_t handle) -> Stream* {
    auto it = by_handle_.find(handle);
    return it == by_handle_.end() ? nullptr : it->second;
  };
  // Tells the source where the peer stands (outside the lock) and sets `next`.
  auto resume = [&](Stream& st, uint64_t durable, ResumeCause cause) {
    st.resuming = true;
    ++st.rewinds;
    l.unlock();
    Result<uint64_t> next = st.src->Resume(durable, cause);
    l.lock();
    st.resuming = false;
    const uint64_t dropped = st.inflight.size();
    st.inflight.clear();
    ++st.rewinds;
    if (cause == ResumeCause::kOpen || durable > st.acked) st.acked = durable;
    if (next.ok()) {
      st.next = std::max<uint64_t>(*next, 1);
      if (dropped > 0) after.push_back([&st, dropped] { st.src->Rewound(dropped); });
    } else {
      Stall(st, next.status());
    }
    return next.ok();
  };

  if (auto* r = std::get_if<proto::VolumeOpenReply>(&m)) {
    if (open_fifo_.empty()) {
      session_error_ = Status::Corruption("VolumeOpenReply without a VolumeOpen from the " + opt_.peer_name);
    } else {
      Stream& st = *open_fifo_.front();
      open_fifo_.pop_front();
      if (st.removed) {
        // Removed while its open was on the way: the answer is dropped (the
        // peer's handle is never used).
      } else {
        st.handle = r->volume_id;
        st.open_durable = r->durable_seq;
        st.sent_max = std::max(st.sent_max, r->durable_seq);
        by_handle_[r->volume_id] = &st;
        const bool was_stalled = !st.stalled.ok();
        st.stalled = Status::OK();
        if (resume(st, r->durable_seq, ResumeCause::kOpen)) {
          stats_.last_error.clear();
          if (was_stalled) after.push_back([&st] { st.src->Stalled(Status::OK()); });
          log_->info("{} {} opened at the {} (volume id {}), resuming after seq {}", opt_.label,
                    log::Where{st.name, peer, r->durable_seq}, opt_.peer_name, r->volume_id, r->durable_seq);
        }
        st.opened = true;
      }
    }
  } else if (auto* a = std::get_if<proto::Ack>(&m)) {
    Stream* st = stream_of(a->volume_id);
    if (st != nullptr && a->durable_seq > st->sent_max) {
      // Never trusted: releasing records the peer cannot hold would lose them.
      session_error_ = Status::Corruption(opt_.peer_name + " acknowledged seq " + std::to_string(a->durable_seq) +
                                          " of " + st->name + ", beyond the last sent (" +
                                          std::to_string(st->sent_max) + ")");
    } else if (st != nullptr) {
      if (a->durable_seq > st->acked) {
        st->acked = a->durable_seq;
        const uint64_t d = a->durable_seq;
        after.push_back([st, d] { st->src->Acked(d); });
      }
      while (!st->inflight.empty() && st->inflight.front().last <= st->acked) {
        if (now > st->inflight.front().sent_us) stats_.stages.ack_us += now - st->inflight.front().sent_us;
        ++stats_.stages.acked_frames;
        st->inflight.pop_front();
      }
      if (st->next <= st->acked) st->next = st->acked + 1;
    }
  } else if (auto* n = std::get_if<proto::Nack>(&m)) {
    Stream* st = stream_of(n->volume_id);
    const std::string what = std::string(proto::NackReasonName(n->reason)) + ": " + n->message;
    if (st == nullptr && !open_fifo_.empty()) {
      // The answer to the oldest VolumeOpen: refused.
      Stream& o = *open_fifo_.front();
      open_fifo_.pop_front();
      if (!o.removed) {
        o.open_error = Status::PermissionDenied(opt_.peer_name + " refused the volume: " + what);
        o.opened = false;
        log_->error("{} {} {}", opt_.label, log::Where{o.name, peer, 0}, o.open_error.message());
        if (proto::IsFailedOverNack(*n)) {
          o.fenced_open = true;
          o.fence_pending = true;
          after.push_back([this, &o, msg = n->message] {
            o.src->Fenced(msg);
            {
              std::lock_guard<std::mutex> fl(mu_);
              o.fence_pending = false;
            }
            cv_.notify_all();
          });
        }
        Stall(o, o.open_error);
      }
    } else if (st == nullptr) {
      log_->warn("{} nack for unknown volume id {} from the {} ignored: {}", opt_.label, n->volume_id,
                opt_.peer_name, what);
    } else {
      switch (n->reason) {
        case proto::NackReason::kGap: {
          ++stats_.gap_nacks;
          const uint64_t expected = std::max<uint64_t>(n->expected_seq, 1);
          if (expected - 1 > st->sent_max) {
            // A gap claims the peer holds what was never sent: as a forged Ack.
            session_error_ = Status::Corruption(opt_.peer_name + " expects seq " + std::to_string(expected) +
                                                " of " + st->name + ", beyond the last sent (" +
                                                std::to_string(st->sent_max) + ")");
          } else if (expected != st->gap_expected) {
            log_->info("{} {} gap at the {}, resending from {}", opt_.label, log::Where{st->name, peer, expected},
                      opt_.peer_name, expected);
            st->gap_expected = expected;
            resume(*st, expected - 1, ResumeCause::kGap);
          }
          break;
        }
        case proto::NackReason::kBusy: {
          ++stats_.busy_nacks;
          const uint64_t dropped = st->inflight.size();
          Rewind(*st, st->acked + 1);
          st->hold_until_us = now + opt_.link.busy_hold_ms * 1000;
          if (dropped > 0) after.push_back([st, dropped] { st->src->Rewound(dropped); });
          break;
        }
        case proto::NackReason::kInternal: {
          auto oldest = calls_.end();
          for (auto it = calls_.begin(); it != calls_.end(); ++it) {
            if (it->second->stream == st->id && !it->second->done) {
              oldest = it;
              break;
            }
          }
          if (oldest != calls_.end()) {  // a hash request could not be answered (an older peer)
            FailCall(*oldest->second, Status::Unavailable(opt_.peer_name + " could not answer: " + n->message), &after);
            if (oldest->second->async) calls_.erase(oldest);
            break;
          }
          // An I/O failure at the peer; the batch was undone: resend after a pause.
          log_->warn("{} {} the {} failed a batch ({}), resending after a pause", opt_.label,
                    log::Where{st->name, peer, st->acked + 1}, opt_.peer_name, n->message);
          const uint64_t dropped = st->inflight.size();
          Rewind(*st, st->acked + 1);
          st->hold_until_us = now + opt_.link.internal_hold_ms * 1000;
          if (dropped > 0) after.push_back([st, dropped] { st->src->Rewound(dropped); });
          break;
        }
        case proto::NackReason::kUnknownVolume:  // our handle is stale: reconnect and reopen
          session_error_ = Status::Unavailable(opt_.peer_name + " does not know volume id " +
                                               std::to_string(n->volume_id));
          break;
        default:
          log_->error("{} {} the {} refused a batch: {}", opt_.label, log::Where{st->name, peer, n->expected_seq},
                     opt_.peer_name, what);
          Rewind(*st, st->acked + 1);
          Stall(*st, Status::Unavailable(opt_.peer_name + " refused a batch: " + what));
          if (proto::IsFailedOverNack(*n)) after.push_back([src = st->src, msg = n->message] { src->Fenced(msg); });
      }
    }
  } else if (std::optional<uint64_t> rid = AnswerId(m)) {
    // The answer to a call (an unknown or completed request_id: ignored).
    auto it = calls_.find(*rid);
    if (it != calls_.end() && !it->second->done) {
      PendingCall& p = *it->second;
      if (proto::TypeOf(m) != p.answer) {
        session_error_ = Status::Corruption(opt_.peer_name + " answered request " + std::to_string(*rid) +
                                            " with message type " + std::to_string(int(proto::TypeOf(m))));
      } else {
        p.done = true;
        p.response = std::move(m);
        if (p.bytes) p.bytes->received.fetch_add(frame_bytes);
        if (p.async) {
          after.push_back([cb = std::move(p.callback), r = std::move(p.response)]() mutable { cb(std::move(r)); });
          calls_.erase(it);
        }
      }
    }
  } else if ((std::holds_alternative<proto::GroupHold>(m) || std::holds_alternative<proto::GroupRelease>(m)) &&
             opt_.on_peer_request) {
    after.push_back([this, r = std::move(m)]() mutable { opt_.on_peer_request(*this, std::move(r)); });
  } else if (std::holds_alternative<proto::Heartbeat>(m) || std::holds_alternative<proto::Stats>(m)) {
    // Liveness only. Not answered from this thread: a reader blocked behind
    // a full send buffer would stop reading the acks that drain it.
  } else {
    session_error_ = Status::Corruption("unexpected message type " + std::to_string(int(proto::TypeOf(m))) +
                                        " from the " + opt_.peer_name);
  }
  const bool failed = !session_error_.ok();
  std::vector<std::pair<RecordSource*, Status>> notes;
  notes.swap(stall_notes_);
  ++notifies_;
  l.unlock();
  cv_.notify_all();
  for (auto& f : after) f();
  for (auto& [src, why] : notes) src->Stalled(why);
  if (failed) s.ch->Close();
}

bool ReplicationSender::WaitConnected(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait_for(l, timeout, [&] { return stop_.load() || (connected_.load() && channel_ != nullptr); });
  return !stop_.load() && connected_.load() && channel_ != nullptr;
}

Result<uint64_t> ReplicationSender::WaitOpened(StreamId id, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> l(mu_);
  if (id >= streams_.size() || streams_[id]->removed) return Status::NotFound("no such stream");
  Stream& st = *streams_[id];
  // Down after a failed attempt: do not hold the caller for a peer known to
  // be unreachable.
  if (!connected_.load() && !stats_.last_error.empty() && !st.opened)
    return Status::Unavailable(opt_.peer_name + " not reachable: " + stats_.last_error);
  bool ok = cv_.wait_for(
      l, timeout, [&] { return stop_.load() || st.opened || (!st.open_error.ok() && !st.fence_pending); });
  if (!st.open_error.ok() && !st.fence_pending) return st.open_error;
  if (!ok || !st.opened) return Status::Unavailable(opt_.peer_name + " not reachable");
  return st.open_durable;
}

void ReplicationSender::FailCall(PendingCall& c, const Status& why, std::vector<std::function<void()>>* after) {
  c.done = true;
  c.status = why;
  if (c.callback) after->push_back([cb = std::move(c.callback), why] { cb(why); });
}

uint64_t ReplicationSender::AddCallLocked(size_t stream, proto::MsgType answer, CallCallback done,
                                          std::shared_ptr<CallBytes> bytes) {
  auto p = std::make_shared<PendingCall>();
  p->stream = stream;
  p->answer = answer;
  p->async = true;
  p->callback = std::move(done);
  p->bytes = std::move(bytes);
  const uint64_t request_id = next_request_id_++;
  calls_[request_id] = std::move(p);
  last_call_us_ = std::max<uint64_t>(opt_.clock->NowMicros(), 1);
  return request_id;
}

Status ReplicationSender::Send(const proto::Message& m) {
  std::shared_ptr<FrameChannel> ch;
  {
    std::lock_guard<std::mutex> l(mu_);
    ch = channel_;
  }
  if (ch == nullptr || stop_.load()) return Status::Unavailable("not connected to the " + opt_.peer_name);
  if (Status s = ch->Send(m); !s.ok()) return Status::Unavailable(opt_.peer_name + " connection lost: " + s.ToString());
  return Status::OK();
}

void ReplicationSender::SendCall(const std::shared_ptr<FrameChannel>& ch, const proto::Message& request,
                                 uint64_t request_id, CallBytes* bytes) {
  uint64_t wire = 0;
  Status s = ch->Send(request, &wire);
  if (s.ok()) {
    if (bytes != nullptr) bytes->sent.fetch_add(wire);
    return;
  }
  // Not sent: unless the reader already failed it with the connection, fail it here,
  // as the end of the session would (kUnavailable, whatever the channel said:
  // a channel closed under the send says kAborted).
  CallCallback cb;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = calls_.find(request_id);
    if (it == calls_.end()) return;
    cb = std::move(it->second->callback);
    calls_.erase(it);
  }
  if (cb) cb(Status::Unavailable(opt_.peer_name + " connection lost: " + s.ToString()));
}

Result<proto::HashResponse> ReplicationSender::Hash(StreamId id, const proto::HashRequest& request,
                                                    std::chrono::milliseconds timeout) {
  std::shared_ptr<FrameChannel> ch;
  auto pending = std::make_shared<PendingCall>();
  pending->stream = id;
  pending->answer = proto::MsgType::kHashResponse;
  uint64_t request_id = 0;
  proto::HashRequest fwd = request;
  {
    std::unique_lock<std::mutex> l(mu_);
    if (id >= streams_.size() || streams_[id]->removed) return Status::NotFound("no such stream");
    Stream& st = *streams_[id];
    if (!connected_.load() && !stats_.last_error.empty())
      return Status::Unavailable(opt_.peer_name + " unavailable: " + stats_.last_error);
    if (!cv_.wait_for(l, timeout, [&] { return stop_.load() || !st.stalled.ok() || (st.opened && channel_); }) ||
        stop_.load())
      return Status::Unavailable(opt_.peer_name + " unavailable");
    if (st.removed) return Status::NotFound("no such stream");
    if (!st.stalled.ok()) return Status::Unavailable("volume stalled: " + st.stalled.message());
    ch = channel_;
    request_id = next_request_id_++;
    fwd.volume_id = st.handle;
    fwd.request_id = request_id;
    calls_[request_id] = pending;
    last_call_us_ = std::max<uint64_t>(opt_.clock->NowMicros(), 1);
  }
  Status s = ch->Send(fwd);
  std::unique_lock<std::mutex> l(mu_);
  if (s.ok()) cv_.wait_for(l, timeout, [&] { return pending->done || stop_.load(); });
  calls_.erase(request_id);
  if (!s.ok()) return s;
  if (!pending->done) return Status::Unavailable(opt_.peer_name + " did not answer the hash request in time");
  if (!pending->status.ok()) return pending->status;
  return std::get<proto::HashResponse>(std::move(pending->response));
}

void ReplicationSender::HashAsync(StreamId id, const proto::HashRequest& request, HashCallback done) {
  std::shared_ptr<FrameChannel> ch;
  proto::HashRequest fwd = request;
  Status why;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (id >= streams_.size() || streams_[id]->removed) {
      why = Status::NotFound("no such stream");
    } else if (stop_.load() || !channel_ || !streams_[id]->opened) {
      why = Status::Unavailable(opt_.peer_name + " unavailable" +
                                (stats_.last_error.empty() ? std::string() : ": " + stats_.last_error));
    } else if (!streams_[id]->stalled.ok()) {
      why = Status::Unavailable("volume stalled: " + streams_[id]->stalled.message());
    } else {
      ch = channel_;
      fwd.volume_id = streams_[id]->handle;
      // The one call mechanism; the answer is a HashResponse (checked by the reader).
      fwd.request_id = AddCallLocked(id, proto::MsgType::kHashResponse, [done](Result<proto::Message> r) {
        if (!r.ok()) return done(r.status());
        done(std::get<proto::HashResponse>(std::move(*r)));
      });
    }
  }
  if (!why.ok()) {
    done(why);
    return;
  }
  SendCall(ch, fwd, fwd.request_id);
}

void ReplicationSender::CallAsync(proto::Message request, CallCallback done, std::shared_ptr<CallBytes> bytes) {
  proto::MsgType answer{};
  if (std::holds_alternative<proto::FailbackPlanRequest>(request)) {
    answer = proto::MsgType::kFailbackPlan;
  } else if (std::holds_alternative<proto::PullRequest>(request)) {
    answer = proto::MsgType::kPullResponse;
  } else {
    done(Status::InvalidArgument("CallAsync: message type " + std::to_string(int(proto::TypeOf(request))) +
                                 " is not a name-addressed request"));
    return;
  }
  std::shared_ptr<FrameChannel> ch;
  uint64_t request_id = 0;
  Status why;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stop_.load() || !channel_) {
      why = Status::Unavailable(opt_.peer_name + " unavailable" +
                                (stats_.last_error.empty() ? std::string() : ": " + stats_.last_error));
    } else {
      ch = channel_;
      request_id = AddCallLocked(kNoStream, answer, std::move(done), bytes);
    }
  }
  if (!why.ok()) {
    done(why);
    return;
  }
  std::visit(
      [&](auto& m) {
        if constexpr (requires { m.request_id; }) m.request_id = request_id;
      },
      request);
  SendCall(ch, request, request_id, bytes.get());
}

}  // namespace cdp::repl


// SPDX-License-Identifier: Apache-2.0
#include "common/replication_sender.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <random>
#include <variant>

#include "common/log.h"

namespace cdp::repl {

using Millis = std::chrono::milliseconds;

namespace {

// The request_id of a message that answers a call; nullopt for any other.
std::optional<uint64_t> AnswerId(const proto::Message& m) {
  if (auto* h = std::get_if<proto::HashResponse>(&m)) return h->request_id;
  if (auto* p = std::get_if<proto::FailbackPlan>(&m)) return p->request_id;
  if (auto* r = std::get_if<proto::PullResponse>(&m)) return r->request_id;
  return std::nullopt;
}

}  // namespace

struct ReplicationSender::Stream {
  size_t id = 0;
  RecordSource* src = nullptr;
  std::string name;         // the volume, for log lines
  int worker = 0;           // the sending thread that ships it
  bool open_sent = false;
  bool opened = false;      // the open was answered (and the source resumed)
  bool removed = false;     // RemoveStream: never opened, read or told anything again
  bool fenced_open = false; // this connection's open was refused as failed over
  // The refusal is failed over and source->Fenced has not returned yet: the
  // refusal is not answered to WaitOpened before the source has recorded the
  // fence (a PS must never open an agent's volume in between).
  bool fence_pending = false;
  bool resuming = false;    // the reader is telling the source where the peer stands
  Status open_error;        // the peer refused the open
  Status stalled;           // not ok: shipping stopped until the next connection
  uint32_t handle = 0;      // the peer's volume_id
  uint64_t open_durable = 0;
  uint64_t next = 1;        // next sequence to send
  uint64_t acked = 0;       // the peer's durable sequence
  uint64_t sent_max = 0;    // the highest sequence ever sent or told by an open
  uint64_t gap_expected = 0;  // the last gap rewind target (repeats are ignored)
  uint64_t rewinds = 0;       // bumped when `next` moves back: a racing send is not counted
  std::deque<uint64_t> inflight;  // last sequence of each unacknowledged frame
  size_t window = 1;              // frames in flight at most (the source's, or max_inflight)
  uint64_t hold_until_us = 0;
};

struct ReplicationSender::Session {
  std::shared_ptr<FrameChannel> ch;
  uint64_t epoch = 0;
  std::atomic<uint64_t> last_rx_us{0};
  std::atomic<uint64_t> last_tx_us{0};
};

ReplicationSender::ReplicationSender(SenderOptions options)
    : opt_(std::move(options)), log_(log::Get(opt_.log_name)) {
  if (opt_.clock == nullptr) opt_.clock = SystemClock::Get();
  opt_.workers = std::max(1, opt_.workers);
  opt_.max_inflight = std::max(1, opt_.max_inflight);
}

ReplicationSender::~ReplicationSender() { Stop(); }

ReplicationSender::StreamId ReplicationSender::AddStream(RecordSource* source) {
  auto st = std::make_unique<Stream>();
  st->src = source;
  st->name = source->OpenMessage().name;
  st->window = size_t(source->max_inflight() > 0 ? source->max_inflight() : opt_.max_inflight);
  std::lock_guard<std::mutex> l(mu_);
  st->id = streams_.size();
  st->worker = int(st->id % size_t(opt_.workers));
  streams_.push_back(std::move(st));
  ++notifies_;
  cv_.notify_all();
  return streams_.size() - 1;
}

void ReplicationSender::RemoveStream(StreamId id) {
  std::vector<std::function<void()>> after;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (id >= streams_.size() || streams_[id]->removed) return;
    Stream& st = *streams_[id];
    st.removed = true;
    st.opened = false;
    st.inflight.clear();
    // Its pending open stays in open_fifo_ (the answers come in order); the
    // answer is ignored there.
    for (auto it = by_handle_.begin(); it != by_handle_.end();)
      it = it->second == &st ? by_handle_.erase(it) : std::next(it);
    for (auto it = calls_.begin(); it != calls_.end();) {
      if (it->second->stream == id && !it->second->done)
        FailCall(*it->second, Status::NotFound("stream removed"), &after);
      it = it->second->stream == id && it->second->async ? calls_.erase(it) : std::next(it);
    }
    ++notifies_;
  }
  cv_.notify_all();
  for (auto& f : after) f();
}

void ReplicationSender::Start() {
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] { Run(); });
}

void ReplicationSender::Stop() {
  std::shared_ptr<FrameChannel> ch;
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    ch = channel_;
    ++notifies_;
  }
  if (ch) ch->Close();
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void ReplicationSender::Notify() {
  {
    std::lock_guard<std::mutex> l(mu_);
    ++notifies_;
  }
  cv_.notify_all();
}

void ReplicationSender::Reconnect() {
  std::shared_ptr<FrameChannel> ch;
  {
    std::lock_guard<std::mutex> l(mu_);
    ch = channel_;
  }
  if (ch) ch->Close();
}

std::string ReplicationSender::state() const {
  std::lock_guard<std::mutex> l(mu_);
  if (connected_.load()) return "connected";
  return stats_.last_error.empty() ? "connecting" : "disconnected: " + stats_.last_error;
}

LinkStats ReplicationSender::Stats() const {
  std::lock_guard<std::mutex> l(mu_);
  LinkStats s = stats_;
  s.connected = connected_.load();
  return s;
}

bool ReplicationSender::SleepMs(uint64_t ms) {
  std::unique_lock<std::mutex> l(mu_);
  return !cv_.wait_for(l, Millis(ms), [&] { return stop_.load(); });
}

void ReplicationSender::Run() {
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<double> jitter(0.5, 1.5);
  uint64_t backoff = opt_.backoff_min_ms;
  std::string last_logged;      // the last failure logged as a warning
  uint64_t last_logged_us = 0;  // and when
  while (!stop_.load()) {
    const Millis timeout(opt_.connect_timeout_ms);
    auto chr = Connect(opt_.host, opt_.port, timeout, {}, opt_.wrap);
    Status s = chr.status();
    std::shared_ptr<FrameChannel> ch;
    if (chr.ok()) {
      ch = std::shared_ptr<FrameChannel>(std::move(*chr));
      s = ClientHandshake(*ch, opt_.role, opt_.tenant, opt_.client_id, opt_.secret, timeout);
    }
    if (s.ok()) {
      backoff = opt_.backoff_min_ms;
      s = RunSession(ch);
    }
    if (stop_.load()) break;
    {
      std::lock_guard<std::mutex> l(mu_);
      stats_.last_error = s.ToString();
    }
    // Jittered, never past backoff_max_ms: a returning peer is probed at
    // least that often.
    const uint64_t sleep = std::min<uint64_t>(uint64_t(double(backoff) * jitter(rng)), opt_.backoff_max_ms);
    // A peer down for long is named once a minute, not at every probe.
    const uint64_t now_us = opt_.clock->NowMicros();
    const std::string why = s.ToString();
    if (why != last_logged || now_us - last_logged_us >= 60'000'000) {
      log_->warn("{} {}:{}: {}; reconnecting in {} ms", opt_.label, opt_.host, opt_.port, why, sleep);
      last_logged = why;
      last_logged_us = now_us;
    } else {
      log_->debug("{} {}:{}: {}; reconnecting in {} ms", opt_.label, opt_.host, opt_.port, why, sleep);
    }
    SleepMs(sleep);
    backoff = std::min(backoff * 2, opt_.backoff_max_ms);
  }
}

Status ReplicationSender::RunSession(const std::shared_ptr<FrameChannel>& ch) {
  Session s;
  s.ch = ch;
  s.last_rx_us = s.last_tx_us = opt_.clock->NowMicros();
  {
    std::lock_guard<std::mutex> l(mu_);
    channel_ = ch;
    s.epoch = ++epoch_;
    session_error_ = Status::OK();
    all_stalled_ = Status::OK();
    open_fifo_.clear();
    by_handle_.clear();
    for (auto& st : streams_) {
      st->open_sent = st->opened = st->resuming = st->fenced_open = false;
      st->open_error = Status::OK();
      st->inflight.clear();
      st->gap_expected = 0;
      st->hold_until_us = 0;
      ++st->rewinds;
    }
    ++stats_.connects;
    // The last error stays until a volume opens: a refused open ends the
    // session again, and clearing it here would hide the refusal while the
    // peer takes its time to answer the next one.
    if (streams_.empty()) stats_.last_error.clear();
    connected_ = true;
  }
  log_->info("{} connected to the {} at {}", opt_.label, opt_.peer_name, ch->peer());
  if (stop_.load()) ch->Close();
  std::thread reader([this, &s] { ReadLoop(s); });
  std::vector<std::thread> pool;
  for (int w = 1; w < opt_.workers; ++w) pool.emplace_back([this, &s, w] { (void)SendLoop(s, w); });
  Status result = SendLoop(s, 0);
  std::vector<std::function<void()>> lost;  // callbacks of calls lost with the connection
  ch->Close();
  cv_.notify_all();
  for (auto& t : pool) t.join();
  reader.join();
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!session_error_.ok()) result = session_error_;
    connected_ = false;
    ++stats_.disconnects;
    channel_.reset();
    for (auto it = calls_.begin(); it != calls_.end();) {
      if (!it->second->done) FailCall(*it->second, Status::Unavailable(opt_.peer_name + " connection lost"), &lost);
      it = it->second->async ? calls_.erase(it) : std::next(it);
    }
    ++notifies_;
  }
  cv_.notify_all();
  for (auto& f : lost) f();
  if (stop_.load() && result.ok()) result = Status::Aborted("stopping");
  return result;
}

Status ReplicationSender::SendLoop(Session& s, int worker) {
  auto fail = [&](Status why) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (session_error_.ok() && s.epoch == epoch_) session_error_ = why;
      ++notifies_;
    }
    s.ch->Close();
    cv_.notify_all();
    return why;
  };
  while (!stop_.load()) {
    std::vector<Stream*> to_open, ship;
    uint64_t seen = 0;
    {
      // The reader may stamp last_rx_us after `now` was read: no wrap-around.
      const uint64_t now = opt_.clock->NowMicros(), rx = s.last_rx_us.load();
      if (worker == 0 && now > rx && now - rx > opt_.dead_peer_ms * 1000) {
        // fail() takes mu_: not called with it held.
        return fail(Status::Unavailable("nothing received from the " + opt_.peer_name + " for " +
                                        std::to_string(opt_.dead_peer_ms) + " ms"));
      }
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      const uint64_t now = opt_.clock->NowMicros();
      if (worker == 0 && !all_stalled_.ok() && session_error_.ok()) {
        // Every stream stalled while calls held the session: end it once they are quiet.
        if (!AllStalledLocked()) {
          all_stalled_ = Status::OK();
        } else if (!CallsHoldSessionLocked(now)) {
          session_error_ = all_stalled_;
        }
      }
      if (!session_error_.ok()) return session_error_;
      for (auto& st : streams_) {
        if (st->removed) continue;
        if (!st->open_sent) {
          if (worker == 0) {  // every open goes out from worker 0, in fifo order
            st->open_sent = true;
            open_fifo_.push_back(st.get());
            to_open.push_back(st.get());
          }
          continue;
        }
        if (st->worker == worker && st->opened && !st->resuming && st->stalled.ok() &&
            st->inflight.size() < st->window && now >= st->hold_until_us) {
          ship.push_back(st.get());
        }
      }
      seen = notifies_;
    }
    for (Stream* st : to_open) {
      Status r = s.ch->Send(st->src->OpenMessage());
      if (!r.ok()) return fail(r);
      s.last_tx_us = opt_.clock->NowMicros();
    }
    bool did = !to_open.empty();
    for (Stream* st : ship) {
      // Only this worker's own sends count: the channel's frame counter also
      // moves with the other workers' frames, and idling on it would spin.
      bool sent = false;
      Status r = ShipOne(s, *st, &sent);
      if (!r.ok()) return fail(r);
      did = did || sent;
    }
    const uint64_t now = opt_.clock->NowMicros(), tx = s.last_tx_us.load();
    if (worker == 0 && now > tx && now - tx > opt_.heartbeat_ms * 1000) {
      Status r = s.ch->Send(proto::Heartbeat{opt_.clock->WallMicros(), 0});
      if (!r.ok()) return fail(r);
      s.last_tx_us = now;
    }
    if (!did) {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait_for(l, Millis(20), [&] { return stop_.load() || notifies_ != seen; });
    }
  }
  return fail(Status::Aborted("stopping"));
}

Status ReplicationSender::ShipOne(Session& s, Stream& st, bool* sent) {
  *sent = false;
  uint64_t from = 0, rewinds = 0;
  uint32_t handle = 0;
  bool inflight = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    from = st.next;
    rewinds = st.rewinds;
    handle = st.handle;
    inflight = !st.inflight.empty();
  }
  // Built in place in the message that is sent: a WriteBatch passed as a
  // Message would be copied, record data and all, into a temporary.
  proto::Message msg{std::in_place_type<proto::WriteBatch>};
  proto::WriteBatch& b = std::get<proto::WriteBatch>(msg);
  auto read = [&] {
    b.records.clear();
    return st.src->Read(from, opt_.frame_bytes, opt_.frame_records, &b.records);
  };
  Status r = read();
  if (r.ok() && opt_.linger_ms > 0 && inflight && !b.records.empty() && b.records.size() < opt_.frame_records) {
    uint64_t bytes = 0;
    for (const auto& rec : b.records) bytes += rec.data.size();
    // A small frame while the link is busy: let it grow once.
    if (bytes < opt_.frame_bytes / 4 && SleepMs(opt_.linger_ms)) r = read();
  }
  if (!r.ok()) {
    Status why = r.WithContext("read at seq " + std::to_string(from));
    log_->error("{} {} shipping stalled: {}", opt_.label, log::Where{st.name, s.ch->peer(), from}, why.ToString());
    std::vector<std::pair<RecordSource*, Status>> notes;
    {
      std::lock_guard<std::mutex> l(mu_);
      Stall(st, why);
      notes.swap(stall_notes_);
    }
    for (auto& [src, status] : notes) src->Stalled(status);
    return Status::OK();
  }
  if (b.records.empty()) return Status::OK();
  b.volume_id = handle;
  b.codec = st.src->codec();
  b.level = st.src->level();
  const uint64_t last = b.records.back().seq;
  {
    // Before the send: the peer's Ack may arrive before Send returns.
    std::lock_guard<std::mutex> l(mu_);
    st.sent_max = std::max(st.sent_max, last);
  }
  uint64_t wire = 0;
  CDP_RETURN_IF_ERROR(s.ch->Send(msg, &wire));
  *sent = true;
  s.last_tx_us = opt_.clock->NowMicros();
  {
    std::lock_guard<std::mutex> l(mu_);
    if (st.rewinds == rewinds && st.next == from) {
      st.next = last + 1;
      if (last > st.acked) st.inflight.push_back(last);
    }
  }
  st.src->Shipped(b, wire);
  return Status::OK();
}

void ReplicationSender::Rewind(Stream& st, uint64_t next) {
  st.inflight.clear();
  st.next = std::max(next, st.acked + 1);
  ++st.rewinds;
}

void ReplicationSender::Stall(Stream& st, const Status& why) {
  st.stalled = why;
  stall_notes_.emplace_back(st.src, why);
  if (AllStalledLocked() && session_error_.ok()) {
    Status end = why.WithContext("every volume stalled");
    if (CallsHoldSessionLocked(opt_.clock->NowMicros())) {
      all_stalled_ = end;  // SendLoop ends the session once the calls are quiet
    } else {
      session_error_ = end;
    }
  }
  ++notifies_;
}

bool ReplicationSender::AllStalledLocked() const {
  bool retry = false;  // a stall a new connection may clear
  for (const auto& st : streams_) {
    if (st->removed) continue;
    if (st->stalled.ok()) return false;
    retry = retry || !st->fenced_open;
  }
  return retry;
}

bool ReplicationSender::CallsHoldSessionLocked(uint64_t now_us) const {
  for (const auto& [id, c] : calls_)
    if (!c->done) return true;
  return last_call_us_ != 0 && now_us < last_call_us_ + opt_.call_hold_ms * 1000;
}

void ReplicationSender::ReadLoop(Session& s) {
  while (!stop_.load()) {
    auto m = s.ch->Receive(Millis(500));
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
    Handle(s, *m);
  }
}

// Runs in the reader thread. Sources are called outside mu_ (`after`).
void ReplicationSender::Handle(Session& s, proto::Message& m) {
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
      while (!st->inflight.empty() && st->inflight.front() <= st->acked) st->inflight.pop_front();
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
          st->hold_until_us = now + opt_.busy_hold_ms * 1000;
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
          st->hold_until_us = now + opt_.internal_hold_ms * 1000;
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
        if (p.async) {
          after.push_back([cb = std::move(p.callback), r = std::move(p.response)]() mutable { cb(std::move(r)); });
          calls_.erase(it);
        }
      }
    }
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

uint64_t ReplicationSender::AddCallLocked(size_t stream, proto::MsgType answer, CallCallback done) {
  auto p = std::make_shared<PendingCall>();
  p->stream = stream;
  p->answer = answer;
  p->async = true;
  p->callback = std::move(done);
  const uint64_t request_id = next_request_id_++;
  calls_[request_id] = std::move(p);
  last_call_us_ = std::max<uint64_t>(opt_.clock->NowMicros(), 1);
  return request_id;
}

void ReplicationSender::SendCall(const std::shared_ptr<FrameChannel>& ch, const proto::Message& request,
                                 uint64_t request_id) {
  Status s = ch->Send(request);
  if (s.ok()) return;
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

void ReplicationSender::CallAsync(proto::Message request, CallCallback done) {
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
      request_id = AddCallLocked(kNoStream, answer, std::move(done));
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
  SendCall(ch, request, request_id);
}

}  // namespace cdp::repl

// SPDX-License-Identifier: Apache-2.0
#include "common/wire/replication_sender.h"

#include "common/wire/replication_sender_state.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <random>
#include <variant>

#include "common/base/log.h"

namespace cdp::repl {

ReplicationSender::ReplicationSender(SenderOptions options)
    : opt_(std::move(options)), log_(log::Get(opt_.log_name)) {
  if (opt_.clock == nullptr) opt_.clock = SystemClock::Get();
  opt_.link.workers = std::max(1, opt_.link.workers);
  opt_.link.max_inflight = std::max(1, opt_.link.max_inflight);
}

ReplicationSender::~ReplicationSender() { Stop(); }

ReplicationSender::StreamId ReplicationSender::AddStream(RecordSource* source) {
  auto st = std::make_unique<Stream>();
  st->src = source;
  st->name = source->OpenMessage().name;
  st->window = size_t(source->max_inflight() > 0 ? source->max_inflight() : opt_.link.max_inflight);
  std::lock_guard<std::mutex> l(mu_);
  st->id = streams_.size();
  st->worker = int(st->id % size_t(opt_.link.workers));
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
  bool idle = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    ++notifies_;
    idle = idle_workers_ > 0;
  }
  // Only an idle worker waits for this. A worker lingering for its frame to
  // grow (SleepMs) is not woken: on a busy tap that was a context switch per
  // captured write, to find the linger not over and wait again.
  if (idle) cv_.notify_all();
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
  uint64_t backoff = opt_.link.backoff_min_ms;
  std::string last_logged;      // the last failure logged as a warning
  uint64_t last_logged_us = 0;  // and when
  while (!stop_.load()) {
    const Millis timeout(opt_.link.connect_timeout_ms);
    auto chr = Connect(opt_.link.peer.host, opt_.link.peer.port, timeout, {}, opt_.wrap);
    Status s = chr.status();
    std::shared_ptr<FrameChannel> ch;
    if (chr.ok()) {
      ch = std::shared_ptr<FrameChannel>(std::move(*chr));
      s = ClientHandshake(*ch, opt_.role, opt_.link.tenant, opt_.link.client_id, opt_.link.secret, timeout);
    }
    if (s.ok()) {
      backoff = opt_.link.backoff_min_ms;
      s = RunSession(ch);
    }
    if (stop_.load()) break;
    {
      std::lock_guard<std::mutex> l(mu_);
      stats_.last_error = s.ToString();
    }
    // Jittered, never past backoff_max_ms: a returning peer is probed at
    // least that often.
    const uint64_t sleep = std::min<uint64_t>(uint64_t(double(backoff) * jitter(rng)), opt_.link.backoff_max_ms);
    // A peer down for long is named once a minute, not at every probe.
    const uint64_t now_us = opt_.clock->NowMicros();
    const std::string why = s.ToString();
    if (why != last_logged || now_us - last_logged_us >= 60'000'000) {
      log_->warn("{} {}:{}: {}; reconnecting in {} ms", opt_.label, opt_.link.peer.host, opt_.link.peer.port, why, sleep);
      last_logged = why;
      last_logged_us = now_us;
    } else {
      log_->debug("{} {}:{}: {}; reconnecting in {} ms", opt_.label, opt_.link.peer.host, opt_.link.peer.port, why, sleep);
    }
    SleepMs(sleep);
    backoff = std::min(backoff * 2, opt_.link.backoff_max_ms);
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
  cv_.notify_all();  // WaitConnected
  log_->info("{} connected to the {} at {}", opt_.label, opt_.peer_name, ch->peer());
  if (stop_.load()) ch->Close();
  std::thread reader([this, &s] { ReadLoop(s); });
  std::vector<std::thread> pool;
  for (int w = 1; w < opt_.link.workers; ++w) pool.emplace_back([this, &s, w] { (void)SendLoop(s, w); });
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
      if (worker == 0 && now > rx && now - rx > opt_.link.dead_peer_ms * 1000) {
        // fail() takes mu_: not called with it held.
        return fail(Status::Unavailable("nothing received from the " + opt_.peer_name + " for " +
                                        std::to_string(opt_.link.dead_peer_ms) + " ms"));
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
    if (worker == 0 && now > tx && now - tx > opt_.link.heartbeat_ms * 1000) {
      Status r = s.ch->Send(proto::Heartbeat{opt_.clock->WallMicros(), 0});
      if (!r.ok()) return fail(r);
      s.last_tx_us = now;
    }
    if (!did) {
      std::unique_lock<std::mutex> l(mu_);
      ++idle_workers_;
      cv_.wait_for(l, Millis(20), [&] { return stop_.load() || notifies_ != seen; });
      --idle_workers_;
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
  uint64_t read_us = 0;
  auto read = [&] {
    b.records.clear();
    const uint64_t t0 = opt_.clock->NowMicros();
    Status status = st.src->Read(from, opt_.link.frame_bytes, opt_.link.frame_records, &b.records);
    read_us += opt_.clock->NowMicros() - t0;
    return status;
  };
  Status r = read();
  if (r.ok() && opt_.link.linger_ms > 0 && inflight && !b.records.empty() && b.records.size() < opt_.link.frame_records) {
    uint64_t bytes = 0;
    for (const auto& rec : b.records) bytes += rec.bytes().size();
    // A small frame while the link is busy: let it grow once.
    if (bytes < opt_.link.frame_bytes / 4 && SleepMs(opt_.link.linger_ms)) r = read();
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
  if (b.records.empty()) {
    std::lock_guard<std::mutex> l(mu_);
    stats_.stages.idle_read_us += read_us;
    return Status::OK();
  }
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
  FrameChannel::SendCost cost;
  CDP_RETURN_IF_ERROR(s.ch->Send(msg, &wire, &cost));
  *sent = true;
  const uint64_t sent_us = opt_.clock->NowMicros();
  s.last_tx_us = sent_us;
  uint64_t record_bytes = 0;  // counted outside the lock the reader takes for every Ack
  for (const auto& rec : b.records) record_bytes += rec.bytes().size();
  {
    std::lock_guard<std::mutex> l(mu_);
    if (st.rewinds == rewinds && st.next == from) {
      st.next = last + 1;
      if (last > st.acked) st.inflight.push_back({last, sent_us});
    }
    // Its Ack came before the write returned (the reader may also have moved
    // `next` past it): acknowledged, with no time to count.
    if (last <= st.acked) ++stats_.stages.acked_frames;
    ShipStages& g = stats_.stages;
    ++g.frames;
    g.read_us += read_us;
    g.encode_us += cost.encode_us;
    g.encode_cpu_us += cost.encode_cpu_us;
    g.write_us += cost.write_us;
    g.write_cpu_us += cost.write_cpu_us;
    g.record_bytes += record_bytes;
    g.wire_bytes += wire;
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
  return last_call_us_ != 0 && now_us < last_call_us_ + opt_.link.call_hold_ms * 1000;
}

}  // namespace cdp::repl

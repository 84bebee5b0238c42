#include "agent/sender.h"

#include <algorithm>
#include <vector>

#include "common/hash.h"
#include "common/log.h"

namespace cdp::agent {

using namespace std::chrono_literals;

// Everything one connected session shares between the sending thread and the
// receiver thread.
struct Sender::Conn {
  std::unique_ptr<FrameChannel> ch;
  uint32_t volume_id = 0;
  std::thread receiver;

  std::mutex mu;
  std::condition_variable cv;
  Status broken;                 // set by the receiver on a fatal error
  uint64_t acked = 0;            // highest durable_seq seen
  uint64_t gap_expected = 0;     // non-zero: resend from here
  bool busy = false;             // a kBusy Nack arrived
  bool internal_nack = false;    // a kInternal Nack arrived (see ResyncStep)
  uint64_t last_rx_us = 0;       // when the last message arrived
  std::map<uint64_t, proto::HashResponse> hashes;
  std::deque<std::pair<uint64_t, uint64_t>> inflight;  // (last seq, bytes) per batch

  // Sender-thread state.
  uint64_t next_send = 1;
  uint64_t next_request_id = 1;
  uint64_t pending_request = 0;  // HashRequest awaiting its response
  uint64_t pending_first = 0;
  uint32_t pending_count = 0;
  uint64_t pending_sent_us = 0;
  uint64_t resync_pause_until_us = 0;
  uint64_t last_tx_us = 0;
  std::deque<uint64_t> to_ship;  // regions found different, waiting for room
};

Sender::Sender(CaptureDevice* device, SenderOptions opts) : dev_(device), opts_(std::move(opts)) {
  if (opts_.clock == nullptr) opts_.clock = SystemClock::Get();
}

Sender::~Sender() { Stop(); }

void Sender::Start() {
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] { Run(); });
}

void Sender::Stop() {
  if (!thread_.joinable()) return;  // idempotent; touches nothing once stopped
  {
    std::lock_guard lk(stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  dev_->queue().Wake();
  {
    std::lock_guard lk(mu_);
    if (active_ != nullptr) active_->Close();
  }
  if (thread_.joinable()) thread_.join();
}

SenderStats Sender::Stats() const {
  std::lock_guard lk(mu_);
  SenderStats s = st_;
  s.resync_remaining = dev_->bitmap().ResyncCount();
  if (s.resync_remaining > 0 && resync_pass_done_ > 0) {
    double elapsed = double(opts_.clock->NowMicros() - resync_pass_start_us_) / 1e6;
    s.resync_eta_seconds = elapsed / double(resync_pass_done_) * double(s.resync_remaining);
  } else {
    s.resync_eta_seconds = 0;
  }
  return s;
}

void Sender::SetError(const Status& s) {
  std::lock_guard lk(mu_);
  st_.last_error = s.ToString();
}

void Sender::Checkpoint(bool force) {
  uint64_t now = opts_.clock->NowMicros();
  {
    std::lock_guard lk(mu_);
    if (!force && now - last_checkpoint_us_ < opts_.checkpoint_interval_ms * 1000) return;
    last_checkpoint_us_ = now;
  }
  auto r = dev_->bitmap().Checkpoint();
  if (!r.ok()) {
    log::Get("agent")->error("{} dirty bitmap checkpoint failed: {}", log::Where{dev_->volume(), "", 0},
                             r.status().ToString());
  }
}

void Sender::Run() {
  auto lg = log::Get("agent");
  uint64_t backoff = opts_.backoff_min_ms;
  while (!stop_) {
    Status s = Session();
    {
      std::lock_guard lk(mu_);
      if (st_.connected) ++st_.disconnects;
      st_.connected = false;
    }
    if (stop_) break;
    SetError(s);
    lg->warn("{} session with process server ended: {}; retrying in {} ms",
             log::Where{dev_->volume(), opts_.ps_host, dev_->queue().acked_seq()}, s.ToString(), backoff);
    Checkpoint(false);
    std::unique_lock lk(stop_mu_);
    stop_cv_.wait_for(lk, std::chrono::milliseconds(backoff), [&] { return stop_.load(); });
    bool was_connected = false;
    {
      std::lock_guard l2(mu_);
      was_connected = st_.batches_sent > 0 && s.code() == Code::kUnavailable;
    }
    backoff = was_connected ? opts_.backoff_min_ms : std::min(backoff * 2, opts_.backoff_max_ms);
  }
  Checkpoint(true);
}

Status Sender::Session() {
  auto lg = log::Get("agent");
  CDP_ASSIGN_OR_RETURN(std::unique_ptr<FrameChannel> ch,
                       Connect(opts_.ps_host, opts_.ps_port, std::chrono::milliseconds(opts_.connect_timeout_ms)));
  CDP_RETURN_IF_ERROR(ClientHandshake(*ch, proto::Role::kAgent, opts_.tenant, opts_.client_id, opts_.secret,
                                      std::chrono::milliseconds(opts_.connect_timeout_ms)));
  proto::VolumeOpen vo;
  vo.name = dev_->volume();
  vo.size = dev_->size();
  vo.block_size = dev_->preferred_block_size();
  proto::Hash128 id = Xxh3_128(vo.name.data(), vo.name.size());
  for (int i = 0; i < 8; ++i) {
    vo.uuid[i] = uint8_t(id.low >> (8 * i));
    vo.uuid[8 + i] = uint8_t(id.high >> (8 * i));
  }
  vo.generation = opts_.generation;
  CDP_RETURN_IF_ERROR(ch->Send(vo));
  auto reply = ch->Receive(std::chrono::milliseconds(opts_.connect_timeout_ms * 4));
  if (!reply.ok()) return reply.status().WithContext("waiting for VolumeOpenReply");
  if (auto* n = std::get_if<proto::Nack>(&*reply)) {
    return Status::Unavailable("volume open refused: " + n->message + " (reason " +
                               std::to_string(int(n->reason)) + ")");
  }
  auto* vr = std::get_if<proto::VolumeOpenReply>(&*reply);
  if (vr == nullptr) return Status::Corruption("unexpected reply to VolumeOpen");

  CaptureQueue& q = dev_->queue();
  const uint64_t d = vr->durable_seq;
  bool first_contact = false;
  {
    std::lock_guard lk(mu_);
    first_contact = st_.connects == 0;
    ++st_.connects;
    st_.connected = true;
    st_.last_error.clear();
  }
  auto renumber = [this](uint64_t old_acked, uint64_t new_acked) { dev_->bitmap().Renumber(old_acked, new_acked); };
  if (!q.Resume(d, renumber)) {
    // Outside our window. On the first contact of this process that is normal
    // (our numbers were provisional); later it means the server's history and
    // ours disagree: everything is compared again.
    if (!first_contact) {
      std::lock_guard lk(mu_);
      ++st_.history_lost;
      lg->error("{} process server resumes at {} outside our window: full resync",
                log::Where{dev_->volume(), ch->peer(), d}, d);
      dev_->bitmap().MarkAllCompare();
    }
  }
  dev_->bitmap().SetAcked(q.acked_seq());
  lg->info("{} volume open, resuming after {}", log::Where{dev_->volume(), ch->peer(), d + 1}, d);

  Conn c;
  c.ch = std::move(ch);
  {
    std::lock_guard lk(mu_);
    active_ = c.ch.get();
  }
  if (stop_) c.ch->Close();
  c.volume_id = vr->volume_id;
  c.acked = q.acked_seq();
  c.next_send = c.acked + 1;
  c.last_rx_us = c.last_tx_us = opts_.clock->NowMicros();
  c.receiver = std::thread([this, &c] { Receiver(&c); });

  Status result;
  while (!stop_) {
    {
      std::unique_lock lk(c.mu);
      if (!c.broken.ok()) {
        result = c.broken;
        break;
      }
      if (c.gap_expected != 0) {
        uint64_t e = c.gap_expected;
        c.gap_expected = 0;
        lk.unlock();
        if (!q.Resume(e - 1, [this](uint64_t o, uint64_t n) { dev_->bitmap().Renumber(o, n); })) {
          std::lock_guard l2(mu_);
          ++st_.history_lost;
          dev_->bitmap().MarkAllCompare();
        }
        dev_->bitmap().SetAcked(q.acked_seq());
        lk.lock();
        c.next_send = e;
        c.inflight.clear();
      }
      if (c.internal_nack) {
        c.internal_nack = false;
        if (c.pending_request == 0) {
          result = Status::Unavailable("process server reported an internal error");
          break;
        }
        // The hash request could not be answered (master target unreachable):
        // pause the resync, keep shipping.
        lg->warn("{} hash request refused by the process server; resync paused {} ms",
                 log::Where{dev_->volume(), c.ch->peer(), 0}, opts_.hash_retry_ms);
        c.pending_request = 0;
        c.resync_pause_until_us = opts_.clock->NowMicros() + opts_.hash_retry_ms * 1000;
      }
      uint64_t now = opts_.clock->NowMicros();
      if (c.last_rx_us != 0 && now - c.last_rx_us > opts_.dead_peer_ms * 1000) {
        result = Status::Unavailable("nothing received from the process server for " +
                                     std::to_string(opts_.dead_peer_ms) + " ms");
        break;
      }
      if (c.busy) {
        c.busy = false;
        c.next_send = std::max(c.acked, q.acked_seq()) + 1;
        c.inflight.clear();
        lk.unlock();
        std::unique_lock sl(stop_mu_);
        stop_cv_.wait_for(sl, std::chrono::milliseconds(opts_.busy_backoff_ms), [&] { return stop_.load(); });
        continue;
      }
    }
    bool sent = false, progressed = false;
    result = SendSome(&c, &sent);
    if (!result.ok()) break;
    uint64_t now = opts_.clock->NowMicros();
    if (sent) {
      c.last_tx_us = now;
    } else if (now - c.last_tx_us > opts_.heartbeat_ms * 1000) {
      result = c.ch->Send(proto::Heartbeat{opts_.clock->WallMicros(), 0});
      if (!result.ok()) break;
      c.last_tx_us = now;
    }
    result = ResyncStep(&c, &progressed);
    if (!result.ok()) break;
    Checkpoint(false);
    {
      std::lock_guard lk(mu_);
      st_.acked_seq = q.acked_seq();
      std::vector<QueuedRecord> oldest;
      st_.rpo_lag_us = 0;
      if (q.Peek(q.acked_seq() + 1, 1, 1, &oldest)) {
        uint64_t now = opts_.clock->WallMicros();
        st_.rpo_lag_us = now > oldest[0].timestamp_us ? now - oldest[0].timestamp_us : 0;
      }
    }
    if (!sent && !progressed) {
      // Idle: wait for a new record, an ack (which wakes the queue) or a tick.
      uint64_t window_full = 0;
      {
        std::lock_guard lk(c.mu);
        window_full = c.inflight.size() >= size_t(opts_.max_inflight);
      }
      if (window_full) {
        std::unique_lock lk(c.mu);
        c.cv.wait_for(lk, 50ms, [&] {
          return c.inflight.size() < size_t(opts_.max_inflight) || !c.broken.ok() || stop_;
        });
      } else {
        q.WaitFor(c.next_send, 50);
      }
    }
  }
  c.ch->Close();
  if (c.receiver.joinable()) c.receiver.join();
  {
    std::lock_guard lk(mu_);
    active_ = nullptr;
  }
  if (stop_ && result.ok()) result = Status::Aborted("stopping");
  return result;
}

void Sender::Receiver(Conn* c) {
  CaptureQueue& q = dev_->queue();
  while (true) {
    auto m = c->ch->Receive(200ms);
    if (!m.ok()) {
      if (m.status().code() == Code::kBusy) {
        if (stop_) return;
        continue;
      }
      std::lock_guard lk(c->mu);
      if (c->broken.ok()) c->broken = m.status();
      c->cv.notify_all();
      q.Wake();
      return;
    }
    {
      std::lock_guard lk(c->mu);
      c->last_rx_us = opts_.clock->NowMicros();
    }
    if (auto* a = std::get_if<proto::Ack>(&*m)) {
      q.Ack(a->durable_seq);
      dev_->bitmap().SetAcked(q.acked_seq());
      std::lock_guard lk(c->mu);
      c->acked = std::max(c->acked, a->durable_seq);
      while (!c->inflight.empty() && c->inflight.front().first <= c->acked) c->inflight.pop_front();
      c->cv.notify_all();
      q.Wake();
    } else if (auto* n = std::get_if<proto::Nack>(&*m)) {
      std::lock_guard lk(c->mu);
      if (n->reason == proto::NackReason::kGap) {
        std::lock_guard l2(mu_);
        ++st_.gap_nacks;
        c->gap_expected = std::max<uint64_t>(n->expected_seq, 1);
      } else if (n->reason == proto::NackReason::kBusy) {
        std::lock_guard l2(mu_);
        ++st_.busy_nacks;
        c->busy = true;
      } else if (n->reason == proto::NackReason::kInternal) {
        c->internal_nack = true;  // the sending thread decides (hash request or not)
      } else {
        c->broken = Status::Unavailable("process server refused: " + n->message + " (reason " +
                                        std::to_string(int(n->reason)) + ")");
      }
      c->cv.notify_all();
      q.Wake();
      if (!c->broken.ok()) return;
    } else if (auto* h = std::get_if<proto::HashResponse>(&*m)) {
      std::lock_guard lk(c->mu);
      c->hashes[h->request_id] = std::move(*h);
      c->cv.notify_all();
      q.Wake();
    } else if (std::get_if<proto::Heartbeat>(&*m) != nullptr || std::get_if<proto::Stats>(&*m) != nullptr) {
      // Liveness only.
    } else {
      std::lock_guard lk(c->mu);
      c->broken = Status::Corruption("unexpected message from process server");
      c->cv.notify_all();
      q.Wake();
      return;
    }
  }
}

Status Sender::SendSome(Conn* c, bool* sent) {
  *sent = false;
  {
    std::lock_guard lk(c->mu);
    if (c->inflight.size() >= size_t(opts_.max_inflight)) return Status::OK();
  }
  CaptureQueue& q = dev_->queue();
  std::vector<QueuedRecord> recs;
  if (!q.Peek(c->next_send, opts_.batch_bytes, opts_.batch_records, &recs)) return Status::OK();
  // Linger briefly when the batch is small and nothing is in flight to let it grow.
  uint64_t bytes = 0;
  for (auto& r : recs) bytes += r.length;
  if (opts_.linger_ms > 0 && bytes < opts_.batch_bytes / 4 && recs.size() < opts_.batch_records) {
    bool link_busy = false;
    {
      std::lock_guard lk(c->mu);
      link_busy = !c->inflight.empty();
    }
    if (link_busy) {
      std::this_thread::sleep_for(std::chrono::milliseconds(opts_.linger_ms));
      if (!q.Peek(c->next_send, opts_.batch_bytes, opts_.batch_records, &recs)) return Status::OK();
    }
  }
  if (recs.front().seq != c->next_send) {
    // The queue was renumbered or acked past us: start from its first record.
    c->next_send = recs.front().seq;
  }
  proto::WriteBatch wb;
  wb.volume_id = c->volume_id;
  wb.records.reserve(recs.size());
  uint64_t data_bytes = 0, reread = 0;
  for (auto& r : recs) {
    proto::Record pr;
    pr.seq = r.seq;
    pr.offset = r.offset;
    pr.length = r.length;
    pr.kind = r.kind;
    pr.timestamp_us = r.timestamp_us;
    if (r.kind == proto::RecordKind::kData && !r.has_data) {
      pr.data.resize(r.length);
      CDP_RETURN_IF_ERROR(dev_->ReadBacking(r.offset, r.length, pr.data.data()));
      reread += r.length;
    } else {
      if (r.data) pr.data = *r.data;
    }
    data_bytes += pr.data.size();
    wb.records.push_back(std::move(pr));
  }
  uint64_t last = wb.records.back().seq;
  size_t n = wb.records.size();
  CDP_RETURN_IF_ERROR(c->ch->Send(wb));
  {
    std::lock_guard lk(c->mu);
    c->inflight.emplace_back(last, data_bytes);
  }
  c->next_send = last + 1;
  *sent = true;
  std::lock_guard lk(mu_);
  ++st_.batches_sent;
  st_.records_sent += n;
  st_.bytes_sent += data_bytes;
  st_.reread_bytes += reread;
  return Status::OK();
}

Status Sender::ResyncStep(Conn* c, bool* progressed) {
  *progressed = false;
  DirtyBitmap& bm = dev_->bitmap();
  // 1. Regions known to differ wait for room in the queue.
  while (!c->to_ship.empty()) {
    uint64_t r = c->to_ship.front();
    CDP_ASSIGN_OR_RETURN(uint64_t seq, dev_->ShipRegion(r));
    if (seq == 0) return Status::OK();  // no room: after acknowledgements
    c->to_ship.pop_front();
    *progressed = true;
    std::lock_guard lk(mu_);
    ++st_.resync_shipped;
    ++resync_pass_done_;
  }
  // 2. A hash response to process?
  if (c->pending_request != 0) {
    proto::HashResponse resp;
    {
      std::lock_guard lk(c->mu);
      auto it = c->hashes.find(c->pending_request);
      if (it == c->hashes.end()) {
        if (opts_.clock->NowMicros() - c->pending_sent_us > opts_.hash_timeout_ms * 1000) {
          return Status::Unavailable("hash response timed out");
        }
        return Status::OK();
      }
      resp = std::move(it->second);
      c->hashes.erase(it);
    }
    if (resp.first_region != c->pending_first || resp.hashes.size() != c->pending_count ||
        resp.region_size != bm.region_size()) {
      return Status::Corruption("hash response does not match the request");
    }
    uint64_t compared = 0, equal = 0;
    for (uint32_t i = 0; i < c->pending_count; ++i) {
      uint64_t r = c->pending_first + i;
      if (bm.ResyncState(r) != DirtyBitmap::Resync::kCompare) continue;
      CDP_ASSIGN_OR_RETURN(proto::Hash128 local, dev_->HashRegion(r));
      ++compared;
      if (local == resp.hashes[i]) {
        bm.ResyncDone(r, 0);
        ++equal;
      } else {
        c->to_ship.push_back(r);
      }
    }
    c->pending_request = 0;
    bm.SetCursor(c->pending_first + c->pending_count);
    *progressed = true;
    std::lock_guard lk(mu_);
    st_.resync_compared += compared;
    st_.resync_equal += equal;
    resync_pass_done_ += equal;
    return Status::OK();
  }
  // 3. Start the next comparison (only in data mode: records must fit).
  if (bm.ResyncCount() == 0) {
    std::lock_guard lk(mu_);
    st_.resync_total = 0;
    resync_pass_done_ = 0;
    return Status::OK();
  }
  if (dev_->queue().mode() != CaptureMode::kData) return Status::OK();
  if (opts_.clock->NowMicros() < c->resync_pause_until_us) return Status::OK();
  {
    std::lock_guard lk(mu_);
    if (st_.resync_total == 0) {
      st_.resync_total = bm.ResyncCount();
      resync_pass_start_us_ = opts_.clock->NowMicros();
      resync_pass_done_ = 0;
    }
  }
  auto next = bm.NextResync(bm.cursor());
  if (!next) next = bm.NextResync(0);
  if (!next) return Status::OK();
  uint64_t first = *next;
  if (bm.ResyncState(first) == DirtyBitmap::Resync::kShip) {
    c->to_ship.push_back(first);
    bm.SetCursor(first + 1);
    *progressed = true;
    return Status::OK();
  }
  uint32_t count = uint32_t(std::min<uint64_t>(opts_.hash_batch, bm.region_count() - first));
  proto::HashRequest hr;
  hr.volume_id = c->volume_id;
  hr.request_id = c->next_request_id++;
  hr.region_size = bm.region_size();
  hr.first_region = first;
  hr.count = count;
  CDP_RETURN_IF_ERROR(c->ch->Send(hr));
  c->pending_request = hr.request_id;
  c->pending_first = first;
  c->pending_count = count;
  c->pending_sent_us = opts_.clock->NowMicros();
  *progressed = true;
  return Status::OK();
}

}  // namespace cdp::agent

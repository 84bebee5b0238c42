#include "process-server/mt_link.h"

#include <algorithm>
#include <type_traits>
#include <variant>

#include "common/log.h"

namespace cdp::ps {
namespace {

using Millis = std::chrono::milliseconds;

std::string NackName(proto::NackReason r) {
  switch (r) {
    case proto::NackReason::kGap: return "gap";
    case proto::NackReason::kBusy: return "busy";
    case proto::NackReason::kUnknownVolume: return "unknown volume";
    case proto::NackReason::kBadRecord: return "bad record";
    case proto::NackReason::kWrongGeneration: return "wrong generation";
    case proto::NackReason::kPermissionDenied: return "permission denied";
    case proto::NackReason::kInternal: return "internal";
    case proto::NackReason::kCorruption: return "corruption";
  }
  return "unknown";
}

}  // namespace

MtLink::MtLink(MtLinkOptions options) : opt_(std::move(options)), rng_(std::random_device{}()) {}

MtLink::~MtLink() { Stop(); }

void MtLink::Start() {
  if (thread_.joinable()) return;
  thread_ = std::thread([this] { Run(); });
}

void MtLink::Stop() {
  stop_.store(true);
  std::shared_ptr<FrameChannel> ch;
  {
    std::lock_guard<std::mutex> l(mu_);
    ch = channel_;
  }
  if (ch) ch->Close();
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void MtLink::AddVolume(Volume* v) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (volumes_.count(v)) return;
    auto lv = std::make_unique<LinkVolume>();
    lv->vol = v;
    lv->worker = int(volumes_.size() % size_t(std::max(1, opt_.workers)));
    volumes_[v] = std::move(lv);
  }
  cv_.notify_all();
}

void MtLink::Notify() { cv_.notify_all(); }

std::string MtLink::state() const {
  std::lock_guard<std::mutex> l(mu_);
  if (connected_.load()) return "connected";
  return last_error_.empty() ? "connecting" : "disconnected: " + last_error_;
}

void MtLink::SleepMs(uint64_t ms) {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait_for(l, Millis(ms), [&] { return stop_.load(); });
}

void MtLink::Run() {
  auto log = log::Get("ps.link");
  uint64_t backoff = opt_.backoff_min_ms;
  while (!stop_.load()) {
    Status s;
    auto chr = Connect(opt_.host, opt_.port, Millis(5000));
    std::shared_ptr<FrameChannel> ch;
    if (chr.ok()) {
      ch = std::shared_ptr<FrameChannel>(std::move(*chr));
      s = ClientHandshake(*ch, proto::Role::kProcessServer, opt_.tenant, opt_.client_id, opt_.secret, Millis(10000));
    } else {
      s = chr.status();
    }
    if (!s.ok()) {
      {
        std::lock_guard<std::mutex> l(mu_);
        last_error_ = s.ToString();
      }
      std::uniform_real_distribution<double> jitter(0.5, 1.5);
      uint64_t sleep = uint64_t(double(backoff) * jitter(rng_));
      log->warn("tenant={} link={} peer={}:{} connect failed: {}; retry in {} ms", opt_.tenant, opt_.index,
                opt_.host, opt_.port, s.ToString(), sleep);
      SleepMs(sleep);
      backoff = std::min(backoff * 2, opt_.backoff_max_ms);
      continue;
    }
    backoff = opt_.backoff_min_ms;
    uint64_t epoch;
    {
      std::lock_guard<std::mutex> l(mu_);
      channel_ = ch;
      epoch = ++epoch_;
      conn_failed_ = false;
      last_error_.clear();
      open_fifo_.clear();
      by_mt_id_.clear();
      for (auto& [v, lv] : volumes_) {
        lv->open_sent = lv->opened = false;
        lv->open_error = Status::OK();
        lv->inflight.clear();
      }
    }
    connected_.store(true);
    connects_.fetch_add(1);
    log->info("tenant={} link={} peer={} connected", opt_.tenant, opt_.index, ch->peer());
    if (stop_.load()) ch->Close();
    std::thread reader([this, ch, epoch] { ReadLoop(ch, epoch); });
    // The compression pool: workers 1..n-1 ship their share of the volumes
    // (FrameChannel::Send compresses in the calling thread, outside its lock);
    // worker 0 (this thread) also sends opens and heartbeats.
    int workers = std::max(1, opt_.workers);
    std::vector<std::thread> pool;
    std::vector<Status> results(static_cast<size_t>(workers));
    for (int w = 1; w < workers; ++w)
      pool.emplace_back([this, ch, epoch, w, &results] {
        results[size_t(w)] = SendLoop(ch, epoch, w);
        ch->Close();
        cv_.notify_all();
      });
    s = SendLoop(ch, epoch, 0);
    ch->Close();
    cv_.notify_all();
    for (auto& t : pool) t.join();
    for (int w = 1; w < workers && s.code() == Code::kUnavailable; ++w)
      if (!results[size_t(w)].ok() && results[size_t(w)].code() != Code::kUnavailable) s = results[size_t(w)];
    reader.join();
    connected_.store(false);
    {
      std::lock_guard<std::mutex> l(mu_);
      channel_.reset();
      for (auto& [id, h] : hashes_) {
        if (!h->done) {
          h->done = true;
          h->status = Status::Unavailable("master target connection lost");
        }
      }
      if (!s.ok()) last_error_ = s.ToString();
    }
    cv_.notify_all();
    if (stop_.load()) break;
    std::uniform_real_distribution<double> jitter(0.5, 1.5);
    uint64_t sleep = uint64_t(double(backoff) * jitter(rng_));
    log->warn("tenant={} link={} connection lost: {}; reconnect in {} ms", opt_.tenant, opt_.index, s.ToString(),
              sleep);
    SleepMs(sleep);
    backoff = std::min(backoff * 2, opt_.backoff_max_ms);
  }
}

Status MtLink::SendLoop(const std::shared_ptr<FrameChannel>& ch, uint64_t epoch, int worker) {
  auto log = log::Get("ps.link");
  uint64_t last_heartbeat = opt_.clock->NowMicros();
  while (!stop_.load() && !ch->broken()) {
    std::vector<LinkVolume*> to_open, ship;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (conn_failed_ || epoch != epoch_) return Status::Unavailable(last_error_.empty() ? "reader stopped" : last_error_);
      uint64_t now = opt_.clock->NowMicros();
      for (auto& [v, lv] : volumes_) {
        if (!lv->open_sent) {
          if (worker == 0) {  // every open goes out from worker 0, in fifo order
            lv->open_sent = true;
            open_fifo_.push_back(lv.get());
            to_open.push_back(lv.get());
          }
          continue;
        }
        if (lv->worker != worker) continue;
        if (lv->opened && v->stalled().empty() && int(lv->inflight.size()) < opt_.max_inflight &&
                   now >= lv->hold_until_us) {
          ship.push_back(lv.get());
        }
        if (!lv->inflight.empty() && now - lv->last_progress_us > opt_.ack_timeout_ms * 1000)
          return Status::Unavailable("no acknowledgement from the master target for " +
                                     std::to_string(opt_.ack_timeout_ms) + " ms (" + v->key() + ")");
      }
    }
    for (LinkVolume* lv : to_open) CDP_RETURN_IF_ERROR(ch->Send(lv->vol->open_message()));

    bool did = false;
    for (LinkVolume* lv : ship) {
      uint64_t from, rewinds;
      uint32_t mt_id;
      {
        std::lock_guard<std::mutex> l(mu_);
        from = lv->next;
        rewinds = lv->rewinds;
        mt_id = lv->mt_id;
      }
      Volume* v = lv->vol;
      auto recs = v->spool().Read(from, opt_.frame_bytes);
      if (!recs.ok()) {
        v->SetStalled("spool read at seq " + std::to_string(from) + ": " + recs.status().ToString());
        log->error("{} shipping stalled: {}", log::Where{v->key(), ch->peer(), from}, recs.status().ToString());
        continue;
      }
      if (recs->empty()) continue;
      proto::WriteBatch b;
      b.volume_id = mt_id;
      b.codec = v->codec();
      b.level = v->level();
      uint64_t raw = 0;
      for (const auto& r : *recs) raw += kRecordHeaderSize + r.data.size();
      uint64_t last = recs->back().seq;
      b.records = std::move(*recs);
      uint64_t before = ch->bytes_sent();
      Status s = ch->Send(b);
      if (!s.ok()) return s;
      uint64_t wire = ch->bytes_sent() - before;
      {
        std::lock_guard<std::mutex> l(mu_);
        if (lv->rewinds == rewinds && lv->next == from) {
          lv->next = last + 1;
          if (last > lv->acked) {
            if (lv->inflight.empty()) lv->last_progress_us = opt_.clock->NowMicros();
            lv->inflight.push_back(last);
          }
        }
      }
      VolumeCounters& c = v->counters();
      c.raw_out.fetch_add(raw);
      c.wire_out.fetch_add(wire);
      c.frames_out.fetch_add(1);
      did = true;
      if (opt_.throttle) {
        uint64_t wait_us = opt_.throttle->Reserve(wire);
        if (wait_us > 0) SleepMs((wait_us + 999) / 1000);
      }
    }
    uint64_t now = opt_.clock->NowMicros();
    if (worker == 0 && now - last_heartbeat > opt_.heartbeat_ms * 1000) {
      last_heartbeat = now;
      proto::Heartbeat hb;
      hb.sent_us = opt_.clock->WallMicros();
      CDP_RETURN_IF_ERROR(ch->Send(hb));
    }
    if (!did) {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait_for(l, Millis(20));
    }
  }
  return stop_.load() ? Status::Aborted("stopping") : Status::Unavailable("channel broken");
}

void MtLink::Rewind(LinkVolume& lv, uint64_t to) {
  if (!lv.inflight.empty()) lv.vol->counters().resent_frames.fetch_add(lv.inflight.size());
  lv.inflight.clear();
  lv.next = std::max(to, lv.acked + 1);
  lv.rewinds++;
}

void MtLink::ReadLoop(std::shared_ptr<FrameChannel> ch, uint64_t epoch) {
  auto log = log::Get("ps.link");
  while (!stop_.load()) {
    auto m = ch->Receive(Millis(500));
    if (!m.ok()) {
      if (m.status().IsBusy() && !ch->broken()) continue;
      {
        std::lock_guard<std::mutex> l(mu_);
        if (epoch == epoch_) {
          conn_failed_ = true;
          last_error_ = m.status().ToString();
        }
      }
      if (!stop_.load()) log->warn("tenant={} link={} peer={} receive: {}", opt_.tenant, opt_.index, ch->peer(),
                                   m.status().ToString());
      cv_.notify_all();
      return;
    }
    HandleMessage(*ch, *m);
  }
}

void MtLink::HandleMessage(FrameChannel& ch, proto::Message& m) {
  auto log = log::Get("ps.link");
  std::vector<std::pair<Volume*, uint64_t>> release;  // done outside the lock
  std::vector<std::pair<Volume*, uint64_t>> floors;
  bool fail = false;
  std::string fail_reason;
  {
    std::lock_guard<std::mutex> l(mu_);
    uint64_t now = opt_.clock->NowMicros();
    if (auto* r = std::get_if<proto::VolumeOpenReply>(&m)) {
      if (open_fifo_.empty()) {
        fail = true;
        fail_reason = "VolumeOpenReply without a VolumeOpen";
      } else {
        LinkVolume* lv = open_fifo_.front();
        open_fifo_.pop_front();
        lv->opened = true;
        lv->mt_id = r->volume_id;
        lv->mt_open_durable = r->durable_seq;
        by_mt_id_[r->volume_id] = lv;
        lv->acked = r->durable_seq;
        lv->rewind_to = 0;
        lv->inflight.clear();
        lv->next = r->durable_seq + 1;
        lv->rewinds++;
        lv->last_progress_us = now;
        lv->vol->counters().mt_acked.store(r->durable_seq);
        floors.emplace_back(lv->vol, r->durable_seq);
        SpoolStats st = lv->vol->spool().stats();
        if (st.first_seq != 0 && r->durable_seq + 1 < st.first_seq) {
          lv->vol->SetStalled("master target is at seq " + std::to_string(r->durable_seq) +
                              " but the spool starts at " + std::to_string(st.first_seq) + ": resync needed");
        } else if (lv->vol->stalled().rfind("master target", 0) == 0) {
          lv->vol->SetStalled("");
        }
        log->info("{} opened at the master target (mt volume {}), resuming after seq {}",
                  log::Where{lv->vol->key(), ch.peer(), r->durable_seq}, r->volume_id, r->durable_seq);
      }
    } else if (auto* a = std::get_if<proto::Ack>(&m)) {
      auto it = by_mt_id_.find(a->volume_id);
      if (it != by_mt_id_.end()) {
        LinkVolume& lv = *it->second;
        if (a->durable_seq > lv.acked) {
          lv.acked = a->durable_seq;
          lv.last_progress_us = now;
          release.emplace_back(lv.vol, lv.acked);
          lv.vol->counters().mt_acked.store(lv.acked);
        }
        while (!lv.inflight.empty() && lv.inflight.front() <= lv.acked) lv.inflight.pop_front();
        if (lv.next <= lv.acked) lv.next = lv.acked + 1;
      }
    } else if (auto* n = std::get_if<proto::Nack>(&m)) {
      auto it = by_mt_id_.find(n->volume_id);
      LinkVolume* lv = it != by_mt_id_.end() ? it->second : nullptr;
      if (lv == nullptr && !open_fifo_.empty()) {
        // The answer to the oldest VolumeOpen: refused.
        lv = open_fifo_.front();
        open_fifo_.pop_front();
        lv->open_error = Status::PermissionDenied("master target refused the volume: " + NackName(n->reason) +
                                                  " " + n->message);
        lv->vol->SetStalled(lv->open_error.message());
        log->error("{} {}", log::Where{lv->vol->key(), ch.peer(), 0}, lv->open_error.message());
      } else if (lv != nullptr) {
        lv->last_progress_us = now;
        switch (n->reason) {
          case proto::NackReason::kGap:
            if (n->expected_seq > 0 && n->expected_seq - 1 > lv->acked) {
              lv->acked = n->expected_seq - 1;
              release.emplace_back(lv->vol, lv->acked);
              lv->vol->counters().mt_acked.store(lv->acked);
            }
            if (n->expected_seq != lv->rewind_to) {
              log->info("{} gap at the master target, resending from {}",
                        log::Where{lv->vol->key(), ch.peer(), n->expected_seq}, n->expected_seq);
              lv->rewind_to = n->expected_seq;
              Rewind(*lv, n->expected_seq);
            }
            break;
          case proto::NackReason::kBusy:
            Rewind(*lv, lv->acked + 1);
            lv->hold_until_us = now + 200'000;
            break;
          case proto::NackReason::kInternal:  // an I/O failure at the MT; the batch was undone: resend
            log->warn("{} master target failed a batch ({}), resending after a pause",
                      log::Where{lv->vol->key(), ch.peer(), lv->acked + 1}, n->message);
            Rewind(*lv, lv->acked + 1);
            lv->hold_until_us = now + 1'000'000;
            break;
          case proto::NackReason::kUnknownVolume:  // our handle is stale: reconnect and reopen
            fail = true;
            fail_reason = "master target does not know volume handle " + std::to_string(n->volume_id);
            break;
          default:
            lv->vol->SetStalled("master target nack: " + NackName(n->reason) + " " + n->message);
            Rewind(*lv, lv->acked + 1);
            log->error("{} master target refused a batch: {} {}", log::Where{lv->vol->key(), ch.peer(), n->expected_seq},
                       NackName(n->reason), n->message);
        }
      }
    } else if (auto* h = std::get_if<proto::HashResponse>(&m)) {
      auto it = hashes_.find(h->request_id);
      if (it != hashes_.end() && !it->second->done) {
        it->second->done = true;
        it->second->response = std::move(*h);
      }
    } else if (std::holds_alternative<proto::Heartbeat>(m) || std::holds_alternative<proto::Stats>(m)) {
      // Liveness only. Not answered from this thread: a reader blocked behind
      // a full send buffer would stop reading the acks that drain it.
    } else {
      fail = true;
      fail_reason = "unexpected message type " + std::to_string(int(proto::TypeOf(m))) + " from the master target";
    }
    if (fail) {
      conn_failed_ = true;
      last_error_ = fail_reason;
    }
  }
  for (auto& [v, seq] : floors) {
    if (seq > v->spool().durable_seq()) v->spool().SetFloor(seq);
    (void)v->spool().Release(seq);
  }
  for (auto& [v, seq] : release) {
    Status s = v->spool().Release(seq);
    if (!s.ok()) log->warn("{} spool release: {}", log::Where{v->key(), ch.peer(), seq}, s.ToString());
  }
  if (fail) {
    log->error("tenant={} link={} peer={}: {}", opt_.tenant, opt_.index, ch.peer(), fail_reason);
    ch.Close();
  }
  cv_.notify_all();
}

Result<uint64_t> MtLink::WaitOpened(Volume* v, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> l(mu_);
  auto it = volumes_.find(v);
  if (it == volumes_.end()) return Status::NotFound("volume not on this link");
  LinkVolume* lv = it->second.get();
  // Down after a failed attempt: do not hold the agent's open for a master
  // target that is known to be unreachable.
  if (!connected_.load() && !last_error_.empty() && !lv->opened)
    return Status::Unavailable("master target not reachable: " + last_error_);
  cv_.notify_all();
  bool ok = cv_.wait_for(l, timeout, [&] { return stop_.load() || lv->opened || !lv->open_error.ok(); });
  if (!lv->open_error.ok()) return lv->open_error;
  if (!ok || !lv->opened) return Status::Unavailable("master target not reachable");
  return lv->mt_open_durable;
}

Result<proto::HashResponse> MtLink::Hash(Volume* v, const proto::HashRequest& req, std::chrono::milliseconds timeout) {
  std::shared_ptr<FrameChannel> ch;
  PendingHash pending;
  uint64_t id;
  proto::HashRequest fwd = req;
  {
    std::unique_lock<std::mutex> l(mu_);
    auto it = volumes_.find(v);
    if (it == volumes_.end()) return Status::NotFound("volume not on this link");
    if (!connected_.load() && !last_error_.empty())
      return Status::Unavailable("master target unavailable: " + last_error_);
    if (!cv_.wait_for(l, timeout, [&] { return stop_.load() || it->second->opened; }))
      return Status::Unavailable("master target unavailable");
    if (stop_.load() || !channel_) return Status::Unavailable("master target unavailable");
    ch = channel_;
    id = next_request_id_++;
    fwd.volume_id = it->second->mt_id;
    fwd.request_id = id;
    hashes_[id] = &pending;
  }
  Status s = ch->Send(fwd);
  std::unique_lock<std::mutex> l(mu_);
  if (s.ok()) cv_.wait_for(l, timeout, [&] { return pending.done || stop_.load(); });
  hashes_.erase(id);
  if (!s.ok()) return s;
  if (!pending.done) return Status::Unavailable("master target did not answer the hash request in time");
  if (!pending.status.ok()) return pending.status;
  return std::move(pending.response);
}

}  // namespace cdp::ps

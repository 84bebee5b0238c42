#include "agent/sender.h"

#include <algorithm>
#include <vector>

#include "common/hash.h"
#include "common/log.h"

namespace cdp::agent {

using namespace std::chrono_literals;

namespace {

repl::SenderOptions LinkOptions(const SenderOptions& o) {
  repl::SenderOptions l;
  l.clock = o.clock;
  l.log_name = "agent";
  l.peer_name = "process server";
  l.label = "tenant=" + o.tenant;
  l.host = o.ps.host;
  l.port = o.ps.port;
  l.role = proto::Role::kAgent;
  l.tenant = o.tenant;
  l.secret = o.secret;
  l.client_id = o.client_id;
  l.frame_bytes = o.batch_bytes;
  l.frame_records = o.batch_records;
  l.linger_ms = o.linger_ms;
  l.max_inflight = o.max_inflight;
  l.workers = 1;
  l.connect_timeout_ms = o.connect_timeout_ms;
  l.backoff_min_ms = o.backoff_min_ms;
  l.backoff_max_ms = o.backoff_max_ms;
  l.busy_hold_ms = o.busy_backoff_ms;
  l.heartbeat_ms = o.heartbeat_ms;
  l.dead_peer_ms = o.dead_peer_ms;
  if (o.tls != nullptr) l.wrap = TlsWrapper(o.tls, TlsSide::kClient, std::chrono::milliseconds(o.connect_timeout_ms));
  return l;
}

const SenderOptions& WithClock(SenderOptions& o) {
  if (o.clock == nullptr) o.clock = SystemClock::Get();
  return o;
}

}  // namespace

Sender::Sender(CaptureDevice* device, SenderOptions opts)
    : dev_(device), opts_(std::move(opts)), link_(LinkOptions(WithClock(opts_))) {
  stream_ = link_.AddStream(this);
}

// A stopped sender no longer touches the device (Stop() removed the queue's
// hook): the device may be gone by now.
Sender::~Sender() { Stop(); }

void Sender::Start() {
  if (resync_.joinable()) return;
  stop_ = false;
  dev_->queue().SetOnAppend([this] { link_.Notify(); });
  link_.Start();
  resync_ = std::thread([this] { ResyncLoop(); });
}

void Sender::Stop() {
  if (!resync_.joinable()) return;  // idempotent; touches nothing once stopped
  {
    std::lock_guard lk(stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  link_.Stop();  // fails a pending hash request
  resync_.join();
  dev_->queue().SetOnAppend({});
  Checkpoint(true);
}

SenderStats Sender::Stats() const {
  const repl::LinkStats ls = link_.Stats();
  CaptureQueue& q = dev_->queue();
  std::vector<QueuedRecord> oldest;
  const bool pending = q.Peek(q.acked_seq() + 1, 1, 1, &oldest);
  std::lock_guard lk(mu_);
  SenderStats s = st_;
  s.connected = ls.connected;
  s.connects = ls.connects;
  s.disconnects = ls.disconnects;
  s.busy_nacks = ls.busy_nacks;
  s.gap_nacks = ls.gap_nacks;
  if (!ls.last_error.empty()) s.last_error = ls.last_error;
  s.acked_seq = q.acked_seq();
  s.rpo_lag_us = 0;
  if (pending) {
    const uint64_t now = opts_.clock->WallMicros();
    s.rpo_lag_us = now > oldest[0].timestamp_us ? now - oldest[0].timestamp_us : 0;
  }
  s.resync_remaining = dev_->bitmap().ResyncCount();
  if (s.resync_remaining > 0 && resync_pass_done_ > 0) {
    double elapsed = double(opts_.clock->NowMicros() - resync_pass_start_us_) / 1e6;
    s.resync_eta_seconds = elapsed / double(resync_pass_done_) * double(s.resync_remaining);
  } else {
    s.resync_eta_seconds = 0;
  }
  return s;
}

// ---- RecordSource over the capture queue ----

proto::VolumeOpen Sender::OpenMessage() {
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
  return vo;
}

Result<uint64_t> Sender::Resume(uint64_t durable, repl::ResumeCause cause) {
  CaptureQueue& q = dev_->queue();
  bool first_contact = false;
  {
    std::lock_guard lk(mu_);
    first_contact = cause == repl::ResumeCause::kOpen && !contacted_;
    contacted_ = true;
  }
  auto renumber = [this](uint64_t old_acked, uint64_t new_acked) { dev_->bitmap().Renumber(old_acked, new_acked); };
  if (!q.Resume(durable, renumber) && !first_contact) {
    // Outside our window. On the first contact of this process that is normal
    // (our numbers were provisional); later it means the server's history and
    // ours disagree: everything is compared again.
    log::Get("agent")->error("{} process server resumes at {} outside our window: full resync",
                             log::Where{dev_->volume(), opts_.ps.host, durable}, durable);
    dev_->bitmap().MarkAllCompare();
    std::lock_guard lk(mu_);
    ++st_.history_lost;
  }
  dev_->bitmap().SetAcked(q.acked_seq());
  return q.acked_seq() + 1;
}

Status Sender::Read(uint64_t from, uint64_t max_bytes, size_t max_records, std::vector<proto::Record>* out) {
  std::vector<QueuedRecord> recs;
  if (!dev_->queue().Peek(from, max_bytes, max_records, &recs)) return Status::OK();
  out->reserve(recs.size());
  uint64_t reread = 0;
  for (auto& r : recs) {
    proto::Record pr;
    pr.seq = r.seq;
    pr.offset = r.offset;
    pr.length = r.length;
    pr.kind = r.kind;
    pr.timestamp_us = r.timestamp_us;
    if (r.kind == proto::RecordKind::kData && !r.has_data) {
      // Metadata mode: the current content of the range.
      pr.data.resize(r.length);
      CDP_RETURN_IF_ERROR(dev_->ReadBacking(r.offset, r.length, pr.data.data()));
      reread += r.length;
    } else if (r.data) {
      pr.data = *r.data;
    }
    out->push_back(std::move(pr));
  }
  std::lock_guard lk(mu_);
  st_.reread_bytes += reread;
  return Status::OK();
}

void Sender::Acked(uint64_t durable) {
  dev_->queue().Ack(durable);
  dev_->bitmap().SetAcked(dev_->queue().acked_seq());
}

void Sender::Shipped(const proto::WriteBatch& batch, uint64_t wire_bytes) {
  (void)wire_bytes;
  uint64_t data_bytes = 0;
  for (const auto& r : batch.records) data_bytes += r.data.size();
  std::lock_guard lk(mu_);
  ++st_.batches_sent;
  st_.records_sent += batch.records.size();
  st_.bytes_sent += data_bytes;
}

// ---- Resync and checkpoints ----

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

void Sender::ResyncLoop() {
  while (!stop_) {
    Checkpoint(false);
    Result<bool> progressed = ResyncStep();
    if (!progressed.ok() && !stop_) {
      log::Get("agent")->warn("{} resync paused {} ms: {}", log::Where{dev_->volume(), opts_.ps.host, 0},
                              opts_.hash_retry_ms, progressed.status().ToString());
      std::lock_guard lk(mu_);
      st_.last_error = progressed.status().ToString();
      resync_pause_until_us_ = opts_.clock->NowMicros() + opts_.hash_retry_ms * 1000;
    }
    if (!progressed.ok() || !*progressed) {
      std::unique_lock lk(stop_mu_);
      stop_cv_.wait_for(lk, 50ms, [&] { return stop_.load(); });
    }
  }
}

Result<bool> Sender::ResyncStep() {
  DirtyBitmap& bm = dev_->bitmap();
  bool progressed = false;
  // 1. Regions known to differ wait for room in the queue.
  while (!to_ship_.empty()) {
    uint64_t r = to_ship_.front();
    CDP_ASSIGN_OR_RETURN(uint64_t seq, dev_->ShipRegion(r));
    if (seq == 0) return progressed;  // no room: after acknowledgements
    to_ship_.pop_front();
    progressed = true;
    std::lock_guard lk(mu_);
    ++st_.resync_shipped;
    ++resync_pass_done_;
  }
  // 2. Start the next comparison (only in data mode: records must fit).
  if (bm.ResyncCount() == 0) {
    std::lock_guard lk(mu_);
    st_.resync_total = 0;
    resync_pass_done_ = 0;
    return progressed;
  }
  if (dev_->queue().mode() != CaptureMode::kData) return progressed;
  if (opts_.clock->NowMicros() < resync_pause_until_us_) return progressed;
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
  if (!next) return progressed;
  const uint64_t first = *next;
  if (bm.ResyncState(first) == DirtyBitmap::Resync::kShip) {
    to_ship_.push_back(first);
    bm.SetCursor(first + 1);
    return true;
  }
  const uint32_t count = uint32_t(std::min<uint64_t>(opts_.hash_batch, bm.region_count() - first));
  proto::HashRequest hr;
  hr.request_id = next_request_id_++;
  hr.region_size = bm.region_size();
  hr.first_region = first;
  hr.count = count;
  // 3. Compare with the replica as the master target has it.
  auto resp = link_.Hash(stream_, hr, std::chrono::milliseconds(opts_.hash_timeout_ms));
  if (!resp.ok()) {
    // The process server could not answer (master target unreachable) or the
    // connection is down: pause the resync; shipping goes on.
    if (stop_) return false;
    return resp.status().WithContext("hash request");
  }
  if (resp->first_region != first || resp->hashes.size() != count || resp->region_size != bm.region_size()) {
    return Status::Corruption("hash response does not match the request");
  }
  uint64_t compared = 0, equal = 0;
  for (uint32_t i = 0; i < count; ++i) {
    uint64_t r = first + i;
    if (bm.ResyncState(r) != DirtyBitmap::Resync::kCompare) continue;
    CDP_ASSIGN_OR_RETURN(proto::Hash128 local, dev_->HashRegion(r));
    ++compared;
    if (local == resp->hashes[i]) {
      bm.ResyncDone(r, 0);
      ++equal;
    } else {
      to_ship_.push_back(r);
    }
  }
  bm.SetCursor(first + count);
  std::lock_guard lk(mu_);
  st_.resync_compared += compared;
  st_.resync_equal += equal;
  resync_pass_done_ += equal;
  return true;
}

}  // namespace cdp::agent

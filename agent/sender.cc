// SPDX-License-Identifier: Apache-2.0
#include "agent/sender.h"

#include <algorithm>
#include <vector>

#include "common/base/log.h"
#include "common/wire/hash.h"

namespace cdp::agent {

using namespace std::chrono_literals;

repl::LinkOptions AgentLinkDefaults() {
  repl::LinkOptions l;
  l.peer = HostPort{"127.0.0.1", 7400};
  l.client_id = "agent";
  l.frame_bytes = 4u << 20;
  l.linger_ms = 2;
  l.max_inflight = 4;
  l.heartbeat_ms = 5'000;
  return l;
}

namespace {

repl::SenderOptions ReplOptions(const SenderOptions& o) {
  repl::SenderOptions l;
  l.link = o.link;
  l.clock = o.clock;
  l.log_name = "agent";
  l.peer_name = "process server";
  l.label = "tenant=" + o.link.tenant;
  l.role = proto::Role::kAgent;
  l.on_peer_request = o.on_peer_request;
  if (o.tls != nullptr) l.wrap = TlsWrapper(o.tls, TlsSide::kClient, std::chrono::milliseconds(o.link.connect_timeout_ms));
  return l;
}

const SenderOptions& WithClock(SenderOptions& o) {
  if (o.clock == nullptr) o.clock = SystemClock::Get();
  return o;
}

}  // namespace

std::unique_ptr<repl::ReplicationSender> NewPsLink(SenderOptions opts) {
  return std::make_unique<repl::ReplicationSender>(ReplOptions(WithClock(opts)));
}

// Seals one record of a sealed volume (common/crypto/seal.h) in place: data becomes
// kSealed (the stored blocks, then their MACs), zero and trim kSealedZero (the
// MACs of the zero blocks); flushes and tags stay as they are.
Status SealRecord(const seal::BlockSealer& sealer, proto::Record* r) {
  if (r->kind == proto::RecordKind::kData) {
    Bytes macs(seal::MacBytes(r->length));
    if (Status s = sealer.Seal(r->offset, r->data, macs.data()); !s.ok())
      return s.WithContext("record seq " + std::to_string(r->seq) + " of a sealed volume");
    r->data.insert(r->data.end(), macs.begin(), macs.end());
    r->kind = proto::RecordKind::kSealed;
  } else if (r->kind == proto::RecordKind::kZero || r->kind == proto::RecordKind::kTrim) {
    r->data.resize(seal::MacBytes(r->length));
    if (Status s = sealer.ZeroMacs(r->offset, r->length, r->data.data()); !s.ok())
      return s.WithContext("record seq " + std::to_string(r->seq) + " of a sealed volume");
    r->kind = proto::RecordKind::kSealedZero;
  }
  return Status::OK();
}

std::array<uint8_t, 16> VolumeUuid(const std::string& name) {
  proto::Hash128 id = Xxh3_128(name.data(), name.size());
  std::array<uint8_t, 16> u{};
  for (int i = 0; i < 8; ++i) {
    u[i] = uint8_t(id.low >> (8 * i));
    u[8 + i] = uint8_t(id.high >> (8 * i));
  }
  return u;
}

Sender::Sender(CaptureDevice* device, SenderOptions opts, repl::ReplicationSender* shared, ResyncDriver* driver)
    : dev_(device),
      opts_(std::move(opts)),
      own_link_(shared == nullptr ? std::make_unique<repl::ReplicationSender>(ReplOptions(WithClock(opts_))) : nullptr),
      link_(shared == nullptr ? own_link_.get() : shared),
      driver_(driver) {
  WithClock(opts_);
  generation_.store(opts_.generation);
  stream_ = link_->AddStream(this);
  opts_.resync.clock = opts_.clock;
  resync_engine_ =
      std::make_unique<Resync>(dev_, opts_.resync, [this](const proto::HashRequest& r, Resync::HashCallback done) {
        if (driver_ == nullptr) return link_->HashAsync(stream_, r, std::move(done));
        link_->HashAsync(stream_, r, [d = driver_, done = std::move(done)](Result<proto::HashResponse> resp) {
          done(std::move(resp));
          d->Wake();
        });
      });
}

// A stopped sender no longer touches the device (Stop() removed the queue's
// hook): the device may be gone by now.
Sender::~Sender() { Stop(); }

void Sender::Start() {
  if (started_) return;
  started_ = true;
  stop_ = false;
  dev_->queue().SetOnAppend([this] { link_->Notify(); });
  if (own_link_) own_link_->Start();
  if (driver_ == nullptr) resync_ = std::thread([this] { ResyncLoop(); });
}

void Sender::Stop() {
  if (!started_) return;  // idempotent; touches nothing once stopped
  started_ = false;
  {
    std::lock_guard lk(stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  // Fails the pending hash requests.
  if (own_link_) {
    own_link_->Stop();
  } else {
    link_->RemoveStream(stream_);
  }
  if (resync_.joinable()) resync_.join();
  resync_engine_->Abort();
  dev_->queue().SetOnAppend({});
  Checkpoint(true);
}

void Sender::CallAsync(proto::Message request, repl::ReplicationSender::CallCallback done,
                       std::shared_ptr<repl::CallBytes> bytes) {
  link_->CallAsync(std::move(request), std::move(done), std::move(bytes));
}

SenderStats Sender::Stats() const {
  const repl::LinkStats ls = link_->Stats();
  CaptureQueue& q = dev_->queue();
  std::vector<QueuedRecord> oldest;
  const bool pending = q.Peek(q.acked_seq() + 1, 1, 1, &oldest);
  std::lock_guard lk(mu_);
  SenderStats s = st_;
  s.link = ls;
  s.acked_seq = q.acked_seq();
  s.confirmed = contacted_;
  s.rpo_lag_us = 0;
  if (pending) {
    const uint64_t now = opts_.clock->WallMicros();
    s.rpo_lag_us = now > oldest[0].timestamp_us ? now - oldest[0].timestamp_us : 0;
  }
  s.resync_remaining = dev_->bitmap().ResyncCount();
  s.resync = resync_engine_->Stats();
  if (!s.resync.last_error.empty() && s.link.last_error.empty()) s.link.last_error = s.resync.last_error;
  return s;
}

// ---- RecordSource over the capture queue ----

proto::VolumeOpen Sender::OpenMessage() {
  proto::VolumeOpen vo;
  vo.name = dev_->volume();
  vo.size = dev_->size();
  vo.block_size = dev_->preferred_block_size();
  vo.uuid = VolumeUuid(vo.name);
  vo.generation = generation_.load();
  vo.sealed = dev_->sealer() != nullptr;
  vo.acked_seq = dev_->bitmap().KnownAcked();
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
  const bool in_window = q.Resume(durable, renumber);
  // Below what it acknowledged to an earlier process of ours (the bitmap's
  // persisted sequence): the server lost records whose regions may be clean.
  const bool lost_since_restart = dev_->bitmap().Resumed(durable);
  if ((!in_window && !first_contact) || lost_since_restart) {
    // Outside our window. On the first contact of this process that is normal
    // (our numbers were provisional); later it means the server's history and
    // ours disagree: everything is compared again.
    log::Get("agent")->error("{} process server resumes at {} {}: full resync",
                             log::Where{dev_->volume(), opts_.link.peer.host, durable}, durable,
                             lost_since_restart ? "below what it acknowledged before this agent started"
                                                : "outside our window");
    dev_->bitmap().MarkAllCompare();
    std::lock_guard lk(mu_);
    ++st_.history_lost;
  }
  dev_->bitmap().SetAcked(q.acked_seq());
  // Records up to here are at the process server, maybe still in its spool:
  // every later compare asks the replica for at least this sequence.
  std::lock_guard lk(mu_);
  floor_ = q.acked_seq();
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
    } else if (r.data && dev_->sealer() != nullptr) {
      pr.data = *r.data;  // sealed in a copy: the queue's buffer is shared
    } else {
      pr.shared = r.data;  // framed where it lies (proto::Record::shared)
    }
    // Tenant-side encryption: nothing of the block leaves this host in the clear.
    if (const seal::BlockSealer* s = dev_->sealer()) CDP_RETURN_IF_ERROR(SealRecord(*s, &pr));
    out->push_back(std::move(pr));
  }
  // The queue cut the batch at the work cap by lengths; sealed records also
  // carry their MACs, which the cap counts (proto::BatchWork): a full batch
  // of zero ranges would be refused by the process server. The records cut
  // off are read again next time.
  if (dev_->sealer() != nullptr) proto::CutToWorkCap(out);
  std::lock_guard lk(mu_);
  st_.reread_bytes += reread;
  return Status::OK();
}

void Sender::Acked(uint64_t durable) {
  dev_->queue().Ack(durable);
  dev_->bitmap().SetAcked(dev_->queue().acked_seq());
  // The resync may be holding records back for fill_target: they may go now,
  // not at the end of its wait for hash answers.
  if (resync_engine_->Kick() && driver_ != nullptr) driver_->Wake();
}

void Sender::Shipped(const proto::WriteBatch& batch, uint64_t wire_bytes) {
  (void)wire_bytes;
  uint64_t data_bytes = 0;
  for (const auto& r : batch.records) data_bytes += r.bytes().size();
  std::lock_guard lk(mu_);
  ++st_.batches_sent;
  st_.records_sent += batch.records.size();
  st_.bytes_sent += data_bytes;
}

void Sender::Stalled(const Status& why) {
  if (!why.ok()) return;
  std::lock_guard lk(mu_);
  st_.fenced.clear();
}

Status Sender::StartGeneration(uint64_t gen, bool equal) {
  {
    auto lk = dev_->queue().Lock();  // no write is captured meanwhile
    dev_->queue().ResetLocked();
    dev_->bitmap().ForgetAll();
    if (!equal) dev_->bitmap().MarkAllCompare();
  }
  CDP_RETURN_IF_ERROR(dev_->bitmap().Checkpoint().status());
  {
    std::lock_guard lk(mu_);
    contacted_ = false;
    floor_ = 0;
    st_.fenced.clear();
  }
  generation_.store(gen);
  log::Get("agent")->warn("{} generation {}: {}", log::Where{dev_->volume(), opts_.link.peer.host, 0}, gen,
                          equal ? "the source equals the replica; replication resumes without a resync"
                                : "every region is compared with the replica");
  // The stream is fenced under the old generation: a new connection opens the new one.
  link_->Reconnect();
  return Status::OK();
}

void Sender::Fenced(const std::string& message) {
  log::Get("agent")->error("{} fenced: {}", log::Where{dev_->volume(), opts_.link.peer.host, 0}, message);
  std::lock_guard lk(mu_);
  st_.fenced = message;
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

bool Sender::ResyncTick(bool* idle) {
  Checkpoint(false);
  dev_->TickDetector();  // windows close on time too, not only at the next write
  {
    std::lock_guard lk(mu_);
    resync_engine_->SetFloor(floor_);
  }
  // Hash requests need the volume open on the current connection.
  const bool open = link_->WaitOpened(stream_, 0ms).ok();
  Result<bool> progressed = open ? resync_engine_->Step() : Result<bool>(false);
  if (!progressed.ok() && !stop_) {
    log::Get("agent")->warn("{} resync: {}", log::Where{dev_->volume(), opts_.link.peer.host, 0},
                            resync_engine_->Stats().last_error);
  }
  *idle = resync_engine_->Idle();
  return progressed.ok() && *progressed;
}

void Sender::ResyncLoop() {
  while (!stop_) {
    bool idle = false;
    if (ResyncTick(&idle)) continue;
    if (idle) {
      std::unique_lock lk(stop_mu_);
      stop_cv_.wait_for(lk, 50ms, [&] { return stop_.load(); });
    } else {
      resync_engine_->Wait(10ms);
    }
  }
}

// ---- ResyncDriver ----

void ResyncDriver::Start() {
  if (!running_.empty()) return;
  {
    std::lock_guard lk(mu_);
    stop_ = false;
  }
  const size_t n = std::min(threads_, std::max<size_t>(1, senders_.size()));
  for (size_t t = 0; t < n; ++t) running_.emplace_back([this, t, n] { Loop(t, n); });
}

void ResyncDriver::Stop() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : running_) t.join();
  running_.clear();
}

void ResyncDriver::Wake() {
  {
    std::lock_guard lk(mu_);
    ++wakes_;
  }
  cv_.notify_all();
}

void ResyncDriver::Loop(size_t t, size_t n) {
  for (;;) {
    uint64_t seen = 0;
    {
      std::lock_guard lk(mu_);
      if (stop_) return;
      seen = wakes_;
    }
    bool progressed = false;
    bool all_idle = true;
    for (size_t i = t; i < senders_.size(); i += n) {
      bool idle = false;
      progressed = senders_[i]->ResyncTick(&idle) || progressed;
      all_idle = all_idle && idle;
    }
    if (progressed) continue;
    std::unique_lock lk(mu_);
    cv_.wait_for(lk, all_idle ? 50ms : 10ms, [&] { return stop_ || wakes_ != seen; });
  }
}

}  // namespace cdp::agent

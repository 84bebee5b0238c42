// SPDX-License-Identifier: Apache-2.0
#include "process-server/mt_link.h"

#include "common/base/log.h"
#include "common/net/stream_filters.h"

namespace cdp::ps {

class MtLink::SpoolSource final : public repl::RecordSource {
 public:
  SpoolSource(SpooledVolume* v, size_t copy) : v_(v), copy_(copy) {}

  proto::VolumeOpen OpenMessage() override { return v_->open_message(); }
  proto::Codec codec() const override { return v_->codec(); }
  int level() const override { return v_->level(); }
  int max_inflight() const override { return v_->max_inflight(); }

  Result<uint64_t> Resume(uint64_t durable, repl::ResumeCause cause) override {
    Spool& spool = v_->spool();
    if (cause == repl::ResumeCause::kOpen) {
      // The master target may be ahead of an empty spool (the spool was
      // lost): continue after it. Ahead of records the spool still holds, it
      // claims what it never received: releasing them would lose them.
      if (v_->beyond(copy_)) {
        // Records spooled since may reuse numbers the MT holds: resuming after
        // `durable` would skip them (agent_session.cc learns the floor first).
        Status again = Status::Corruption(
            "master target holds sequence numbers this spool may have given to other records (it stood beyond the "
            "spool while records were unshipped, or answered first after a new spool numbered records): records "
            "spooled since may reuse its sequence numbers: refused until the agent's open learns every master "
            "target's position, or cdpctl reprotect");
        return again.MarkDataLoss();
      }
      if (durable > spool.durable_seq()) {
        if (spool.stats().backlog_records > 0) {
          KeepRefused(durable);
          Status beyond = Status::Corruption("master target claims sequence " + std::to_string(durable) +
                                             " beyond the spool's last " + std::to_string(spool.durable_seq()) +
                                             " while records are unshipped: nothing released");
          return beyond.MarkDataLoss();
        }
        spool.SetFloor(durable);
      } else if (v_->unanchored(copy_) && durable > spool.stats().released_seq) {
        // The first answer since the spool was created, and the MT holds
        // sequences this spool has numbered records with: records numbered
        // before that MT answered (a spool lost, a volume moved here while
        // its MT was down). Resuming after `durable` would skip them.
        const SpoolStats st = spool.stats();
        KeepRefused(durable);
        Status reused = Status::Corruption(
            "master target stands at seq " + std::to_string(durable) + ", but this spool numbered records " +
            std::to_string(st.released_seq + 1) + ".." + std::to_string(spool.durable_seq()) +
            " before that master target answered (the spool is new: it was lost, or the volume moved to this "
            "process server): they may reuse its sequence numbers; refused until cdpctl reprotect");
        return reused.MarkDataLoss();
      }
      CDP_RETURN_IF_ERROR(v_->SetAnchored(copy_));
      // This copy's cursor is now the MT's word; the spool releases what
      // every copy has (SpooledVolume).
      if (!v_->SetCopyOpened(copy_, durable)) {
        SpoolStats st = spool.stats();
        return Status::OutOfRange("master target is at seq " + std::to_string(durable) + " but the spool starts at " +
                                  std::to_string(st.released_seq + 1) + ": resync needed");
      }
    } else {
      v_->SetCopyAcked(copy_, durable);
    }
    return durable + 1;
  }

  Status Read(uint64_t from, uint64_t max_bytes, size_t max_records, std::vector<proto::Record>* out) override {
    (void)max_records;  // a spool read is bounded by bytes
    CDP_ASSIGN_OR_RETURN(std::vector<proto::Record> recs, v_->spool().Read(from, max_bytes));
    proto::CutToWorkCap(&recs);
    *out = std::move(recs);
    return Status::OK();
  }

  void Acked(uint64_t durable) override { v_->SetCopyAcked(copy_, durable); }

  void Stalled(const Status& why) override {
    v_->SetStalled(copy_, why.ok() ? "" : why.message(), why.data_loss());
    if (why.ok()) v_->SetFenced(copy_, "");
  }

  void Fenced(const std::string& message) override {
    log::Get("ps.link")->error("{} fenced by the master target (copy {}): {}", log::Where{v_->key(), "", 0}, copy_,
                               message);
    v_->SetFenced(copy_, message);
  }

  void Shipped(const proto::WriteBatch& batch, uint64_t wire_bytes) override {
    uint64_t raw = 0;
    for (const auto& r : batch.records) raw += kRecordHeaderSize + r.data.size();
    VolumeCounters& c = v_->counters();
    c.raw_out.fetch_add(raw);
    c.wire_out.fetch_add(wire_bytes);
    c.frames_out.fetch_add(1);
  }

  void Rewound(uint64_t frames) override { v_->counters().resent_frames.fetch_add(frames); }

 private:
  // The copy stays refused from now on (CopyState::beyond).
  void KeepRefused(uint64_t durable) {
    if (Status kept = v_->SetBeyond(copy_); !kept.ok())
      log::Get("ps.link")->error("{} the refusal of copy {} is not persisted (a restart would forget it): {}",
                                 log::Where{v_->key(), "", durable}, copy_, kept.ToString());
  }

  SpooledVolume* const v_;
  const size_t copy_;
};

namespace {

repl::SenderOptions ReplOptions(const MtLinkOptions& o) {
  repl::SenderOptions l;
  l.link = o.link;
  l.clock = o.clock;
  l.log_name = "ps.link";
  l.peer_name = "master target";
  l.label = "tenant=" + o.link.tenant + " link=" + std::to_string(o.index);
  if (o.copy > 0) l.label += " copy=" + std::to_string(o.copy) + " mt=" + o.link.peer.ToString();
  if (o.throttle != nullptr) {
    Throttle* t = o.throttle;
    l.wrap = [t](std::unique_ptr<ByteStream> s) -> Result<std::unique_ptr<ByteStream>> {
      return std::unique_ptr<ByteStream>(std::make_unique<ThrottleFilter>(std::move(s), t));
    };
  }
  // TLS over the throttle: the throttle charges the bytes on the wire.
  if (o.tls != nullptr)
    l.wrap = TlsWrapper(o.tls, TlsSide::kClient, std::chrono::milliseconds(o.link.connect_timeout_ms), l.wrap);
  l.role = proto::Role::kProcessServer;
  l.on_peer_request = o.on_peer_request;
  return l;
}

}  // namespace

MtLink::MtLink(MtLinkOptions options) : opt_(std::move(options)), sender_(ReplOptions(opt_)) {}

MtLink::~MtLink() { Stop(); }

void MtLink::Start() { sender_.Start(); }

void MtLink::Stop() { sender_.Stop(); }

void MtLink::AddVolume(SpooledVolume* v) {
  std::lock_guard<std::mutex> l(mu_);
  if (volumes_.count(v)) return;
  auto src = std::make_unique<SpoolSource>(v, opt_.copy);
  auto id = sender_.AddStream(src.get());
  volumes_[v] = {std::move(src), id};
}

void MtLink::RemoveVolume(SpooledVolume* v) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = volumes_.find(v);
  if (it == volumes_.end()) return;
  sender_.RemoveStream(it->second.second);
  removed_.push_back(std::move(it->second.first));
  volumes_.erase(it);
}

Result<repl::ReplicationSender::StreamId> MtLink::StreamOf(SpooledVolume* v) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = volumes_.find(v);
  if (it == volumes_.end()) return Status::NotFound("volume not on this link");
  return it->second.second;
}

Result<uint64_t> MtLink::WaitOpened(SpooledVolume* v, std::chrono::milliseconds timeout) {
  CDP_ASSIGN_OR_RETURN(auto id, StreamOf(v));
  return sender_.WaitOpened(id, timeout);
}

void MtLink::HashAsync(SpooledVolume* v, const proto::HashRequest& req, repl::ReplicationSender::HashCallback done) {
  auto id = StreamOf(v);
  if (!id.ok()) return done(id.status());
  sender_.HashAsync(*id, req, std::move(done));
}

}  // namespace cdp::ps

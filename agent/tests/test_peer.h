// SPDX-License-Identifier: Apache-2.0
// TEST HARNESS ONLY (not shipped): a minimal process-server *peer* for the
// agent's tests, built on the real FrameChannel + ServerHandshake. It accepts
// agent connections on 127.0.0.1 (ephemeral port), answers VolumeOpen with its
// durable sequence, applies every WriteBatch to an in-memory replica image (so
// a test can compare it with the source), acknowledges it, and answers
// HashRequest with the block digests of that image. Each volume name gets its
// own image (of the size given to the constructor). It is *not* the process
// server (no spool, no durability): it stands in for one only where the tests
// need to control the pace — Pause() stops it from reading, so the agent's
// queue backs up exactly as behind a slow process server.
//
// Thread safety: all public methods are thread-safe.
#pragma once

#include <atomic>

#include <boost/asio.hpp>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "common/net/listener.h"
#include "common/wire/block_digest.h"
#include "common/wire/channel.h"
#include "common/wire/hash.h"
#include "common/wire/protocol.h"

namespace cdp::agent::testing {

class TestPeer {
 public:
  TestPeer(std::string tenant, std::string secret, uint64_t volume_size)
      : tenant_(std::move(tenant)), secret_(std::move(secret)), volume_size_(volume_size) {
    Listener::Options lo;
    lo.name = "test-peer";
    lo.tcp = {"127.0.0.1", 0};
    lo.mode = Listener::Mode::kThreadPerConnection;
    listener_ = std::make_unique<Listener>(lo, ServeFrames([this](FrameChannel& ch) { Serve(ch); }));
    Status s = listener_->Start();
    if (!s.ok()) throw std::runtime_error("test peer: " + s.ToString());
    port_ = listener_->tcp_port();
  }
  ~TestPeer() {
    stop_ = true;
    Resume();
    listener_->Stop();  // shuts every connection down and joins the Serve threads
  }

  uint16_t port() const { return port_; }
  // Connections accepted (agent sessions) and live now.
  ListenerStats listener_stats() const { return listener_->stats(); }
  void Pause() {
    std::lock_guard lk(mu_);
    paused_ = true;
  }
  void Resume() {
    std::lock_guard lk(mu_);
    paused_ = false;
    cv_.notify_all();
  }
  // Replaces the replica image of `vol` (before the agent connects).
  void SetImage(Bytes image, const std::string& vol = "vol") {
    std::lock_guard lk(mu_);
    Vol(vol).image = std::move(image);
  }
  Bytes Image(const std::string& vol = "vol") {
    std::lock_guard lk(mu_);
    return Vol(vol).image;
  }
  // A sealed volume's MACs as received (empty until the first sealed record).
  Bytes Macs(const std::string& vol = "vol") {
    std::lock_guard lk(mu_);
    return Vol(vol).macs;
  }
  uint64_t durable(const std::string& vol = "vol") {
    std::lock_guard lk(mu_);
    return Vol(vol).durable;
  }
  // Records received by kind, data records whose length is the region size
  // and whose offset is region-aligned (what a resync ships), tags by name.
  uint64_t count(proto::RecordKind k, const std::string& vol = "vol") {
    std::lock_guard lk(mu_);
    auto& v = Vol(vol);
    auto it = v.kinds.find(k);
    return it == v.kinds.end() ? 0 : it->second;
  }
  // (tag name, its sequence) in arrival order.
  std::vector<std::pair<std::string, uint64_t>> tags(const std::string& vol = "vol") {
    std::lock_guard lk(mu_);
    return Vol(vol).tags;
  }
  // Held: batches are acknowledged (durable) but not applied to the image,
  // and hash requests see the image as applied (kBehind below min_seq), as a
  // process server whose spool the master target has not applied yet.
  // Releasing applies what was held.
  void HoldApply(bool hold, const std::string& vol = "vol") {
    std::lock_guard lk(mu_);
    hold_apply_ = hold;
    if (hold) return;
    VolState& v = Vol(vol);
    for (const auto& r : v.held) Apply(v, r);
    v.held.clear();
    v.applied = v.durable;
    cv_.notify_all();
  }
  uint64_t behind_answers() const {
    std::lock_guard lk(mu_);
    return behind_answers_;
  }
  // The next `n` hash requests are answered Nack{kInternal} (master target down).
  void RefuseHashes(int n) {
    std::lock_guard lk(mu_);
    refuse_hashes_ = n;
  }
  uint64_t hash_requests() const {
    std::lock_guard lk(mu_);
    return hash_requests_;
  }
  // Failback (agent/failback.h): FailbackPlanRequest for `vol` is answered
  // with `plan` in pages of `page` extents, PullRequest with the blocks of
  // `provider` (the promoted image) whose digest differs. Until this is
  // called, both answer kNotFailingBack.
  void SetFailback(const std::string& vol, Bytes provider, std::vector<proto::BlockExtent> plan, size_t page) {
    std::lock_guard lk(mu_);
    Failback& f = failback_[vol];
    f.provider = std::move(provider);
    f.plan = std::move(plan);
    f.page = page;
  }
  // VolumeOpens below `gen` are refused as failed over (a fenced generation).
  void FenceBelow(uint64_t gen) {
    std::lock_guard lk(mu_);
    min_generation_ = gen;
  }
  uint64_t last_generation() const {
    std::lock_guard lk(mu_);
    return last_generation_;
  }
  // The next pull answer also carries a block that was not asked for.
  void CorruptNextPull() {
    std::lock_guard lk(mu_);
    corrupt_pull_ = true;
  }
  // Blocks sent in pull answers; digests received in pull requests.
  uint64_t pulled_blocks() const {
    std::lock_guard lk(mu_);
    return pulled_blocks_;
  }
  uint64_t digests_received() const {
    std::lock_guard lk(mu_);
    return digests_received_;
  }
  // Waits (bounded) until `pred(durable)` holds.
  template <typename Pred>
  bool WaitDurable(Pred pred, std::chrono::milliseconds timeout, const std::string& vol = "vol") {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, timeout, [&] { return pred(Vol(vol).durable); });
  }

 private:
  struct Failback {
    Bytes provider;
    std::vector<proto::BlockExtent> plan;
    size_t page = 1;
  };
  Status HandleFailback(FrameChannel& ch, const proto::Message& m) {
    std::unique_lock lk(mu_);
    if (auto* fp = std::get_if<proto::FailbackPlanRequest>(&m)) {
      proto::FailbackPlan out;
      out.request_id = fp->request_id;
      auto it = failback_.find(fp->volume);
      if (it == failback_.end()) {
        out.status = proto::FailbackStatus::kNotFailingBack;
      } else {
        const Failback& f = it->second;
        for (const proto::BlockExtent& e : f.plan) {
          if (e.first_block < fp->from_block) continue;
          if (out.extents.size() == f.page) {
            out.next_block = e.first_block;
            break;
          }
          out.extents.push_back(e);
        }
      }
      lk.unlock();
      return ch.Send(out);
    }
    const auto& pr = std::get<proto::PullRequest>(m);
    proto::PullResponse out;
    out.request_id = pr.request_id;
    auto it = failback_.find(pr.volume);
    if (it == failback_.end()) {
      out.status = proto::FailbackStatus::kNotFailingBack;
    } else {
      const Bytes& img = it->second.provider;
      size_t d = 0;
      digests_received_ += pr.digests.size();
      for (const proto::BlockExtent& e : pr.extents) {
        for (uint64_t b = e.first_block; b < e.first_block + e.count; ++b, ++d) {
          const uint8_t* p = img.data() + b * 4096;
          if (LeafDigest(p, 4096) == pr.digests[d]) continue;
          proto::Record r;
          r.seq = out.records.size() + 1;
          r.offset = b * 4096;
          r.length = 4096;
          r.kind = IsAllZero(p, 4096) ? proto::RecordKind::kZero : proto::RecordKind::kData;
          if (r.kind == proto::RecordKind::kData) r.data.assign(p, p + 4096);
          out.records.push_back(std::move(r));
          ++pulled_blocks_;
        }
      }
      if (corrupt_pull_) {
        corrupt_pull_ = false;
        proto::Record r;
        r.seq = out.records.size() + 1;
        r.offset = (pr.extents.back().first_block + pr.extents.back().count) * 4096;  // just past what was asked
        r.length = 4096;
        r.kind = proto::RecordKind::kZero;
        out.records.push_back(std::move(r));
      }
    }
    out.codec = proto::Codec::kZstd;
    lk.unlock();
    return ch.Send(out);
  }

  struct VolState {
    Bytes image;
    uint64_t durable = 0;
    uint64_t applied = 0;            // < durable while records are held
    std::vector<proto::Record> held;
    std::map<proto::RecordKind, uint64_t> kinds;
    std::vector<std::pair<std::string, uint64_t>> tags;
    Bytes macs;  // sealed volumes: kSealMacSize bytes per 4 KiB block, as the MT keeps them
  };
  static void Apply(VolState& v, const proto::Record& r) {  // mu_ held
    Bytes& img = v.image;
    switch (r.kind) {
      case proto::RecordKind::kData:
        std::copy(r.data.begin(), r.data.end(), img.begin() + long(r.offset));
        break;
      case proto::RecordKind::kZero:
      case proto::RecordKind::kTrim:
        std::fill(img.begin() + long(r.offset), img.begin() + long(r.offset + r.length), 0);
        break;
      case proto::RecordKind::kTag:
        v.tags.emplace_back(std::string(r.data.begin(), r.data.end()), r.seq);
        break;
      case proto::RecordKind::kFlush:
      case proto::RecordKind::kAnomaly:
        break;
      case proto::RecordKind::kSealed:
      case proto::RecordKind::kSealedZero: {
        const uint64_t mac_bytes = proto::SealMacBytes(r.length);
        if (r.kind == proto::RecordKind::kSealed) {
          std::copy(r.data.begin(), r.data.begin() + long(r.length), img.begin() + long(r.offset));
        } else {
          std::fill(img.begin() + long(r.offset), img.begin() + long(r.offset + r.length), 0);
        }
        if (v.macs.size() < proto::SealMacBytes(img.size())) v.macs.resize(proto::SealMacBytes(img.size()));
        std::copy(r.data.end() - long(mac_bytes), r.data.end(), v.macs.begin() + long(proto::SealMacBytes(r.offset)));
        break;
      }
    }
  }
  VolState& Vol(const std::string& name) {  // mu_ held
    auto it = vols_.find(name);
    if (it == vols_.end()) {
      it = vols_.emplace(name, VolState{}).first;
      it->second.image.assign(volume_size_, 0);
    }
    return it->second;
  }

  void Serve(FrameChannel& ch) {
    auto who = ServerHandshake(
        ch, [this](const std::string& t) -> std::optional<std::string> {
          if (t == tenant_) return secret_;
          return std::nullopt;
        },
        std::chrono::milliseconds(5000));
    if (!who.ok()) return;
    std::map<uint32_t, std::string> handles;  // volume_id -> volume, on this connection
    while (!stop_) {
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return !paused_ || stop_; });
      }
      auto m = ch.Receive(std::chrono::milliseconds(100));
      if (!m.ok()) {
        if (m.status().code() == Code::kBusy) continue;
        break;
      }
      Status s = Handle(ch, *m, &handles);
      if (!s.ok()) break;
    }
  }

  // Many volumes may be open on one connection (an agent's shared link).
  Status Handle(FrameChannel& ch, const proto::Message& m, std::map<uint32_t, std::string>* handles) {
    if (auto* vo = std::get_if<proto::VolumeOpen>(&m)) {
      std::lock_guard lk(mu_);
      last_generation_ = vo->generation;
      if (vo->generation < min_generation_)
        return ch.Send(proto::Nack{0, proto::NackReason::kWrongGeneration, 0, "failed over: test fence"});
      if (vo->size != Vol(vo->name).image.size())
        return ch.Send(proto::Nack{0, proto::NackReason::kBadRecord, 0, "size"});
      const uint32_t id = uint32_t(handles->size() + 1);
      (*handles)[id] = vo->name;
      return ch.Send(proto::VolumeOpenReply{id, Vol(vo->name).durable});
    }
    if (std::holds_alternative<proto::FailbackPlanRequest>(m) || std::holds_alternative<proto::PullRequest>(m))
      return HandleFailback(ch, m);
    if (handles->empty()) return Status::InvalidArgument("no volume open");
    uint32_t volume_id = 0;
    if (auto* wb = std::get_if<proto::WriteBatch>(&m)) volume_id = wb->volume_id;
    if (auto* hr = std::get_if<proto::HashRequest>(&m)) volume_id = hr->volume_id;
    const std::string* vol = nullptr;
    if (auto it = handles->find(volume_id); it != handles->end()) vol = &it->second;
    if (volume_id != 0 && vol == nullptr)
      return ch.Send(proto::Nack{volume_id, proto::NackReason::kUnknownVolume, 0, "volume not open"});
    if (auto* wb = std::get_if<proto::WriteBatch>(&m)) {
      std::unique_lock lk(mu_);
      VolState& v = Vol(*vol);
      Bytes& img = v.image;
      uint64_t& dur = v.durable;
      for (const auto& r : wb->records) {
        if (r.seq <= dur) continue;
        if (r.seq != dur + 1) {
          uint64_t e = dur + 1;
          lk.unlock();
          return ch.Send(proto::Nack{wb->volume_id, proto::NackReason::kGap, e, "gap"});
        }
        if (r.offset + r.length > img.size() && r.kind != proto::RecordKind::kTag) {
          return Status::InvalidArgument("record out of range");
        }
        ++v.kinds[r.kind];
        if (hold_apply_) {
          v.held.push_back(r);  // durable (acknowledged), not yet applied: a spool
        } else {
          Apply(v, r);
          v.applied = r.seq;
        }
        dur = r.seq;
      }
      uint64_t d = dur;
      cv_.notify_all();
      lk.unlock();
      return ch.Send(proto::Ack{wb->volume_id, d});
    }
    if (auto* hr = std::get_if<proto::HashRequest>(&m)) {
      {
        std::lock_guard lk(mu_);
        if (refuse_hashes_ > 0) {
          --refuse_hashes_;
          ++hash_requests_;
          return ch.Send(proto::Nack{hr->volume_id, proto::NackReason::kInternal, 0, "master target unavailable"});
        }
      }
      proto::HashResponse resp;
      resp.volume_id = hr->volume_id;
      resp.request_id = hr->request_id;
      resp.region_size = hr->region_size;
      resp.first_region = hr->first_region;
      std::lock_guard lk(mu_);
      ++hash_requests_;
      const Bytes& img = Vol(*vol).image;
      resp.seq = Vol(*vol).applied;
      if (hr->min_seq > resp.seq) {
        ++behind_answers_;
        resp.status = proto::HashStatus::kBehind;
        return ch.Send(resp);
      }
      DigestSource src;
      src.size = img.size();
      src.read = [&img](uint64_t off, size_t n, uint8_t* buf) {
        std::memcpy(buf, img.data() + off, n);
        return Status::OK();
      };
      DigestReader reader(std::move(src));
      auto units = reader.Units(hr->region_size, hr->first_region, hr->count);
      if (!units.ok()) {
        resp.status = proto::HashStatus::kFailed;
      } else {
        resp.hashes = std::move(*units);
      }
      return ch.Send(resp);
    }
    if (auto* hb = std::get_if<proto::Heartbeat>(&m)) return ch.Send(proto::Heartbeat{1, hb->sent_us});
    return Status::InvalidArgument("unexpected message");
  }

  std::string tenant_, secret_;
  std::unique_ptr<Listener> listener_;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool paused_ = false;
  uint64_t volume_size_;
  std::map<std::string, VolState> vols_;
  uint64_t hash_requests_ = 0;
  int refuse_hashes_ = 0;
  std::map<std::string, Failback> failback_;
  bool corrupt_pull_ = false;
  uint64_t min_generation_ = 0;
  uint64_t last_generation_ = 0;
  uint64_t pulled_blocks_ = 0;
  uint64_t digests_received_ = 0;
  bool hold_apply_ = false;
  uint64_t behind_answers_ = 0;
};

}  // namespace cdp::agent::testing

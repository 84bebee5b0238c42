// SPDX-License-Identifier: Apache-2.0
#include "agent/failback.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>

#include "common/base/clock.h"
#include "common/base/log.h"
#include "common/wire/block_digest.h"

namespace cdp::agent {

namespace {

using Millis = std::chrono::milliseconds;

// One PullRequest in flight: what was asked and the old content read for it.
struct Piece {
  std::vector<proto::BlockExtent> extents;
  std::vector<uint64_t> starts;  // index of each extent's first block in `old`
  Bytes old;                     // the blocks as read here, in extent order
  // Byte position in `old` of `block`, or -1 when not asked for.
  int64_t Position(uint64_t block, uint32_t bs) const {
    auto it = std::upper_bound(extents.begin(), extents.end(), block,
                               [](uint64_t b, const proto::BlockExtent& e) { return b < e.first_block; });
    if (it == extents.begin()) return -1;
    --it;
    if (block >= it->first_block + it->count) return -1;
    return int64_t((starts[size_t(it - extents.begin())] + (block - it->first_block)) * bs);
  }
};

class Pass {
 public:
  Pass(CaptureDevice& dev, BranchStore& branch, const FailbackOptions& o) : dev_(dev), branch_(branch), o_(o) {}

  Result<FailbackPassStats> Run() {
    const auto t0 = std::chrono::steady_clock::now();
    CDP_RETURN_IF_ERROR(Connect());
    CDP_ASSIGN_OR_RETURN(std::vector<proto::BlockExtent> plan, Plan());
    std::vector<proto::BlockExtent> local = LocalBlocks();
    st_.plan_blocks = proto::ExtentBlocks(plan).value_or(0);
    st_.local_blocks = proto::ExtentBlocks(local).value_or(0);
    plan.insert(plan.end(), local.begin(), local.end());
    std::vector<proto::BlockExtent> all = proto::MergeExtents(std::move(plan));
    st_.compared_blocks = proto::ExtentBlocks(all).value_or(0);
    CDP_RETURN_IF_ERROR(PullAll(all));
    st_.wire_bytes_in = ch_->bytes_received();
    st_.wire_bytes_out = ch_->bytes_sent();
    ch_->Close();
    st_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return st_;
  }

 private:
  uint32_t bs() const { return dev_.preferred_block_size(); }
  uint64_t blocks() const { return dev_.size() / bs(); }

  Status Connect() {
    const Millis timeout(o_.link.connect_timeout_ms);
    StreamWrapper wrap;
    if (o_.tls != nullptr) wrap = TlsWrapper(o_.tls, TlsSide::kClient, timeout);
    CDP_ASSIGN_OR_RETURN(ch_, cdp::Connect(o_.link.peer.host, o_.link.peer.port, timeout, {}, wrap));
    return ClientHandshake(*ch_, proto::Role::kAgent, o_.link.tenant, o_.link.client_id, o_.link.secret, timeout);
  }

  // The next failback answer (heartbeats from the PS are skipped).
  Result<proto::Message> Answer() {
    for (;;) {
      CDP_ASSIGN_OR_RETURN(proto::Message m, ch_->Receive(Millis(o_.answer_timeout_ms)));
      if (std::holds_alternative<proto::Heartbeat>(m) || std::holds_alternative<proto::Stats>(m)) continue;
      if (std::holds_alternative<proto::FailbackPlan>(m) || std::holds_alternative<proto::PullResponse>(m)) return m;
      return Status::Corruption("failback: unexpected message type " + std::to_string(int(proto::TypeOf(m))) +
                                " from the process server");
    }
  }

  static Status Refused(proto::FailbackStatus s, const std::string& volume) {
    if (s == proto::FailbackStatus::kNotFailingBack)
      return Status::InvalidArgument(volume + " is not failing back at the master target (cdpctl failback starts it)");
    return Status::Unavailable(volume + ": the process server or the master target could not answer (see their logs)");
  }

  Result<std::vector<proto::BlockExtent>> Plan() {
    std::vector<proto::BlockExtent> out;
    uint64_t from = 0;
    for (;;) {
      const uint64_t id = next_id_++;
      CDP_RETURN_IF_ERROR(ch_->Send(proto::FailbackPlanRequest{id, dev_.volume(), from}));
      ++st_.requests;
      CDP_ASSIGN_OR_RETURN(proto::Message m, Answer());
      auto* p = std::get_if<proto::FailbackPlan>(&m);
      if (p == nullptr || p->request_id != id) return Status::Corruption("failback: answer to another request");
      if (p->status != proto::FailbackStatus::kOk) return Refused(p->status, dev_.volume());
      for (const proto::BlockExtent& e : p->extents) {
        if (e.first_block < from || e.first_block >= blocks() || e.count > blocks() - e.first_block)
          return Status::Corruption("failback plan: an extent outside the volume or the page");
        out.push_back(e);
      }
      if (p->next_block == 0) break;
      if (p->next_block <= from) return Status::Corruption("failback plan: the next page does not move on");
      from = p->next_block;
    }
    return proto::MergeExtents(std::move(out));
  }

  // Blocks written here and never acknowledged by the PS (the queue), and
  // regions flagged for a resync (whole regions).
  std::vector<proto::BlockExtent> LocalBlocks() {
    std::vector<proto::BlockExtent> out;
    auto add = [&](uint64_t offset, uint64_t len) {
      if (len == 0) return;
      const uint64_t first = offset / bs(), end = std::min(blocks(), (offset + len + bs() - 1) / bs());
      for (uint64_t b = first; b < end;) {
        const uint64_t n = std::min<uint64_t>(end - b, UINT32_MAX);
        out.push_back(proto::BlockExtent{b, uint32_t(n)});
        b += n;
      }
    };
    CaptureQueue& q = dev_.queue();
    std::vector<QueuedRecord> recs;
    for (uint64_t from = q.acked_seq() + 1; q.Peek(from, 64u << 20, 65536, &recs);) {
      for (const QueuedRecord& r : recs) {
        if (proto::IsWriteKind(r.kind))
          add(r.offset, r.length);
        from = r.seq + 1;
      }
      recs.clear();
      out = proto::MergeExtents(std::move(out));
    }
    DirtyBitmap& bm = dev_.bitmap();
    for (std::optional<uint64_t> r = bm.NextResync(0); r; r = bm.NextResync(*r + 1))
      add(*r * bm.region_size(), dev_.RegionLength(*r));
    return proto::MergeExtents(std::move(out));
  }

  Status PullAll(const std::vector<proto::BlockExtent>& all) {
    std::map<uint64_t, Piece> inflight;
    size_t ei = 0;
    uint64_t done_in_extent = 0;
    while (ei < all.size() || !inflight.empty()) {
      while (ei < all.size() && int(inflight.size()) < std::max(1, o_.max_requests)) {
        Piece p;
        proto::PullRequest req;
        uint64_t n_blocks = 0;
        while (ei < all.size() && n_blocks < proto::kMaxPullBlocks) {
          const proto::BlockExtent& e = all[ei];
          const uint64_t take = std::min<uint64_t>(e.count - done_in_extent, proto::kMaxPullBlocks - n_blocks);
          p.extents.push_back(proto::BlockExtent{e.first_block + done_in_extent, uint32_t(take)});
          p.starts.push_back(n_blocks);
          n_blocks += take;
          done_in_extent += take;
          if (done_in_extent == e.count) {
            ++ei;
            done_in_extent = 0;
          }
        }
        p.old.resize(n_blocks * bs());
        for (size_t i = 0; i < p.extents.size(); ++i) {
          CDP_RETURN_IF_ERROR(dev_.ReadBacking(p.extents[i].first_block * bs(), size_t(p.extents[i].count) * bs(),
                                               p.old.data() + p.starts[i] * bs()));
        }
        req.request_id = next_id_++;
        req.volume = dev_.volume();
        req.extents = p.extents;
        req.digests.reserve(n_blocks);
        if (const seal::BlockSealer* s = dev_.sealer()) {
          // A sealed volume: the provider holds the stored blocks, so compare those.
          Bytes stored = p.old;
          for (size_t i = 0; i < p.extents.size(); ++i) {
            CDP_RETURN_IF_ERROR(s->Seal(p.extents[i].first_block * bs(),
                                        std::span<uint8_t>(stored.data() + p.starts[i] * bs(),
                                                           size_t(p.extents[i].count) * bs()),
                                        nullptr));
          }
          for (uint64_t b = 0; b < n_blocks; ++b) req.digests.push_back(LeafDigest(stored.data() + b * bs(), bs()));
        } else {
          for (uint64_t b = 0; b < n_blocks; ++b) req.digests.push_back(LeafDigest(p.old.data() + b * bs(), bs()));
        }
        CDP_RETURN_IF_ERROR(ch_->Send(req));
        ++st_.requests;
        inflight.emplace(req.request_id, std::move(p));
      }
      CDP_ASSIGN_OR_RETURN(proto::Message m, Answer());
      auto* r = std::get_if<proto::PullResponse>(&m);
      if (r == nullptr) return Status::Corruption("failback: a plan where a pull answer was due");
      auto it = inflight.find(r->request_id);
      if (it == inflight.end()) return Status::Corruption("failback: answer to a request not in flight");
      if (r->status != proto::FailbackStatus::kOk) return Refused(r->status, dev_.volume());
      CDP_ASSIGN_OR_RETURN(std::vector<proto::Record> plain, Open(std::move(r->records)));
      CDP_RETURN_IF_ERROR(Apply(it->second, plain));
      inflight.erase(it);
    }
    // The source once per pass: its old content is durable in the branch
    // already, so until this sync a crash leaves old or new content in each
    // block, and the next pass compares (and pulls) again.
    return dev_.SyncFailbackWrites();
  }

  // A sealed volume's answer: every block checked against its MAC and
  // decrypted (kSealed -> kData, kSealedZero -> kZero); a block that fails
  // its check fails the pass, and nothing of the answer is written. A plain
  // volume's answer must hold plain records (and the reverse).
  Result<std::vector<proto::Record>> Open(std::vector<proto::Record> records) {
    const seal::BlockSealer* s = dev_.sealer();
    for (proto::Record& rec : records) {
      const bool sealed = rec.kind == proto::RecordKind::kSealed || rec.kind == proto::RecordKind::kSealedZero;
      if (sealed != (s != nullptr))
        return Status::Corruption(std::string("failback pull: ") + (s ? "a plain record for a sealed volume"
                                                                       : "a sealed record for a plain volume"));
      if (!sealed) continue;
      if (rec.offset % seal::kUnit != 0 || rec.length % seal::kUnit != 0 ||
          rec.data.size() != seal::MacBytes(rec.length) + (rec.kind == proto::RecordKind::kSealed ? rec.length : 0))
        return Status::Corruption("failback pull: a sealed record that is not whole blocks and their MACs");
      const Bytes macs(rec.data.end() - long(seal::MacBytes(rec.length)), rec.data.end());
      Bytes blocks(rec.length, 0);
      if (rec.kind == proto::RecordKind::kSealed) std::copy_n(rec.data.begin(), rec.length, blocks.begin());
      if (Status st = s->Open(rec.offset, blocks, macs.data()); !st.ok())
        return st.WithContext("failback pull of " + dev_.volume());
      if (rec.kind == proto::RecordKind::kSealed) {
        rec.kind = proto::RecordKind::kData;
        rec.data = std::move(blocks);
      } else {
        rec.kind = proto::RecordKind::kZero;
        rec.data.clear();
      }
    }
    return records;
  }

  // Checks every record of an answer, then saves and writes them.
  Status Apply(const Piece& p, const std::vector<proto::Record>& records) {
    for (const proto::Record& rec : records) {
      if ((rec.kind != proto::RecordKind::kData && rec.kind != proto::RecordKind::kZero) || rec.length == 0 ||
          rec.offset % bs() != 0 || rec.length % bs() != 0)
        return Status::Corruption("failback pull: a record that is not whole blocks of data or zeros");
      for (uint64_t b = rec.offset / bs(); b < (rec.offset + rec.length) / bs(); ++b) {
        if (p.Position(b, bs()) < 0) return Status::Corruption("failback pull: a block that was not asked for");
      }
    }
    if (records.empty()) return Status::OK();
    // The old content of every run, block by block (a run lies inside one
    // extent, but do not rely on the peer for that), saved in one go: one
    // sync for the data, one for the index.
    uint64_t total = 0;
    for (const proto::Record& rec : records) total += rec.length;
    Bytes old(total);
    std::vector<BranchStore::Piece> pieces;
    pieces.reserve(records.size());
    uint64_t at = 0;
    for (const proto::Record& rec : records) {
      const uint64_t first = rec.offset / bs();
      for (uint64_t i = 0; i < rec.length / bs(); ++i) {
        const int64_t pos = p.Position(first + i, bs());
        std::copy_n(p.old.data() + pos, bs(), old.data() + at + i * bs());
      }
      pieces.push_back(BranchStore::Piece{rec.offset, ByteSpan(old.data() + at, rec.length)});
      at += rec.length;
    }
    const uint64_t before = branch_.saved_blocks();
    CDP_RETURN_IF_ERROR(branch_.SaveMany(pieces));
    st_.saved_blocks += branch_.saved_blocks() - before;
    // Only now may the source change.
    for (const proto::Record& rec : records) {
      CDP_RETURN_IF_ERROR(dev_.WriteFailback(rec.offset, rec.length, rec.data));
      st_.pulled_blocks += rec.length / bs();
      st_.pulled_bytes += rec.length;
    }
    return Status::OK();
  }

  CaptureDevice& dev_;
  BranchStore& branch_;
  const FailbackOptions& o_;
  std::unique_ptr<FrameChannel> ch_;
  uint64_t next_id_ = 1;
  FailbackPassStats st_;
};

}  // namespace

Result<FailbackPassStats> RunFailbackPass(CaptureDevice& dev, BranchStore& branch, const FailbackOptions& o) {
  if (dev.preferred_block_size() != kLeafSize)
    return Status::NotSupported(dev.volume() + ": failback compares 4 KiB blocks; the volume's block size is " +
                                std::to_string(dev.preferred_block_size()));
  Pass pass(dev, branch, o);
  auto r = pass.Run();
  if (r.ok()) {
    log::Get("agent")->info(
        "{} failback pass: {} blocks compared ({} named by the provider side, {} never shipped from here), {} pulled "
        "({} bytes, {} newly saved to the branch), {} bytes in, {} bytes out, {:.2f} s",
        log::Where{dev.volume(), o.link.peer.host, 0}, r->compared_blocks, r->plan_blocks, r->local_blocks, r->pulled_blocks,
        r->pulled_bytes, r->saved_blocks, r->wire_bytes_in, r->wire_bytes_out, r->seconds);
  }
  return r;
}

}  // namespace cdp::agent

// SPDX-License-Identifier: Apache-2.0
#include "agent/failback.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>

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

// The answers to the pass's calls, as their callbacks deliver them (on the
// link's reader); shared with the callbacks, which may outlive a pass that
// gave up waiting.
class Answers {
 public:
  void Put(uint64_t token, Result<proto::Message> answer) {
    {
      std::lock_guard<std::mutex> l(mu_);
      done_.emplace_back(token, std::move(answer));
    }
    cv_.notify_all();
  }
  // The next answer; kUnavailable after `timeout` without one.
  Result<std::pair<uint64_t, Result<proto::Message>>> Next(Millis timeout) {
    std::unique_lock<std::mutex> l(mu_);
    if (!cv_.wait_for(l, timeout, [&] { return !done_.empty(); }))
      return Status::Unavailable("failback: no answer from the process server within " +
                                 std::to_string(timeout.count()) + " ms");
    auto out = std::move(done_.front());
    done_.pop_front();
    return out;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<uint64_t, Result<proto::Message>>> done_;
};

class Pass {
 public:
  Pass(CaptureDevice& dev, BranchStore& branch, const FailbackOptions& o) : dev_(dev), branch_(branch), o_(o) {}

  Result<FailbackPassStats> Run() {
    const auto t0 = std::chrono::steady_clock::now();
    if (!o_.call) return Status::Unavailable(dev_.volume() + ": failback needs the link to the process server");
    CDP_ASSIGN_OR_RETURN(std::vector<proto::BlockExtent> plan, Plan());
    std::vector<proto::BlockExtent> local = LocalBlocks();
    st_.plan_blocks = proto::ExtentBlocks(plan).value_or(0);
    st_.local_blocks = proto::ExtentBlocks(local).value_or(0);
    plan.insert(plan.end(), local.begin(), local.end());
    std::vector<proto::BlockExtent> all = proto::MergeExtents(std::move(plan));
    st_.compared_blocks = proto::ExtentBlocks(all).value_or(0);
    CDP_RETURN_IF_ERROR(PullAll(all));
    st_.wire_bytes_in = bytes_->received.load();
    st_.wire_bytes_out = bytes_->sent.load();
    st_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return st_;
  }

 private:
  uint32_t bs() const { return dev_.preferred_block_size(); }
  uint64_t blocks() const { return dev_.size() / bs(); }

  // Sends `request` on the link; its answer comes back through answers_
  // with `token`.
  void Call(proto::Message request, uint64_t token) {
    o_.call(
        std::move(request),
        [answers = answers_, token](Result<proto::Message> r) { answers->Put(token, std::move(r)); }, bytes_);
    ++st_.requests;
  }

  // The next answer to one of the pass's calls: (its token, the message).
  Result<std::pair<uint64_t, proto::Message>> Answer() {
    CDP_ASSIGN_OR_RETURN(auto a, answers_->Next(Millis(o_.answer_timeout_ms)));
    if (!a.second.ok()) return a.second.status().WithContext("failback request to the process server");
    return std::make_pair(a.first, std::move(*a.second));
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
      Call(proto::FailbackPlanRequest{0, dev_.volume(), from}, id);
      CDP_ASSIGN_OR_RETURN(auto answer, Answer());
      auto* p = std::get_if<proto::FailbackPlan>(&answer.second);
      if (p == nullptr || answer.first != id) return Status::Corruption("failback: answer to another request");
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
        const uint64_t id = next_id_++;
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
        Call(std::move(req), id);
        inflight.emplace(id, std::move(p));
      }
      CDP_ASSIGN_OR_RETURN(auto answer, Answer());
      auto* r = std::get_if<proto::PullResponse>(&answer.second);
      if (r == nullptr) return Status::Corruption("failback: a plan where a pull answer was due");
      auto it = inflight.find(answer.first);
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
  const std::shared_ptr<Answers> answers_ = std::make_shared<Answers>();
  const std::shared_ptr<repl::CallBytes> bytes_ = std::make_shared<repl::CallBytes>();
  uint64_t next_id_ = 1;  // the tokens of the pass's calls
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
        log::Where{dev.volume(), o.peer, 0}, r->compared_blocks, r->plan_blocks, r->local_blocks, r->pulled_blocks,
        r->pulled_bytes, r->saved_blocks, r->wire_bytes_in, r->wire_bytes_out, r->seconds);
  }
  return r;
}

}  // namespace cdp::agent

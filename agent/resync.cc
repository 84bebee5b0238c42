// SPDX-License-Identifier: Apache-2.0
#include "agent/resync.h"

#include <algorithm>

#include "common/wire/block_digest.h"

namespace cdp::agent {

Resync::Resync(CaptureDevice* device, ResyncOptions opts, HashFn hash)
    : dev_(device), opts_(opts), hash_(std::move(hash)) {
  if (opts_.clock == nullptr) opts_.clock = SystemClock::Get();
  if (opts_.batch_regions == 0) opts_.batch_regions = 1;
  if (opts_.max_requests < 1) opts_.max_requests = 1;
  opts_.fill_max = std::max(opts_.fill_max, opts_.fill_target);
  window_ = opts_.fill_target;
  st_.fill_window_bytes = window_;
}

void Resync::SetFloor(uint64_t seq) { floor_ = seq; }

uint64_t Resync::RegionBytes(uint64_t region) const { return dev_->RegionLength(region); }

bool Resync::Idle() const {
  return regions_.empty() && out_.empty() && runs_.empty() && later_.empty() &&
         dev_->bitmap().ResyncCount() == 0;
}

ResyncStats Resync::Stats() const {
  std::lock_guard lk(mu_);
  return st_;
}

void Resync::Wait(std::chrono::milliseconds max) {
  std::unique_lock lk(mu_);
  cv_.wait_for(lk, max, [&] { return !answers_.empty() || kicked_; });
  kicked_ = false;
}

bool Resync::Kick() {
  {
    std::lock_guard lk(mu_);
    if (st_.inflight_bytes == 0) return false;
    kicked_ = true;
  }
  cv_.notify_all();
  return true;
}

void Resync::Abort() {
  out_.clear();
  later_.clear();
  runs_.clear();
  regions_.clear();
  std::lock_guard lk(mu_);
  answers_.clear();
}

void Resync::DropAll(const Status& why) {
  Abort();
  backoff_ms_ = std::clamp<uint64_t>(backoff_ms_ * 2, opts_.retry_min_ms, opts_.retry_max_ms);
  pause_until_us_ = opts_.clock->NowMicros() + backoff_ms_ * 1000;
  std::lock_guard lk(mu_);
  ++st_.hash_failed;
  st_.last_error = why.ToString() + " (resync paused " + std::to_string(backoff_ms_) + " ms)";
}

void Resync::Send(Request r) {
  const uint64_t ticket = next_ticket_++;
  proto::HashRequest req;
  req.region_size = r.unit;
  req.first_region = r.first;
  req.count = r.count;
  req.min_seq = r.min_seq;
  out_.emplace(ticket, std::move(r));
  {
    std::lock_guard lk(mu_);
    ++st_.hash_requests;
  }
  // The callback may run at once, on this thread: mu_ is not held here.
  hash_(req, [this, ticket](Result<proto::HashResponse> resp) {
    std::lock_guard lk(mu_);
    answers_.push_back(Answer{ticket, std::move(resp)});
    cv_.notify_all();
  });
}

bool Resync::PickRegions() {
  DirtyBitmap& bm = dev_->bitmap();
  const uint32_t rs = bm.region_size();
  // Local digests in memory are bounded: at most 256 MiB of regions in flight.
  const uint64_t batch = std::max<uint64_t>(1, std::min<uint64_t>(opts_.batch_regions, (64u << 20) / rs));
  if (regions_.size() + batch > std::max<uint64_t>(batch, (256u << 20) / rs)) return false;
  auto next = bm.NextResync(bm.cursor());
  while (next && regions_.count(*next)) next = bm.NextResync(*next + 1);
  if (!next) {
    next = bm.NextResync(0);
    while (next && regions_.count(*next)) next = bm.NextResync(*next + 1);
  }
  if (!next) return false;
  Request r;
  r.unit = rs;
  r.first = *next;
  r.min_seq = floor_;
  std::vector<uint32_t> epochs;
  for (uint64_t reg = *next; reg < bm.region_count() && r.regions.size() < batch; ++reg) {
    if (bm.ResyncState(reg) == DirtyBitmap::Resync::kNone || regions_.count(reg)) break;
    // The epoch before the sequence, both before the local read (see resync.h).
    epochs.push_back(bm.ResyncEpoch(reg));
    r.min_seq = std::max(r.min_seq, bm.LastSeq(reg));
    r.regions.push_back(reg);
  }
  r.count = uint32_t(r.regions.size());
  bm.SetCursor(r.first + r.count);
  for (size_t i = 0; i < r.regions.size(); ++i) {
    Region& g = regions_[r.regions[i]];
    g.epoch = epochs[i];
    g.pending = 1;  // the first-level answer
  }
  // Records still in our queue are compared once they are applied: the
  // request waits for the acknowledgement (and the replica for min_seq).
  if (r.min_seq > dev_->queue().acked_seq()) {
    later_.push_back(std::move(r));
    return true;
  }
  Send(std::move(r));
  return true;
}

Status Resync::ReadLeaves(const std::vector<uint64_t>& regions) {
  if (regions.empty()) return Status::OK();
  const uint32_t rs = dev_->bitmap().region_size();
  const uint64_t first = regions.front(), count = regions.back() - first + 1;  // one contiguous run
  DigestStats ds;
  auto read = dev_->LeafDigests(first * rs, count * rs, &ds);
  {
    std::lock_guard lk(mu_);
    st_.read_bytes += ds.bytes_read;
    st_.skipped_bytes += ds.bytes_skipped;
  }
  CDP_ASSIGN_OR_RETURN(auto leaves, std::move(read));
  const size_t per = rs / kLeafSize;
  for (uint64_t reg : regions) {
    const size_t b = size_t(reg - first) * per;
    Region& g = regions_.at(reg);
    g.ready = true;
    if (b >= leaves.size()) continue;
    g.leaves.assign(leaves.begin() + long(b), leaves.begin() + long(std::min(leaves.size(), b + per)));
  }
  return Status::OK();
}

std::vector<uint64_t> Resync::Compare(uint64_t region, uint32_t unit, uint64_t first_unit,
                                      std::span<const proto::Hash128> remote) {
  Region& g = regions_.at(region);
  const uint64_t region_off = region * dev_->bitmap().region_size();
  const size_t per = unit / kLeafSize;
  std::vector<uint64_t> descend;
  std::vector<size_t> leaves_differ;
  for (size_t j = 0; j < remote.size(); ++j) {
    const uint64_t u = first_unit + j;
    const size_t lb = size_t((u * unit - region_off) / kLeafSize);
    if (lb >= g.leaves.size()) break;
    const size_t n = std::min(per, g.leaves.size() - lb);
    const proto::Hash128 local = UnitDigest(std::span<const proto::Hash128>(g.leaves.data() + lb, n));
    if (local == remote[j]) continue;
    if (unit <= kLeafSize) {
      leaves_differ.push_back(lb);
    } else if (remote[j] == kZeroDigest) {
      // The replica reads zeros there: exactly our non-zero leaves differ.
      for (size_t k = lb; k < lb + n; ++k) {
        if (g.leaves[k] != kZeroDigest) leaves_differ.push_back(k);
      }
    } else if (local == kZeroDigest) {
      // We read zeros there: one kZero record makes the replica equal.
      for (size_t k = lb; k < lb + n; ++k) leaves_differ.push_back(k);
    } else {
      descend.push_back(u);
    }
  }
  // Differing leaves, merged into runs of adjacent ones.
  for (size_t i = 0; i < leaves_differ.size();) {
    size_t j = i + 1;
    while (j < leaves_differ.size() && leaves_differ[j] == leaves_differ[j - 1] + 1 &&
           (j - i + 1) * kLeafSize <= proto::kMaxRecordLength) {
      ++j;
    }
    const uint64_t off = region_off + uint64_t(leaves_differ[i]) * kLeafSize;
    const uint64_t end = std::min<uint64_t>(region_off + uint64_t(leaves_differ[j - 1] + 1) * kLeafSize, dev_->size());
    runs_.push_back(Run{off, uint32_t(end - off), region});
    ++g.pending;
    i = j;
  }
  return descend;
}

void Resync::Descend(uint32_t unit, const std::vector<std::pair<uint64_t, uint64_t>>& units, uint64_t min_seq) {
  // Differing units (sorted, with their regions) become requests for the
  // units of unit/16 bytes inside them; neighbours up to kMergeGap units apart
  // share one request (a few wasted digests cost less than a round trip).
  constexpr uint64_t kMergeGap = 4;
  const uint32_t child = std::max<uint32_t>(kLeafSize, unit / 16);
  const uint64_t ratio = unit / child;
  const uint64_t child_total = (dev_->size() + child - 1) / child;
  for (size_t i = 0; i < units.size();) {
    size_t j = i + 1;
    while (j < units.size() && units[j].first - units[j - 1].first <= kMergeGap &&
           (units[j].first - units[i].first + 1) * ratio <= proto::kMaxHashes) {
      ++j;
    }
    Request r;
    r.unit = child;
    r.first = units[i].first * ratio;
    r.count = uint32_t(std::min<uint64_t>((units[j - 1].first - units[i].first + 1) * ratio, child_total - r.first));
    r.min_seq = min_seq;
    for (size_t k = i; k < j; ++k) {
      if (r.regions.empty() || r.regions.back() != units[k].second) {
        r.regions.push_back(units[k].second);
        ++regions_.at(units[k].second).pending;
      }
    }
    later_.push_back(std::move(r));  // sent as the in-flight cap allows
    i = j;
  }
}

Status Resync::Handle(const Request& r, const proto::HashResponse& resp) {
  const uint64_t units_total = (dev_->size() + r.unit - 1) / r.unit;
  const uint64_t expect = std::min<uint64_t>(r.count, units_total - r.first);
  if (resp.region_size != r.unit || resp.first_region != r.first || resp.hashes.size() != expect) {
    return Status::Corruption("hash response does not match the request");
  }
  const uint64_t rs = dev_->bitmap().region_size();
  const bool first_level = r.unit == rs;
  std::vector<std::pair<uint64_t, uint64_t>> descend;  // (unit, region)
  uint64_t equal = 0;
  for (uint64_t region : r.regions) {
    // The units of the response inside this region.
    const uint64_t lo = std::max<uint64_t>(r.first, region * rs / r.unit);
    const uint64_t hi = std::min<uint64_t>(r.first + expect, (region + 1) * rs / r.unit);
    Region& g = regions_.at(region);
    const int pending_before = g.pending;
    const size_t descend_before = descend.size();
    if (first_level && !g.ready && hi > lo) {
      if (resp.hashes[lo - r.first] == kZeroDigest) {
        // The replica reads zeros: what differs is exactly our non-zero
        // blocks, found as they are shipped, read once (no digests). It
        // counts as differing until then (Finish corrects it).
        g.scan = true;
        const uint64_t off = region * rs, end = off + RegionBytes(region);
        for (uint64_t o = off; o < end; o += proto::kMaxRecordLength) {
          runs_.push_back(Run{o, uint32_t(std::min<uint64_t>(proto::kMaxRecordLength, end - o)), region, true});
          ++g.pending;
        }
        continue;
      }
      Status s = ReadLeaves({region});
      if (!s.ok()) return s.WithContext("resync read");
    }
    if (hi > lo) {
      for (uint64_t u : Compare(region, r.unit, lo, std::span(resp.hashes).subspan(lo - r.first, hi - lo))) {
        descend.emplace_back(u, region);
      }
    }
    if (g.pending == pending_before && descend.size() == descend_before) ++equal;  // nothing differs
  }
  if (first_level) {
    // Digests are read once answers tell which regions need them while the
    // replica reads as zeros, else ahead, beside the master target's hashing.
    lazy_ = std::all_of(resp.hashes.begin(), resp.hashes.end(), [](const proto::Hash128& h) { return h == kZeroDigest; });
  }
  Descend(r.unit, descend, r.min_seq);
  for (uint64_t region : r.regions) {
    auto it = regions_.find(region);
    if (it != regions_.end() && --it->second.pending == 0) Finish(region);
  }
  if (first_level) {
    std::lock_guard lk(mu_);
    st_.regions_compared += r.regions.size();
    st_.regions_equal += equal;
    st_.regions_differ += r.regions.size() - equal;
  }
  return Status::OK();
}

void Resync::Finish(uint64_t region) {
  auto it = regions_.find(region);
  if (it == regions_.end() || it->second.pending != 0) return;
  if (it->second.scan && !it->second.scan_shipped) {  // nothing differed after all
    std::lock_guard lk(mu_);
    ++st_.regions_equal;
    --st_.regions_differ;
  }
  // A bitmap-mode write flagged it meanwhile: it stays flagged and is compared again.
  const bool done = dev_->bitmap().ResyncDoneAt(region, it->second.epoch);
  regions_.erase(it);
  if (done) {
    std::lock_guard lk(mu_);
    st_.done_bytes += RegionBytes(region);
  }
}

bool Resync::ShipSome(Status* error) {
  const uint64_t acked = dev_->queue().acked_seq();
  uint64_t inflight = 0;
  while (!queued_.empty() && queued_.front().first <= acked) {
    window_acked_ += queued_.front().second;
    queued_.pop_front();
  }
  for (const auto& q : queued_) inflight += q.second;
  bool did = false;
  const uint64_t now = opts_.clock->NowMicros();
  // The window: what was acknowledged in the last plan-ahead, measured over a
  // quarter of it (see resync.h).
  const uint64_t plan_us = opts_.plan_ahead_ms * 1000;
  if (window_since_us_ == 0 || plan_us == 0) {
    window_since_us_ = now;
    window_acked_ = 0;
  } else if (now - window_since_us_ >= plan_us / 4) {
    const double per_plan = double(window_acked_) * double(plan_us) / double(now - window_since_us_);
    window_ = uint64_t(std::clamp(per_plan, double(opts_.fill_target), double(opts_.fill_max)));
    window_since_us_ = now;
    window_acked_ = 0;
  }
  if (opts_.max_rate > 0) {
    const uint64_t elapsed = rate_refill_us_ == 0 ? 0 : now - rate_refill_us_;
    rate_refill_us_ = now;
    // At most one second of burst.
    rate_tokens_ = std::min<uint64_t>(opts_.max_rate, rate_tokens_ + opts_.max_rate * elapsed / 1'000'000);
  }
  while (!runs_.empty()) {
    const Run run = runs_.front();
    if (inflight > 0 && inflight + run.length > window_) break;
    if (opts_.max_rate > 0 && rate_tokens_ < std::min<uint64_t>(run.length, opts_.max_rate)) break;
    uint64_t seq = 0, bytes = run.length, records = 1;
    if (run.scan) {
      auto shipped = dev_->ShipNonZero(run.offset, run.length);
      if (!shipped.ok()) {
        *error = shipped.status().WithContext("resync read");
        return did;
      }
      if (!shipped->room) break;  // no room in the queue now
      seq = shipped->last_seq;
      bytes = shipped->bytes;
      records = shipped->records;
      if (auto it = regions_.find(run.region); it != regions_.end() && records > 0) it->second.scan_shipped = true;
      std::lock_guard lk(mu_);
      st_.read_bytes += shipped->read;
      st_.skipped_bytes += shipped->skipped;
    } else {
      auto shipped = dev_->ShipRange(run.offset, run.length);
      if (!shipped.ok()) {
        *error = shipped.status().WithContext("resync read");
        return did;
      }
      if (*shipped == 0) break;  // no room in the queue now
      seq = *shipped;
    }
    runs_.pop_front();
    did = true;
    if (records > 0) {
      queued_.emplace_back(seq, bytes);
      inflight += bytes;
    }
    if (opts_.max_rate > 0) rate_tokens_ -= std::min<uint64_t>(rate_tokens_, bytes);
    {
      std::lock_guard lk(mu_);
      st_.shipped_records += records;
      st_.shipped_bytes += bytes;
      // Scan records are runs of whole blocks (the volume's last may be short).
      st_.shipped_blocks += (bytes + kLeafSize - 1) / kLeafSize;
    }
    auto it = regions_.find(run.region);
    if (it != regions_.end() && --it->second.pending == 0) Finish(run.region);
  }
  std::lock_guard lk(mu_);
  st_.inflight_bytes = inflight;
  st_.fill_window_bytes = window_;
  return did;
}

Result<bool> Resync::Step() {
  DirtyBitmap& bm = dev_->bitmap();
  bool did = false;
  Status error;
  // 1. Answers.
  std::vector<Answer> got;
  {
    std::lock_guard lk(mu_);
    got.swap(answers_);
  }
  for (Answer& a : got) {
    auto it = out_.find(a.ticket);
    if (it == out_.end()) continue;  // dropped meanwhile
    Request r = std::move(it->second);
    out_.erase(it);
    did = true;
    Status why;
    if (!a.response.ok()) {
      why = a.response.status();
    } else if (a.response->status == proto::HashStatus::kBehind) {
      r.not_before_us = opts_.clock->NowMicros() + opts_.behind_retry_ms * 1000;
      later_.push_back(std::move(r));
      std::lock_guard lk(mu_);
      ++st_.hash_behind;
      continue;
    } else if (a.response->status != proto::HashStatus::kOk) {
      why = Status::Unavailable("the replica could not answer a hash request (status " +
                                std::to_string(int(a.response->status)) + ")");
    } else {
      why = Handle(r, *a.response);
      if (why.ok() && backoff_ms_ != 0) {
        backoff_ms_ = 0;
        std::lock_guard lk(mu_);
        st_.last_error.clear();  // answered again: the pause is over
      }
    }
    if (!why.ok()) {
      DropAll(why);
      return why.WithContext("resync");
    }
  }
  // 2. Blocks known to differ, as the rate controller allows.
  if (ShipSome(&error)) did = true;
  if (!error.ok()) {
    DropAll(error);
    return error;
  }
  const uint64_t now = opts_.clock->NowMicros();
  if (now < pause_until_us_) return did;
  // 3. Requests asked again (kBehind) or waiting for an acknowledgement.
  const uint64_t acked = dev_->queue().acked_seq();
  for (size_t n = later_.size(); n > 0 && int(out_.size()) < opts_.max_requests; --n) {
    Request r = std::move(later_.front());
    later_.pop_front();
    if (r.not_before_us > now || r.min_seq > acked) {
      later_.push_back(std::move(r));
      continue;
    }
    Send(std::move(r));
    did = true;
  }
  // 4. New regions (data mode only: their records must fit).
  if (bm.ResyncCount() > 0 && dev_->queue().mode() == CaptureMode::kData) {
    {
      std::lock_guard lk(mu_);
      if (st_.total_bytes == 0) {
        st_.total_bytes = bm.ResyncCount() * bm.region_size();
        st_.done_bytes = 0;
        pass_start_us_ = now;
      }
    }
    while (int(out_.size() + later_.size()) < opts_.max_requests) {
      if (!PickRegions()) break;
      did = true;
      // Local digests of the run just picked, read after its request went
      // out (the master target hashes meanwhile); but while the replica
      // answers zeros (an initial sync), once the answer tells which regions
      // need them (Handle): those it reads as zeros need none. A sealed
      // volume always reads them here.
      if (lazy_ && dev_->sealer() == nullptr) continue;
      // Every region without digests: the run just picked, and those picked
      // while the replica answered zeros and not answered yet (not those
      // answered zeros: they need none), read run by contiguous run
      // (ReadLeaves reads from the first to the last).
      Status s;
      std::vector<uint64_t> fresh;
      for (auto it = regions_.begin(); s.ok() && it != regions_.end(); ++it) {
        if (it->second.ready || it->second.scan) continue;
        if (!fresh.empty() && it->first != fresh.back() + 1) {
          s = ReadLeaves(fresh);
          fresh.clear();
        }
        fresh.push_back(it->first);
      }
      if (s.ok()) s = ReadLeaves(fresh);
      if (!s.ok()) {
        DropAll(s);
        return s.WithContext("resync read");
      }
    }
  }
  // Progress.
  std::lock_guard lk(mu_);
  const uint64_t remaining = bm.ResyncCount() * uint64_t(bm.region_size());
  st_.remaining_bytes = remaining;
  if (remaining == 0 && regions_.empty()) {  // the pass is over
    st_.total_bytes = 0;
    st_.done_bytes = 0;
    st_.eta_seconds = 0;
  } else if (st_.done_bytes > 0) {
    const double elapsed = double(now - pass_start_us_) / 1e6;
    st_.eta_seconds = elapsed / double(st_.done_bytes) * double(remaining);
  }
  return did;
}

}  // namespace cdp::agent

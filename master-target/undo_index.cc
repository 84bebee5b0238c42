#include "master-target/undo_index.h"

#include <algorithm>

namespace cdp::mt {

void UndoIndex::Add(const UndoEntry& e) {
  Slot& slot = by_offset_[e.offset];
  slot.v.push_back(e);
  slot.max_len = std::max(slot.max_len, e.length);
  SegmentRefs& refs = by_segment_[e.segment];
  refs.offsets.push_back(e.offset);
  refs.max_seq = std::max(refs.max_seq, e.seq);
  ++count_;
}

std::vector<ReadPiece> UndoIndex::Lookup(uint64_t point, uint64_t offset, uint64_t len) const {
  const uint64_t end = offset + len;
  std::vector<UndoEntry> cand;
  uint64_t lo = offset >= kMaxUndoChunk - 1 ? offset - (kMaxUndoChunk - 1) : 0;
  for (auto it = by_offset_.lower_bound(lo); it != by_offset_.end() && it->first < end; ++it) {
    const Slot& slot = it->second;
    const uint64_t start = it->first;
    if (start + slot.max_len <= offset) continue;
    auto j = std::upper_bound(slot.v.begin(), slot.v.end(), point,
                              [](uint64_t p, const UndoEntry& e) { return p < e.seq; });
    uint64_t reach = start;
    for (; j != slot.v.end(); ++j) {
      uint64_t e_end = j->offset + j->length;
      if (e_end > reach) {
        if (e_end > offset) cand.push_back(*j);
        reach = e_end;
        if (reach >= end || reach >= start + slot.max_len) break;
      }
    }
  }
  std::sort(cand.begin(), cand.end(), [](const UndoEntry& a, const UndoEntry& b) {
    return a.seq != b.seq ? a.seq < b.seq : a.offset < b.offset;
  });

  // Paint: each candidate, oldest first, takes the bytes no older one took.
  std::vector<std::pair<uint64_t, uint64_t>> gaps{{offset, end}};
  std::vector<ReadPiece> pieces;
  for (const UndoEntry& e : cand) {
    if (gaps.empty()) break;
    uint64_t cs = e.offset, ce = e.offset + e.length;
    std::vector<std::pair<uint64_t, uint64_t>> next;
    next.reserve(gaps.size() + 1);
    for (auto [gs, ge] : gaps) {
      uint64_t s = std::max(gs, cs), t = std::min(ge, ce);
      if (s >= t) {
        next.emplace_back(gs, ge);
        continue;
      }
      if (gs < s) next.emplace_back(gs, s);
      ReadPiece p;
      p.offset = s;
      p.length = uint32_t(t - s);
      p.from_undo = true;
      p.entry = e;
      pieces.push_back(p);
      if (t < ge) next.emplace_back(t, ge);
    }
    gaps.swap(next);
  }
  for (auto [gs, ge] : gaps) {
    // Replica pieces may be long; split so each fits a uint32 length.
    while (gs < ge) {
      uint64_t n = std::min<uint64_t>(ge - gs, 1u << 30);
      ReadPiece p;
      p.offset = gs;
      p.length = uint32_t(n);
      pieces.push_back(p);
      gs += n;
    }
  }
  std::sort(pieces.begin(), pieces.end(), [](const ReadPiece& a, const ReadPiece& b) { return a.offset < b.offset; });
  return pieces;
}

void UndoIndex::RemoveSegmentsUpTo(uint64_t segment) {
  while (!by_segment_.empty() && by_segment_.begin()->first <= segment) {
    for (uint64_t off : by_segment_.begin()->second.offsets) {
      auto it = by_offset_.find(off);
      if (it == by_offset_.end()) continue;
      auto& v = it->second.v;
      auto keep = std::find_if(v.begin(), v.end(), [&](const UndoEntry& e) { return e.segment > segment; });
      count_ -= size_t(keep - v.begin());
      v.erase(v.begin(), keep);
      if (v.empty()) by_offset_.erase(it);
    }
    by_segment_.erase(by_segment_.begin());
  }
}

void UndoIndex::RemoveAbove(uint64_t seq) {
  while (!by_segment_.empty()) {
    auto last = std::prev(by_segment_.end());
    if (last->second.max_seq <= seq) break;
    bool all_gone = true;
    for (uint64_t off : last->second.offsets) {
      auto it = by_offset_.find(off);
      if (it == by_offset_.end()) continue;
      auto& v = it->second.v;
      while (!v.empty() && v.back().seq > seq) {
        v.pop_back();
        --count_;
      }
      for (const UndoEntry& e : v) {
        if (e.segment == last->first) all_gone = false;
      }
      if (v.empty()) by_offset_.erase(it);
    }
    if (all_gone) {
      by_segment_.erase(last);
    } else {
      last->second.max_seq = seq;
      break;
    }
  }
}

std::vector<UndoEntry> UndoIndex::EntriesAbove(uint64_t seq) const {
  std::vector<UndoEntry> out;
  for (const auto& [off, slot] : by_offset_) {
    for (auto it = slot.v.rbegin(); it != slot.v.rend() && it->seq > seq; ++it) out.push_back(*it);
  }
  std::sort(out.begin(), out.end(), [](const UndoEntry& a, const UndoEntry& b) {
    if (a.seq != b.seq) return a.seq > b.seq;
    if (a.segment != b.segment) return a.segment > b.segment;
    return a.file_offset > b.file_offset;
  });
  return out;
}

uint64_t UndoIndex::min_seq() const {
  uint64_t m = 0;
  for (const auto& [off, slot] : by_offset_) {
    if (!slot.v.empty() && (m == 0 || slot.v.front().seq < m)) m = slot.v.front().seq;
  }
  return m;
}

}  // namespace cdp::mt

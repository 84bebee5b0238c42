// SPDX-License-Identifier: Apache-2.0
#include "master-target/replica_batch.h"

#include <algorithm>
#include <cstring>

namespace cdp::mt {

void BatchOverlay::Insert(uint64_t off, uint64_t len, const uint8_t* data) {
  const uint64_t end = off + len;
  auto it = m_.lower_bound(off);
  if (it != m_.begin()) {
    auto p = std::prev(it);
    if (p->second.end > off) {
      Ext tail = p->second;
      uint64_t pstart = p->first;
      p->second.end = off;
      if (tail.end > end) m_[end] = Ext{tail.end, tail.data ? tail.data + (end - pstart) : nullptr};
    }
  }
  it = m_.lower_bound(off);
  while (it != m_.end() && it->first < end) {
    if (it->second.end > end) {
      Ext e = it->second;
      uint64_t s = it->first;
      m_.erase(it);
      m_[end] = Ext{e.end, e.data ? e.data + (end - s) : nullptr};
      break;
    }
    it = m_.erase(it);
  }
  m_[off] = Ext{end, data};
}

bool BatchOverlay::Touches(uint64_t off, uint64_t len) const {
  auto it = m_.upper_bound(off);
  if (it != m_.begin() && std::prev(it)->second.end > off) return true;
  return it != m_.end() && it->first < off + len;
}

void BatchOverlay::Patch(uint64_t off, uint64_t len, uint8_t* buf) const {
  const uint64_t end = off + len;
  auto it = m_.upper_bound(off);
  if (it != m_.begin()) --it;
  for (; it != m_.end() && it->first < end; ++it) {
    uint64_t s = std::max(it->first, off), t = std::min(it->second.end, end);
    if (s >= t) continue;
    if (it->second.data) {
      std::memcpy(buf + (s - off), it->second.data + (s - it->first), t - s);
    } else {
      std::memset(buf + (s - off), 0, t - s);
    }
  }
}

Result<bool> KnownHoles::IsHole(uint64_t off, uint64_t n) {
  if (Covers(off, n)) return true;
  CDP_ASSIGN_OR_RETURN(uint64_t data, replica_->NextData(off));
  if (data > off) Add(off, data);
  return data >= off + n;
}

bool KnownHoles::Covers(uint64_t off, uint64_t n) const {
  auto it = m_.upper_bound(off);
  if (it == m_.begin()) return false;
  return std::prev(it)->second >= off + n;
}

void KnownHoles::Add(uint64_t start, uint64_t end) {
  auto it = m_.upper_bound(start);
  if (it != m_.begin() && std::prev(it)->second >= start) {
    it = std::prev(it);
    start = it->first;
    end = std::max(end, it->second);
    it = m_.erase(it);
  }
  while (it != m_.end() && it->first <= end) {
    end = std::max(end, it->second);
    it = m_.erase(it);
  }
  m_[start] = end;
}

bool IsSealedKind(proto::RecordKind k) {
  return k == proto::RecordKind::kSealed || k == proto::RecordKind::kSealedZero;
}


std::vector<proto::Record> UnsealRecords(const std::vector<proto::Record>& recs, size_t first, uint64_t volume_size) {
  std::vector<proto::Record> out;
  out.reserve(2 * (recs.size() - first));
  for (size_t i = first; i < recs.size(); ++i) {
    const proto::Record& r = recs[i];
    if (!IsSealedKind(r.kind)) {
      out.push_back(r);
      continue;
    }
    const uint64_t macs = proto::SealMacBytes(r.length);
    const bool zero = r.kind == proto::RecordKind::kSealedZero;
    proto::Record blocks{r.seq, r.offset, r.length, zero ? proto::RecordKind::kZero : proto::RecordKind::kData,
                         r.timestamp_us, {}};
    if (!zero) blocks.data.assign(r.data.begin(), r.data.begin() + r.length);
    out.push_back(std::move(blocks));
    out.push_back(proto::Record{r.seq, volume_size + proto::SealMacBytes(r.offset), uint32_t(macs),
                                proto::RecordKind::kData, r.timestamp_us, Bytes(r.data.end() - macs, r.data.end())});
  }
  return out;
}

}  // namespace cdp::mt

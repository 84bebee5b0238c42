#include "master-target/digest_cache.h"

namespace cdp::mt {

std::optional<std::vector<proto::Hash128>> DigestCache::Get(uint64_t block) {
  std::lock_guard lk(mu_);
  auto it = map_.find(block);
  if (it == map_.end()) return std::nullopt;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  ++hits_;
  return it->second.leaves;
}

void DigestCache::Put(uint64_t block, std::vector<proto::Hash128> leaves) {
  if (max_blocks_ == 0) return;
  std::lock_guard lk(mu_);
  auto it = map_.find(block);
  if (it != map_.end()) {
    it->second.leaves = std::move(leaves);
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    return;
  }
  while (map_.size() >= max_blocks_) {
    map_.erase(lru_.back());
    lru_.pop_back();
  }
  lru_.push_front(block);
  map_.emplace(block, Entry{std::move(leaves), lru_.begin()});
}

void DigestCache::Drop(uint64_t offset, uint64_t len) {
  if (len == 0) return;
  std::lock_guard lk(mu_);
  const uint64_t first = offset / kBlock, last = (offset + len - 1) / kBlock;
  if (last - first >= map_.size()) {
    // A long range: walk the cache instead of the range.
    for (auto it = map_.begin(); it != map_.end();) {
      if (it->first >= first && it->first <= last) {
        lru_.erase(it->second.lru);
        it = map_.erase(it);
      } else {
        ++it;
      }
    }
    return;
  }
  for (uint64_t b = first; b <= last; ++b) {
    auto it = map_.find(b);
    if (it == map_.end()) continue;
    lru_.erase(it->second.lru);
    map_.erase(it);
  }
}

void DigestCache::Clear() {
  std::lock_guard lk(mu_);
  map_.clear();
  lru_.clear();
}

uint64_t DigestCache::hits() const {
  std::lock_guard lk(mu_);
  return hits_;
}

}  // namespace cdp::mt

// DigestCache: leaf digests (common/block_digest.h) of recently hashed 1 MiB
// blocks of a replica's current image. A resync asks for a region, then for
// its 64 KiB units, then for 4 KiB leaves, within moments: with the cache the
// replica is read once, not three times. Every write to the replica file drops
// the blocks it touches (Drop), so a cached digest always describes the
// current image. Bounded: the least recently used blocks go first.
//
// Thread safety: all methods are thread-safe.
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "common/protocol.h"

namespace cdp::mt {

class DigestCache {
 public:
  static constexpr uint64_t kBlock = 1u << 20;

  explicit DigestCache(size_t max_blocks = 2048) : max_blocks_(max_blocks) {}

  // The leaves of block `block` (index; bytes [block·kBlock, +kBlock)), if cached.
  std::optional<std::vector<proto::Hash128>> Get(uint64_t block);
  void Put(uint64_t block, std::vector<proto::Hash128> leaves);
  // [offset, offset+len) of the replica changed.
  void Drop(uint64_t offset, uint64_t len);
  void Clear();
  uint64_t hits() const;

 private:
  struct Entry {
    std::vector<proto::Hash128> leaves;
    std::list<uint64_t>::iterator lru;
  };
  const size_t max_blocks_;
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, Entry> map_;
  std::list<uint64_t> lru_;  // front = most recent
  uint64_t hits_ = 0;
};

}  // namespace cdp::mt

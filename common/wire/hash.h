// SPDX-License-Identifier: Apache-2.0
// XXH3 hashes (libxxhash): 64-bit for quick identity, 128-bit for region hashes
// in resync and online verify. Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/wire/protocol.h"

namespace cdp {

uint64_t Xxh3_64(const void* data, size_t n);
proto::Hash128 Xxh3_128(const void* data, size_t n);

// 32 lowercase hex digits, high half first: how hashes travel in JSON (/v1/hashes).
std::string HashToHex(const proto::Hash128& h);

// Streaming XXH3-128 for a region read in pieces. Not thread-safe.
class Xxh3_128Stream {
 public:
  Xxh3_128Stream();
  ~Xxh3_128Stream();
  Xxh3_128Stream(const Xxh3_128Stream&) = delete;
  Xxh3_128Stream& operator=(const Xxh3_128Stream&) = delete;
  void Update(const void* data, size_t n);
  proto::Hash128 Digest() const;

 private:
  void* state_;  // XXH3_state_t*
};

}  // namespace cdp

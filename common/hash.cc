#include "common/hash.h"

#include <new>

#include <xxhash.h>

namespace cdp {

uint64_t Xxh3_64(const void* data, size_t n) { return XXH3_64bits(data, n); }

proto::Hash128 Xxh3_128(const void* data, size_t n) {
  const XXH128_hash_t h = XXH3_128bits(data, n);
  return proto::Hash128{h.low64, h.high64};
}

Xxh3_128Stream::Xxh3_128Stream() : state_(XXH3_createState()) {
  if (state_ == nullptr) throw std::bad_alloc();
  XXH3_128bits_reset(static_cast<XXH3_state_t*>(state_));
}

Xxh3_128Stream::~Xxh3_128Stream() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void Xxh3_128Stream::Update(const void* data, size_t n) {
  XXH3_128bits_update(static_cast<XXH3_state_t*>(state_), data, n);
}

proto::Hash128 Xxh3_128Stream::Digest() const {
  const XXH128_hash_t h = XXH3_128bits_digest(static_cast<const XXH3_state_t*>(state_));
  return proto::Hash128{h.low64, h.high64};
}

}  // namespace cdp

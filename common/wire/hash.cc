// SPDX-License-Identifier: Apache-2.0
#include "common/wire/hash.h"

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

std::string HashToHex(const proto::Hash128& h) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out(32, '0');
  for (int i = 0; i < 16; ++i) {
    out[size_t(15 - i)] = kDigits[(h.high >> (4 * i)) & 0xf];
    out[size_t(31 - i)] = kDigits[(h.low >> (4 * i)) & 0xf];
  }
  return out;
}

}  // namespace cdp

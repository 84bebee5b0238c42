#include "common/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace cdp::crc32c {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // Castagnoli, reflected

// Slicing-by-8 tables: kTables[0] is the classic byte table; kTables[k][b] is the
// CRC of byte b followed by k zero bytes. Computed at compile time (constants).
using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables MakeTables() {
  Tables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int j = 0; j < 8; ++j) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[0][i] = c;
  }
  for (size_t k = 1; k < 8; ++k) {
    for (uint32_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFF];
  }
  return t;
}

constexpr Tables kTables = MakeTables();

inline uint32_t Load32(const uint8_t* p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t ExtendSse42(uint32_t init, const uint8_t* p,
                                                        size_t n) {
  uint64_t crc = ~init;
  // Head: single bytes until p is 8-byte aligned.
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    crc = _mm_crc32_u8(uint32_t(crc), *p++);
    --n;
  }
  // Body: 8 bytes per instruction, 4 words per iteration.
  while (n >= 32) {
    uint64_t w[4];
    std::memcpy(w, p, 32);
    crc = _mm_crc32_u64(crc, w[0]);
    crc = _mm_crc32_u64(crc, w[1]);
    crc = _mm_crc32_u64(crc, w[2]);
    crc = _mm_crc32_u64(crc, w[3]);
    p += 32;
    n -= 32;
  }
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    crc = _mm_crc32_u64(crc, w);
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    crc = _mm_crc32_u8(uint32_t(crc), *p++);
    --n;
  }
  return ~uint32_t(crc);
}
#endif

}  // namespace

uint32_t ExtendPortable(uint32_t init, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  const auto& t = kTables;
  uint32_t crc = ~init;
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xFF];
    --n;
  }
  while (n >= 8) {
    const uint32_t lo = crc ^ Load32(p);
    const uint32_t hi = Load32(p + 4);
    crc = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
          t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xFF];
    --n;
  }
  return ~crc;
}

bool HardwareAvailable() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("sse4.2");
#else
  return false;
#endif
}

uint32_t Extend(uint32_t init, const void* data, size_t n) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("sse4.2")) {
    return ExtendSse42(init, static_cast<const uint8_t*>(data), n);
  }
#endif
  return ExtendPortable(init, data, n);
}

}  // namespace cdp::crc32c

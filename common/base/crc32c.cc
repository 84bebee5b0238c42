// SPDX-License-Identifier: Apache-2.0
#include "common/base/crc32c.h"

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
// The crc32 instruction has a latency of 3 cycles and a throughput of 1, so the
// hardware path runs three independent streams over adjacent chunks and joins
// them: for the raw CRC register, crc(A|B) = Shift_|B|(crc(A)) ^ crc0(B), where
// Shift_n appends n zero bytes. Shift_n is linear over GF(2); kShiftLong/Short
// hold it as four byte-indexed tables for the two chunk sizes used.
constexpr size_t kLong = 8192;
constexpr size_t kShort = 256;

using Op = std::array<uint32_t, 32>;  // images of the 32 basis vectors

constexpr uint32_t Apply(const Op& op, uint32_t v) {
  uint32_t r = 0;
  for (int i = 0; v != 0; ++i, v >>= 1) {
    if (v & 1) r ^= op[size_t(i)];
  }
  return r;
}

constexpr Op Compose(const Op& a, const Op& b) {  // a after b
  Op r{};
  for (size_t i = 0; i < 32; ++i) r[i] = Apply(a, b[i]);
  return r;
}

using ShiftTable = std::array<std::array<uint32_t, 256>, 4>;

constexpr ShiftTable MakeShift(size_t bytes) {
  Op bit{};  // one zero bit into the reflected register
  bit[0] = kPoly;
  for (size_t i = 1; i < 32; ++i) bit[i] = 1u << (i - 1);
  Op result{};
  for (size_t i = 0; i < 32; ++i) result[i] = 1u << i;
  for (uint64_t n = uint64_t(bytes) * 8; n != 0; n >>= 1) {
    if (n & 1) result = Compose(bit, result);
    bit = Compose(bit, bit);
  }
  ShiftTable t{};
  for (size_t k = 0; k < 4; ++k) {
    for (uint32_t b = 0; b < 256; ++b) t[k][b] = Apply(result, b << (8 * k));
  }
  return t;
}

constexpr ShiftTable kShiftLong = MakeShift(kLong);
constexpr ShiftTable kShiftShort = MakeShift(kShort);

inline uint32_t Shift(const ShiftTable& t, uint32_t crc) {
  return t[0][crc & 0xFF] ^ t[1][(crc >> 8) & 0xFF] ^ t[2][(crc >> 16) & 0xFF] ^ t[3][crc >> 24];
}

__attribute__((target("sse4.2"))) inline const uint8_t* ThreeWay(uint64_t* crc,
                                                                 const uint8_t* p,
                                                                 size_t chunk,
                                                                 const ShiftTable& shift) {
  uint64_t c0 = *crc, c1 = 0, c2 = 0;
  const uint8_t* end = p + chunk;
  while (p < end) {
    uint64_t a, b, c;
    std::memcpy(&a, p, 8);
    std::memcpy(&b, p + chunk, 8);
    std::memcpy(&c, p + 2 * chunk, 8);
    c0 = _mm_crc32_u64(c0, a);
    c1 = _mm_crc32_u64(c1, b);
    c2 = _mm_crc32_u64(c2, c);
    p += 8;
  }
  uint32_t r = Shift(shift, uint32_t(c0)) ^ uint32_t(c1);
  r = Shift(shift, r) ^ uint32_t(c2);
  *crc = r;
  return p + 2 * chunk;
}

__attribute__((target("sse4.2"))) uint32_t ExtendSse42(uint32_t init, const uint8_t* p,
                                                        size_t n) {
  uint64_t crc = ~init;
  // Head: single bytes until p is 8-byte aligned.
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    crc = _mm_crc32_u8(uint32_t(crc), *p++);
    --n;
  }
  while (n >= 3 * kLong) {
    p = ThreeWay(&crc, p, kLong, kShiftLong);
    n -= 3 * kLong;
  }
  while (n >= 3 * kShort) {
    p = ThreeWay(&crc, p, kShort, kShiftShort);
    n -= 3 * kShort;
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

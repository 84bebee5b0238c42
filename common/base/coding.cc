// SPDX-License-Identifier: Apache-2.0
#include "common/base/coding.h"

namespace cdp {

bool IsAllZero(const uint8_t* p, size_t n) {
  // 256 bytes at a time with an OR reduction the compiler vectorises; stop at
  // the first chunk holding data (most data blocks fail in the first chunk).
  size_t i = 0;
  for (; i + 256 <= n; i += 256) {
    uint64_t acc = 0;
    for (size_t k = 0; k < 256; k += 8) {
      uint64_t w;
      std::memcpy(&w, p + i + k, 8);
      acc |= w;
    }
    if (acc != 0) return false;
  }
  for (; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

}  // namespace cdp

// SPDX-License-Identifier: Apache-2.0
// CRC32C (Castagnoli), used to frame every wire and on-disk record.
// Uses the SSE4.2 crc32 instruction when the CPU has it (checked once at run
// time), else a portable table-driven implementation; both give the same value.
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cdp::crc32c {

// Returns the CRC32C of data[0, n) continuing from `init` (the CRC of what came before).
uint32_t Extend(uint32_t init, const void* data, size_t n);
inline uint32_t Value(const void* data, size_t n) { return Extend(0, data, n); }

// The portable implementation, exposed so tests can compare both paths.
uint32_t ExtendPortable(uint32_t init, const void* data, size_t n);
bool HardwareAvailable();

}  // namespace cdp::crc32c

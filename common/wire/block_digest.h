// SPDX-License-Identifier: Apache-2.0
// Block digests: how resync and online verify compare a range of a volume
// without moving its bytes (docs/formats/protocol.md, "Block digests").
//
//   leaf   = 4 KiB (kLeafSize; the volume's last leaf may be shorter)
//   digest(leaf) = kZeroDigest when every byte is zero, else XXH3-128 of the
//                  bytes (an XXH3 value equal to kZeroDigest is mapped to
//                  {1, 0}, so the zero flag is never a real hash)
//   digest(unit of U bytes, U a power of two > 4 KiB)
//                = kZeroDigest when every leaf in it is zero, else XXH3-128
//                  over the concatenated digests of its leaves (16 bytes
//                  each: low then high, little-endian)
//
// So one read of a range yields the digests of every unit size in it: the
// resync asks for 1 MiB units, then 64 KiB units of the ones that differ,
// then 4 KiB leaves, and both sides compute all three from the same leaves.
// An all-zero range is compared by its flag; on the wire a zero digest
// travels as one flag byte instead of 16 bytes of hash.
//
// DigestReader reads through a DigestSource; where the source can tell that a
// range is a hole (SEEK_DATA), the range is not read at all.
//
// Thread safety: pure functions; a DigestReader is used by one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "common/base/coding.h"  // IsAllZero
#include "common/base/result.h"
#include "common/wire/protocol.h"

namespace cdp {

inline constexpr uint32_t kLeafSize = 4096;
inline constexpr proto::Hash128 kZeroDigest{0, 0};
// A sealed volume (common/crypto/seal.h) at the master target: a leaf that reads as
// zeros but whose MAC was never written (the replica was never sent that
// block). It equals no source digest, so the source ships the block's MAC
// (a sealed zero record); the MT can tell the two apart, the source cannot.
inline constexpr proto::Hash128 kUnsealedZeroDigest{2, 0};

proto::Hash128 LeafDigest(const uint8_t* p, size_t n);
// The digest of a unit from the digests of its leaves (in order).
proto::Hash128 UnitDigest(std::span<const proto::Hash128> leaves);

// The digest of a unit held in memory (`n` bytes from a leaf boundary).
proto::Hash128 DigestOf(const uint8_t* p, size_t n);

// A unit size a digest request may name: a power of two in 4 KiB .. 1 GiB.
bool ValidUnitSize(uint64_t unit);

struct DigestSource {
  uint64_t size = 0;  // bytes of the volume
  // Reads exactly n bytes at off (inside the volume).
  std::function<Status(uint64_t off, size_t n, uint8_t* buf)> read;
  // The first offset >= off that may hold data (everything before it reads
  // as zeros), or `size`; empty: no allocation information (read everything).
  std::function<Result<uint64_t>(uint64_t off)> next_data;
};

struct DigestStats {
  uint64_t bytes_read = 0;     // read from the source
  uint64_t bytes_skipped = 0;  // known zero without reading (holes)
};

class DigestReader {
 public:
  // Reads `chunk` bytes at a time (the buffer is allocated at the first read:
  // a reader that finds everything elsewhere costs no allocation).
  explicit DigestReader(DigestSource src, size_t chunk = 1u << 20) : src_(std::move(src)), chunk_(chunk) {}

  // Leaf digests of [offset, offset + len), clipped to the volume. `offset`
  // must be leaf-aligned. kOutOfRange when offset is past the end.
  Result<std::vector<proto::Hash128>> Leaves(uint64_t offset, uint64_t len);
  // Digests of units [first, first + count) of `unit` bytes (the last unit of
  // the volume may be short). kInvalidArgument for a bad unit, kOutOfRange
  // when `first` starts past the end; units past the end are not returned.
  Result<std::vector<proto::Hash128>> Units(uint32_t unit, uint64_t first, uint32_t count);

  const DigestStats& stats() const { return stats_; }

 private:
  DigestSource src_;
  size_t chunk_;
  Bytes buf_;
  DigestStats stats_;
};

// Digests of `unit`-byte units from the leaf digests of a range starting at a
// unit boundary (the last unit may have fewer leaves).
std::vector<proto::Hash128> UnitsFromLeaves(std::span<const proto::Hash128> leaves, uint32_t unit);

}  // namespace cdp

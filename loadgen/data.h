// SPDX-License-Identifier: Apache-2.0
// Realistic mixed test data for load generation (and for bench/, which links
// cdp_loadgen for it: bench depends on loadgen, never the other way round).
//
// Real volumes are not uniform: some blocks are zero (unused space, freshly
// allocated files), some are text (logs, configs), many are database pages
// (structured rows, a slot array, free space), and some are incompressible
// (media, encrypted or already compressed files). DataGenerator produces such a
// mixture block by block, reproducibly from a seed, with one knob:
//
//   compressibility 0..1 = the share of blocks that are NOT random.
//     0    -> every block is random (incompressible);
//     1    -> no random blocks (zero / text / database-page only);
//     0.75 -> the default "realistic mixed" data (25% random).
//   The compressible share is split among zero, text and database-page blocks
//   by zero_share : text_share : db_share.
//
// Block kinds:
//   kZero    all zero bytes.
//   kText    log lines: timestamp, level, component, message with numbers.
//   kDbPage  a slotted page: header (page number, LSN, checksum), slot array of
//            u16 offsets, fixed-schema rows packed from the end, zeros between.
//   kRandom  uniformly random bytes.
//
// Thread safety: a DataGenerator is not thread-safe; use one per thread (give
// each a different seed). Output depends only on the options and the sequence
// of calls, never on the clock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/base/coding.h"
#include "common/wire/protocol.h"

namespace cdp::loadgen {

enum class BlockKind : uint8_t { kZero, kText, kDbPage, kRandom };
std::string_view BlockKindName(BlockKind k);

struct DataMix {
  double compressibility = 0.75;  // 0..1, clamped
  double zero_share = 0.2;        // relative shares of the compressible blocks
  double text_share = 0.4;
  double db_share = 0.4;
  size_t block_size = 4096;       // bytes per block (> 0)
  uint64_t seed = 1;
};

class DataGenerator {
 public:
  explicit DataGenerator(const DataMix& mix = DataMix());

  // Picks the next block's kind from the mix and fills dst[0, n) with one block
  // of that kind (n need not equal block_size). Returns the kind.
  BlockKind NextBlock(uint8_t* dst, size_t n);
  // Fills dst[0, n) with one block of the given kind.
  void FillBlock(BlockKind kind, uint8_t* dst, size_t n);
  // Fills dst[0, n) block by block (the last block may be short).
  void Fill(uint8_t* dst, size_t n);
  // Returns n bytes of mixed data.
  Bytes Generate(size_t n);

  // Blocks of each kind produced so far (indexed by BlockKind).
  uint64_t count(BlockKind k) const { return counts_[static_cast<size_t>(k)]; }
  const DataMix& mix() const { return mix_; }

 private:
  uint64_t Next();             // xoshiro256**
  uint64_t Below(uint64_t n);  // uniform-ish in [0, n), n > 0
  double Unit();               // [0, 1)
  void FillRandom(uint8_t* dst, size_t n);
  void FillText(uint8_t* dst, size_t n);
  void FillDbPage(uint8_t* dst, size_t n);

  DataMix mix_;
  uint64_t s_[4];
  uint64_t counts_[4] = {0, 0, 0, 0};
  uint64_t clock_us_ = 1'795'000'000'000'000;  // synthetic time for log lines and rows
  uint64_t log_line_ = 0;
  uint64_t page_no_ = 0;
  uint64_t lsn_ = 1;
  uint64_t row_id_ = 1;
};

// A write batch of `records` kData records of mix.block_size bytes each, with
// contiguous sequences from `first_seq` and contiguous offsets from
// `first_offset`, data from `gen`, timestamps 1 us apart. codec = kNone.
proto::WriteBatch MakeWriteBatch(DataGenerator& gen, uint32_t volume_id, uint64_t first_seq,
                                 uint64_t first_offset, size_t records);

}  // namespace cdp::loadgen

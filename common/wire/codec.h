// SPDX-License-Identifier: Apache-2.0
// Codecs: none, lz4, zstd(level), behind one interface.
//
// Compress() appends the compressed form of `in` to `*out`. Decompress() is
// told the exact size the data must decompress to (carried beside it on the
// wire or on disk) and refuses anything else: a frame that would expand past
// `expected_size` (a decompression bomb) or stops short is kCorruption, and at
// most `expected_size` bytes are ever allocated. Callers cap `expected_size`
// (proto::kMaxBatchRaw) before calling.
// Both Compress() and Decompress() append to `*out`; on failure `*out` is left
// as it was. An `expected_size` above proto::kMaxBatchRaw is kInvalidArgument.
//
// Thread safety: a Codec object keeps per-thread-unsafe contexts; use one per
// thread (the compression pool does). The free functions are thread-safe.
#pragma once

#include <memory>
#include <string_view>

#include "common/base/coding.h"
#include "common/base/result.h"
#include "common/wire/protocol.h"

namespace cdp {

class Codec {
 public:
  virtual ~Codec() = default;
  virtual proto::Codec id() const = 0;
  virtual Status Compress(ByteSpan in, Bytes* out) = 0;
  virtual Status Decompress(ByteSpan in, size_t expected_size, Bytes* out) = 0;
};

// level: zstd 1..19 (0 means the default, 3; others are clamped to 1..19);
// ignored for lz4 and none. Returns nullptr for an id outside proto::Codec.
std::unique_ptr<Codec> NewCodec(proto::Codec id, int level = 0);

// Whether compressing `data` looks worth it, judged by a sample as btrfs's
// compression heuristic does: kSampleSlices slices of kSampleSlice bytes
// spread evenly over the data, compressed together, must shrink by at least
// 1/32. Data up to kSampleMin bytes is not sampled (true). The sample costs
// about 1/32 of compressing a 1 MiB block, where a block of random or
// encrypted data costs a full pass for nothing. Data compressible only at
// places the sample missed travels raw: the price of the shortcut.
inline constexpr size_t kSampleSlice = 4096;
inline constexpr size_t kSampleSlices = 8;
inline constexpr size_t kSampleMin = 64 * 1024;
bool SampleCompresses(Codec& codec, ByteSpan data);
// The same, of the concatenation of `pieces`.
bool SampleCompresses(Codec& codec, std::span<const ByteSpan> pieces);

// "none", "lz4", "zstd" <-> proto::Codec.
Result<proto::Codec> ParseCodecName(std::string_view name);
std::string_view CodecName(proto::Codec id);

}  // namespace cdp

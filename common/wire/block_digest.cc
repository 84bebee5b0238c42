// SPDX-License-Identifier: Apache-2.0
#include "common/wire/block_digest.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "common/wire/hash.h"

namespace cdp {

proto::Hash128 LeafDigest(const uint8_t* p, size_t n) {
  if (IsAllZero(p, n)) return kZeroDigest;
  proto::Hash128 h = Xxh3_128(p, n);
  if (h == kZeroDigest) h.low = 1;
  return h;
}

proto::Hash128 UnitDigest(std::span<const proto::Hash128> leaves) {
  if (leaves.size() == 1) return leaves[0];
  bool zero = true;
  for (const auto& l : leaves) zero = zero && l == kZeroDigest;
  if (zero) return kZeroDigest;
  Bytes flat(leaves.size() * 16);
  for (size_t i = 0; i < leaves.size(); ++i) {
    EncodeFixed64(flat.data() + 16 * i, leaves[i].low);
    EncodeFixed64(flat.data() + 16 * i + 8, leaves[i].high);
  }
  proto::Hash128 h = Xxh3_128(flat.data(), flat.size());
  if (h == kZeroDigest) h.low = 1;
  return h;
}

proto::Hash128 DigestOf(const uint8_t* p, size_t n) {
  std::vector<proto::Hash128> leaves;
  leaves.reserve((n + kLeafSize - 1) / kLeafSize);
  for (size_t i = 0; i < n; i += kLeafSize) leaves.push_back(LeafDigest(p + i, std::min<size_t>(kLeafSize, n - i)));
  return UnitDigest(leaves);
}

bool ValidUnitSize(uint64_t unit) { return std::has_single_bit(unit) && unit >= kLeafSize && unit <= (1ull << 30); }

std::vector<proto::Hash128> UnitsFromLeaves(std::span<const proto::Hash128> leaves, uint32_t unit) {
  const size_t per = unit / kLeafSize;
  std::vector<proto::Hash128> out;
  out.reserve((leaves.size() + per - 1) / per);
  for (size_t i = 0; i < leaves.size(); i += per) {
    out.push_back(UnitDigest(leaves.subspan(i, std::min(per, leaves.size() - i))));
  }
  return out;
}

Result<std::vector<proto::Hash128>> DigestReader::Leaves(uint64_t offset, uint64_t len) {
  if (offset % kLeafSize != 0) return Status::InvalidArgument("digest range must start on a 4 KiB boundary");
  if (offset >= src_.size) return Status::OutOfRange("digest range starts past the end of the volume");
  const uint64_t end = offset + std::min(len, src_.size - offset);
  std::vector<proto::Hash128> out;
  out.reserve(size_t((end - offset + kLeafSize - 1) / kLeafSize));
  uint64_t pos = offset;
  while (pos < end) {
    if (src_.next_data) {
      CDP_ASSIGN_OR_RETURN(uint64_t data, src_.next_data(pos));
      // [pos, data) is a hole: zero leaves without reading. A leaf only
      // partly in the hole is read.
      const uint64_t zero_end = std::min(end, data / kLeafSize * kLeafSize);
      if (zero_end > pos) {
        for (uint64_t p = pos; p < zero_end; p += kLeafSize) out.push_back(kZeroDigest);
        stats_.bytes_skipped += zero_end - pos;
        pos = zero_end;
        continue;
      }
    }
    if (buf_.empty()) buf_.resize(std::max<size_t>(chunk_, kLeafSize));
    const size_t n = size_t(std::min<uint64_t>(buf_.size(), end - pos));
    CDP_RETURN_IF_ERROR(src_.read(pos, n, buf_.data()));
    stats_.bytes_read += n;
    for (size_t i = 0; i < n; i += kLeafSize) {
      out.push_back(LeafDigest(buf_.data() + i, std::min<size_t>(kLeafSize, n - i)));
    }
    pos += n;
  }
  return out;
}

Result<std::vector<proto::Hash128>> DigestReader::Units(uint32_t unit, uint64_t first, uint32_t count) {
  if (!ValidUnitSize(unit)) return Status::InvalidArgument("unit size must be a power of two in 4 KiB..1 GiB");
  if (count == 0 || count > proto::kMaxHashes) return Status::InvalidArgument("bad unit count");
  const uint64_t units = (src_.size + unit - 1) / unit;
  if (first >= units) return Status::OutOfRange("unit past the end of the volume");
  const uint64_t last = std::min<uint64_t>(units, first + count);
  std::vector<proto::Hash128> out;
  out.reserve(size_t(last - first));
  for (uint64_t u = first; u < last; ++u) {
    const uint64_t begin = u * unit, end = std::min<uint64_t>(begin + unit, src_.size);
    if (src_.next_data) {
      // A unit wholly in a hole costs one seek, not a leaf list.
      CDP_ASSIGN_OR_RETURN(uint64_t data, src_.next_data(begin));
      if (data >= end) {
        out.push_back(kZeroDigest);
        stats_.bytes_skipped += end - begin;
        continue;
      }
    }
    CDP_ASSIGN_OR_RETURN(auto leaves, Leaves(begin, end - begin));
    out.push_back(UnitDigest(leaves));
  }
  return out;
}

}  // namespace cdp

// SPDX-License-Identifier: Apache-2.0
#include "common/nbd/nbd_replies.h"

#include <algorithm>

#include "common/nbd/nbd_proto.h"

namespace cdp::nbd {

namespace {
constexpr size_t kH = kStructuredReplyHeaderSize;
constexpr uint64_t kMinHole = 4096;
constexpr uint32_t kMaxDescriptorLength = 0xfffff000u;  // a u32, block aligned
}  // namespace

Bytes EncodeErrorChunk(uint64_t handle, uint32_t err) {
  Bytes b(kH + 6, 0);  // errno, then a message length of 0
  EncodeStructuredReply(b.data(), kReplyFlagDone, kReplyTypeError, handle, 6);
  EncodeBE32(b.data() + kH, err);
  return b;
}

Bytes EncodeDoneChunk(uint64_t handle) {
  Bytes b(kH);
  EncodeStructuredReply(b.data(), kReplyFlagDone, kReplyTypeNone, handle, 0);
  return b;
}

std::vector<DeviceExtent> ClipExtents(const std::vector<DeviceExtent>& ext, uint64_t len) {
  std::vector<DeviceExtent> out;
  uint64_t covered = 0;
  for (DeviceExtent e : ext) {
    if (covered >= len) break;
    e.length = std::min(e.length, len - covered);
    if (e.length == 0) continue;
    AppendExtent(&out, e);
    covered += e.length;
  }
  if (covered < len) AppendExtent(&out, DeviceExtent{len - covered, false, false});
  return out;
}

std::vector<ReadChunk> PlanRead(uint64_t offset, const std::vector<DeviceExtent>& ext) {
  std::vector<ReadChunk> chunks;
  uint64_t pos = offset;
  for (const DeviceExtent& e : ext) {
    // A hole needs room for itself and a data chunk after it within the cap.
    const bool hole = e.zero && e.length >= kMinHole && chunks.size() + 2 < kMaxReadChunks;
    if (!hole && !chunks.empty() && !chunks.back().hole) {
      chunks.back().length += e.length;
    } else {
      chunks.push_back(ReadChunk{pos, e.length, hole});
    }
    pos += e.length;
  }
  return chunks;
}

size_t ReadReplySize(const std::vector<ReadChunk>& chunks) {
  size_t total = 0;
  for (const ReadChunk& c : chunks) total += kH + (c.hole ? 12 : 8 + c.length);
  return total;
}

size_t EncodeReadChunk(uint8_t* p, uint64_t handle, const ReadChunk& c, bool last) {
  const uint16_t flags = last ? kReplyFlagDone : 0;
  if (c.hole) {
    EncodeStructuredReply(p, flags, kReplyTypeOffsetHole, handle, 12);
    EncodeBE64(p + kH, c.offset);
    EncodeBE32(p + kH + 8, uint32_t(c.length));
    return kH + 12;
  }
  EncodeStructuredReply(p, flags, kReplyTypeOffsetData, handle, uint32_t(8 + c.length));
  EncodeBE64(p + kH, c.offset);
  return kH + 8;
}

std::vector<StatusDescriptor> BlockStatusDescriptors(const std::vector<DeviceExtent>& ext, uint64_t length,
                                                     bool req_one) {
  std::vector<StatusDescriptor> desc;
  uint64_t covered = 0;
  for (const DeviceExtent& e : ext) {
    uint64_t left = std::min<uint64_t>(e.length, length - covered);
    const uint32_t flags = (e.hole ? kStateHole : 0) | (e.zero ? kStateZero : 0);
    while (left > 0 && desc.size() < kMaxDeviceExtents) {
      const uint32_t n = uint32_t(std::min<uint64_t>(left, kMaxDescriptorLength));
      desc.push_back(StatusDescriptor{n, flags});
      left -= n;
      covered += n;
    }
    if (req_one || covered >= length || desc.size() >= kMaxDeviceExtents) break;
  }
  if (req_one) desc.resize(1);
  return desc;
}

Bytes EncodeBlockStatus(uint64_t handle, uint32_t context_id, const std::vector<StatusDescriptor>& desc) {
  const uint32_t len = uint32_t(4 + 8 * desc.size());
  Bytes b(kH + len);
  uint8_t* p = b.data();
  EncodeStructuredReply(p, kReplyFlagDone, kReplyTypeBlockStatus, handle, len);
  p += kH;
  EncodeBE32(p, context_id);
  p += 4;
  for (const StatusDescriptor& d : desc) {
    EncodeBE32(p, d.length);
    EncodeBE32(p + 4, d.flags);
    p += 8;
  }
  return b;
}

void KnownData::Remember(uint64_t offset, const std::vector<StatusDescriptor>& desc) {
  ranges_.clear();
  uint64_t at = offset;
  for (const StatusDescriptor& d : desc) {
    if ((d.flags & kStateZero) == 0) {
      if (!ranges_.empty() && ranges_.back().second == at) {
        ranges_.back().second = at + d.length;
      } else {
        ranges_.emplace_back(at, at + d.length);
      }
    }
    at += d.length;
  }
}

bool KnownData::Covers(uint64_t offset, uint64_t len) const {
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), offset,
                             [](uint64_t off, const std::pair<uint64_t, uint64_t>& r) { return off < r.first; });
  if (it == ranges_.begin()) return false;
  --it;
  return offset >= it->first && offset + len <= it->second;
}

}  // namespace cdp::nbd

// SPDX-License-Identifier: Apache-2.0
// The server's structured replies (NBD_OPT_STRUCTURED_REPLY, docs/formats/
// nbd.md), as pure functions over a device's extents: how a READ is cut into
// OFFSET_HOLE and OFFSET_DATA chunks, the descriptors of a BLOCK_STATUS
// answer, the ERROR chunk, and which ranges a connection already knows to be
// data. No device and no I/O here: the connection (nbd_connection.cc) asks
// the device, reads the data chunks in place and sends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "common/base/coding.h"
#include "common/nbd/block_device.h"

namespace cdp::nbd {

// A structured reply of one NBD_REPLY_TYPE_ERROR chunk, flagged DONE, with
// errno `err` and no message (the server's log has the cause).
Bytes EncodeErrorChunk(uint64_t handle, uint32_t err);
// A structured reply of one NBD_REPLY_TYPE_NONE chunk, flagged DONE: the
// answer to a zero-length READ.
Bytes EncodeDoneChunk(uint64_t handle);

// `ext` cut or padded to exactly `len` bytes: extents past `len` are dropped,
// the last one shortened, and a shortfall (a device that answered less, or an
// empty list after a device error) is one data extent. Adjacent extents of
// the same kind are merged.
std::vector<DeviceExtent> ClipExtents(const std::vector<DeviceExtent>& ext, uint64_t len);

// One chunk of a structured READ reply.
struct ReadChunk {
  uint64_t offset = 0;
  uint64_t length = 0;
  bool hole = false;  // OFFSET_HOLE: no payload; otherwise OFFSET_DATA, read in place
  bool operator==(const ReadChunk&) const = default;
};
// Most chunks one READ reply has: past it the rest is one data chunk.
inline constexpr size_t kMaxReadChunks = 64;

// The chunks of a READ of [offset, offset + sum of ext): a zero extent of at
// least one 4 KiB block is a hole, everything else data, adjacent data merged,
// at most kMaxReadChunks. `ext` must cover the READ exactly (ClipExtents).
std::vector<ReadChunk> PlanRead(uint64_t offset, const std::vector<DeviceExtent>& ext);
// Bytes of the whole reply to `chunks`: headers, payload headers and data.
size_t ReadReplySize(const std::vector<ReadChunk>& chunks);
// Writes chunk `c`'s header and payload header at `p` (DONE when `last`) and
// returns their size. A data chunk's c.length data bytes go right after.
size_t EncodeReadChunk(uint8_t* p, uint64_t handle, const ReadChunk& c, bool last);

// One BLOCK_STATUS descriptor: a length and NBD_STATE_* flags.
struct StatusDescriptor {
  uint32_t length = 0;
  uint32_t flags = 0;
  bool operator==(const StatusDescriptor&) const = default;
};
// The descriptors that answer a BLOCK_STATUS of `length` bytes from the
// device's extents: an extent longer than a u32 is split, none reaches past
// `length`, at most kMaxDeviceExtents; with `req_one`, exactly one.
// `ext` must not be empty.
std::vector<StatusDescriptor> BlockStatusDescriptors(const std::vector<DeviceExtent>& ext, uint64_t length,
                                                     bool req_one);
// The BLOCK_STATUS chunk (DONE) of context `context_id` with `desc`.
Bytes EncodeBlockStatus(uint64_t handle, uint32_t context_id, const std::vector<StatusDescriptor>& desc);

// The data ranges of a connection's last BLOCK_STATUS answer. A READ wholly
// inside one needs no second allocation query: it is one data chunk (as
// nbdcopy and qemu-img read, map first). A data claim stays true whatever is
// written since (data means allocated or not known); a zero claim would not,
// so only data is remembered.
class KnownData {
 public:
  // Replaces what is known with the data descriptors of an answer at `offset`.
  void Remember(uint64_t offset, const std::vector<StatusDescriptor>& desc);
  // Whether [offset, offset + len) lies in one remembered data range.
  bool Covers(uint64_t offset, uint64_t len) const;

 private:
  std::vector<std::pair<uint64_t, uint64_t>> ranges_;  // [begin, end), sorted, disjoint
};

}  // namespace cdp::nbd

// SPDX-License-Identifier: Apache-2.0
// What each transmission request does to an export (nbd_server_impl.h,
// ExecuteRequest): the device call, the export's counters, and the reply,
// simple or structured (the chunk layout is nbd_replies.h). The connection
// (nbd_connection.cc) owns the wire, the strands and the in-flight cap.
#include "common/nbd/nbd_server_impl.h"

namespace cdp::nbd_detail {

namespace {

// A structured reply of one ERROR chunk.
Reply ErrorChunk(const RequestContext& ctx, const nbd::Request& r, uint32_t err) {
  ctx.export_entry.errors++;
  return Reply::Of(nbd::EncodeErrorChunk(r.handle, err));
}

// READ with structured replies: OFFSET_HOLE chunks for the runs the device
// reports as zeros, OFFSET_DATA chunks read in place for the rest, the last
// chunk flagged DONE; any failure is one ERROR chunk instead. A READ inside
// a data extent of the connection's last BLOCK_STATUS asks no allocation.
Reply StructuredRead(const RequestContext& ctx, const nbd::Request& r) {
  ExportEntry& st = ctx.export_entry;
  if (r.length == 0) return Reply::Of(nbd::EncodeDoneChunk(r.handle));
  std::vector<DeviceExtent> ext;
  if (ctx.known != nullptr ? ctx.known->Covers(r.offset, r.length) : ctx.read_in_known_data) {
    ext.push_back(DeviceExtent{r.length, false, false});
  } else if (!ctx.device.Extents(r.offset, r.length, &ext).ok()) {
    ext.clear();  // all data: the read then finds the error itself
  }
  const std::vector<nbd::ReadChunk> chunks = nbd::PlanRead(r.offset, nbd::ClipExtents(ext, r.length));
  Reply o;
  o.block_size = nbd::ReadReplySize(chunks);
  o.block.reset(new uint8_t[o.block_size]);  // not zero-filled: every byte is written below
  uint8_t* p = o.block.get();
  for (size_t i = 0; i < chunks.size(); ++i) {
    const nbd::ReadChunk& c = chunks[i];
    p += nbd::EncodeReadChunk(p, r.handle, c, i + 1 == chunks.size());
    if (c.hole) continue;
    Status s = ctx.device.Read(c.offset, uint32_t(c.length), p);
    if (!s.ok()) {
      ctx.log.warn("{} READ offset {} length {} failed: {}", log::Where{st.name, ctx.peer, 0}, c.offset, c.length,
                   s.ToString());
      return ErrorChunk(ctx, r, nbd::ErrorFromStatus(s));
    }
    p += c.length;
  }
  st.reads++, st.bytes_read += r.length;
  return o;
}

// NBD_CMD_BLOCK_STATUS for base:allocation: one BLOCK_STATUS chunk, DONE.
Reply BlockStatus(const RequestContext& ctx, const nbd::Request& r) {
  std::vector<DeviceExtent> ext;
  Status s = ctx.device.Extents(r.offset, r.length, &ext);
  if (!s.ok() || ext.empty()) {
    ctx.log.warn("{} BLOCK_STATUS offset {} length {} failed: {}", log::Where{ctx.export_entry.name, ctx.peer, 0},
                 r.offset, r.length, s.ok() ? "no extents" : s.ToString());
    return ErrorChunk(ctx, r, s.ok() ? nbd::kEIO : nbd::ErrorFromStatus(s));
  }
  const std::vector<nbd::StatusDescriptor> desc =
      nbd::BlockStatusDescriptors(ext, r.length, (r.flags & nbd::kCmdFlagReqOne) != 0);
  ctx.known->Remember(r.offset, desc);
  ctx.export_entry.block_status_ops++;
  return Reply::Of(nbd::EncodeBlockStatus(r.handle, nbd::kBaseAllocationId, desc));
}

// Every other command, and READ without structured replies: a simple reply.
Reply SimpleReply(const RequestContext& ctx, const nbd::Request& r, Bytes payload, uint32_t err) {
  Reply reply;
  reply.block_size = nbd::kSimpleReplySize;
  if (err == 0 && r.type == nbd::kCmdRead) reply.block_size += r.length;
  reply.block.reset(new uint8_t[reply.block_size]);  // default-initialised: not zero-filled
  ExportEntry& st = ctx.export_entry;
  BlockDevice& dev = ctx.device;
  if (err == 0) {
    const bool fua = (r.flags & nbd::kCmdFlagFua) != 0;
    const uint64_t len = r.length;
    Status s;
    // Zero-length requests succeed without reaching the device.
    switch (r.type) {
      case nbd::kCmdRead:
        if (len > 0) s = dev.Read(r.offset, r.length, reply.block.get() + nbd::kSimpleReplySize);
        if (s.ok()) st.reads++, st.bytes_read += len;
        break;
      case nbd::kCmdWrite:
        // Handed over, not copied: the capture queue keeps this very buffer.
        if (len > 0) s = dev.WriteShared(r.offset, std::make_shared<const Bytes>(std::move(payload)), fua);
        if (s.ok()) st.writes++, st.bytes_written += len;
        break;
      case nbd::kCmdTrim:
        if (len > 0) s = dev.Trim(r.offset, len, fua);
        if (s.ok()) st.trims++, st.bytes_trimmed += len;
        break;
      case nbd::kCmdWriteZeroes:
        if (len > 0) s = dev.WriteZeroes(r.offset, len, fua, (r.flags & nbd::kCmdFlagNoHole) == 0);
        if (s.ok()) st.zero_ops++, st.bytes_zeroed += len;
        break;
      case nbd::kCmdFlush:
        s = dev.Flush();
        if (s.ok()) st.flushes++;
        break;
      default:
        s = Status::InvalidArgument("unexpected command");  // CheckRequest let it through
        break;
    }
    err = nbd::ErrorFromStatus(s);
    if (err != 0) {
      ctx.log.warn("{} {} offset {} length {} failed: {}", log::Where{st.name, ctx.peer, 0},
                   nbd::CommandName(r.type), r.offset, r.length, s.ToString());
    }
  }
  if (err != 0) {
    st.errors++;
    reply.block_size = nbd::kSimpleReplySize;  // a simple reply carries no data on error
  }
  nbd::EncodeSimpleReply(reply.block.get(), err, r.handle);
  return reply;
}

}  // namespace

Reply ExecuteRequest(const RequestContext& ctx, const nbd::Request& r, Bytes payload, uint32_t err) {
  if (err != 0) {
    ctx.log.debug("{} {} offset {} length {} flags 0x{:x} refused with error {}",
                  log::Where{ctx.export_entry.name, ctx.peer, 0}, nbd::CommandName(r.type), r.offset, r.length,
                  r.flags, err);
  }
  if (ctx.structured && (r.type == nbd::kCmdRead || r.type == nbd::kCmdBlockStatus)) {
    if (err != 0) return ErrorChunk(ctx, r, err);
    return r.type == nbd::kCmdRead ? StructuredRead(ctx, r) : BlockStatus(ctx, r);
  }
  return SimpleReply(ctx, r, std::move(payload), err);
}

}  // namespace cdp::nbd_detail

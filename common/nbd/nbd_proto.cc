// SPDX-License-Identifier: Apache-2.0
#include "common/nbd/nbd_proto.h"

#include <algorithm>
#include <cerrno>

namespace cdp::nbd {
namespace {

// True when the first min(n, 8) bytes of `in` agree with the big-endian
// encoding of `magic` (of width `width` bytes).
bool MagicPrefixMatches(ByteSpan in, uint64_t magic, size_t width) {
  const size_t n = std::min(in.size(), width);
  for (size_t i = 0; i < n; ++i) {
    if (in[i] != uint8_t(magic >> (8 * (width - 1 - i)))) return false;
  }
  return true;
}

}  // namespace

ParseResult ParseClientFlags(ByteSpan in, bool server_offered_no_zeroes, uint32_t* flags) {
  if (in.size() < kClientFlagsSize) return ParseResult::kNeedMore;
  const uint32_t f = DecodeBE32(in.data());
  const uint32_t known = kClientFlagFixedNewstyle | kClientFlagNoZeroes;
  if ((f & ~known) != 0) return ParseResult::kBad;
  if ((f & kClientFlagFixedNewstyle) == 0) return ParseResult::kBad;
  if ((f & kClientFlagNoZeroes) != 0 && !server_offered_no_zeroes) return ParseResult::kBad;
  *flags = f;
  return ParseResult::kComplete;
}

ParseResult ParseOptionHeader(ByteSpan in, OptionHeader* out) {
  if (!MagicPrefixMatches(in, kIHaveOpt, 8)) return ParseResult::kBad;
  if (in.size() < kOptionHeaderSize) return ParseResult::kNeedMore;
  out->option = DecodeBE32(in.data() + 8);
  out->length = DecodeBE32(in.data() + 12);
  return ParseResult::kComplete;
}

ParseResult ParseRequest(ByteSpan in, Request* out) {
  if (!MagicPrefixMatches(in, kRequestMagic, 4)) return ParseResult::kBad;
  if (in.size() < kRequestHeaderSize) return ParseResult::kNeedMore;
  const uint8_t* p = in.data();
  out->flags = DecodeBE16(p + 4);
  out->type = DecodeBE16(p + 6);
  out->handle = DecodeBE64(p + 8);
  out->offset = DecodeBE64(p + 16);
  out->length = DecodeBE32(p + 24);
  return ParseResult::kComplete;
}

bool ValidWireName(std::string_view name) {
  return name.size() <= kMaxStringLength && name.find('\0') == std::string_view::npos;
}

Status ParseInfoRequest(ByteSpan payload, InfoRequest* out) {
  if (payload.size() < 6) return Status::InvalidArgument("NBD_OPT_INFO/GO data shorter than 6 bytes");
  const uint32_t name_len = DecodeBE32(payload.data());
  if (name_len > payload.size() - 6) return Status::InvalidArgument("NBD_OPT_INFO/GO name length exceeds the option data");
  if (name_len > kMaxStringLength) return Status::InvalidArgument("export name longer than 4096 bytes");
  std::string name(reinterpret_cast<const char*>(payload.data() + 4), name_len);
  if (!ValidWireName(name)) return Status::InvalidArgument("export name holds a NUL byte");
  const uint8_t* p = payload.data() + 4 + name_len;
  const uint16_t count = DecodeBE16(p);
  const size_t rest = payload.size() - 6 - name_len;
  if (rest != size_t(count) * 2) return Status::InvalidArgument("NBD_OPT_INFO/GO request count does not match the data length");
  out->name = std::move(name);
  out->infos.clear();
  out->infos.reserve(count);
  for (size_t i = 0; i < count; ++i) out->infos.push_back(DecodeBE16(p + 2 + 2 * i));
  return Status::OK();
}

Status ParseMetaContextRequest(ByteSpan payload, MetaContextRequest* out) {
  // A string at `p`: u32 length, then the bytes; advances `p`.
  auto take = [&](ByteSpan* p, std::string* s, const char* what) -> Status {
    if (p->size() < 4) return Status::InvalidArgument(std::string(what) + " length runs past the option data");
    const uint32_t n = DecodeBE32(p->data());
    if (n > p->size() - 4) return Status::InvalidArgument(std::string(what) + " runs past the option data");
    if (n > kMaxStringLength) return Status::InvalidArgument(std::string(what) + " longer than 4096 bytes");
    s->assign(reinterpret_cast<const char*>(p->data() + 4), n);
    if (!ValidWireName(*s)) return Status::InvalidArgument(std::string(what) + " holds a NUL byte");
    *p = p->subspan(4 + n);
    return Status::OK();
  };
  ByteSpan p = payload;
  MetaContextRequest r;
  CDP_RETURN_IF_ERROR(take(&p, &r.name, "export name"));
  if (p.size() < 4) return Status::InvalidArgument("meta context request without a query count");
  const uint32_t count = DecodeBE32(p.data());
  p = p.subspan(4);
  if (count > kMaxMetaQueries) {
    return Status::InvalidArgument("more than " + std::to_string(kMaxMetaQueries) + " meta context queries");
  }
  for (uint32_t i = 0; i < count; ++i) {
    std::string q;
    CDP_RETURN_IF_ERROR(take(&p, &q, "meta context query"));
    r.queries.push_back(std::move(q));
  }
  if (!p.empty()) return Status::InvalidArgument("meta context request has bytes after its queries");
  *out = std::move(r);
  return Status::OK();
}

Bytes EncodeMetaContext(uint32_t id, std::string_view name) {
  Bytes b;
  PutBE32(b, id);
  b.insert(b.end(), name.begin(), name.end());
  return b;
}

void EncodeStructuredReply(uint8_t* p, uint16_t flags, uint16_t type, uint64_t handle, uint32_t length) {
  EncodeBE32(p, kStructuredReplyMagic);
  p[4] = uint8_t(flags >> 8);
  p[5] = uint8_t(flags);
  p[6] = uint8_t(type >> 8);
  p[7] = uint8_t(type);
  EncodeBE64(p + 8, handle);
  EncodeBE32(p + 16, length);
}

Bytes EncodeGreeting(uint16_t handshake_flags) {
  Bytes b;
  b.reserve(kGreetingSize);
  PutBE64(b, kNbdMagic);
  PutBE64(b, kIHaveOpt);
  PutBE16(b, handshake_flags);
  return b;
}

Bytes EncodeOptionReply(uint32_t option, uint32_t reply_type, ByteSpan data) {
  Bytes b;
  b.reserve(kOptReplyHeaderSize + data.size());
  PutBE64(b, kOptReplyMagic);
  PutBE32(b, option);
  PutBE32(b, reply_type);
  PutBE32(b, uint32_t(data.size()));
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

Bytes EncodeOptionReply(uint32_t option, uint32_t reply_type, std::string_view text) {
  if (text.size() > kMaxStringLength) text = text.substr(0, kMaxStringLength);
  return EncodeOptionReply(option, reply_type,
                           ByteSpan(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

Bytes EncodeServerReplyData(std::string_view name, std::string_view description) {
  Bytes b;
  PutBE32(b, uint32_t(name.size()));
  PutBytes(b, name);
  PutBytes(b, description.substr(0, kMaxStringLength));
  return b;
}

Bytes EncodeInfoExport(uint64_t size, uint16_t transmission_flags) {
  Bytes b;
  PutBE16(b, kInfoExport);
  PutBE64(b, size);
  PutBE16(b, transmission_flags);
  return b;
}

Bytes EncodeInfoString(uint16_t info_type, std::string_view s) {
  Bytes b;
  PutBE16(b, info_type);
  PutBytes(b, s.substr(0, kMaxStringLength));
  return b;
}

Bytes EncodeInfoBlockSize(uint32_t minimum, uint32_t preferred, uint32_t maximum) {
  Bytes b;
  PutBE16(b, kInfoBlockSize);
  PutBE32(b, minimum);
  PutBE32(b, preferred);
  PutBE32(b, maximum);
  return b;
}

Bytes EncodeExportNameReply(uint64_t size, uint16_t transmission_flags, bool no_zeroes) {
  Bytes b;
  PutBE64(b, size);
  PutBE16(b, transmission_flags);
  if (!no_zeroes) b.insert(b.end(), kExportNameReplyZeroes, 0);
  return b;
}

void EncodeSimpleReply(uint8_t* p, uint32_t error, uint64_t handle) {
  EncodeBE32(p, kSimpleReplyMagic);
  EncodeBE32(p + 4, error);
  EncodeBE64(p + 8, handle);
}

Bytes EncodeRequest(const Request& r) {
  Bytes b;
  b.reserve(kRequestHeaderSize);
  PutBE32(b, kRequestMagic);
  PutBE16(b, r.flags);
  PutBE16(b, r.type);
  PutBE64(b, r.handle);
  PutBE64(b, r.offset);
  PutBE32(b, r.length);
  return b;
}

uint32_t CheckRequest(const Request& r, const ExportLimits& limits) {
  const uint16_t tf = limits.transmission_flags;
  uint16_t allowed_flags = 0;
  uint16_t needed_tflag = 0;
  bool writes = false;
  switch (r.type) {
    case kCmdDisc:
      return 0;
    case kCmdRead:
      break;
    case kCmdWrite:
      writes = true;
      break;
    case kCmdFlush:
      needed_tflag = kFlagSendFlush;
      break;
    case kCmdTrim:
      needed_tflag = kFlagSendTrim;
      writes = true;
      break;
    case kCmdWriteZeroes:
      needed_tflag = kFlagSendWriteZeroes;
      allowed_flags |= kCmdFlagNoHole;
      if (tf & kFlagSendFastZero) allowed_flags |= kCmdFlagFastZero;
      writes = true;
      break;
    case kCmdBlockStatus:
      if (!limits.block_status || r.length == 0) return kEINVAL;
      allowed_flags |= kCmdFlagReqOne;
      break;
    default:
      return kEINVAL;  // CACHE and unknown commands
  }
  // FUA is valid on every command once NBD_FLAG_SEND_FUA was advertised.
  if (tf & kFlagSendFua) allowed_flags |= kCmdFlagFua;
  if ((r.flags & ~allowed_flags) != 0) return kEINVAL;
  if (needed_tflag != 0 && (tf & needed_tflag) == 0) return kEINVAL;
  if (writes && (tf & kFlagReadOnly)) return kEPERM;
  // FAST_ZERO: only a punched hole is fast (BlockDeviceFeatures::fast_zero);
  // with NO_HOLE zeros would be written, so fail at once, touching nothing.
  if ((r.flags & kCmdFlagFastZero) && (r.flags & kCmdFlagNoHole)) return kENOTSUP;
  if ((r.type == kCmdRead || r.type == kCmdWrite) && r.length > limits.max_payload) return kEINVAL;
  if (r.type == kCmdFlush) return 0;  // offset and length are reserved
  const bool past_end = r.offset > limits.size || uint64_t(r.length) > limits.size - r.offset;
  if (past_end) {
    return (r.type == kCmdWrite || r.type == kCmdWriteZeroes) ? kENOSPC : kEINVAL;
  }
  return 0;
}

uint32_t ErrorFromStatus(const Status& s) {
  switch (s.code()) {
    case Code::kOk:
      return 0;
    case Code::kNoSpace:
      return kENOSPC;
    case Code::kPermissionDenied:
      return kEPERM;
    case Code::kInvalidArgument:
    case Code::kOutOfRange:
    case Code::kNotSupported:
      return kEINVAL;
    case Code::kAborted:
      return kESHUTDOWN;
    default:
      // The spec asks for EDQUOT and EFBIG to be reported as ENOSPC.
      if (s.errno_value() == EFBIG || s.errno_value() == EDQUOT) return kENOSPC;
      return kEIO;
  }
}

std::string CommandName(uint16_t type) {
  switch (type) {
    case kCmdRead: return "READ";
    case kCmdWrite: return "WRITE";
    case kCmdDisc: return "DISC";
    case kCmdFlush: return "FLUSH";
    case kCmdTrim: return "TRIM";
    case kCmdCache: return "CACHE";
    case kCmdWriteZeroes: return "WRITE_ZEROES";
    case kCmdBlockStatus: return "BLOCK_STATUS";
    default: return "CMD(" + std::to_string(type) + ")";
  }
}

}  // namespace cdp::nbd

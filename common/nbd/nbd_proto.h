// SPDX-License-Identifier: Apache-2.0
// NBD protocol: constants, and pure parsers/encoders for the messages the
// server exchanges (NetworkBlockDevice/nbd doc/proto.md). Everything here is
// a pure function over byte spans: it knows nothing about sockets, so tests
// feed it one byte at a time. The server (common/nbd/nbd_server.h) drives it.
//
// Byte order: the NBD protocol is big-endian ("network byte order") on the
// wire. That is a fixed external format, so this file has its own big-endian
// encoders; OpenCDP's own formats stay little-endian (common/base/coding.h).
//
// Parsers answer kComplete (and how many bytes they used), kNeedMore (nothing
// consumed; call again with more bytes) or kBad (the peer broke the protocol;
// the connection must be closed). A parser reports kBad as soon as the bytes
// seen so far prove the message bad (for example a wrong magic), even before
// the whole header has arrived.
//
// Thread safety: all functions are pure; no shared state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/coding.h"
#include "common/base/status.h"

namespace cdp::nbd {

// ---- Magics -----------------------------------------------------------------
inline constexpr uint64_t kNbdMagic = 0x4e42444d41474943ull;        // "NBDMAGIC"
inline constexpr uint64_t kIHaveOpt = 0x49484156454F5054ull;        // "IHAVEOPT"
inline constexpr uint64_t kOptReplyMagic = 0x0003e889045565a9ull;
inline constexpr uint32_t kRequestMagic = 0x25609513u;
inline constexpr uint32_t kSimpleReplyMagic = 0x67446698u;
inline constexpr uint32_t kStructuredReplyMagic = 0x668e33efu;

// ---- Handshake flags (server, 16 bits) and client flags (32 bits) ----------
inline constexpr uint16_t kFlagFixedNewstyle = 1u << 0;
inline constexpr uint16_t kFlagNoZeroes = 1u << 1;
inline constexpr uint32_t kClientFlagFixedNewstyle = 1u << 0;
inline constexpr uint32_t kClientFlagNoZeroes = 1u << 1;

// ---- Transmission flags (16 bits) ------------------------------------------
inline constexpr uint16_t kFlagHasFlags = 1u << 0;
inline constexpr uint16_t kFlagReadOnly = 1u << 1;
inline constexpr uint16_t kFlagSendFlush = 1u << 2;
inline constexpr uint16_t kFlagSendFua = 1u << 3;
inline constexpr uint16_t kFlagRotational = 1u << 4;
inline constexpr uint16_t kFlagSendTrim = 1u << 5;
inline constexpr uint16_t kFlagSendWriteZeroes = 1u << 6;
inline constexpr uint16_t kFlagSendDf = 1u << 7;
inline constexpr uint16_t kFlagCanMultiConn = 1u << 8;
inline constexpr uint16_t kFlagSendResize = 1u << 9;
inline constexpr uint16_t kFlagSendCache = 1u << 10;
inline constexpr uint16_t kFlagSendFastZero = 1u << 11;

// ---- Options ----------------------------------------------------------------
inline constexpr uint32_t kOptExportName = 1;
inline constexpr uint32_t kOptAbort = 2;
inline constexpr uint32_t kOptList = 3;
inline constexpr uint32_t kOptStartTls = 5;
inline constexpr uint32_t kOptInfo = 6;
inline constexpr uint32_t kOptGo = 7;
inline constexpr uint32_t kOptStructuredReply = 8;
inline constexpr uint32_t kOptListMetaContext = 9;
inline constexpr uint32_t kOptSetMetaContext = 10;

// ---- Option replies ---------------------------------------------------------
inline constexpr uint32_t kRepAck = 1;
inline constexpr uint32_t kRepServer = 2;
inline constexpr uint32_t kRepInfo = 3;
inline constexpr uint32_t kRepMetaContext = 4;
inline constexpr uint32_t kRepErrBit = 1u << 31;
inline constexpr uint32_t kRepErrUnsup = kRepErrBit | 1;
inline constexpr uint32_t kRepErrPolicy = kRepErrBit | 2;
inline constexpr uint32_t kRepErrInvalid = kRepErrBit | 3;
inline constexpr uint32_t kRepErrPlatform = kRepErrBit | 4;
inline constexpr uint32_t kRepErrTlsReqd = kRepErrBit | 5;
inline constexpr uint32_t kRepErrUnknown = kRepErrBit | 6;
inline constexpr uint32_t kRepErrShutdown = kRepErrBit | 7;
inline constexpr uint32_t kRepErrBlockSizeReqd = kRepErrBit | 8;
inline constexpr uint32_t kRepErrTooBig = kRepErrBit | 9;

// ---- NBD_REP_INFO types -----------------------------------------------------
inline constexpr uint16_t kInfoExport = 0;
inline constexpr uint16_t kInfoName = 1;
inline constexpr uint16_t kInfoDescription = 2;
inline constexpr uint16_t kInfoBlockSize = 3;

// ---- Commands and command flags --------------------------------------------
inline constexpr uint16_t kCmdRead = 0;
inline constexpr uint16_t kCmdWrite = 1;
inline constexpr uint16_t kCmdDisc = 2;
inline constexpr uint16_t kCmdFlush = 3;
inline constexpr uint16_t kCmdTrim = 4;
inline constexpr uint16_t kCmdCache = 5;
inline constexpr uint16_t kCmdWriteZeroes = 6;
inline constexpr uint16_t kCmdBlockStatus = 7;

inline constexpr uint16_t kCmdFlagFua = 1u << 0;
inline constexpr uint16_t kCmdFlagNoHole = 1u << 1;
inline constexpr uint16_t kCmdFlagDf = 1u << 2;
inline constexpr uint16_t kCmdFlagReqOne = 1u << 3;
inline constexpr uint16_t kCmdFlagFastZero = 1u << 4;

// ---- Structured replies (NBD_OPT_STRUCTURED_REPLY) and block status ----------
inline constexpr uint16_t kReplyFlagDone = 1u << 0;
inline constexpr uint16_t kReplyTypeNone = 0;
inline constexpr uint16_t kReplyTypeOffsetData = 1;
inline constexpr uint16_t kReplyTypeOffsetHole = 2;
inline constexpr uint16_t kReplyTypeBlockStatus = 5;
inline constexpr uint16_t kReplyTypeError = (1u << 15) + 1;
// base:allocation flags of a block status descriptor.
inline constexpr uint32_t kStateHole = 1u << 0;
inline constexpr uint32_t kStateZero = 1u << 1;
// The one metadata context we serve, and its id on every connection.
inline constexpr std::string_view kBaseAllocation = "base:allocation";
inline constexpr uint32_t kBaseAllocationId = 1;

// ---- Errors (reply error field) ---------------------------------------------
inline constexpr uint32_t kEPERM = 1;
inline constexpr uint32_t kEIO = 5;
inline constexpr uint32_t kENOMEM = 12;
inline constexpr uint32_t kEINVAL = 22;
inline constexpr uint32_t kENOSPC = 28;
inline constexpr uint32_t kEOVERFLOW = 75;
inline constexpr uint32_t kENOTSUP = 95;
inline constexpr uint32_t kESHUTDOWN = 108;

// ---- Sizes ------------------------------------------------------------------
inline constexpr size_t kGreetingSize = 18;      // NBDMAGIC, IHAVEOPT, u16 flags
inline constexpr size_t kClientFlagsSize = 4;
inline constexpr size_t kOptionHeaderSize = 16;  // IHAVEOPT, u32 option, u32 length
inline constexpr size_t kOptReplyHeaderSize = 20;
inline constexpr size_t kRequestHeaderSize = 28;
inline constexpr size_t kSimpleReplySize = 16;
inline constexpr size_t kStructuredReplyHeaderSize = 20;  // magic, flags, type, handle, length
inline constexpr size_t kExportNameReplyZeroes = 124;
inline constexpr size_t kMaxStringLength = 4096;  // spec: strings MUST be <= 4096 bytes

// ---- Big-endian helpers -----------------------------------------------------
inline void PutBE16(Bytes& b, uint16_t v) {
  b.push_back(uint8_t(v >> 8));
  b.push_back(uint8_t(v));
}
inline void PutBE32(Bytes& b, uint32_t v) {
  for (int i = 3; i >= 0; --i) b.push_back(uint8_t(v >> (8 * i)));
}
inline void PutBE64(Bytes& b, uint64_t v) {
  for (int i = 7; i >= 0; --i) b.push_back(uint8_t(v >> (8 * i)));
}
inline void EncodeBE32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * (3 - i)));
}
inline void EncodeBE64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = uint8_t(v >> (8 * (7 - i)));
}
inline uint16_t DecodeBE16(const uint8_t* p) { return uint16_t((uint16_t(p[0]) << 8) | p[1]); }
inline uint32_t DecodeBE32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = (v << 8) | p[i];
  return v;
}
inline uint64_t DecodeBE64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return v;
}

// ---- Parsers ----------------------------------------------------------------
enum class ParseResult { kComplete, kNeedMore, kBad };

// Client flags (4 bytes). kBad when a bit other than FIXED_NEWSTYLE and
// NO_ZEROES is set, or when FIXED_NEWSTYLE is missing (this server speaks
// fixed newstyle only), or NO_ZEROES without `server_offered_no_zeroes`.
ParseResult ParseClientFlags(ByteSpan in, bool server_offered_no_zeroes, uint32_t* flags);

struct OptionHeader {
  uint32_t option = 0;
  uint32_t length = 0;  // option data bytes that follow; NOT capped here
};
// Option header (16 bytes). kBad on a wrong IHAVEOPT magic.
ParseResult ParseOptionHeader(ByteSpan in, OptionHeader* out);

struct Request {
  uint16_t flags = 0;
  uint16_t type = 0;
  uint64_t handle = 0;
  uint64_t offset = 0;
  uint32_t length = 0;
};
// Request header (28 bytes); a WRITE's `length` payload bytes follow it and
// are not part of this parse. kBad on a wrong request magic.
ParseResult ParseRequest(ByteSpan in, Request* out);

// NBD_OPT_INFO / NBD_OPT_GO data: u32 name length, name, u16 count, u16[count].
struct InfoRequest {
  std::string name;
  std::vector<uint16_t> infos;
};
// Parses a complete option payload. kInvalidArgument (-> NBD_REP_ERR_INVALID)
// when lengths are inconsistent, the name is longer than 4096 bytes or holds
// a NUL, or the trailing data does not match the request count exactly.
Status ParseInfoRequest(ByteSpan payload, InfoRequest* out);

// A name the spec allows on the wire: <= 4096 bytes, no NUL.
bool ValidWireName(std::string_view name);

// NBD_OPT_LIST_META_CONTEXT / NBD_OPT_SET_META_CONTEXT data: u32 name length,
// name, u32 query count, then each query as u32 length + string. At most
// kMaxMetaQueries queries, each a valid string; kInvalidArgument otherwise
// (-> NBD_REP_ERR_INVALID), naming what is wrong.
inline constexpr uint32_t kMaxMetaQueries = 64;
struct MetaContextRequest {
  std::string name;
  std::vector<std::string> queries;
};
Status ParseMetaContextRequest(ByteSpan payload, MetaContextRequest* out);
// The data of one NBD_REP_META_CONTEXT: u32 id, then the context's name.
Bytes EncodeMetaContext(uint32_t id, std::string_view name);

// ---- Encoders ---------------------------------------------------------------
// Server greeting: NBDMAGIC, IHAVEOPT, handshake flags.
Bytes EncodeGreeting(uint16_t handshake_flags);
// Option reply: magic, option, reply type, length, data.
Bytes EncodeOptionReply(uint32_t option, uint32_t reply_type, ByteSpan data = {});
Bytes EncodeOptionReply(uint32_t option, uint32_t reply_type, std::string_view text);
// NBD_REP_SERVER payload: u32 name length, name, then the description.
Bytes EncodeServerReplyData(std::string_view name, std::string_view description);
// NBD_REP_INFO payloads.
Bytes EncodeInfoExport(uint64_t size, uint16_t transmission_flags);
Bytes EncodeInfoString(uint16_t info_type, std::string_view s);  // NAME or DESCRIPTION
Bytes EncodeInfoBlockSize(uint32_t minimum, uint32_t preferred, uint32_t maximum);
// Reply to NBD_OPT_EXPORT_NAME: u64 size, u16 flags, 124 zero bytes unless no_zeroes.
Bytes EncodeExportNameReply(uint64_t size, uint16_t transmission_flags, bool no_zeroes);
// Simple reply header (16 bytes) written at `p`.
void EncodeSimpleReply(uint8_t* p, uint32_t error, uint64_t handle);
// Structured reply chunk header (20 bytes) written at `p`; `length` is the
// payload's that follows.
void EncodeStructuredReply(uint8_t* p, uint16_t flags, uint16_t type, uint64_t handle, uint32_t length);
// A full request header, as a client sends it (used by tests and tools).
Bytes EncodeRequest(const Request& r);

// ---- Request validation -----------------------------------------------------
struct ExportLimits {
  uint64_t size = 0;
  uint16_t transmission_flags = 0;  // what was advertised to the client
  uint32_t max_payload = 32u << 20;  // cap for READ and WRITE lengths
  // NBD_CMD_BLOCK_STATUS is valid: structured replies and base:allocation
  // were negotiated for this export.
  bool block_status = false;
};
// The NBD error a request must be answered with before touching the device,
// or 0 if it may be executed. Follows proto.md "Error values":
//   unknown command, unknown or inapplicable flag, command not advertised -> EINVAL
//   WRITE / TRIM / WRITE_ZEROES on a read-only export                  -> EPERM
//   READ / WRITE longer than max_payload                               -> EINVAL
//   WRITE / WRITE_ZEROES past the end                                  -> ENOSPC
//   READ / TRIM / BLOCK_STATUS past the end (or offset + length overflowing) -> EINVAL
//   BLOCK_STATUS without a negotiated context, or of length 0           -> EINVAL
//   FAST_ZERO on WRITE_ZEROES unless NBD_FLAG_SEND_FAST_ZERO was advertised -> EINVAL
//   FAST_ZERO with NO_HOLE (zeros would be written, not a hole punched)  -> ENOTSUP
// NBD_CMD_DISC always returns 0 (it has no reply).
uint32_t CheckRequest(const Request& r, const ExportLimits& limits);

// Maps a BlockDevice Status to the NBD error sent to the client: ok -> 0,
// kNoSpace -> ENOSPC, kPermissionDenied -> EPERM, kInvalidArgument /
// kOutOfRange / kNotSupported -> EINVAL, kAborted -> ESHUTDOWN, an errno of
// EFBIG or EDQUOT -> ENOSPC, else EIO.
uint32_t ErrorFromStatus(const Status& s);

// "READ", "WRITE", ... for logs; "CMD(n)" for unknown types.
std::string CommandName(uint16_t type);

}  // namespace cdp::nbd

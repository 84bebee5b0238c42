// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the NBD transmission phase (common/nbd/nbd_proto.h): the
// stream of request headers a client sends after the handshake, and the
// validation every request gets before it may touch a device.
//
// The input is read as NbdServer reads it: a 28-byte request header, then for
// NBD_CMD_WRITE its `length` payload bytes, and so on. Each complete request is
// checked by CheckRequest against several exports (read-only, every feature,
// empty, huge).
//
// Properties: the header re-encodes to the same 28 bytes; a request that
// CheckRequest lets through stays inside the export and within max_payload,
// uses only advertised commands and flags, and never writes a read-only export.
#include <cstddef>
#include <cstdint>

#include "common/nbd/nbd_proto.h"
#include "fuzz/fuzz_util.h"

namespace {

using namespace cdp;
using namespace cdp::nbd;
using cdp::fuzz::Check;

constexpr uint16_t kAllFeatures = kFlagHasFlags | kFlagSendFlush | kFlagSendFua | kFlagSendTrim |
                                  kFlagSendWriteZeroes | kFlagCanMultiConn;
const ExportLimits kExports[] = {
    {1u << 20, kAllFeatures, 32u << 20},
    {1u << 20, kFlagHasFlags | kFlagReadOnly | kFlagSendFlush, 32u << 20},
    {0, kAllFeatures, 4096},
    {UINT64_MAX, kAllFeatures, UINT32_MAX},
    {(1ull << 40) + 511, kFlagHasFlags, 1u << 16},
};

void CheckAllowed(const Request& r, const ExportLimits& x) {
  const uint32_t err = CheckRequest(r, x);
  if (err != 0 || r.type == kCmdDisc) return;
  const uint16_t tf = x.transmission_flags;
  Check(r.type == kCmdRead || r.type == kCmdWrite || r.type == kCmdFlush || r.type == kCmdTrim ||
        r.type == kCmdWriteZeroes);
  Check((r.flags & ~(kCmdFlagFua | kCmdFlagNoHole)) == 0);
  Check((r.flags & kCmdFlagFua) == 0 || (tf & kFlagSendFua) != 0);
  Check((r.flags & kCmdFlagNoHole) == 0 || r.type == kCmdWriteZeroes);
  const bool writes = r.type == kCmdWrite || r.type == kCmdTrim || r.type == kCmdWriteZeroes;
  Check(!writes || (tf & kFlagReadOnly) == 0);
  if (r.type == kCmdFlush) {
    Check((tf & kFlagSendFlush) != 0);
    return;
  }
  Check(r.type != kCmdTrim || (tf & kFlagSendTrim) != 0);
  Check(r.type != kCmdWriteZeroes || (tf & kFlagSendWriteZeroes) != 0);
  Check(r.offset <= x.size && r.length <= x.size - r.offset);
  Check((r.type != kCmdRead && r.type != kCmdWrite) || r.length <= x.max_payload);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ByteSpan rest(data, size);
  while (!rest.empty()) {
    Request r;
    ParseResult pr = ParseRequest(rest, &r);
    if (pr == ParseResult::kNeedMore) {
      Check(rest.size() < kRequestHeaderSize);
      break;
    }
    if (pr == ParseResult::kBad) break;
    Bytes again = EncodeRequest(r);
    Check(again == Bytes(rest.begin(), rest.begin() + kRequestHeaderSize));
    rest = rest.subspan(kRequestHeaderSize);
    for (const ExportLimits& x : kExports) CheckAllowed(r, x);
    (void)CommandName(r.type);
    if (r.type == kCmdWrite) {  // its payload follows the header
      if (r.length > rest.size()) break;
      rest = rest.subspan(r.length);
    }
  }
  return 0;
}

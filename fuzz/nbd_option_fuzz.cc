// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the NBD handshake parsers (common/nbd/nbd_proto.h): what a
// client can send before transmission.
//
// The input is read the way NbdServer's handshake reads a connection: 4 bytes
// of client flags, then option headers, each followed by its data (options
// longer than NbdServerOptions::max_option_bytes end the input, as the server
// skips or closes). Every option's data goes through the decoder the server
// uses for it (NBD_OPT_INFO/GO: ParseInfoRequest; LIST/SET_META_CONTEXT:
// ParseMetaContextRequest; EXPORT_NAME: ValidWireName).
// The whole input is also given to ParseInfoRequest directly, so mutations
// reach it without a valid header in front.
//
// Properties: parsers never read past the span; kNeedMore only while a header
// is incomplete; a parsed INFO/GO request accounts for every byte of the data
// and re-encodes to it; names that pass are <= 4096 bytes without NUL.
#include <cstddef>
#include <cstdint>

#include "common/nbd/nbd_proto.h"
#include "common/nbd/nbd_server.h"
#include "fuzz/fuzz_util.h"

namespace {

using namespace cdp;
using namespace cdp::nbd;
using cdp::fuzz::Check;

void CheckInfoRequest(ByteSpan data) {
  InfoRequest r;
  Status s = ParseInfoRequest(data, &r);
  if (!s.ok()) return;
  Check(ValidWireName(r.name));
  Bytes again;
  PutBE32(again, uint32_t(r.name.size()));
  PutBytes(again, r.name);
  PutBE16(again, uint16_t(r.infos.size()));
  for (uint16_t i : r.infos) PutBE16(again, i);
  Check(again == Bytes(data.begin(), data.end()));
}

// LIST/SET_META_CONTEXT data: a parsed request accounts for every byte and
// re-encodes to it; at most kMaxMetaQueries valid strings.
void CheckMetaContextRequest(ByteSpan data) {
  MetaContextRequest r;
  if (!ParseMetaContextRequest(data, &r).ok()) return;
  Check(ValidWireName(r.name) && r.queries.size() <= kMaxMetaQueries);
  Bytes again;
  PutBE32(again, uint32_t(r.name.size()));
  PutBytes(again, r.name);
  PutBE32(again, uint32_t(r.queries.size()));
  for (const std::string& q : r.queries) {
    Check(ValidWireName(q));
    PutBE32(again, uint32_t(q.size()));
    PutBytes(again, q);
  }
  Check(again == Bytes(data.begin(), data.end()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ByteSpan in(data, size);
  const uint32_t max_option = NbdServerOptions().max_option_bytes;

  uint32_t flags = 0;
  ParseResult fr = ParseClientFlags(in, true, &flags);
  uint32_t flags2 = 0;
  ParseResult fr2 = ParseClientFlags(in, false, &flags2);
  Check((fr == ParseResult::kNeedMore) == (size < kClientFlagsSize));
  // Refusing NO_ZEROES can only turn an accepted flag word into a refused one.
  Check(fr2 != ParseResult::kComplete || (fr == ParseResult::kComplete && flags == flags2));
  if (fr == ParseResult::kComplete) {
    Check((flags & kClientFlagFixedNewstyle) != 0);
    ByteSpan rest = in.subspan(kClientFlagsSize);
    while (!rest.empty()) {
      OptionHeader h;
      ParseResult r = ParseOptionHeader(rest, &h);
      if (r == ParseResult::kNeedMore) {
        Check(rest.size() < kOptionHeaderSize);
        break;
      }
      if (r == ParseResult::kBad) break;
      rest = rest.subspan(kOptionHeaderSize);
      if (h.length > max_option || h.length > rest.size()) break;
      ByteSpan payload = rest.first(h.length);
      rest = rest.subspan(h.length);
      switch (h.option) {
        case kOptInfo:
        case kOptGo:
          CheckInfoRequest(payload);
          break;
        case kOptListMetaContext:
        case kOptSetMetaContext:
          CheckMetaContextRequest(payload);
          break;
        case kOptExportName:
          (void)ValidWireName(std::string_view(reinterpret_cast<const char*>(payload.data()), payload.size()));
          break;
        default:
          break;
      }
    }
  }

  // Straight to the INFO/GO and META_CONTEXT decoders.
  CheckInfoRequest(in);
  CheckMetaContextRequest(in);
  return 0;
}

// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the files beside a process server's spool
// (process-server/spool_meta.h): volume.meta, copies.meta, beyond.meta and
// anchor.meta, as SpooledVolume reads them from a disk that may be damaged.
//
// Input: a selector byte, then the file. The selector's low two bits pick the
// file (volume, copies, beyond, anchor); with bit 2 set the harness appends
// the right CRC32C, so that the fuzzer explores the fields behind the CRC.
//
// Properties: no crash, no read outside the input; a failure is Corruption
// naming the file; what decodes encodes back to exactly the input; a
// beyond.meta never decodes as an anchor.meta, nor the other way round.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/base/crc32c.h"
#include "fuzz/fuzz_util.h"
#include "process-server/spool_meta.h"

namespace {

using namespace cdp;
using cdp::fuzz::Check;

// A decode's outcome: OK and encoding back to `in`, or Corruption naming `file`.
template <typename R, typename Encode>
void Expect(const R& r, ByteSpan in, const std::string& file, Encode encode) {
  if (!r.ok()) {
    Check(r.status().IsCorruption() && r.status().ToString().find(file) != std::string::npos);
    return;
  }
  const Bytes again = encode(*r);
  Check(again.size() == in.size() && std::equal(again.begin(), again.end(), in.begin()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t sel = data[0];
  Bytes file(data + 1, data + size);
  if (sel & 4) PutFixed32(file, crc32c::Value(file.data(), file.size()));
  const ByteSpan in(file.data(), file.size());
  switch (sel & 3) {
    case 0: {
      auto r = ps::DecodeVolumeMeta(in);
      if (r.ok()) Check(ValidName(r->name));
      Expect(r, in, "volume.meta", [](const proto::VolumeOpen& o) { return ps::EncodeVolumeMeta(o); });
      break;
    }
    case 1:
      Expect(ps::DecodeCopiesMeta(in), in, ps::kCopiesFile,
             [](const std::vector<std::pair<std::string, uint64_t>>& c) { return ps::EncodeCopiesMeta(c); });
      break;
    default: {
      const ps::CopyList& list = (sel & 3) == 2 ? ps::kBeyondList : ps::kAnchorList;
      const ps::CopyList& other = (sel & 3) == 2 ? ps::kAnchorList : ps::kBeyondList;
      auto r = ps::DecodeCopyList(list, in);
      Expect(r, in, list.file, [&](const std::vector<std::string>& c) { return ps::EncodeCopyList(list, c); });
      if (r.ok()) Check(!ps::DecodeCopyList(other, in).ok());
      break;
    }
  }
  return 0;
}

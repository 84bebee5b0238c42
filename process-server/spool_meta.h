// SPDX-License-Identifier: Apache-2.0
// The small files beside a volume's spool (docs/formats/spool.md), each one
// record written whole with WriteFileAtomic and ending in a CRC32C of all
// before it; what each means to the process server: spooled_volume.h.
//
//   volume.meta  (version 1) the VolumeOpen the spool was created with:
//     magic u32 "CDPM" | version u32 = 1 | name_len u32 | name | size u64 |
//     block_size u32 | uuid[16] | generation u64 | [flags u8 = 1: sealed] |
//     crc32c u32
//   copies.meta  (version 1) each copy's cursor, matched by name (so
//     reordering the `mt` keys keeps them):
//     magic u32 "CDPC" | version u32 = 1 | count u32 (<= 64) |
//     count x { name_len u32 (<= 1024) | name (the MT's host:port) | acked u64 } |
//     crc32c u32
//   beyond.meta, anchor.meta  (version 1) the names of the copies listed:
//     magic u32 ("CDPB", "CDPA") | version u32 = 1 | count u32 (<= 64) |
//     count x { name_len u32 (<= 1024) | name (the MT's host:port, "" with one copy) } |
//     crc32c u32
//
// Decoders take any bytes (a damaged disk reaches them; fuzz/spool_meta_fuzz.cc):
// a bad CRC, magic, version, count, length or trailing byte is Corruption
// naming the file; what decodes encodes back to the same bytes.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/base/coding.h"
#include "common/base/result.h"
#include "common/wire/protocol.h"

namespace cdp::ps {

inline constexpr uint32_t kMetaMagic = 0x4d504443;  // "CDPM"
inline constexpr uint32_t kMetaVersion = 1;
inline constexpr uint8_t kMetaSealed = 1;  // the optional flags byte of a sealed volume
inline constexpr uint32_t kCopiesMagic = 0x43504443;  // "CDPC"
inline constexpr uint32_t kCopiesVersion = 1;
inline constexpr char kCopiesFile[] = "copies.meta";
// beyond.meta and anchor.meta.
struct CopyList {
  uint32_t magic;
  const char* file;
};
inline constexpr uint32_t kCopyListVersion = 1;
inline constexpr CopyList kBeyondList{0x42504443, "beyond.meta"};  // "CDPB"
inline constexpr CopyList kAnchorList{0x41504443, "anchor.meta"};  // "CDPA"

// volume.meta.
Bytes EncodeVolumeMeta(const proto::VolumeOpen& open);
Result<proto::VolumeOpen> DecodeVolumeMeta(ByteSpan data);

// copies.meta: (MT name, acknowledged sequence) per copy.
Bytes EncodeCopiesMeta(const std::vector<std::pair<std::string, uint64_t>>& cursors);
Result<std::vector<std::pair<std::string, uint64_t>>> DecodeCopiesMeta(ByteSpan data);

// beyond.meta, anchor.meta: the names of the copies listed.
Bytes EncodeCopyList(const CopyList& list, const std::vector<std::string>& copies);
Result<std::vector<std::string>> DecodeCopyList(const CopyList& list, ByteSpan data);

}  // namespace cdp::ps

// SPDX-License-Identifier: Apache-2.0
// The wire protocol's shared codec pieces (common/wire/protocol.h is the format),
// internal to cdp_wire: its limits, the bounded Put/Get helpers, records and
// write batches, and the failback extents and digests. protocol_records.cc
// defines them; protocol.cc encodes and parses each message with them and
// frames it. Every Get checks bounds and caps; Bad() is a peer's malformed
// input (kCorruption), Invalid() a caller's (kInvalidArgument).
//
// Thread safety: pure functions.
#pragma once

#include <array>
#include <span>
#include <string>
#include <vector>

#include "common/base/coding.h"
#include "common/wire/protocol.h"

namespace cdp::proto::codec {


// Smallest encoded record: seq, offset, length, kind, timestamp, data_len.
inline constexpr size_t kRecordHeaderSize = 8 + 8 + 4 + 1 + 8 + 4;
// volume_id, codec, raw_size, count.
inline constexpr size_t kBatchHeaderSize = 4 + 1 + 4 + 4;
inline constexpr uint16_t kKnownFlags = 0;
inline constexpr uint32_t kMinBlockSize = 512;
inline constexpr uint32_t kMaxBlockSize = 1u << 20;
inline constexpr uint8_t kVolumeOpenSealed = 1;   // VolumeOpen flags bit 0
inline constexpr uint8_t kVolumeOpenAcked = 2;    // VolumeOpen flags bit 1: acked_seq follows
inline constexpr uint32_t kMinRegionSize = 4096;  // the digest leaf (common/wire/block_digest.h)
inline constexpr uint32_t kMaxRegionSize = 1u << 30;

inline bool KnownType(uint8_t t) {
  return t >= uint8_t(MsgType::kHello) && t <= uint8_t(MsgType::kGroupRelease);
}
inline bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

inline Status Bad(std::string what) { return Status::Corruption("bad message: " + std::move(what)); }
inline Status Invalid(std::string what) { return Status::InvalidArgument("cannot encode: " + std::move(what)); }


// ---- encoding and decoding helpers (protocol_records.cc) ----
Status PutName(Bytes& b, const std::string& s, const char* field);
Status PutText(Bytes& b, const std::string& s, const char* field);
template <size_t N>
void PutArray(Bytes& b, const std::array<uint8_t, N>& a) {
  PutBytes(b, ByteSpan(a.data(), a.size()));
}
bool GetString(ByteReader& r, size_t cap, std::string* out);
bool GetName(ByteReader& r, std::string* out);
template <size_t N>
bool GetArray(ByteReader& r, std::array<uint8_t, N>* a) {
  ByteSpan s;
  if (!r.GetSpan(N, &s)) return false;
  std::copy(s.begin(), s.end(), a->begin());
  return true;
}

// ---- records and batches ----
bool IsPullKind(RecordKind k);  // a pull answer's kinds
bool KnownKind(uint8_t k);
// One record's fields; `expected_seq` 0 for a batch's first record.
Status CheckRecord(uint64_t seq, uint64_t offset, uint32_t length, RecordKind kind, ByteSpan data,
                   uint64_t expected_seq);
// A WriteBatch's payload; with `pieces`, large record data is referenced, not copied.
Status EncodeBatch(const WriteBatch& wb, Bytes& out, std::vector<ByteSpan>* pieces = nullptr);
Result<Message> ParseBatch(ByteReader& r);

// ---- failback pieces ----
bool KnownFailbackStatus(uint8_t s);
void PutExtents(Bytes& b, std::span<const BlockExtent> extents);
bool GetExtents(ByteReader& r, uint32_t max, std::vector<BlockExtent>* out);
void PutDigest(Bytes& b, const Hash128& h);
bool GetDigest(ByteReader& r, Hash128* h);

}  // namespace cdp::proto::codec

// SPDX-License-Identifier: Apache-2.0
#include "common/wire/protocol.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <string>
#include <type_traits>

#include "common/base/crc32c.h"
#include "common/wire/codec.h"
#include "common/wire/protocol_codec.h"

namespace cdp::proto {
using namespace codec;

namespace {

// ---- per-message encoders ----

struct PayloadEncoder {
  Bytes& b;

  Status operator()(const Hello& m) {
    if (m.role < Role::kAgent || m.role > Role::kControl) return Invalid("unknown role");
    PutU8(b, uint8_t(m.role));
    CDP_RETURN_IF_ERROR(PutName(b, m.tenant, "tenant"));
    CDP_RETURN_IF_ERROR(PutName(b, m.client_id, "client_id"));
    PutArray(b, m.client_nonce);
    return Status::OK();
  }
  Status operator()(const Challenge& m) {
    PutArray(b, m.server_nonce);
    PutArray(b, m.server_proof);
    return Status::OK();
  }
  Status operator()(const Auth& m) {
    PutArray(b, m.client_proof);
    return Status::OK();
  }
  Status operator()(const AuthResult& m) {
    PutU8(b, m.accepted ? 1 : 0);
    return PutText(b, m.reason, "reason");
  }
  Status operator()(const VolumeOpen& m) {
    if (!IsPowerOfTwo(m.block_size) || m.block_size < kMinBlockSize || m.block_size > kMaxBlockSize) {
      return Invalid("block_size must be a power of two in 512..1 MiB");
    }
    if (m.size == 0 || m.size % m.block_size != 0) return Invalid("size must be a positive multiple of block_size");
    CDP_RETURN_IF_ERROR(PutName(b, m.name, "volume"));
    PutFixed64(b, m.size);
    PutFixed32(b, m.block_size);
    PutArray(b, m.uuid);
    PutFixed64(b, m.generation);
    if (m.sealed && m.size % kSealUnit != 0) return Invalid("a sealed volume's size must be a multiple of 4 KiB");
    const uint8_t flags = uint8_t((m.sealed ? kVolumeOpenSealed : 0) | (m.acked_seq != 0 ? kVolumeOpenAcked : 0));
    if (flags != 0) PutU8(b, flags);
    if (m.acked_seq != 0) PutFixed64(b, m.acked_seq);
    return Status::OK();
  }
  Status operator()(const VolumeOpenReply& m) {
    PutFixed32(b, m.volume_id);
    PutFixed64(b, m.durable_seq);
    return Status::OK();
  }
  Status operator()(const WriteBatch& m) { return EncodeBatch(m, b); }
  Status operator()(const Ack& m) {
    PutFixed32(b, m.volume_id);
    PutFixed64(b, m.durable_seq);
    return Status::OK();
  }
  Status operator()(const Nack& m) {
    if (m.reason < NackReason::kGap || m.reason > NackReason::kCorruption) return Invalid("unknown nack reason");
    PutFixed32(b, m.volume_id);
    PutFixed32(b, uint32_t(m.reason));
    PutFixed64(b, m.expected_seq);
    return PutText(b, m.message, "message");
  }
  Status operator()(const HashRequest& m) {
    if (!IsPowerOfTwo(m.region_size) || m.region_size < kMinRegionSize || m.region_size > kMaxRegionSize) {
      return Invalid("region_size must be a power of two in 4 KiB..1 GiB");
    }
    if (m.count == 0 || m.count > kMaxHashes) return Invalid("hash count out of range");
    if (m.at_seq != 0 && m.at_seq < m.min_seq) return Invalid("hash request: at_seq below min_seq");
    if (m.first_region > (std::numeric_limits<uint64_t>::max() / m.region_size) - m.count) {
      return Invalid("hash range overflows");
    }
    PutFixed32(b, m.volume_id);
    PutFixed64(b, m.request_id);
    PutFixed32(b, m.region_size);
    PutFixed64(b, m.first_region);
    PutFixed32(b, m.count);
    PutFixed64(b, m.min_seq);
    PutFixed64(b, m.at_seq);
    return Status::OK();
  }
  Status operator()(const HashResponse& m) {
    if (!IsPowerOfTwo(m.region_size) || m.region_size < kMinRegionSize || m.region_size > kMaxRegionSize) {
      return Invalid("region_size must be a power of two in 4 KiB..1 GiB");
    }
    if (m.status > HashStatus::kFailed) return Invalid("unknown hash status");
    if (m.status == HashStatus::kOk ? (m.hashes.empty() || m.hashes.size() > kMaxHashes) : !m.hashes.empty()) {
      return Invalid("hash count out of range");
    }
    if (m.first_region > (std::numeric_limits<uint64_t>::max() / m.region_size) - m.hashes.size()) {
      return Invalid("hash range overflows");
    }
    PutFixed32(b, m.volume_id);
    PutFixed64(b, m.request_id);
    PutFixed32(b, m.region_size);
    PutFixed64(b, m.first_region);
    PutFixed64(b, m.seq);
    b.push_back(uint8_t(m.status));
    PutFixed32(b, uint32_t(m.hashes.size()));
    for (const Hash128& h : m.hashes) PutDigest(b, h);
    return Status::OK();
  }
  Status operator()(const Heartbeat& m) {
    PutFixed64(b, m.sent_us);
    PutFixed64(b, m.echo_us);
    return Status::OK();
  }
  Status operator()(const FailbackPlanRequest& m) {
    PutFixed64(b, m.request_id);
    CDP_RETURN_IF_ERROR(PutName(b, m.volume, "volume"));
    PutFixed64(b, m.from_block);
    return Status::OK();
  }
  Status operator()(const FailbackPlan& m) {
    if (m.status > FailbackStatus::kFailed) return Invalid("unknown failback status");
    if (m.status == FailbackStatus::kOk ? m.extents.size() > kMaxExtents : !m.extents.empty())
      return Invalid("failback plan: extent count out of range");
    if (!ExtentBlocks(m.extents)) return Invalid("failback plan: extents empty, unsorted or overlapping");
    PutFixed64(b, m.request_id);
    b.push_back(uint8_t(m.status));
    PutFixed64(b, m.next_block);
    PutExtents(b, m.extents);
    return Status::OK();
  }
  Status operator()(const PullRequest& m) {
    std::optional<uint64_t> blocks = ExtentBlocks(m.extents);
    if (!blocks || m.extents.empty() || *blocks > kMaxPullBlocks) return Invalid("pull request: bad extents");
    if (m.digests.size() != *blocks) return Invalid("pull request: one digest per block");
    PutFixed64(b, m.request_id);
    CDP_RETURN_IF_ERROR(PutName(b, m.volume, "volume"));
    PutExtents(b, m.extents);
    for (const Hash128& h : m.digests) PutDigest(b, h);
    return Status::OK();
  }
  Status operator()(const PullResponse& m) {
    if (m.status > FailbackStatus::kFailed) return Invalid("unknown failback status");
    if (m.status != FailbackStatus::kOk && !m.records.empty()) return Invalid("pull response: records with an error");
    for (size_t i = 0; i < m.records.size(); ++i) {
      const Record& r = m.records[i];
      if (r.seq != i + 1) return Invalid("pull response: record sequences must be 1, 2, ...");
      if (!IsPullKind(r.kind)) return Invalid("pull response: kind");
    }
    PutFixed64(b, m.request_id);
    b.push_back(uint8_t(m.status));
    if (m.records.empty()) return Status::OK();
    WriteBatch wb;  // volume_id 0: the request named the volume
    wb.codec = m.codec;
    wb.level = m.level;
    wb.records = m.records;  // a copy: EncodeBatch takes a batch
    return EncodeBatch(wb, b);
  }
  Status operator()(const GroupHold& m) {
    if (m.round == 0) return Invalid("group hold: round 0");
    if (m.timeout_ms == 0 || m.timeout_ms > kMaxGroupHoldMs) return Invalid("group hold: timeout out of range");
    if (m.volumes.empty() || m.volumes.size() > kMaxGroupVolumes) return Invalid("group hold: volume count out of range");
    PutFixed64(b, m.round);
    PutFixed32(b, m.timeout_ms);
    PutFixed32(b, uint32_t(m.volumes.size()));
    for (const std::string& v : m.volumes) CDP_RETURN_IF_ERROR(PutName(b, v, "volume"));
    b.push_back(m.freeze ? 1 : 0);
    return Status::OK();
  }
  Status operator()(const GroupHeld& m) {
    if (m.status > GroupHoldStatus::kRefused) return Invalid("group held: unknown status");
    PutFixed64(b, m.round);
    b.push_back(uint8_t(m.status));
    return PutText(b, m.message, "message");
  }
  Status operator()(const GroupRelease& m) {
    if (!m.marker.empty() && !ValidName(m.marker)) return Invalid("group release: invalid marker name");
    PutFixed64(b, m.round);
    return PutText(b, m.marker, "marker");  // empty: abandoned
  }
  Status operator()(const Stats& m) {
    if (m.values.size() > kMaxStats) return Invalid("more than kMaxStats values");
    PutFixed32(b, uint32_t(m.values.size()));
    for (const auto& [name, value] : m.values) {
      CDP_RETURN_IF_ERROR(PutName(b, name, "stat"));
      PutFixed64(b, std::bit_cast<uint64_t>(value));
    }
    return Status::OK();
  }
};

// ---- per-message parsers (the reader covers exactly the payload) ----

Result<Message> ParsePayload(MsgType type, ByteReader& r) {
  switch (type) {
    case MsgType::kHello: {
      Hello m;
      uint8_t role = 0;
      if (!r.GetU8(&role)) return Bad("truncated hello");
      if (role < uint8_t(Role::kAgent) || role > uint8_t(Role::kControl)) return Bad("unknown role");
      m.role = Role(role);
      if (!GetName(r, &m.tenant)) return Bad("hello: invalid tenant name");
      if (!GetName(r, &m.client_id)) return Bad("hello: invalid client_id");
      if (!GetArray(r, &m.client_nonce)) return Bad("truncated hello");
      return Message(std::move(m));
    }
    case MsgType::kChallenge: {
      Challenge m;
      if (!GetArray(r, &m.server_nonce) || !GetArray(r, &m.server_proof)) return Bad("truncated challenge");
      return Message(m);
    }
    case MsgType::kAuth: {
      Auth m;
      if (!GetArray(r, &m.client_proof)) return Bad("truncated auth");
      return Message(m);
    }
    case MsgType::kAuthResult: {
      AuthResult m;
      uint8_t accepted = 0;
      if (!r.GetU8(&accepted) || accepted > 1) return Bad("auth result: bad accepted flag");
      m.accepted = accepted == 1;
      if (!GetString(r, kMaxTextLength, &m.reason)) return Bad("auth result: bad reason");
      return Message(std::move(m));
    }
    case MsgType::kVolumeOpen: {
      VolumeOpen m;
      if (!GetName(r, &m.name)) return Bad("volume open: invalid volume name");
      if (!r.GetFixed64(&m.size) || !r.GetFixed32(&m.block_size) || !GetArray(r, &m.uuid) ||
          !r.GetFixed64(&m.generation)) {
        return Bad("truncated volume open");
      }
      if (!IsPowerOfTwo(m.block_size) || m.block_size < kMinBlockSize || m.block_size > kMaxBlockSize) {
        return Bad("volume open: bad block_size");
      }
      if (m.size == 0 || m.size % m.block_size != 0) return Bad("volume open: bad size");
      if (r.remaining() > 0) {
        uint8_t flags = 0;
        if (!r.GetU8(&flags)) return Bad("truncated volume open");
        if ((flags & ~(kVolumeOpenSealed | kVolumeOpenAcked)) != 0) return Bad("volume open: unknown flags");
        if (flags == 0) return Bad("volume open: a flags byte with no flag");
        if ((flags & kVolumeOpenAcked) != 0 && (!r.GetFixed64(&m.acked_seq) || m.acked_seq == 0))
          return Bad("volume open: bad acknowledged sequence");
        if (r.remaining() != 0) return Bad("volume open: bytes after the flags");
        m.sealed = (flags & kVolumeOpenSealed) != 0;
        if (m.sealed && m.size % kSealUnit != 0) return Bad("volume open: sealed size not a multiple of 4 KiB");
      }
      return Message(std::move(m));
    }
    case MsgType::kVolumeOpenReply: {
      VolumeOpenReply m;
      if (!r.GetFixed32(&m.volume_id) || !r.GetFixed64(&m.durable_seq)) return Bad("truncated volume open reply");
      return Message(m);
    }
    case MsgType::kWriteBatch:
      return ParseBatch(r);
    case MsgType::kAck: {
      Ack m;
      if (!r.GetFixed32(&m.volume_id) || !r.GetFixed64(&m.durable_seq)) return Bad("truncated ack");
      return Message(m);
    }
    case MsgType::kNack: {
      Nack m;
      uint32_t reason = 0;
      if (!r.GetFixed32(&m.volume_id) || !r.GetFixed32(&reason) || !r.GetFixed64(&m.expected_seq)) {
        return Bad("truncated nack");
      }
      if (reason < uint32_t(NackReason::kGap) || reason > uint32_t(NackReason::kCorruption)) {
        return Bad("nack: unknown reason");
      }
      m.reason = NackReason(reason);
      if (!GetString(r, kMaxTextLength, &m.message)) return Bad("nack: bad message");
      return Message(std::move(m));
    }
    case MsgType::kHashRequest: {
      HashRequest m;
      if (!r.GetFixed32(&m.volume_id) || !r.GetFixed64(&m.request_id) || !r.GetFixed32(&m.region_size) ||
          !r.GetFixed64(&m.first_region) || !r.GetFixed32(&m.count) || !r.GetFixed64(&m.min_seq) ||
          !r.GetFixed64(&m.at_seq)) {
        return Bad("truncated hash request");
      }
      if (m.at_seq != 0 && m.at_seq < m.min_seq) return Bad("hash request: at_seq below min_seq");
      if (!IsPowerOfTwo(m.region_size) || m.region_size < kMinRegionSize || m.region_size > kMaxRegionSize) {
        return Bad("hash request: bad region_size");
      }
      if (m.count == 0 || m.count > kMaxHashes) return Bad("hash request: count out of range");
      if (m.first_region > (std::numeric_limits<uint64_t>::max() / m.region_size) - m.count) {
        return Bad("hash request: range overflows");
      }
      return Message(m);
    }
    case MsgType::kHashResponse: {
      HashResponse m;
      uint32_t count = 0;
      uint8_t status = 0;
      if (!r.GetFixed32(&m.volume_id) || !r.GetFixed64(&m.request_id) || !r.GetFixed32(&m.region_size) ||
          !r.GetFixed64(&m.first_region) || !r.GetFixed64(&m.seq) || !r.GetU8(&status) || !r.GetFixed32(&count)) {
        return Bad("truncated hash response");
      }
      if (!IsPowerOfTwo(m.region_size) || m.region_size < kMinRegionSize || m.region_size > kMaxRegionSize) {
        return Bad("hash response: bad region_size");
      }
      if (status > uint8_t(HashStatus::kFailed)) return Bad("hash response: unknown status");
      m.status = HashStatus(status);
      if (m.status == HashStatus::kOk ? (count == 0 || count > kMaxHashes) : count != 0) {
        return Bad("hash response: count out of range");
      }
      if (m.first_region > (std::numeric_limits<uint64_t>::max() / m.region_size) - count) {
        return Bad("hash response: range overflows");
      }
      // Every digest takes at least its flag byte: check before allocating.
      if (r.remaining() < count) return Bad("hash response: shorter than its count");
      m.hashes.resize(count);
      for (Hash128& h : m.hashes) {
        uint8_t flag = 0;
        if (!r.GetU8(&flag)) return Bad("truncated hash response");
        if (flag == 1) continue;
        if (flag != 0) return Bad("hash response: bad digest flag");
        if (!r.GetFixed64(&h.low) || !r.GetFixed64(&h.high)) return Bad("truncated hash response");
        if (h == Hash128{}) return Bad("hash response: a zero digest must travel as its flag");
      }
      if (r.remaining() != 0) return Bad("hash response: bytes after the digests");
      return Message(std::move(m));
    }
    case MsgType::kHeartbeat: {
      Heartbeat m;
      if (!r.GetFixed64(&m.sent_us) || !r.GetFixed64(&m.echo_us)) return Bad("truncated heartbeat");
      return Message(m);
    }
    case MsgType::kFailbackPlanRequest: {
      FailbackPlanRequest m;
      if (!r.GetFixed64(&m.request_id)) return Bad("truncated failback plan request");
      if (!GetName(r, &m.volume)) return Bad("failback plan request: invalid volume name");
      if (!r.GetFixed64(&m.from_block) || r.remaining() != 0) return Bad("failback plan request: bad length");
      return Message(std::move(m));
      return Message(m);
    }
    case MsgType::kFailbackPlan: {
      FailbackPlan m;
      uint8_t status = 0;
      if (!r.GetFixed64(&m.request_id) || !r.GetU8(&status) || !r.GetFixed64(&m.next_block))
        return Bad("truncated failback plan");
      if (!KnownFailbackStatus(status)) return Bad("failback plan: unknown status");
      m.status = FailbackStatus(status);
      if (!GetExtents(r, m.status == FailbackStatus::kOk ? kMaxExtents : 0, &m.extents))
        return Bad("failback plan: bad extents");
      if (!m.extents.empty() && m.next_block != 0 && m.next_block < m.extents.back().first_block + m.extents.back().count)
        return Bad("failback plan: next_block inside the page");
      if (r.remaining() != 0) return Bad("failback plan: bytes after the extents");
      return Message(std::move(m));
    }
    case MsgType::kPullRequest: {
      PullRequest m;
      if (!r.GetFixed64(&m.request_id)) return Bad("truncated pull request");
      if (!GetName(r, &m.volume)) return Bad("pull request: invalid volume name");
      if (!GetExtents(r, kMaxPullBlocks, &m.extents) || m.extents.empty()) return Bad("pull request: bad extents");
      std::optional<uint64_t> blocks = ExtentBlocks(m.extents);
      if (!blocks || *blocks > kMaxPullBlocks) return Bad("pull request: more than kMaxPullBlocks blocks");
      if (r.remaining() < *blocks) return Bad("pull request: shorter than its digests");
      m.digests.resize(size_t(*blocks));
      for (Hash128& h : m.digests) {
        if (!GetDigest(r, &h)) return Bad("pull request: bad digest");
      }
      if (r.remaining() != 0) return Bad("pull request: bytes after the digests");
      return Message(std::move(m));
    }
    case MsgType::kPullResponse: {
      PullResponse m;
      uint8_t status = 0;
      if (!r.GetFixed64(&m.request_id) || !r.GetU8(&status)) return Bad("truncated pull response");
      if (!KnownFailbackStatus(status)) return Bad("pull response: unknown status");
      m.status = FailbackStatus(status);
      if (r.remaining() == 0) return Message(std::move(m));
      if (m.status != FailbackStatus::kOk) return Bad("pull response: records with an error");
      CDP_ASSIGN_OR_RETURN(Message inner, ParseBatch(r));
      WriteBatch& wb = std::get<WriteBatch>(inner);
      if (wb.volume_id != 0) return Bad("pull response: a volume id inside");
      if (wb.records.front().seq != 1) return Bad("pull response: record sequences must start at 1");
      for (const Record& rec : wb.records) {
        if (!IsPullKind(rec.kind)) return Bad("pull response: record kind");
      }
      m.codec = wb.codec;
      m.records = std::move(wb.records);
      return Message(std::move(m));
    }
    case MsgType::kGroupHold: {
      GroupHold m;
      uint32_t count = 0;
      if (!r.GetFixed64(&m.round) || !r.GetFixed32(&m.timeout_ms) || !r.GetFixed32(&count)) {
        return Bad("truncated group hold");
      }
      if (m.round == 0) return Bad("group hold: round 0");
      if (m.timeout_ms == 0 || m.timeout_ms > kMaxGroupHoldMs) return Bad("group hold: timeout out of range");
      // Each name takes at least 2 + 1 bytes.
      if (count == 0 || count > kMaxGroupVolumes || uint64_t(count) * 3 > r.remaining()) {
        return Bad("group hold: volume count out of range");
      }
      m.volumes.reserve(count);
      for (uint32_t i = 0; i < count; ++i) {
        std::string name;
        if (!GetName(r, &name)) return Bad("group hold: invalid volume name");
        if (std::find(m.volumes.begin(), m.volumes.end(), name) != m.volumes.end()) {
          return Bad("group hold: a volume named twice");
        }
        m.volumes.push_back(std::move(name));
      }
      uint8_t freeze = 0;
      if (!r.GetU8(&freeze)) return Bad("truncated group hold");
      if (freeze > 1) return Bad("group hold: unknown freeze value");
      m.freeze = freeze == 1;
      return Message(std::move(m));
    }
    case MsgType::kGroupHeld: {
      GroupHeld m;
      uint8_t status = 0;
      if (!r.GetFixed64(&m.round) || !r.GetU8(&status)) return Bad("truncated group held");
      if (status > uint8_t(GroupHoldStatus::kRefused)) return Bad("group held: unknown status");
      m.status = GroupHoldStatus(status);
      if (!GetString(r, kMaxTextLength, &m.message)) return Bad("group held: bad message");
      return Message(std::move(m));
    }
    case MsgType::kGroupRelease: {
      GroupRelease m;
      if (!r.GetFixed64(&m.round)) return Bad("truncated group release");
      if (!GetString(r, kMaxTextLength, &m.marker)) return Bad("group release: bad marker");
      if (!m.marker.empty() && !ValidName(m.marker)) return Bad("group release: invalid marker name");
      return Message(std::move(m));
    }
    case MsgType::kStats: {
      Stats m;
      uint32_t count = 0;
      if (!r.GetFixed32(&count)) return Bad("truncated stats");
      // Each value takes at least 2 + 1 + 8 bytes.
      if (count > kMaxStats || uint64_t(count) * 11 > r.remaining()) return Bad("stats: count out of range");
      m.values.reserve(count);
      for (uint32_t i = 0; i < count; ++i) {
        std::string name;
        uint64_t bits = 0;
        if (!GetName(r, &name)) return Bad("stats: invalid name");
        if (!r.GetFixed64(&bits)) return Bad("truncated stats");
        m.values.emplace_back(std::move(name), std::bit_cast<double>(bits));
      }
      return Message(std::move(m));
    }
  }
  return Bad("unknown message type");
}

}  // namespace

MsgType TypeOf(const Message& m) {
  // The variant's alternatives are declared in MsgType order, starting at 1.
  static_assert(std::is_same_v<std::variant_alternative_t<0, Message>, Hello>);
  static_assert(std::is_same_v<std::variant_alternative_t<12, Message>, Stats>);
  static_assert(std::is_same_v<std::variant_alternative_t<16, Message>, PullResponse>);
  static_assert(std::is_same_v<std::variant_alternative_t<19, Message>, GroupRelease>);
  static_assert(std::variant_size_v<Message> == size_t(MsgType::kGroupRelease));
  return MsgType(uint8_t(m.index() + 1));
}

bool IsFailedOverNack(const Nack& n) {
  return n.reason == NackReason::kWrongGeneration && n.message.rfind(kFailedOverText, 0) == 0;
}

std::string_view NackReasonName(NackReason r) {
  switch (r) {
    case NackReason::kGap: return "gap";
    case NackReason::kBusy: return "busy";
    case NackReason::kUnknownVolume: return "unknown volume";
    case NackReason::kBadRecord: return "bad record";
    case NackReason::kWrongGeneration: return "wrong generation";
    case NackReason::kPermissionDenied: return "permission denied";
    case NackReason::kInternal: return "internal";
    case NackReason::kCorruption: return "corruption";
  }
  return "unknown";
}

Status EncodePayloadPieces(const Message& m, PayloadPieces* out) {
  out->own.clear();
  out->size = 0;
  if (const auto* wb = std::get_if<WriteBatch>(&m)) {
    CDP_RETURN_IF_ERROR(EncodeBatch(*wb, out->own, &out->pieces));
  } else {
    CDP_RETURN_IF_ERROR(std::visit(PayloadEncoder{out->own}, m));
    out->pieces.assign(1, ByteSpan(out->own));
  }
  for (ByteSpan b : out->pieces) out->size += b.size();
  if (out->size > kMaxPayload) return Invalid("payload larger than kMaxPayload");
  return Status::OK();
}

Result<Bytes> EncodePayload(const Message& m) {
  Bytes payload;
  Status s = std::visit(PayloadEncoder{payload}, m);
  if (!s.ok()) return s;
  if (payload.size() > kMaxPayload) return Invalid("payload larger than kMaxPayload");
  return payload;
}

void EncodeHeader(MsgType type, uint16_t flags, uint64_t sequence, std::span<const ByteSpan> payload, uint8_t* h) {
  size_t size = 0;
  for (ByteSpan b : payload) size += b.size();
  EncodeFixed32(h, kMagic);
  h[4] = kVersion;
  h[5] = uint8_t(type);
  EncodeFixed16(h + 6, flags);
  EncodeFixed32(h + 8, uint32_t(size));
  EncodeFixed64(h + 12, sequence);
  EncodeFixed32(h + 20, 0);
  uint32_t crc = crc32c::Value(h, kHeaderSize);
  for (ByteSpan b : payload) crc = crc32c::Extend(crc, b.data(), b.size());
  EncodeFixed32(h + 20, crc);
}

void EncodeHeader(MsgType type, uint16_t flags, uint64_t sequence, ByteSpan payload, uint8_t* h) {
  EncodeHeader(type, flags, sequence, std::span<const ByteSpan>(&payload, 1), h);
}

Result<Bytes> EncodeMessage(const Message& m, uint64_t sequence) {
  Bytes frame(kHeaderSize);
  Status s = std::visit(PayloadEncoder{frame}, m);
  if (!s.ok()) return s;
  if (frame.size() - kHeaderSize > kMaxPayload) return Invalid("payload larger than kMaxPayload");
  ByteSpan payload(frame.data() + kHeaderSize, frame.size() - kHeaderSize);
  EncodeHeader(TypeOf(m), 0, sequence, payload, frame.data());
  return frame;
}

DecodeOutcome DecodeFrame(ByteSpan input, Frame* out, uint32_t max_payload) {
  DecodeOutcome o;
  auto bad = [&o](std::string why) {
    o.state = DecodeState::kBad;
    o.error = Status::Corruption("bad frame: " + std::move(why));
    return o;
  };
  // Reject garbage on its first wrong byte, even before a whole header arrived.
  uint8_t magic[4];
  EncodeFixed32(magic, kMagic);
  for (size_t i = 0; i < 4 && i < input.size(); ++i) {
    if (input[i] != magic[i]) return bad("bad magic");
  }
  if (input.size() > 4 && input[4] != kVersion) return bad("unsupported version " + std::to_string(input[4]));
  if (input.size() > 5 && !KnownType(input[5])) return bad("unknown message type " + std::to_string(input[5]));
  if (input.size() < kHeaderSize) return o;  // kNeedMore

  const uint8_t* h = input.data();
  uint16_t flags = DecodeFixed16(h + 6);
  uint32_t length = DecodeFixed32(h + 8);
  if ((flags & ~kKnownFlags) != 0) return bad("unknown flags");
  if (length > std::min(max_payload, kMaxPayload)) return bad("payload length " + std::to_string(length) + " over the cap");
  if (input.size() - kHeaderSize < length) return o;  // kNeedMore

  uint8_t header[kHeaderSize];
  std::copy(h, h + kHeaderSize, header);
  EncodeFixed32(header + 20, 0);
  uint32_t crc = crc32c::Extend(crc32c::Value(header, kHeaderSize), h + kHeaderSize, length);
  if (crc != DecodeFixed32(h + 20)) return bad("CRC mismatch");

  out->type = MsgType(h[5]);
  out->flags = flags;
  out->sequence = DecodeFixed64(h + 12);
  out->payload = ByteSpan(h + kHeaderSize, length);
  o.state = DecodeState::kComplete;
  o.consumed = kHeaderSize + length;
  return o;
}

Result<Message> ParseMessage(const Frame& frame) {
  if (!KnownType(uint8_t(frame.type))) return Bad("unknown message type");
  if ((frame.flags & ~kKnownFlags) != 0) return Bad("unknown flags");
  if (frame.payload.size() > kMaxPayload) return Bad("payload over the cap");
  ByteReader r(frame.payload);
  Result<Message> m = ParsePayload(frame.type, r);
  if (!m.ok()) return m;
  if (!r.empty()) return Bad("trailing bytes after the message");
  return m;
}

}  // namespace cdp::proto

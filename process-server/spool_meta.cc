// SPDX-License-Identifier: Apache-2.0
#include "process-server/spool_meta.h"

#include <algorithm>

#include "common/base/crc32c.h"

namespace cdp::ps {

Bytes EncodeVolumeMeta(const proto::VolumeOpen& open) {
  Bytes b;
  PutFixed32(b, kMetaMagic);
  PutFixed32(b, kMetaVersion);
  PutFixed32(b, uint32_t(open.name.size()));
  PutBytes(b, std::string_view(open.name));
  PutFixed64(b, open.size);
  PutFixed32(b, open.block_size);
  PutBytes(b, ByteSpan(open.uuid.data(), open.uuid.size()));
  PutFixed64(b, open.generation);
  if (open.sealed) PutU8(b, kMetaSealed);  // only when set: unsealed files are as before
  PutFixed32(b, crc32c::Value(b.data(), b.size()));
  return b;
}

Result<proto::VolumeOpen> DecodeVolumeMeta(ByteSpan data) {
  auto bad = [] { return Status::Corruption("volume.meta: bad record"); };
  if (data.size() < 4) return bad();
  if (crc32c::Value(data.data(), data.size() - 4) != DecodeFixed32(data.data() + data.size() - 4))
    return Status::Corruption("volume.meta: checksum mismatch");
  ByteReader r(data.first(data.size() - 4));
  uint32_t magic = 0, version = 0, name_len = 0;
  if (!r.GetFixed32(&magic) || magic != kMetaMagic || !r.GetFixed32(&version) || version != kMetaVersion ||
      !r.GetFixed32(&name_len) || name_len > kMaxNameLength)
    return bad();
  proto::VolumeOpen o;
  ByteSpan name, uuid;
  if (!r.GetSpan(name_len, &name) || !r.GetFixed64(&o.size) || !r.GetFixed32(&o.block_size) ||
      !r.GetSpan(16, &uuid) || !r.GetFixed64(&o.generation))
    return bad();
  if (!r.empty()) {
    uint8_t flags = 0;
    if (!r.GetU8(&flags) || flags != kMetaSealed || !r.empty()) return bad();
    o.sealed = true;
  }
  o.name.assign(name.begin(), name.end());
  if (!ValidName(o.name)) return bad();
  std::copy(uuid.begin(), uuid.end(), o.uuid.begin());
  return o;
}

Bytes EncodeCopiesMeta(const std::vector<std::pair<std::string, uint64_t>>& cursors) {
  Bytes b;
  PutFixed32(b, kCopiesMagic);
  PutFixed32(b, kCopiesVersion);
  PutFixed32(b, uint32_t(cursors.size()));
  for (const auto& [name, acked] : cursors) {
    PutFixed32(b, uint32_t(name.size()));
    PutBytes(b, std::string_view(name));
    PutFixed64(b, acked);
  }
  PutFixed32(b, crc32c::Value(b.data(), b.size()));
  return b;
}

Result<std::vector<std::pair<std::string, uint64_t>>> DecodeCopiesMeta(ByteSpan data) {
  auto bad = [] { return Status::Corruption("copies.meta: bad record"); };
  if (data.size() < 4) return bad();
  if (crc32c::Value(data.data(), data.size() - 4) != DecodeFixed32(data.data() + data.size() - 4))
    return Status::Corruption("copies.meta: checksum mismatch");
  ByteReader r(data.first(data.size() - 4));
  uint32_t magic = 0, version = 0, count = 0;
  if (!r.GetFixed32(&magic) || magic != kCopiesMagic || !r.GetFixed32(&version) || version != kCopiesVersion ||
      !r.GetFixed32(&count) || count > 64)
    return bad();
  std::vector<std::pair<std::string, uint64_t>> out;
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t len = 0;
    ByteSpan name;
    uint64_t acked = 0;
    if (!r.GetFixed32(&len) || len > 1024 || !r.GetSpan(len, &name) || !r.GetFixed64(&acked)) return bad();
    out.emplace_back(std::string(name.begin(), name.end()), acked);
  }
  if (!r.empty()) return bad();
  return out;
}

Bytes EncodeCopyList(const CopyList& list, const std::vector<std::string>& copies) {
  Bytes b;
  PutFixed32(b, list.magic);
  PutFixed32(b, kCopyListVersion);
  PutFixed32(b, uint32_t(copies.size()));
  for (const std::string& name : copies) {
    PutFixed32(b, uint32_t(name.size()));
    PutBytes(b, std::string_view(name));
  }
  PutFixed32(b, crc32c::Value(b.data(), b.size()));
  return b;
}

Result<std::vector<std::string>> DecodeCopyList(const CopyList& list, ByteSpan data) {
  auto bad = [&] { return Status::Corruption(std::string(list.file) + ": bad record"); };
  if (data.size() < 4) return bad();
  if (crc32c::Value(data.data(), data.size() - 4) != DecodeFixed32(data.data() + data.size() - 4))
    return Status::Corruption(std::string(list.file) + ": checksum mismatch");
  ByteReader r(data.first(data.size() - 4));
  uint32_t magic = 0, version = 0, count = 0;
  if (!r.GetFixed32(&magic) || magic != list.magic || !r.GetFixed32(&version) || version != kCopyListVersion ||
      !r.GetFixed32(&count) || count > 64)
    return bad();
  std::vector<std::string> out;
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t len = 0;
    ByteSpan name;
    if (!r.GetFixed32(&len) || len > 1024 || !r.GetSpan(len, &name)) return bad();
    out.emplace_back(name.begin(), name.end());
  }
  if (!r.empty()) return bad();
  return out;
}

}  // namespace cdp::ps

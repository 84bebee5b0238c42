// SPDX-License-Identifier: Apache-2.0
#include "master-target/keyed_export.h"

#include <algorithm>
#include <cstring>

#include "common/base/log.h"

namespace cdp::mt {

namespace {
uint64_t Floor(uint64_t x) { return x / seal::kUnit * seal::kUnit; }
uint64_t Ceil(uint64_t x) { return (x + seal::kUnit - 1) / seal::kUnit * seal::kUnit; }
constexpr uint64_t kZeroChunk = 1u << 20;  // plaintext zeros sealed per step
}  // namespace

Result<std::shared_ptr<KeyedExportDevice>> KeyedExportDevice::Open(std::shared_ptr<PointInTimeDevice> inner,
                                                                    std::shared_ptr<ReplicaVolume> volume,
                                                                    uint64_t point_seq,
                                                                    std::shared_ptr<const seal::BlockSealer> sealer) {
  const VolumeIdentity& id = volume->identity();
  if (!id.sealed) return Status::InvalidArgument(id.name + " is not sealed: its exports need no key");
  const bool stored = inner->size() == DeviceSize(id);
  if (!stored && !inner->read_only())
    return Status::InvalidArgument(id.name + ": a writable keyed export needs the overlay of the whole replica file");
  if (!stored && inner->size() != id.size) return Status::InvalidArgument(id.name + ": export of another size");
  return std::shared_ptr<KeyedExportDevice>(
      new KeyedExportDevice(std::move(inner), std::move(volume), point_seq, std::move(sealer)));
}

BlockDeviceFeatures KeyedExportDevice::features() const {
  BlockDeviceFeatures f;
  f.flush = true;
  f.multi_conn = true;
  if (!inner_->read_only()) f.fua = f.trim = f.write_zeroes = true;
  return f;
}

Status KeyedExportDevice::ReadBlocks(uint64_t first, Bytes* blocks) {
  Bytes macs(seal::MacBytes(blocks->size()));
  CDP_RETURN_IF_ERROR(inner_->Read(first, uint32_t(blocks->size()), blocks->data()));
  if (inner_->size() == volume_->size()) {
    CDP_RETURN_IF_ERROR(volume_->ReadMacsAt(point_, first, blocks->size(), macs.data()));
  } else {
    CDP_RETURN_IF_ERROR(inner_->Read(MacOffset(first), uint32_t(macs.size()), macs.data()));
  }
  if (Status s = sealer_->Open(first, *blocks, macs.data()); !s.ok()) {
    failures_.fetch_add(1);
    log::Get("mt.export")->error("{} keyed export at sequence {}: {}", log::Where{volume_->identity().name, "", point_},
                                 point_, s.message());
    return Status::Corruption(volume_->identity().name + ": " + s.message());
  }
  return Status::OK();
}

Status KeyedExportDevice::Read(uint64_t offset, uint32_t len, uint8_t* buf) {
  if (offset > size() || len > size() - offset) return Status::OutOfRange("read past the end of the volume");
  if (len == 0) return Status::OK();
  const uint64_t first = Floor(offset);
  Bytes blocks(Ceil(offset + len) - first);
  CDP_RETURN_IF_ERROR(ReadBlocks(first, &blocks));
  std::memcpy(buf, blocks.data() + (offset - first), len);
  return Status::OK();
}

Status KeyedExportDevice::WriteBlocks(uint64_t first, Bytes blocks, bool fua) {
  Bytes macs(seal::MacBytes(blocks.size()));
  CDP_RETURN_IF_ERROR(sealer_->Seal(first, blocks, macs.data()));
  CDP_RETURN_IF_ERROR(inner_->Write(first, blocks, false));
  return inner_->Write(MacOffset(first), macs, fua);
}

Status KeyedExportDevice::Write(uint64_t offset, ByteSpan data, bool fua) {
  if (inner_->read_only()) return Status::PermissionDenied("a keyed export of a point is read-only");
  if (offset > size() || data.size() > size() - offset) return Status::OutOfRange("write past the end of the volume");
  if (data.empty()) return Status::OK();
  std::lock_guard<std::mutex> lk(write_mu_);
  const uint64_t first = Floor(offset), end = Ceil(offset + data.size());
  Bytes blocks(end - first);
  if (first != offset || end != offset + data.size()) {
    // Part of a block: the rest is what the block holds now (checked).
    if (first != offset) {
      Bytes head(seal::kUnit);
      CDP_RETURN_IF_ERROR(ReadBlocks(first, &head));
      std::memcpy(blocks.data(), head.data(), head.size());
    }
    if (end != offset + data.size() && (end - seal::kUnit != first || first == offset)) {
      Bytes tail(seal::kUnit);
      CDP_RETURN_IF_ERROR(ReadBlocks(end - seal::kUnit, &tail));
      std::memcpy(blocks.data() + blocks.size() - seal::kUnit, tail.data(), tail.size());
    }
  }
  std::memcpy(blocks.data() + (offset - first), data.data(), data.size());
  return WriteBlocks(first, std::move(blocks), fua);
}

Status KeyedExportDevice::WriteZeroes(uint64_t offset, uint64_t len, bool fua, bool may_trim) {
  if (inner_->read_only()) return Status::PermissionDenied("a keyed export of a point is read-only");
  if (offset > size() || len > size() - offset) return Status::OutOfRange("range past the end of the volume");
  if (len == 0) return Status::OK();
  const uint64_t head = Ceil(offset), tail = Floor(offset + len);
  if (head >= tail) {  // no whole block: a plain write of zeros
    return Write(offset, Bytes(len, 0), fua);
  }
  if (head != offset) CDP_RETURN_IF_ERROR(Write(offset, Bytes(head - offset, 0), false));
  if (tail != offset + len) CDP_RETURN_IF_ERROR(Write(tail, Bytes(offset + len - tail, 0), false));
  // Whole blocks: zeros stay zeros when sealed (holes in the overlay), and
  // their MACs are the zero blocks' MACs.
  std::lock_guard<std::mutex> lk(write_mu_);
  for (uint64_t at = head; at < tail;) {
    const uint64_t n = std::min(kZeroChunk, tail - at);
    Bytes macs(seal::MacBytes(n));
    CDP_RETURN_IF_ERROR(sealer_->ZeroMacs(at, n, macs.data()));
    CDP_RETURN_IF_ERROR(inner_->WriteZeroes(at, n, false, may_trim));
    CDP_RETURN_IF_ERROR(inner_->Write(MacOffset(at), macs, false));
    at += n;
  }
  return fua ? inner_->Flush() : Status::OK();
}

}  // namespace cdp::mt

// SPDX-License-Identifier: Apache-2.0
#include "common/nbd/sealed_device.h"

#include <algorithm>
#include <cstring>

#include "common/base/log.h"

namespace cdp {

namespace {
uint64_t Floor(uint64_t x) { return x / seal::kUnit * seal::kUnit; }
uint64_t Ceil(uint64_t x) { return (x + seal::kUnit - 1) / seal::kUnit * seal::kUnit; }
constexpr uint64_t kZeroChunk = 1u << 20;  // plaintext zeros sealed per step
}  // namespace

Result<std::shared_ptr<SealedDevice>> SealedDevice::Open(std::shared_ptr<BlockDevice> inner, uint64_t volume_size,
                                                        std::shared_ptr<const seal::BlockSealer> sealer,
                                                        std::string name) {
  if (volume_size % seal::kUnit != 0)
    return Status::InvalidArgument(name + ": a sealed volume's size is whole 4 KiB blocks, not " +
                                   std::to_string(volume_size));
  if (inner->size() != StoredSize(volume_size))
    return Status::InvalidArgument(name + ": the export holds " + std::to_string(inner->size()) +
                                   " bytes, not the stored blocks and MACs of a " + std::to_string(volume_size) +
                                   "-byte sealed volume (" + std::to_string(StoredSize(volume_size)) + ")");
  return std::shared_ptr<SealedDevice>(new SealedDevice(std::move(inner), volume_size, std::move(sealer), std::move(name)));
}

BlockDeviceFeatures SealedDevice::features() const {
  BlockDeviceFeatures f;
  f.flush = true;
  f.multi_conn = true;
  if (!inner_->read_only()) f.fua = f.trim = f.write_zeroes = true;
  return f;
}

Status SealedDevice::ReadBlocks(uint64_t first, Bytes* blocks) {
  Bytes macs(seal::MacBytes(blocks->size()));
  CDP_RETURN_IF_ERROR(inner_->Read(first, uint32_t(blocks->size()), blocks->data()));
  CDP_RETURN_IF_ERROR(inner_->Read(MacOffset(first), uint32_t(macs.size()), macs.data()));
  if (Status s = sealer_->Open(first, *blocks, macs.data()); !s.ok()) {
    failures_.fetch_add(1);
    log::Get("sealed")->error("{}: {}", name_, s.message());
    return Status::Corruption(name_ + ": " + s.message());
  }
  return Status::OK();
}

Status SealedDevice::Read(uint64_t offset, uint32_t len, uint8_t* buf) {
  if (offset > size() || len > size() - offset) return Status::OutOfRange("read past the end of the volume");
  if (len == 0) return Status::OK();
  const uint64_t first = Floor(offset);
  Bytes blocks(Ceil(offset + len) - first);
  CDP_RETURN_IF_ERROR(ReadBlocks(first, &blocks));
  std::memcpy(buf, blocks.data() + (offset - first), len);
  return Status::OK();
}

Status SealedDevice::WriteBlocks(uint64_t first, Bytes blocks, bool fua) {
  Bytes macs(seal::MacBytes(blocks.size()));
  CDP_RETURN_IF_ERROR(sealer_->Seal(first, blocks, macs.data()));
  CDP_RETURN_IF_ERROR(inner_->Write(first, blocks, false));
  return inner_->Write(MacOffset(first), macs, fua);
}

Status SealedDevice::Write(uint64_t offset, ByteSpan data, bool fua) {
  if (inner_->read_only()) return Status::PermissionDenied("this export of a sealed volume is read-only");
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

Status SealedDevice::WriteZeroes(uint64_t offset, uint64_t len, bool fua, bool may_trim) {
  if (inner_->read_only()) return Status::PermissionDenied("this export of a sealed volume is read-only");
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

}  // namespace cdp

// SPDX-License-Identifier: Apache-2.0
#include "storage/rbd_block_device.h"

namespace cdp::storage {

Result<std::shared_ptr<RbdBlockDevice>> RbdBlockDevice::Create(std::shared_ptr<RbdImage> image,
                                                               const Options& options) {
  if (!image) return Status::InvalidArgument("rbd device without an image");
  if (!ValidBlockSize(options.preferred_block_size)) {
    return Status::InvalidArgument("rbd device " + image->name() + ": bad block size " +
                                   std::to_string(options.preferred_block_size));
  }
  CDP_ASSIGN_OR_RETURN(uint64_t size, image->Size());
  if (size == 0) return Status::InvalidArgument("rbd device " + image->name() + ": the image is empty");
  const bool read_only = options.read_only || image->read_only();
  return std::shared_ptr<RbdBlockDevice>(
      new RbdBlockDevice(std::move(image), size, read_only, options.preferred_block_size));
}

BlockDeviceFeatures RbdBlockDevice::features() const {
  BlockDeviceFeatures f;
  f.flush = true;
  f.fua = true;
  f.trim = true;
  f.write_zeroes = true;
  f.multi_conn = true;
  return f;
}

Status RbdBlockDevice::Read(uint64_t offset, uint32_t len, uint8_t* buf) {
  return image_->Read(offset, std::span<uint8_t>(buf, len));
}

Status RbdBlockDevice::Write(uint64_t offset, ByteSpan data, bool fua) {
  if (read_only_) return Status::PermissionDenied("rbd device " + image_->name() + " is read-only");
  CDP_RETURN_IF_ERROR(image_->Write(offset, data));
  return fua ? image_->Flush() : Status::OK();
}

Status RbdBlockDevice::Zero(uint64_t offset, uint64_t len, bool fua, bool keep_allocated) {
  if (read_only_) return Status::PermissionDenied("rbd device " + image_->name() + " is read-only");
  CDP_RETURN_IF_ERROR(keep_allocated ? image_->WriteZeroes(offset, len) : image_->Discard(offset, len));
  return fua ? image_->Flush() : Status::OK();
}

Status RbdBlockDevice::WriteZeroes(uint64_t offset, uint64_t len, bool fua, bool may_trim) {
  return Zero(offset, len, fua, !may_trim);
}

Status RbdBlockDevice::Trim(uint64_t offset, uint64_t len, bool fua) { return Zero(offset, len, fua, false); }

Status RbdBlockDevice::Flush() { return image_->Flush(); }

}  // namespace cdp::storage

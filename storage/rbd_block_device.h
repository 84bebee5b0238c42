// SPDX-License-Identifier: Apache-2.0
// RbdBlockDevice: an RBD image as a BlockDevice (common/block_device.h), so
// the NbdServer (common/nbd_server.h) can export it like a file, and every
// layer written against BlockDevice (capture tap, copy-on-write overlay,
// point-in-time view) can sit on Ceph.
//
//   auto image = storage::RbdImage::Open(pool, "vol1-replica");
//   auto dev = storage::RbdBlockDevice::Create(std::move(*image), {});
//   nbd_server.AddExport("vol1", *dev, ...);
//
// Mapping: Read/Write go to RbdImage; Trim and WriteZeroes(may_trim) zero
// the range through RbdImage::Discard (whole objects deallocated, the rest
// zeroed: a trimmed range reads as zeros, stricter than NBD asks);
// WriteZeroes without may_trim (NO_HOLE) uses RbdImage::WriteZeroes, which
// keeps the range allocated; Flush and FUA call RbdImage::Flush. Features: flush,
// fua, trim, write_zeroes, and multi_conn (every NBD connection goes through
// the one librbd handle, so one flush covers writes from all of them).
//
// The size is read once at Create: BlockDevice requires it constant, so the
// image must not be resized while the device exists.
//
// Thread safety: as BlockDevice; librbd serves concurrent calls on one handle.
#pragma once

#include <cstdint>
#include <memory>

#include "common/block_device.h"
#include "common/result.h"
#include "storage/rbd_image.h"

namespace cdp::storage {

class RbdBlockDevice final : public BlockDevice {
 public:
  struct Options {
    bool read_only = false;  // refuse writes even if the image is writable
    uint32_t preferred_block_size = 4096;
  };

  // kInvalidArgument for an empty image or a bad block size; the image's
  // error if its size cannot be read. A read-only RbdImage gives a
  // read-only device.
  static Result<std::shared_ptr<RbdBlockDevice>> Create(std::shared_ptr<RbdImage> image, const Options& options);

  uint64_t size() const override { return size_; }
  bool read_only() const override { return read_only_; }
  BlockDeviceFeatures features() const override;
  uint32_t preferred_block_size() const override { return block_size_; }
  Status Read(uint64_t offset, uint32_t len, uint8_t* buf) override;
  Status Write(uint64_t offset, ByteSpan data, bool fua) override;
  Status WriteZeroes(uint64_t offset, uint64_t len, bool fua, bool may_trim) override;
  Status Trim(uint64_t offset, uint64_t len, bool fua) override;
  Status Flush() override;

  RbdImage& image() { return *image_; }

 private:
  RbdBlockDevice(std::shared_ptr<RbdImage> image, uint64_t size, bool read_only, uint32_t block_size)
      : image_(std::move(image)), size_(size), read_only_(read_only), block_size_(block_size) {}
  Status Zero(uint64_t offset, uint64_t len, bool fua, bool keep_allocated);

  std::shared_ptr<RbdImage> image_;
  uint64_t size_;
  bool read_only_;
  uint32_t block_size_;
};

}  // namespace cdp::storage

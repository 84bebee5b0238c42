// SPDX-License-Identifier: Apache-2.0
// BranchDevice: a read-only BlockDevice presenting the original site's image
// as it was before failback — a filter over the live source volume (nbdkit
// style): blocks saved in a BranchStore (agent/branch_store.h) read from the
// store, every other block from `base`, the live source volume.
//
// Limit: blocks not saved come from the live volume, so the image is exact
// only as long as the source's unsaved blocks keep the original site's
// content: during failback (which saves each block before overwriting it) and
// after it, until the source is written again by anyone else. An operator who
// wants to keep the branch past that copies it out first (e.g. with nbdcopy).
//
// Reads racing with failback: a Read first reads from `base` the blocks not
// saved at that moment, then overlays every block saved by the time it asks
// the store. A block failback overwrote in between was saved before it was
// overwritten, so it is taken from the store: a read never returns content
// failback wrote.
//
// Writes, WriteZeroes and Trim fail with kPermissionDenied (the NBD server
// refuses them before calling, read_only() being true); Flush does nothing.
//
// Thread safety: as BlockDevice; the store is thread-safe and `base` must be
// safe for concurrent reads.
#pragma once

#include <cstdint>
#include <memory>

#include "agent/branch_store.h"
#include "common/base/result.h"
#include "common/nbd/block_device.h"

namespace cdp::agent {

class BranchDevice final : public BlockDevice {
 public:
  // kInvalidArgument when either is null or base->size() differs from the
  // store's volume size. The device keeps both alive.
  static Result<std::shared_ptr<BranchDevice>> Open(std::shared_ptr<BranchStore> store,
                                                    std::shared_ptr<BlockDevice> base);

  uint64_t size() const override { return store_->volume_size(); }
  bool read_only() const override { return true; }
  BlockDeviceFeatures features() const override { return BlockDeviceFeatures{}; }
  uint32_t preferred_block_size() const override { return store_->block_size(); }

  // Any byte range inside the device (kOutOfRange otherwise); the store's or
  // the base's error.
  Status Read(uint64_t offset, uint32_t len, uint8_t* buf) override;
  Status Write(uint64_t offset, ByteSpan data, bool fua) override;
  Status WriteZeroes(uint64_t offset, uint64_t len, bool fua, bool may_trim) override;
  Status Trim(uint64_t offset, uint64_t len, bool fua) override;
  Status Flush() override { return Status::OK(); }

 private:
  BranchDevice(std::shared_ptr<BranchStore> store, std::shared_ptr<BlockDevice> base)
      : store_(std::move(store)), base_(std::move(base)) {}

  std::shared_ptr<BranchStore> store_;
  std::shared_ptr<BlockDevice> base_;
};

}  // namespace cdp::agent

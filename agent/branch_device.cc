// SPDX-License-Identifier: Apache-2.0
#include "agent/branch_device.h"

#include <algorithm>
#include <utility>

namespace cdp::agent {

Result<std::shared_ptr<BranchDevice>> BranchDevice::Open(std::shared_ptr<BranchStore> store,
                                                         std::shared_ptr<BlockDevice> base) {
  if (store == nullptr || base == nullptr) return Status::InvalidArgument("branch device: store and base required");
  if (base->size() != store->volume_size()) {
    return Status::InvalidArgument("branch device: base has " + std::to_string(base->size()) + " bytes, the branch " +
                                   std::to_string(store->volume_size()));
  }
  return std::shared_ptr<BranchDevice>(new BranchDevice(std::move(store), std::move(base)));
}

Status BranchDevice::Read(uint64_t offset, uint32_t len, uint8_t* buf) {
  if (offset > size() || len > size() - offset) return Status::OutOfRange("branch device: read past the end");
  const uint64_t bs = store_->block_size();
  const uint64_t end = offset + len;
  // Blocks saved now stay saved: only the others need the base.
  uint64_t pos = offset;
  while (pos < end) {
    const uint64_t next = std::min(end, (pos / bs + 1) * bs);
    if (store_->Contains(pos / bs)) {
      pos = next;
      continue;
    }
    uint64_t stop = next;
    while (stop < end && !store_->Contains(stop / bs)) stop = std::min(end, (stop / bs + 1) * bs);
    CDP_RETURN_IF_ERROR(base_->Read(pos, uint32_t(stop - pos), buf + (pos - offset)));
    pos = stop;
  }
  return store_->ReadSavedOver(offset, len, buf);
}

Status BranchDevice::Write(uint64_t, ByteSpan, bool) { return Status::PermissionDenied("branch device is read-only"); }

Status BranchDevice::WriteZeroes(uint64_t, uint64_t, bool, bool) {
  return Status::PermissionDenied("branch device is read-only");
}

Status BranchDevice::Trim(uint64_t, uint64_t, bool) { return Status::PermissionDenied("branch device is read-only"); }

}  // namespace cdp::agent

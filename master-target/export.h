// PointInTimeDevice: a recovery point of a volume as an NBD BlockDevice
// (common/nbd_server.h), served while replication goes on.
//
// Reads return the image of the volume at the point (ReplicaVolume::ReadAt: each
// block changed since the point comes from the oldest later undo record, the
// rest from the replica). The point is pinned for the device's lifetime, so
// retention keeps what it needs and a rollback is refused meanwhile.
//
// Writable variant (test failover): writes go to a copy-on-write overlay — a
// sparse file of the volume's size plus an in-memory bitmap of the blocks it
// holds (1 bit per block) — and never reach the replica or the journal. A
// partial write to a block not yet in the overlay first copies the block's
// point-in-time content. The overlay file is removed when the device is
// destroyed (the export ends).
//
// Thread safety: as BlockDevice — methods may be called from several threads.
// Overlay changes are serialised by one mutex.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/nbd_server.h"
#include "master-target/replica_volume.h"

namespace cdp::mt {

class PointInTimeDevice final : public BlockDevice {
 public:
  // Read-only when `overlay_path` is empty; otherwise the overlay file is
  // created there (it must not exist) through `env`. kOutOfRange if the point
  // is not reachable.
  static Result<std::shared_ptr<PointInTimeDevice>> Open(std::shared_ptr<ReplicaVolume> volume, uint64_t point_seq,
                                                         Env* env, const std::string& overlay_path);
  ~PointInTimeDevice() override;

  uint64_t size() const override { return size_; }
  bool read_only() const override { return overlay_ == nullptr; }
  BlockDeviceFeatures features() const override;
  uint32_t preferred_block_size() const override { return block_; }
  Status Read(uint64_t offset, uint32_t len, uint8_t* buf) override;
  Status Write(uint64_t offset, ByteSpan data, bool fua) override;
  Status WriteZeroes(uint64_t offset, uint64_t len, bool fua, bool may_trim) override;
  Status Trim(uint64_t offset, uint64_t len, bool fua) override;
  Status Flush() override;

  uint64_t point_seq() const { return pin_->seq(); }
  uint64_t overlay_blocks() const;

 private:
  PointInTimeDevice(std::shared_ptr<ReplicaVolume> v, std::unique_ptr<PointPin> pin) : volume_(std::move(v)), pin_(std::move(pin)) {}
  Status WriteLocked(uint64_t offset, const uint8_t* data, uint64_t len);  // data == nullptr: zeros

  std::shared_ptr<ReplicaVolume> volume_;
  std::unique_ptr<PointPin> pin_;
  uint64_t size_ = 0;
  uint32_t block_ = 4096;
  Env* env_ = nullptr;
  std::string overlay_path_;
  std::unique_ptr<File> overlay_;
  mutable std::mutex mu_;
  std::vector<bool> in_overlay_;  // per block
};

}  // namespace cdp::mt

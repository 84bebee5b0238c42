// SPDX-License-Identifier: Apache-2.0
// PointInTimeDevice: a recovery point of a volume as an NBD BlockDevice
// (common/nbd/nbd_server.h), served while replication goes on.
//
// Reads return the image of the volume at the point (ReplicaVolume::ReadAt: each
// block changed since the point comes from the oldest later undo record, the
// rest from the replica). The point is pinned for the device's lifetime, so
// retention keeps what it needs and a rollback is refused meanwhile.
//
// Writable variants: writes go to a copy-on-write overlay — a sparse file of
// the volume's size plus a bitmap of the blocks it holds (1 bit per block) —
// and never reach the replica or the journal. A partial write to a block not
// yet in the overlay first copies the block's point-in-time content.
// Whole blocks of zeros (TRIM, WRITE_ZEROES) are holes punched in the overlay,
// not zeros written (where the file system cannot punch, zeros are written).
//
//   test failover (Open with an overlay path): the bitmap lives in memory and
//   the overlay file is removed when the device is destroyed (the export ends).
//
//   A sealed volume's exports (every kind) cover the whole replica file: the
//   stored blocks, then their MACs (ReplicaVolume::ReadStoredAt); size() is
//   then DeviceSize(). The master target never holds the keys: the tenant
//   decrypts and checks them at its own site (`cdpctl serve`,
//   common/nbd/sealed_device.h), and writes to a writable overlay arrive
//   sealed, each block's MAC beside it.
//
//   promoted failover (OpenPersistent; `cdpctl failover`): the bitmap is a
//   file too (docs/formats/failover-overlay.md), and both survive the device
//   and the daemon: the export is served again after a restart. The bitmap is
//   also the record of every block written at the provider (failback's set 2).
//   Crash safety — an acknowledged FLUSH (or FUA write) survives a kill -9 or
//   a power cut; order of a Flush():
//
//     writes since the last flush: overlay data written, bits set in memory
//        |  (reads see them at once; after a crash they may be lost: not acked)
//     overlay file Sync                                      -- sync point 1
//        |
//     bitmap bytes holding the new bits written in place; bitmap Sync -- sync point 2
//        |
//     Flush returns ok -> the NBD client gets its reply
//
//   A bit is set on disk only after its block's data is durable, and bits only
//   ever go from 0 to 1 (the files are discarded as a whole by an undo), so a
//   torn bitmap write leaves each bit old or new, both correct. A block whose
//   bit did not reach the disk reads as the point again (its write was not
//   acknowledged by a flush). Overwrites of a block already in the overlay
//   are in place: until the next flush the block may read old or new.
//
// Thread safety: as BlockDevice — methods may be called from several threads.
// Overlay changes (and a Flush's syncs) are serialised by one mutex.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/env/env.h"
#include "common/nbd/nbd_server.h"
#include "master-target/replica_volume.h"

namespace cdp::mt {

class PointInTimeDevice final : public BlockDevice {
 public:
  // Read-only when `overlay_path` is empty; otherwise the overlay file is
  // created there (it must not exist) through `env`. kOutOfRange if the point
  // is not reachable.
  static Result<std::shared_ptr<PointInTimeDevice>> Open(std::shared_ptr<ReplicaVolume> volume, uint64_t point_seq,
                                                         Env* env, const std::string& overlay_path);
  // The promoted failover's device: overlay data at `data_path`, bitmap at
  // `bitmap_path`, both through `env`. create: both are made anew (replacing
  // leftovers), sized and synced, with the directory, before this returns;
  // otherwise both must exist and describe this volume and point (kCorruption
  // if not). kOutOfRange if the point is not reachable. The files outlive the
  // device; RemoveOverlay() deletes them.
  static Result<std::shared_ptr<PointInTimeDevice>> OpenPersistent(std::shared_ptr<ReplicaVolume> volume,
                                                                   uint64_t point_seq, Env* env,
                                                                   const std::string& data_path,
                                                                   const std::string& bitmap_path, bool create);
  // Removes a persistent overlay's two files (missing ones are fine) and syncs
  // their directory.
  static Status RemoveOverlay(Env* env, const std::string& data_path, const std::string& bitmap_path);
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
  // The point's allocation (ReplicaVolume::ExtentsAt), and the overlay's for
  // the blocks written here.
  Status Extents(uint64_t offset, uint64_t len, std::vector<DeviceExtent>* out) override;

  uint64_t point_seq() const { return pin_->seq(); }
  // Blocks in the overlay (written since the export began); for a persistent
  // overlay, including writes not yet flushed.
  uint64_t overlay_blocks() const;
  bool persistent() const { return bitmap_ != nullptr; }
  // Failback's final pass: unflushed writes are flushed, and every later
  // write, zero or trim is refused (kPermissionDenied -> EPERM) for the
  // device's lifetime. Reads go on.
  Status Quiesce();
  // The blocks in the overlay (written at the provider), merged, in order.
  std::vector<proto::BlockExtent> WrittenExtents() const;

 private:
  // The device of `v` at the pinned point, without an overlay yet.
  PointInTimeDevice(std::shared_ptr<ReplicaVolume> v, std::unique_ptr<PointPin> pin);
  Status WriteLocked(uint64_t offset, const uint8_t* data, uint64_t len);  // data == nullptr: zeros
  Status FlushLocked();
  Status LoadBitmap(uint64_t point_seq);
  // The point's bytes: the volume's (ReadAt), or the replica file's for a
  // sealed volume (ReadStoredAt).
  Status ReadPoint(uint64_t offset, uint64_t len, uint8_t* buf) const;

  std::shared_ptr<ReplicaVolume> volume_;
  std::unique_ptr<PointPin> pin_;
  uint64_t size_ = 0;
  bool stored_space_ = false;  // size_ = DeviceSize(): a sealed volume's stored blocks and MACs
  uint32_t block_ = 4096;
  Env* env_ = nullptr;
  std::string overlay_path_;
  std::unique_ptr<File> overlay_;
  mutable std::mutex mu_;
  std::vector<bool> in_overlay_;  // per block (in memory: what reads follow)
  bool quiesced_ = false;         // Quiesce(): writes refused
  // Persistent overlay only:
  std::unique_ptr<File> bitmap_;
  Bytes bits_;                      // the bitmap's bytes as on disk after the last flush
  std::vector<uint64_t> unflushed_; // blocks set in in_overlay_ whose bit is not on disk yet
};

}  // namespace cdp::mt

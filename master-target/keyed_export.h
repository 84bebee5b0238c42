// SPDX-License-Identifier: Apache-2.0
// KeyedExportDevice: an export of a sealed volume (tenant-side encryption,
// common/crypto/seal.h) that serves plaintext, because the tenant handed the
// volume's keys to it (`cdpctl export VOLUME@POINT --key-file`, or
// `cdpctl failover VOLUME --to POINT --key-file`).
//
// A stackable filter over a PointInTimeDevice of the volume, which pins the
// point and holds the stored blocks. Two shapes:
//
//   read-only point (Open over a read-only export of the volume's size):
//     the MACs come from the volume at the same point (ReplicaVolume::ReadMacsAt);
//   promoted failover (Open over the persistent overlay of the whole replica
//     file, size DeviceSize(): blocks, then MACs): reads take the MACs from
//     that device, and writes are sealed with the keys — the stored blocks go
//     to the overlay at their offset, their MACs at size + 16 * block — so the
//     overlay holds ciphertext only and failback moves it without the keys.
//
// Every read is widened to whole 4 KiB blocks, and each block is checked and
// decrypted (BlockSealer::Open). A block that fails its check is never
// returned: the read fails with kCorruption naming the block (EIO to the NBD
// client), and the device logs it and counts it. A write of part of a block
// reads (and checks) the rest first. A write's blocks and MACs reach the
// overlay together at the next FLUSH (or with FUA); an unflushed write lost in
// a crash may leave its block failing the check, never wrong data.
//
// The keys live in the sealer, in memory only, for the life of the device;
// nothing of them is written at the master target.
//
// Thread safety: as BlockDevice. Writes are serialised by one mutex (a
// partial-block write is a read-modify-write).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "common/crypto/seal.h"
#include "common/nbd/nbd_server.h"
#include "master-target/export.h"
#include "master-target/replica_volume.h"

namespace cdp::mt {

class KeyedExportDevice final : public BlockDevice {
 public:
  // `inner` is an export of `volume` at `point_seq`: read-only of the
  // volume's size, or the writable persistent overlay of DeviceSize(). The
  // volume must be sealed (kInvalidArgument otherwise).
  static Result<std::shared_ptr<KeyedExportDevice>> Open(std::shared_ptr<PointInTimeDevice> inner,
                                                          std::shared_ptr<ReplicaVolume> volume, uint64_t point_seq,
                                                          std::shared_ptr<const seal::BlockSealer> sealer);

  uint64_t size() const override { return volume_->size(); }
  bool read_only() const override { return inner_->read_only(); }
  BlockDeviceFeatures features() const override;
  Status Read(uint64_t offset, uint32_t len, uint8_t* buf) override;
  Status Write(uint64_t offset, ByteSpan data, bool fua) override;
  Status WriteZeroes(uint64_t offset, uint64_t len, bool fua, bool may_trim) override;
  Status Trim(uint64_t offset, uint64_t len, bool fua) override { return WriteZeroes(offset, len, fua, true); }
  Status Flush() override { return inner_->read_only() ? Status::OK() : inner_->Flush(); }

  // Blocks that failed their integrity check, since Open.
  uint64_t integrity_failures() const { return failures_.load(); }

 private:
  KeyedExportDevice(std::shared_ptr<PointInTimeDevice> inner, std::shared_ptr<ReplicaVolume> volume, uint64_t point_seq,
                    std::shared_ptr<const seal::BlockSealer> sealer)
      : inner_(std::move(inner)), volume_(std::move(volume)), point_(point_seq), sealer_(std::move(sealer)) {}
  // Whole blocks [first, first + blocks.size()): read, checked, decrypted.
  Status ReadBlocks(uint64_t first, Bytes* blocks);
  // Seals whole plaintext blocks at `first` and writes them and their MACs.
  Status WriteBlocks(uint64_t first, Bytes blocks, bool fua);
  uint64_t MacOffset(uint64_t offset) const { return volume_->size() + seal::MacBytes(offset); }

  std::shared_ptr<PointInTimeDevice> inner_;
  std::shared_ptr<ReplicaVolume> volume_;
  uint64_t point_;
  std::shared_ptr<const seal::BlockSealer> sealer_;
  std::atomic<uint64_t> failures_{0};
  std::mutex write_mu_;
};

}  // namespace cdp::mt

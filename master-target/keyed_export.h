// KeyedExportDevice: a point-in-time export of a sealed volume (tenant-side
// encryption, common/seal.h) that serves plaintext, because the tenant handed
// the volume's keys to this export (`cdpctl export VOLUME@POINT --key-file`).
//
// A stackable filter over the volume's plain PointInTimeDevice (which pins the
// point and reads the stored blocks): every read is widened to whole 4 KiB
// blocks, their MACs are read at the same point (ReplicaVolume::ReadMacsAt),
// and each block is checked and decrypted (BlockSealer::Open). A block that
// fails its check is never returned: the read fails with kCorruption naming
// the block (EIO to the NBD client), and the device logs it and counts it.
//
// The keys live in the sealer, in memory only, for the life of the export;
// nothing of them is written at the master target. Read-only.
//
// Thread safety: as BlockDevice (reads from several threads).
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "common/nbd_server.h"
#include "common/seal.h"
#include "master-target/export.h"
#include "master-target/replica_volume.h"

namespace cdp::mt {

class KeyedExportDevice final : public BlockDevice {
 public:
  // `inner` is a read-only export of `volume` at `point_seq`; the volume
  // must be sealed (kInvalidArgument otherwise).
  static Result<std::shared_ptr<KeyedExportDevice>> Open(std::shared_ptr<PointInTimeDevice> inner,
                                                          std::shared_ptr<ReplicaVolume> volume, uint64_t point_seq,
                                                          std::shared_ptr<const seal::BlockSealer> sealer);

  uint64_t size() const override { return inner_->size(); }
  bool read_only() const override { return true; }
  BlockDeviceFeatures features() const override;
  Status Read(uint64_t offset, uint32_t len, uint8_t* buf) override;
  Status Write(uint64_t, ByteSpan, bool) override { return ReadOnly(); }
  Status WriteZeroes(uint64_t, uint64_t, bool, bool) override { return ReadOnly(); }
  Status Trim(uint64_t, uint64_t, bool) override { return ReadOnly(); }
  Status Flush() override { return Status::OK(); }

  // Blocks that failed their integrity check, since Open.
  uint64_t integrity_failures() const { return failures_.load(); }

 private:
  KeyedExportDevice(std::shared_ptr<PointInTimeDevice> inner, std::shared_ptr<ReplicaVolume> volume, uint64_t point_seq,
                    std::shared_ptr<const seal::BlockSealer> sealer)
      : inner_(std::move(inner)), volume_(std::move(volume)), point_(point_seq), sealer_(std::move(sealer)) {}
  static Status ReadOnly() { return Status::PermissionDenied("a keyed export is read-only"); }

  std::shared_ptr<PointInTimeDevice> inner_;
  std::shared_ptr<ReplicaVolume> volume_;
  uint64_t point_;
  std::shared_ptr<const seal::BlockSealer> sealer_;
  std::atomic<uint64_t> failures_{0};
};

}  // namespace cdp::mt

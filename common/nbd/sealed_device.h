// SPDX-License-Identifier: Apache-2.0
// SealedDevice: the plaintext of a sealed volume (tenant-side encryption,
// common/crypto/seal.h), made at the tenant's site from the stored bytes the
// provider serves. A stackable filter over any BlockDevice `inner` that holds
// a sealed volume's stored space (docs/encryption.md):
//
//   [0, volume_size)                          the stored blocks (XTS ciphertext, zeros for zero blocks)
//   [volume_size, volume_size + 16 * blocks)  one 16-byte MAC per 4 KiB block
//
// which is what the master target exports for a sealed volume: a point
// read-only, a promoted failover read-write. `cdpctl serve` stacks it on a
// RemoteDevice (common/nbd/remote_device.h) with the keys derived from the
// tenant key file, so the keys never leave the tenant.
//
// Every read is widened to whole 4 KiB blocks, and each block is checked and
// decrypted (BlockSealer::Open). A block that fails its check is never
// returned: the read fails with kCorruption naming the block (EIO to the NBD
// client), and the device logs it and counts it. Writes (writable `inner`
// only) seal whole blocks and write the stored blocks and their MACs; a write
// of part of a block reads (and checks) the rest first. The blocks and MACs
// of a write reach `inner` together, and are durable at its next Flush (or
// with FUA); an unflushed write lost in a crash may leave its block failing
// the check, never wrong data. Whole zero blocks stay zeros (WRITE_ZEROES to
// `inner`), with the zero blocks' MACs.
//
// Thread safety: as BlockDevice. Writes are serialised by one mutex (a
// partial-block write is a read-modify-write).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "common/crypto/seal.h"
#include "common/nbd/block_device.h"

namespace cdp {

class SealedDevice final : public BlockDevice {
 public:
  // The stored space's size for a volume of `volume_size` bytes.
  static uint64_t StoredSize(uint64_t volume_size) { return volume_size + seal::MacBytes(volume_size); }

  // `inner` must be StoredSize(volume_size) bytes, volume_size a multiple of
  // 4 KiB (kInvalidArgument otherwise, naming `name`: the volume, for logs).
  static Result<std::shared_ptr<SealedDevice>> Open(std::shared_ptr<BlockDevice> inner, uint64_t volume_size,
                                                    std::shared_ptr<const seal::BlockSealer> sealer,
                                                    std::string name);

  uint64_t size() const override { return size_; }
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
  SealedDevice(std::shared_ptr<BlockDevice> inner, uint64_t size, std::shared_ptr<const seal::BlockSealer> sealer,
               std::string name)
      : inner_(std::move(inner)), size_(size), sealer_(std::move(sealer)), name_(std::move(name)) {}
  // Whole blocks [first, first + blocks.size()): read, checked, decrypted.
  Status ReadBlocks(uint64_t first, Bytes* blocks);
  // Seals whole plaintext blocks at `first` and writes them and their MACs.
  Status WriteBlocks(uint64_t first, Bytes blocks, bool fua);
  uint64_t MacOffset(uint64_t offset) const { return size_ + seal::MacBytes(offset); }

  std::shared_ptr<BlockDevice> inner_;
  const uint64_t size_;
  std::shared_ptr<const seal::BlockSealer> sealer_;
  const std::string name_;
  std::atomic<uint64_t> failures_{0};
  std::mutex write_mu_;
};

}  // namespace cdp

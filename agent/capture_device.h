// SPDX-License-Identifier: Apache-2.0
// CaptureDevice: the capture tap of one protected volume. A BlockDevice
// (common/nbd/nbd_server.h) that the NbdServer exports; every WRITE, WRITE_ZEROES
// and TRIM is
//
//   1. marked in the persistent dirty bitmap (synced before the client hears
//      back; free when the region is already marked),
//   2. applied to the backing store and given the next sequence number, both
//      under the volume's capture lock (so sequence order = applied order),
//   3. queued in the CaptureQueue in the current mode (or, in bitmap mode,
//      its regions are flagged for a resync),
//   4. with FUA, followed by a sync of the backing store.
//
// A sealed volume (Options::sealer; tenant-side encryption, common/crypto/seal.h)
// captures whole 4 KiB blocks: a write, zero or trim that covers part of a
// block is captured, under the capture lock, as a data record of the whole
// block as the backing store holds it after the write (so the record is the
// image at its sequence, and the sender can seal it). Digests (resync,
// verify) are of the sealed blocks, as the replica holds them.
//
// FLUSH syncs the backing store, then queues a kFlush record (a
// crash-consistent boundary) unless the volume is inside a window where no
// recovery point can be promised (metadata or bitmap mode, or a resync pending).
//
// Thread safety: as BlockDevice — methods are called concurrently by the
// NbdServer's workers; the sender and resync call the *Backing/ShipRange
// helpers from their own threads.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <optional>
#include <vector>

#include "agent/anomaly_detector.h"
#include "agent/capture_queue.h"
#include "agent/dirty_bitmap.h"
#include "common/base/clock.h"
#include "common/crypto/seal.h"
#include "common/env/env.h"
#include "common/nbd/nbd_server.h"
#include "common/wire/block_digest.h"
#include "common/wire/protocol.h"

namespace cdp::agent {

// The answer of CaptureDevice::DigestAtQuietPoint.
struct QuietDigests {
  // True when the range could not be hashed at a known sequence now; `why`
  // says why. A busy range says nothing about the replica: it is neither
  // equal nor different.
  bool busy = false;
  std::string why;
  uint64_t seq = 0;        // not busy: the digests describe the image at this sequence
  uint64_t numbering = 0;  // CaptureQueue::NumberingLocked() that `seq` belongs to
  uint32_t tries = 0;      // windows tried (each one read of the range)
  std::vector<proto::Hash128> digests;  // not busy: one per unit, in order
};

class CaptureDevice final : public BlockDevice {
 public:
  struct Options {
    std::string volume;             // validated name (ValidName)
    Env* env = nullptr;             // must outlive the device
    const Clock* clock = nullptr;   // must outlive the device
    std::string backing_path;       // existing file or block device
    std::string bitmap_path;        // dirty bitmap file (created when missing)
    uint64_t budget = 64ull << 20;  // capture queue memory budget
    uint32_t region_size = 1u << 20;
    uint32_t block_size = 4096;     // advertised to NBD clients
    // Tenant-side encryption: seal every block with these keys (null: plain).
    std::shared_ptr<const seal::BlockSealer> sealer;
    // Ransomware detection on the plaintext writes (agent/anomaly_detector.h;
    // nullopt: off). An anomaly is queued as a kAnomaly record right after
    // the write that closed the window that fired.
    std::optional<AnomalyOptions> anomaly;
  };

  // Opens the backing store and the dirty bitmap. Fails with kInvalidArgument
  // (bad name, empty or unaligned volume) or the Env's / bitmap's error.
  static Result<std::shared_ptr<CaptureDevice>> Open(const Options& opts);

  // --- BlockDevice ---
  uint64_t size() const override { return size_; }
  bool read_only() const override { return false; }
  BlockDeviceFeatures features() const override;
  uint32_t preferred_block_size() const override { return opts_.block_size; }
  Status Read(uint64_t offset, uint32_t len, uint8_t* buf) override;
  Status Write(uint64_t offset, ByteSpan data, bool fua) override;
  // In data mode the queued record is `data` itself, not a copy of it.
  Status WriteShared(uint64_t offset, std::shared_ptr<const Bytes> data, bool fua) override;
  Status WriteZeroes(uint64_t offset, uint64_t len, bool fua, bool may_trim) override;
  Status Trim(uint64_t offset, uint64_t len, bool fua) override;
  // The backing store's allocation (FileExtents): what the tap's clients see
  // through NBD_CMD_BLOCK_STATUS.
  Status Extents(uint64_t offset, uint64_t len, std::vector<DeviceExtent>* out) override;
  Status Flush() override;

  // --- For the sender, resync and tags ---
  const std::string& volume() const { return opts_.volume; }
  // The volume's sealer (tenant-side encryption), or null.
  const seal::BlockSealer* sealer() const { return opts_.sealer.get(); }
  CaptureQueue& queue() { return *queue_; }
  // Ransomware detection (Options::anomaly): closes the detector's windows
  // that have ended (a periodic call: the sender's resync loop), queuing an
  // anomaly when one fires. A no-op when detection is off.
  void TickDetector();
  // The detector's counters (all 0 when detection is off).
  AnomalyCounters anomaly_counters();
  DirtyBitmap& bitmap() { return *bitmap_; }
  // Reads the backing store (metadata-mode records, hashing).
  Status ReadBacking(uint64_t offset, size_t len, uint8_t* buf) const;
  // Bytes of region `region` (the last one may be short).
  uint32_t RegionLength(uint64_t region) const;
  // Leaf digests (common/wire/block_digest.h) of [offset, offset+len) as it is
  // now; holes of the backing file (SEEK_DATA) are not read. `stats`, when
  // given, accumulates the bytes read and skipped.
  Result<std::vector<proto::Hash128>> LeafDigests(uint64_t offset, uint64_t len, DigestStats* stats) const;
  // Under the capture lock: reads [offset, offset+len) (len <= the record
  // cap) and queues it as one resync record: kZero when it reads as zeros,
  // else data. Returns the sequence, or 0 when the queue has no room now
  // (retry after acknowledgements). The bitmap keeps the regions dirty until
  // the record is acknowledged; their resync state is the caller's.
  Result<uint64_t> ShipRange(uint64_t offset, uint32_t len);
  // What a resync ships where the replica reads zeros, in one read: under the
  // capture lock, reads [offset, offset+len) (len <= the record cap; holes of
  // the backing file are not read) and queues its non-zero 4 KiB blocks as
  // resync data records, one per run of adjacent ones (zero blocks need
  // nothing there). room false: the queue has no room for them now, nothing
  // queued (retry after acknowledgements; read and skipped are then 0). Not
  // for a sealed volume, whose blocks are compared sealed (kInvalidArgument).
  struct NonZeroShip {
    bool room = true;
    uint64_t last_seq = 0;  // of the last record queued (0: none)
    uint64_t records = 0;
    uint64_t bytes = 0;     // of the records queued
    uint64_t read = 0;      // bytes read
    uint64_t skipped = 0;   // bytes of holes, not read
  };
  Result<NonZeroShip> ShipNonZero(uint64_t offset, uint32_t len);
  // Online verify (docs/agent.md, "Verify"): the digests of the `unit`-byte
  // units (common/wire/block_digest.h) covering [offset, offset+len) (clipped to
  // the volume; `offset` a multiple of `unit`) as they were at one sequence
  // S, so that the replica's image at S (the master target's /v1/hashes with
  // at_seq=S) must have the same digests. One try is a window:
  //
  //   lock: S = last sequence; for every bitmap region R the range touches:
  //         R needs no resync, remember LastSeq(R) and ResyncEpoch(R);
  //         the queue is in data mode and the numbering is not provisional
  //   unlock; read and hash the range
  //   lock: every LastSeq(R) <= S, every epoch and the numbering unchanged?
  //         yes: the digests are the image at S.  no: try again.
  //
  // Why it holds: a write reaches the backing store and gets its sequence
  // (and LastSeq) under the capture lock, and a bitmap-mode write bumps the
  // epoch under it; so when neither moved, no write touched the range while
  // it was read, and what was read is the result of every write <= S.
  // Data mode at S means no metadata-mode record <= S is still unsent (those
  // re-read the range later, so the stream would not be the image at S).
  //
  // Busy (not an error) when the range cannot be compared now: provisional
  // numbering, metadata or bitmap mode, a region waiting for a resync, or a
  // write into the range during each of `max_tries` windows. Errors:
  // kInvalidArgument (bad unit or alignment), kOutOfRange (offset past the
  // end), or the backing store's read error. `stats` as LeafDigests.
  Result<QuietDigests> DigestAtQuietPoint(uint64_t offset, uint64_t len, uint32_t unit, uint32_t max_tries,
                                          DigestStats* stats);
  // Failback (agent/failback.h). While a write fence is set, WRITE,
  // WRITE_ZEROES and TRIM are refused with kPermissionDenied(`why`) (EPERM
  // to the client) and nothing is captured; reads go on. Empty: no fence.
  void SetWriteFence(std::string why);
  std::string write_fence() const;
  // Failback's own writes: the provider's content of [offset, offset+len)
  // (`data` of len bytes, or empty for zeros: a hole is punched) goes to the
  // backing store without being captured or marked — the source is becoming
  // the replica's image, not writing new history. Then SyncFailbackWrites().
  Status WriteFailback(uint64_t offset, uint64_t len, ByteSpan data);
  Status SyncFailbackWrites() { return SyncBacking(); }

  // True when a kFlush or tag would mark a state the replica can reproduce:
  // data mode and no region waiting for a resync. Call with the capture lock held.
  bool ConsistentLocked() const;

 private:
  // Write() and WriteShared(): `keep`, when not null, holds `data`'s bytes
  // for the queue; else they are copied for it.
  Status WriteKeeping(uint64_t offset, ByteSpan data, std::shared_ptr<const Bytes> keep, bool fua);
  CaptureDevice(const Options& opts, std::unique_ptr<File> file, uint64_t size,
                std::unique_ptr<DirtyBitmap> bitmap);
  // Applies a zero/trim range under the capture lock, in record-sized chunks.
  Status ApplyRange(proto::RecordKind kind, uint64_t offset, uint64_t len, bool punch);
  // Sealed volumes, capture lock held: queues [offset, offset + len) (whole
  // blocks) as a data record of what the backing store holds now.
  Status QueueBlocksLocked(uint64_t offset, uint64_t len);
  Status SyncBacking();

  Options opts_;
  std::unique_ptr<File> file_;
  uint64_t size_;
  std::unique_ptr<DirtyBitmap> bitmap_;
  std::unique_ptr<CaptureQueue> queue_;
  std::unique_ptr<AnomalyDetector> detector_;  // capture lock; null: detection off
  // Capture lock held: tells the detector of a write (or, with no data, a
  // zero/trim range) queued up to `seq`, and queues the anomaly it reports.
  void DetectLocked(uint64_t offset, ByteSpan data, uint64_t seq);
  // Capture lock held: queues the anomaly the detector reported, if any.
  void QueueAnomalyLocked(const std::optional<Anomaly>& a);
  std::mutex sync_mu_;
  mutable std::mutex fence_mu_;
  std::string fence_;  // SetWriteFence
};

}  // namespace cdp::agent

// SPDX-License-Identifier: Apache-2.0
// DirtyBitmap: the agent's persistent record of which regions (default 1 MiB)
// of a volume may differ between the source and what the process server has
// durably acknowledged. DRBD's activity log, in spirit:
//
//   * Before a write into region R is acknowledged to the NBD client, R is
//     marked dirty on disk (MarkAndPin). Marks of many writers are batched into
//     one file write + one Sync (group commit); a region that is already marked
//     on disk costs no I/O at all.
//   * A region is cleared on disk only when every record captured in it has
//     been acknowledged by the process server, no write into it is in progress,
//     it needs no resync, and it stayed cold for one whole checkpoint interval
//     (Checkpoint() is called periodically; hot regions never cost a sync).
//   * After a crash, every region still dirty on disk needs a resync (hash
//     comparison with the replica, see agent/resync.h). A new bitmap starts with
//     every region dirty: that is the initial sync.
//
// Per-region state kept in memory (12 bytes + 2 bits per region):
//   last_seq   highest sequence captured into the region (0: none)
//   pins       writes in progress into the region (marked, not yet sequenced)
//   resync     kNone, kCompare (hash-compare with the replica first) or
//              kShip (known changed: ship the region's data, bitmap mode)
//   hot        touched since the previous Checkpoint()
//
// On-disk format (docs/formats/dirty-bitmap.md): two fixed-size slots A/B, each
// a checksummed image of the whole bitmap with a counter; a write goes to the
// slot not holding the newest valid image, then Sync(). Loading picks the
// valid slot with the highest counter, so a torn write leaves the previous image.
//
// Lock order: callers may hold the volume's capture lock when calling Assign,
// AssignResync or MarkResyncLocked; DirtyBitmap never calls out while holding its own mutex
// except the file write in the group commit (which runs with the mutex released).
//
// Thread safety: every method is thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/base/result.h"
#include "common/base/status.h"
#include "common/env/env.h"

namespace cdp::agent {

class DirtyBitmap {
 public:
  enum class Resync : uint8_t { kNone = 0, kCompare = 1, kShip = 2 };

  struct Options {
    Env* env = nullptr;          // must outlive the bitmap
    std::string path;            // the bitmap file
    uint64_t volume_size = 0;    // bytes, > 0
    uint32_t region_size = 1u << 20;  // power of two, 4 KiB .. 1 GiB
  };

  // Opens `path`, creating it (every region dirty: initial sync) when missing.
  // Regions dirty on disk come back as Resync::kCompare. Fails with kCorruption
  // when neither slot is valid, kInvalidArgument when the file was written for
  // another volume size or region size, or the Env's error.
  static Result<std::unique_ptr<DirtyBitmap>> Open(const Options& opts);

  DirtyBitmap(const DirtyBitmap&) = delete;
  DirtyBitmap& operator=(const DirtyBitmap&) = delete;

  // Pins the regions of [offset, offset+len) (len > 0, range inside the volume)
  // and returns once all of them are marked dirty on disk. On error the pins
  // are released and nothing may be acknowledged to the client.
  Status MarkAndPin(uint64_t offset, uint64_t len);
  // The write pinned by MarkAndPin got sequence `seq`; releases the pins.
  void Assign(uint64_t offset, uint64_t len, uint64_t seq);
  // The write pinned by MarkAndPin was not captured in the stream (bitmap
  // mode), or failed and may have changed part of the range: its regions
  // need their data shipped again (Resync::kShip). Releases the pins.
  void AssignResync(uint64_t offset, uint64_t len);

  // The process server has durably acknowledged every sequence <= seq.
  void SetAcked(uint64_t seq);
  // The capture queue renumbered its records (CaptureQueue::Resume): sequences
  // > old_acked move by (new_acked - old_acked); older ones were acknowledged
  // and are forgotten; the acknowledged point becomes new_acked.
  void Renumber(uint64_t old_acked, uint64_t new_acked);
  // Every region needs a hash comparison (a full resync, e.g. after the process
  // server lost acknowledged data). Takes effect in memory; persisted by Checkpoint.
  void MarkAllCompare();
  // The server's resume point `durable` at a contact, in its numbering (the
  // numbering SetAcked uses from then on). Every image carries the highest
  // acknowledged sequence, so each region cleared on disk was acknowledged at
  // or below it. True, at the first call of this process only, when `durable`
  // is below the sequence the loaded image carried: the server lost records
  // it had acknowledged to an earlier process, whose regions may be clean on
  // disk (the caller compares everything). Until this first call, images keep
  // the loaded sequence.
  bool Resumed(uint64_t durable);
  // The highest sequence known acknowledged, in the server's numbering: the
  // loaded image's until the first Resumed() of this process, SetAcked's
  // after it (0 after ForgetAll). The agent sends it in its VolumeOpen
  // (proto::VolumeOpen::acked_seq), so that a server that lost those records
  // learns it before it answers.
  uint64_t KnownAcked() const;
  // The source equals the replica of a new generation (re-protect after a
  // failback): nothing captured, acknowledged or flagged is remembered (epochs
  // move, so a compare in flight cannot finish a region), and the new
  // generation's sequences start at 0. Takes effect in memory; the next
  // Checkpoint clears the regions on disk.
  void ForgetAll();

  // Clears regions that are clean (see above), persists the image if it
  // changed (or the cursor did), and returns how many regions it cleared.
  Result<size_t> Checkpoint();

  // Resync bookkeeping (agent/resync.h). The first region >= `from` that needs
  // a resync, or nullopt.
  std::optional<uint64_t> NextResync(uint64_t from) const;
  Resync ResyncState(uint64_t region) const;
  // Region `region` was compared equal to the replica, or its data was queued
  // with sequence `seq` (0 = compared equal): it no longer needs a resync.
  void ResyncDone(uint64_t region, uint64_t seq);
  // Bumped whenever the region is flagged for a resync (AssignResync,
  // MarkAllCompare): a compare that began at epoch E may finish the region
  // only while it is still E (ResyncDoneAt), else a write it did not see
  // would be forgotten.
  uint32_t ResyncEpoch(uint64_t region) const;
  // ResyncDone(region, 0) if the epoch is still `epoch`; false otherwise.
  bool ResyncDoneAt(uint64_t region, uint32_t epoch);
  // A resync record with sequence `seq` covers [offset, offset+len): the
  // regions stay dirty until it is acknowledged (their resync state is kept).
  void NoteShipped(uint64_t offset, uint64_t len, uint64_t seq);
  // Highest sequence captured or shipped into the region in this process (0: none).
  uint64_t LastSeq(uint64_t region) const;
  // Persisted resync cursor (the next region to compare), saved by Checkpoint.
  void SetCursor(uint64_t region);
  uint64_t cursor() const;

  uint64_t region_count() const { return region_count_; }
  uint32_t region_size() const { return region_size_; }
  // Regions dirty in memory (anything not yet known clean on the replica).
  uint64_t DirtyCount() const;
  uint64_t ResyncCount() const;  // O(1)
  // Persisting writes performed (each is one file write + one Sync).
  uint64_t persist_count() const;

 private:
  explicit DirtyBitmap(const Options& opts);
  struct Image;
  Status Load();
  // The newest valid image of format `version` (1 or 2) into *out (left
  // empty when none); *geometry_mismatch set when a valid image of another
  // geometry was seen.
  Status ReadImage(uint32_t version, std::optional<Image>* out, bool* geometry_mismatch);
  Status CreateFresh();
  Bytes EncodeImage(const std::vector<uint8_t>& bits, uint64_t counter, uint64_t cursor, uint64_t acked) const;
  // Writes `bits` to the next slot and syncs. mu_ must NOT be held.
  Status WriteImage(const std::vector<uint8_t>& bits, uint64_t counter, uint64_t cursor, uint64_t acked);
  // The one writer (writing_ set by the caller, `lk` held on mu_): writes `image`
  // with mu_ released, then records the outcome (on-disk image, counter, cursor,
  // last error), clears writing_ and wakes waiters. Returns with `lk` held.
  Status PersistWriting(std::unique_lock<std::mutex>& lk, std::vector<uint8_t> image);
  bool WantedDirtyLocked(uint64_t r) const;
  bool OnDiskLocked(uint64_t r) const { return (ondisk_[r >> 3] >> (r & 7)) & 1; }
  void SetOnDiskLocked(uint64_t r, bool v) {
    if (v) ondisk_[r >> 3] |= uint8_t(1u << (r & 7));
    else ondisk_[r >> 3] &= uint8_t(~(1u << (r & 7)));
  }
  uint64_t FirstRegion(uint64_t offset) const { return offset / region_size_; }
  uint64_t LastRegion(uint64_t offset, uint64_t len) const { return (offset + len - 1) / region_size_; }

  Options opts_;
  uint32_t region_size_;
  uint64_t region_count_;
  size_t slot_size_;
  std::unique_ptr<File> file_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool writing_ = false;         // a slot write is in progress (group commit leader)
  Status last_write_error_;      // of the most recent slot write
  uint64_t write_round_ = 0;     // incremented after every slot write
  uint64_t counter_ = 0;         // of the newest image on disk
  uint64_t cursor_ = 0;
  uint64_t persisted_cursor_ = 0;
  uint64_t acked_ = 0;
  uint64_t loaded_acked_ = 0;    // the acknowledged sequence of the image loaded at Open
  bool resumed_ = false;         // Resumed() or ForgetAll() ran: images carry acked_
  uint64_t persists_ = 0;
  uint64_t resync_count_ = 0;    // regions whose resync_ is not kNone
  std::vector<uint8_t> ondisk_;  // bit per region: dirty in the newest image (see .cc)
  std::vector<uint64_t> last_seq_;
  std::vector<uint32_t> pins_;
  std::vector<uint8_t> resync_;
  std::vector<uint8_t> hot_;
  std::vector<uint32_t> epoch_;  // see ResyncEpoch
};

}  // namespace cdp::agent

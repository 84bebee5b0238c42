// SPDX-License-Identifier: Apache-2.0
// BranchStore: the original site's saved branch during failback. Before
// failback overwrites a block of the source volume with the provider's content,
// the block's old content is saved here, so nothing the original site wrote
// after the split is silently lost (DESIGN.md invariant 10). BranchDevice
// (agent/branch_device.h) presents the saved branch as a read-only image.
//
// Two files (docs/formats/failback-branch.md):
//   <prefix>.img  sparse, the volume's size; a saved block lives at its own offset
//   <prefix>.idx  a checksummed header, then fixed-size records appended in order,
//                 each naming a run of saved blocks {first_block, block_count, crc}
//
// Ordering — the whole point of the store. Save(offset, old_data):
//
//   new = blocks of the range not saved yet      (saved blocks are never rewritten)
//   write new blocks' data to .img -> Sync(.img)          sync point 1
//   append one record per run of new blocks -> Sync(.idx)  sync point 2
//   mark them saved in memory; return ok
//
// Only after Save returned ok may the caller overwrite those source blocks.
//
// Crash safety:
//   * A crash before sync point 1 or between the points leaves data in .img that
//     no record names: those blocks are not saved, and the next Save writes
//     them again (the source was not overwritten, so with the same content).
//   * A record reaches the disk only after its blocks' data did, so every block
//     the index names reads back as the data that was saved for it.
//   * The first saved content of a block is kept forever: re-running failback
//     after a crash passes content failback itself wrote, and must not replace
//     the original site's data with it.
//   * At Open, a torn or bad-CRC record at the end of the index (with no valid
//     record after it) was never acknowledged: it is cut off. A bad record
//     followed by a valid one is damage to synced bytes: kCorruption.
//   * After a failed append to or sync of the index, the index's tail is
//     unknown: every later Save with blocks to save fails with that error
//     until the store is reopened (Open reads what reached the disk). A
//     failure before the index is touched (the .img write or sync) leaves the
//     store usable.
//
// Memory: one bit per block (std::vector<bool>) plus a counter; the index is
// read in chunks at Open, never held whole.
//
// Thread safety: every method is thread-safe; one mutex serialises them all,
// I/O included.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/base/coding.h"
#include "common/base/result.h"
#include "common/base/status.h"
#include "common/env/env.h"

namespace cdp::agent {

class BranchStore {
 public:
  struct Options {
    Env* env = nullptr;              // must outlive the store
    std::string prefix;              // the files are <prefix>.img and <prefix>.idx
    uint64_t volume_size = 0;        // bytes, > 0, a multiple of block_size
    uint32_t block_size = 4096;      // a power of two, 512 B .. 2 MiB
    std::array<uint8_t, 16> uuid{};  // the volume's uuid
    uint64_t time_us = 0;            // wall time written to a new index (creation time)
  };

  // Opens the store at `prefix`, creating both files when the index is missing
  // (.img sized and synced, then the index header written with
  // WriteFileAtomic: synced, renamed, directory synced). Otherwise loads the
  // index: kCorruption for a bad header (short, magic, version, CRC), a bad
  // record followed by a valid one, a valid record outside the volume, or a
  // missing or wrongly sized .img; kInvalidArgument when the index was written
  // for another volume size, block size or uuid (or the options are invalid);
  // else the Env's error. A torn tail is truncated away (and synced).
  static Result<std::unique_ptr<BranchStore>> Open(const Options& opts);

  // Deletes both files of the store at `prefix` (the index first) and syncs
  // their directory. Missing files are fine. The store must not be open.
  static Status Remove(Env* env, const std::string& prefix);

  BranchStore(const BranchStore&) = delete;
  BranchStore& operator=(const BranchStore&) = delete;

  // Saves `old_data`, the current content of the source at [offset,
  // offset + old_data.size()), for the blocks of that range not saved yet
  // (see the ordering above); blocks already saved keep their first content
  // and cost no I/O. ok: every block of the range is durably saved and may be
  // overwritten in the source. kInvalidArgument: offset or length not a
  // multiple of the block size. kOutOfRange: the range ends past the volume.
  // An empty `old_data` is ok and does nothing. Else the Env's error (and see
  // "after a failed append" above); on error nothing new counts as saved.
  Status Save(uint64_t offset, ByteSpan old_data);
  // The same for several ranges at once, with one sync per sync point for
  // all of them (a failback answer's runs). Every range is checked first:
  // one bad range fails the call with nothing written.
  struct Piece {
    uint64_t offset = 0;
    ByteSpan old_data;
  };
  Status SaveMany(std::span<const Piece> pieces);

  // Block `block` (index, not byte offset) is saved. False past the end.
  bool Contains(uint64_t block) const;
  uint64_t saved_blocks() const;
  // The saved blocks as (byte offset, byte length) extents, adjacent blocks
  // merged, in offset order.
  std::vector<std::pair<uint64_t, uint64_t>> Extents() const;

  // Reads [offset, offset + len) of the branch image into `buf` (>= len bytes):
  // saved blocks from .img, every other byte as zero. Any byte range inside
  // the volume (kOutOfRange otherwise); else the Env's error.
  Status ReadSaved(uint64_t offset, uint32_t len, uint8_t* buf);
  // Like ReadSaved, but the bytes of blocks not saved are left as they are in
  // `buf` (BranchDevice fills them from the live volume first).
  Status ReadSavedOver(uint64_t offset, uint32_t len, uint8_t* buf);

  uint64_t volume_size() const { return volume_size_; }
  uint32_t block_size() const { return block_size_; }
  uint64_t block_count() const { return block_count_; }
  const std::array<uint8_t, 16>& uuid() const { return uuid_; }
  // The creation time recorded in the index header (Options::time_us then).
  uint64_t created_us() const { return created_us_; }

 private:
  explicit BranchStore(const Options& opts);
  Status Create();
  Status Load();
  Status ReadSavedOverLocked(uint64_t offset, uint32_t len, uint8_t* buf);

  Env* const env_;
  const std::string img_path_;
  const std::string idx_path_;
  const uint64_t volume_size_;
  const uint32_t block_size_;
  const uint64_t block_count_;
  const std::array<uint8_t, 16> uuid_;
  uint64_t created_us_;

  mutable std::mutex mu_;
  std::unique_ptr<File> img_;
  std::unique_ptr<File> idx_;
  uint64_t idx_size_ = 0;    // bytes of the index known to be whole records
  Status index_error_;       // sticky: a failed append or sync of the index
  std::vector<bool> saved_;  // bit per block
  uint64_t saved_count_ = 0;
};

}  // namespace cdp::agent

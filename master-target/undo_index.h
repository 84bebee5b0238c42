// SPDX-License-Identifier: Apache-2.0
// UndoIndex: the on-disk index of a volume's undo journal that answers
// point-in-time reads: "for each byte of [offset, offset+len), which undo record
// holds its content as of recovery point P?" — the oldest undo record with
// seq > P that covers the byte; a byte covered by none reads from the replica.
// Tables and their meaning: docs/formats/mt-index.md ("Undo index").
//
// Memory does not grow with the journal: the records live in the volume's
// index database (tables `undo`, `undo_regions`, `undo_meta`); memory holds
// a summary of at most kMaxRegions regions (16 bytes each), the lookup
// connection's page cache (kReaderCacheKiB) and the records of the batch
// being applied.
//
//   apply:    Stage(records)  --  visible to lookups at once, before the
//                                 replica changes (exclusive lock)
//             Insert(records) --  inside the batch's commit transaction
//             Committed()     --  after that commit: staged records dropped,
//                                 counters and summary updated
//   failure:  Discarded()     --  staged records and pending changes dropped
//   retention RemoveUpTo(seq), rollback / recovery RemoveAbove(seq): inside
//             the caller's transaction, then Committed().
//
// Layout: `undo` is keyed by (offset, seq), so the records starting at one
// offset lie together in sequence order. Records are at most max_length()
// long, so the records that can overlap [a, b) start in
// [a - max_length() + 1, b). For each start offset a lookup seeks the first
// record with seq > P and walks on only while later records there reach
// further (records of equal length at one offset, the common case of a hot
// block, cost one seek). The summary keeps, per region of the volume, the
// highest seq of any record starting in it, and the highest seq of a record
// longer than kShortRecordBytes starting in it; a region whose highest seq is
// <= P is skipped without a seek. Short records (the common 4-64 KiB write)
// can reach a read only from kShortRecordBytes before it, so further back a
// region is sought only if its long records are newer than P: the old bulk
// copy that made max_length() large no longer makes every small rewrite in
// the window a seek. An over-estimate (after retention or a rollback, or an
// index from before the long summary) costs seeks, never a wrong answer.
//
// Thread safety: the owner (ReplicaVolume) guards it with a shared_mutex —
// Lookup/EntriesBetween/size under the shared lock; Stage/Committed/Discarded
// under the exclusive one; Insert/Remove*/MarkBuilt from the apply thread
// (apply_mu_) inside its transaction, under neither. Lookups may run at once:
// they share one read-only connection behind a mutex of their own.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/base/result.h"
#include "common/store/sqlite.h"
#include "master-target/journal.h"

namespace cdp::mt {

struct UndoEntry {
  uint64_t seq = 0;
  uint64_t offset = 0;
  uint32_t length = 0;
  UndoKind kind = UndoKind::kData;
  uint64_t segment = 0;
  uint64_t file_offset = 0;  // of the record header in its segment
  uint32_t crc = 0;
  uint64_t time_us = 0;

  UndoHeader header() const { return UndoHeader{kind, seq, offset, length, time_us, crc}; }
  UndoLocation location() const { return UndoLocation{segment, file_offset}; }
};

// One piece of a point-in-time read.
struct ReadPiece {
  uint64_t offset = 0;   // in the volume
  uint32_t length = 0;
  bool from_undo = false;  // false: read the replica
  UndoEntry entry;         // when from_undo: the record; the piece starts at
                           // offset - entry.offset inside its old data
};

// Splits [offset, offset+len) into pieces, in offset order, that together
// cover it exactly: each byte from the first of `candidates` (ordered by
// seq) that covers it, or from the replica.
std::vector<ReadPiece> PaintPieces(uint64_t offset, uint64_t len, std::vector<UndoEntry> candidates);

class UndoIndex {
 public:
  static constexpr uint64_t kMaxRegions = 32 * 1024;  // summary entries per volume (256 KiB)
  static constexpr int kReaderCacheKiB = 256;         // the lookup connection's page cache
  static constexpr uint64_t kMinRegionBytes = 1u << 20;
  // Records up to this long are short: a lookup looks for them only from
  // kShortRecordBytes - 1 before the read. Further back, up to max_length(),
  // only the regions whose long records (the second summary) are newer than
  // the point are sought.
  static constexpr uint64_t kShortRecordBytes = 64u << 10;

  // Creates the tables in `db` (the volume's index database, the writer's
  // connection) if missing, loads the summary, and opens `db_path` again
  // read-only for lookups (through the sqlite VFS `vfs`, "" = the default).
  static Result<std::unique_ptr<UndoIndex>> Open(sqlite::Db* db, const std::string& db_path, uint64_t volume_size,
                                                 const std::string& vfs = "");
  UndoIndex(const UndoIndex&) = delete;
  UndoIndex& operator=(const UndoIndex&) = delete;

  // Index format 2 -> 3, inside the caller's transaction on `db`: adds
  // undo_regions.long_max_seq, filled with each region's max_seq (an
  // over-estimate: correct, just not pruned). Does nothing if it is there.
  static Status AddLongSummary(sqlite::Db* db);

  // False for an index made before the undo tables existed: the owner fills
  // it from the journal (Insert), then MarkBuilt, in one transaction.
  bool built() const { return built_; }

  // Records being applied, not yet committed (ascending seq).
  void Stage(const UndoEntry& e);

  // Inside the caller's transaction on `db`:
  Status Insert(std::span<const UndoEntry> entries);
  Status RemoveUpTo(uint64_t seq);   // retention: every record with seq <= seq
  Status RemoveAbove(uint64_t seq);  // rollback, crash recovery
  Status MarkBuilt();
  Status Clear();                    // every record gone, not built (before a fill)
  // The caller's transaction committed / failed (or was never begun).
  void Committed();
  void Discarded();

  // Pieces of [offset, offset+len) as of `point` (see PaintPieces).
  Result<std::vector<ReadPiece>> Lookup(uint64_t point, uint64_t offset, uint64_t len) const;

  // Every record with after < seq <= up_to, newest first (descending seq, and
  // within one seq descending position in the journal): the order to undo
  // them in. A rollback asks window by window, so memory stays bounded.
  Result<std::vector<UndoEntry>> EntriesBetween(uint64_t after, uint64_t up_to) const;

  uint64_t size() const { return count_; }
  uint32_t max_length() const { return max_len_; }
  // Read transactions begun by Lookup on the lookup connection, since Open: at
  // most one per Lookup (all its seeks read one snapshot), none for a lookup
  // the summary answers alone.
  uint64_t lookup_transactions() const { return lookup_txns_.load(); }
  // Index seeks made by Lookup since Open (each a B-tree descent of `undo`).
  uint64_t seeks() const { return seeks_.load(); }

 private:
  UndoIndex(sqlite::Db* db, std::unique_ptr<sqlite::Db> reader, uint64_t volume_size);
  Status Prepare();
  Status LoadMeta();
  // Runs `remove` (a DELETE by seq) and counts what it removed.
  Status RemoveWhere(sqlite::Statement& remove, uint64_t seq);
  // The first record at (offset, seq) or after it in key order.
  Result<bool> Seek(uint64_t offset, uint64_t seq, UndoEntry* out) const;

  sqlite::Db* db_;
  int region_shift_ = 20;
  std::vector<uint64_t> region_max_;       // highest seq of a record starting in each region
  std::vector<uint64_t> region_long_max_;  // the same, of records longer than kShortRecordBytes
  uint64_t count_ = 0;
  uint32_t max_len_ = 0;
  bool built_ = false;
  std::vector<UndoEntry> staged_;

  // Changes written in the open transaction, applied by Committed().
  int64_t pending_count_ = 0;
  uint32_t pending_max_len_ = 0;
  struct RegionMax {
    uint64_t region = 0, max_seq = 0, long_max_seq = 0;
  };
  std::vector<RegionMax> pending_regions_;
  bool pending_built_ = false;
  bool pending_clear_ = false;

  // Writer statements (db_).
  std::optional<sqlite::Statement> insert_, upsert_region_, remove_up_to_, remove_above_, update_meta_;

  // Lookups.
  mutable std::mutex read_mu_;
  std::unique_ptr<sqlite::Db> reader_;
  mutable std::optional<sqlite::Statement> seek_, begin_read_, end_read_;
  mutable std::atomic<uint64_t> lookup_txns_{0};
  mutable std::atomic<uint64_t> seeks_{0};
};

}  // namespace cdp::mt

// UndoIndex: the in-memory index of a volume's undo journal that answers
// point-in-time reads: "for each byte of [offset, offset+len), which undo record
// holds its content as of recovery point P?" — the oldest undo record with
// seq > P that covers the byte; a byte covered by none reads from the replica.
// Format of what it indexes: docs/formats/mt-index.md.
//
// It is rebuilt from the journal when a volume opens and kept up to date by the
// apply engine (records are added in sequence order, oldest segments are
// removed by retention, records past a sequence are removed by rollback and
// crash recovery).
//
// Layout: a map from a record's start offset to the records starting there, in
// sequence order. Records are at most kMaxUndoChunk long, so the records that
// can overlap [a, b) start in [a - kMaxUndoChunk + 1, b). For each start offset
// a lookup binary-searches the first record with seq > P and walks on only
// while later records there reach further (same-offset records of equal
// length, the common case of a hot block, cost one step).
//
// Thread safety: none inside; the owner (ReplicaVolume) guards it with a
// shared_mutex — lookups under the shared lock, changes under the exclusive one.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

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

class UndoIndex {
 public:
  // Adds a record. Records must be added in non-decreasing sequence order.
  void Add(const UndoEntry& e);

  // Splits [offset, offset+len) into pieces, in offset order, that together
  // cover it exactly: each byte from the oldest record with seq > point that
  // covers it, or from the replica.
  std::vector<ReadPiece> Lookup(uint64_t point, uint64_t offset, uint64_t len) const;

  // Removes every record of segments <= `segment` (retention).
  void RemoveSegmentsUpTo(uint64_t segment);
  // Removes every record with seq > `seq` (rollback, crash recovery).
  void RemoveAbove(uint64_t seq);

  // Every record with seq > `seq`, newest first (descending seq, and within one
  // seq descending offset in the journal): the order to undo them in.
  std::vector<UndoEntry> EntriesAbove(uint64_t seq) const;

  size_t size() const { return count_; }
  // The lowest seq indexed (0 if empty).
  uint64_t min_seq() const;

 private:
  struct Slot {
    uint32_t max_len = 0;            // an upper bound of the lengths in `v`
    std::vector<UndoEntry> v;        // ascending seq
  };
  struct SegmentRefs {
    std::vector<uint64_t> offsets;   // start offsets of its records (may repeat)
    uint64_t max_seq = 0;
  };
  std::map<uint64_t, Slot> by_offset_;
  std::map<uint64_t, SegmentRefs> by_segment_;
  size_t count_ = 0;
};

}  // namespace cdp::mt

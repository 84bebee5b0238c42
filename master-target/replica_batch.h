// SPDX-License-Identifier: Apache-2.0
// Helpers of one batch's apply (ReplicaVolume::ApplyLocked,
// master-target/replica_apply.cc), with no state beyond the batch:
// BatchOverlay (what the batch's earlier records wrote), KnownHoles (what the
// replica read as zeros before the batch) and the unsealing of a sealed
// volume's records into the plain writes apply journals.
//
// Thread safety: one batch's objects, one thread.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "common/base/result.h"
#include "common/env/env.h"
#include "common/wire/protocol.h"

namespace cdp::mt {

// The bytes a batch's earlier records wrote, so that a later record in the same
// batch journals the bytes it really overwrites. Non-overlapping extents;
// `data == nullptr` means zeros. Pointers refer into the batch's records.
class BatchOverlay {
 public:
  void Insert(uint64_t off, uint64_t len, const uint8_t* data);

  // Calls fn(offset, length, data) for every extent, ascending; data ==
  // nullptr: zeros.
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (const auto& [off, e] : m_) fn(off, e.end - off, e.data);
  }

  // Whether any extent overlaps [off, off + len).
  bool Touches(uint64_t off, uint64_t len) const;

  void Patch(uint64_t off, uint64_t len, uint8_t* buf) const;

 private:
  struct Ext {
    uint64_t end;
    const uint8_t* data;
  };
  std::map<uint64_t, Ext> m_;
};

// What the replica read as zeros before the batch: disjoint ranges [start,
// end) learnt from File::NextData (SEEK_DATA) as step 1 of apply asks. The
// records of a batch at scattered offsets of a sparse replica then cost a few
// seeks instead of one each, and a zero record over a range that was a hole
// needs no hole punched. Valid until the batch writes the replica.
class KnownHoles {
 public:
  explicit KnownHoles(const File* replica) : replica_(replica) {}

  // True when [off, off + n) read as zeros before the batch; asks the replica
  // unless what was learnt already answers.
  Result<bool> IsHole(uint64_t off, uint64_t n);

  // From what was learnt only: true when [off, off + n) is known to read as zeros.
  bool Covers(uint64_t off, uint64_t n) const;

 private:
  void Add(uint64_t start, uint64_t end);

  const File* replica_;
  std::map<uint64_t, uint64_t> m_;  // start -> end
};

// kSealed or kSealedZero.
bool IsSealedKind(proto::RecordKind k);

// A sealed volume's records as the plain writes apply journals: each sealed
// record of recs[first..] becomes its blocks (data, or zeros) at its range
// and its MACs as data at volume_size + 16 * block, both under the record's
// sequence; other records are copied as they are.
std::vector<proto::Record> UnsealRecords(const std::vector<proto::Record>& recs, size_t first, uint64_t volume_size);

}  // namespace cdp::mt

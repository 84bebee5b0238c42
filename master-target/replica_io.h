// SPDX-License-Identifier: Apache-2.0
// ReplicaIo: the batched reads and writes of apply into the replica file,
// through two handles of it (issue #15, "random-write apply"):
//
//   direct   (OpenOptions::direct, File::DirectAlignment() = A > 0): the whole
//            A-aligned blocks of every range, through an A-aligned staging
//            buffer (at most kStageBytes, for the length of one call), in
//            batches (File::ReadBatch / WriteBatch: several requests in
//            flight on the POSIX Env);
//   buffered (the volume's replica_, which exports, digests, holes and undo
//            also use): the unaligned head and tail of every range.
//
//   range:   |--head--|=========== aligned blocks ===========|--tail--|
//            buffered   direct, in pieces of <= kPieceBytes    buffered
//
// Without a direct handle (none given, or one whose Env ignores `direct`:
// DirectAlignment() == 0) everything goes through the buffered handle.
//
// Coherence (Linux): a direct write flushes the cached pages of its range and
// drops them afterwards, a direct read flushes them first, so a buffered read
// after a direct write and a direct read after a buffered write see the
// latest bytes. What must never happen is a buffered write into the pages of
// a large folio while a direct write to the same folio is in flight (the
// folio, dirty again, could not be dropped and would later write stale bytes
// back): Write() finishes every buffered write before the first direct one,
// and the caller serialises its writes (apply holds the volume's apply lock).
//
// Durability: one Sync() of the buffered handle covers the direct writes too
// (fdatasync is per file, not per handle; MemEnv and FaultEnv follow that).
//
// Thread safety: Read may run on several threads at once; Write must not
// run at the same time as another Write or a Read of the same bytes (apply
// holds the volume's apply lock). The buffered handle may be read by other
// threads meanwhile.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/base/result.h"
#include "common/base/status.h"
#include "common/env/env.h"

namespace cdp::mt {

class ReplicaIo {
 public:
  static constexpr size_t kStageBytes = 4u << 20;  // staging for one direct batch
  static constexpr size_t kPieceBytes = 1u << 20;  // one direct request, at most

  // `buffered` must outlive this object. `direct` may be null.
  ReplicaIo(File* buffered, std::unique_ptr<File> direct);
  ReplicaIo(const ReplicaIo&) = delete;
  ReplicaIo& operator=(const ReplicaIo&) = delete;

  // True when the aligned blocks go through a direct handle.
  bool direct() const { return direct_ != nullptr; }

  // Reads every op (any offsets and lengths; ops may overlap). OK when all
  // were read; otherwise the first failure, and the buffers hold anything.
  Status Read(std::span<const ReadOp> ops);
  // Writes every op; the ops must not overlap (they are not written in order:
  // the unaligned parts first, then the aligned blocks, several at once). OK
  // when all landed; otherwise the first failure, and any part of any op may
  // have landed.
  Status Write(std::span<const WriteOp> ops);

 private:
  struct Piece {
    uint64_t offset;
    size_t n;
    size_t op;      // index of the op it belongs to
    size_t op_off;  // offset inside that op's buffer
  };
  // Splits [offset, offset + n) of op `op` into buffered parts (*edges: op
  // index, offset inside the op, length) and direct pieces.
  struct Edge {
    size_t op;
    size_t op_off;
    size_t n;
  };
  void Split(size_t op, uint64_t offset, size_t n, std::vector<Edge>* edges, std::vector<Piece>* pieces) const;
  struct FreeAligned {
    void operator()(uint8_t* p) const;
  };
  using Staging = std::unique_ptr<uint8_t, FreeAligned>;
  // Calls fn(run, at) for each run of `pieces` that fits the staging buffer
  // together, at[i] being where run[i] sits in it; stops at the first error.
  template <typename Fn>
  static Status ForEachStaged(const std::vector<Piece>& pieces, Fn fn);
  // An align_-aligned buffer for the direct pieces of one call (at most kStageBytes).
  Result<Staging> Stage(const std::vector<Piece>& pieces) const;

  File* buffered_;
  std::unique_ptr<File> direct_;
  uint32_t align_ = 0;
};

}  // namespace cdp::mt

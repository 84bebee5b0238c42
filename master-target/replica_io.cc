// SPDX-License-Identifier: Apache-2.0
#include "master-target/replica_io.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace cdp::mt {

ReplicaIo::ReplicaIo(File* buffered, std::unique_ptr<File> direct) : buffered_(buffered) {
  if (direct && direct->DirectAlignment() > 0 && kPieceBytes % direct->DirectAlignment() == 0) {
    align_ = direct->DirectAlignment();
    direct_ = std::move(direct);
  }
}

void ReplicaIo::FreeAligned::operator()(uint8_t* p) const { std::free(p); }

Result<ReplicaIo::Staging> ReplicaIo::Stage(const std::vector<Piece>& pieces) const {
  size_t need = 0;
  for (const Piece& p : pieces) {
    need += p.n;
    if (need >= kStageBytes) break;
  }
  need = std::min(need, kStageBytes);
  Staging s(static_cast<uint8_t*>(std::aligned_alloc(align_, need)));
  if (!s) return Status::FromErrno(ENOMEM, "replica: staging buffer for direct I/O");
  return s;
}

template <typename Fn>
Status ReplicaIo::ForEachStaged(const std::vector<Piece>& pieces, Fn fn) {
  std::vector<size_t> at;
  for (size_t first = 0; first < pieces.size();) {
    at.clear();
    size_t used = 0, last = first;
    for (; last < pieces.size() && used + pieces[last].n <= kStageBytes; ++last) {
      at.push_back(used);
      used += pieces[last].n;
    }
    CDP_RETURN_IF_ERROR(fn(std::span<const Piece>(pieces.data() + first, last - first), std::span<const size_t>(at)));
    first = last;
  }
  return Status::OK();
}

void ReplicaIo::Split(size_t op, uint64_t offset, size_t n, std::vector<Edge>* edges,
                      std::vector<Piece>* pieces) const {
  const uint64_t end = offset + n;
  const uint64_t mid_begin = (offset + align_ - 1) / align_ * align_;
  const uint64_t mid_end = end / align_ * align_;
  if (mid_begin >= mid_end) {  // no whole block inside
    edges->push_back(Edge{op, 0, n});
    return;
  }
  if (mid_begin > offset) edges->push_back(Edge{op, 0, size_t(mid_begin - offset)});
  for (uint64_t at = mid_begin; at < mid_end;) {
    const size_t len = size_t(std::min<uint64_t>(kPieceBytes, mid_end - at));
    pieces->push_back(Piece{at, len, op, size_t(at - offset)});
    at += len;
  }
  if (mid_end < end) edges->push_back(Edge{op, size_t(mid_end - offset), size_t(end - mid_end)});
}

Status ReplicaIo::Read(std::span<const ReadOp> ops) {
  if (!direct_) return buffered_->ReadBatch(ops);
  std::vector<Edge> edges;
  std::vector<Piece> pieces;
  for (size_t i = 0; i < ops.size(); ++i) Split(i, ops[i].offset, ops[i].n, &edges, &pieces);
  std::vector<ReadOp> batch;
  batch.reserve(edges.size());
  for (const Edge& e : edges) batch.push_back(ReadOp{ops[e.op].offset + e.op_off, e.n, ops[e.op].buf + e.op_off});
  CDP_RETURN_IF_ERROR(buffered_->ReadBatch(batch));
  if (pieces.empty()) return Status::OK();
  CDP_ASSIGN_OR_RETURN(Staging stage, Stage(pieces));
  return ForEachStaged(pieces, [&](std::span<const Piece> run, std::span<const size_t> at) {
    batch.clear();
    for (size_t i = 0; i < run.size(); ++i) batch.push_back(ReadOp{run[i].offset, run[i].n, stage.get() + at[i]});
    CDP_RETURN_IF_ERROR(direct_->ReadBatch(batch));
    for (size_t i = 0; i < run.size(); ++i)
      std::memcpy(ops[run[i].op].buf + run[i].op_off, stage.get() + at[i], run[i].n);
    return Status::OK();
  });
}

Status ReplicaIo::Write(std::span<const WriteOp> ops) {
  if (!direct_) return buffered_->WriteBatch(ops);
  std::vector<Edge> edges;
  std::vector<Piece> pieces;
  for (size_t i = 0; i < ops.size(); ++i) Split(i, ops[i].offset, ops[i].data.size(), &edges, &pieces);
  std::vector<WriteOp> batch;
  batch.reserve(edges.size());
  for (const Edge& e : edges) {
    batch.push_back(WriteOp{ops[e.op].offset + e.op_off, ops[e.op].data.subspan(e.op_off, e.n)});
  }
  // Every buffered write is done before the first direct one (see the header).
  CDP_RETURN_IF_ERROR(buffered_->WriteBatch(batch));
  if (pieces.empty()) return Status::OK();
  CDP_ASSIGN_OR_RETURN(Staging stage, Stage(pieces));
  return ForEachStaged(pieces, [&](std::span<const Piece> run, std::span<const size_t> at) {
    batch.clear();
    for (size_t i = 0; i < run.size(); ++i) {
      std::memcpy(stage.get() + at[i], ops[run[i].op].data.data() + run[i].op_off, run[i].n);
      batch.push_back(WriteOp{run[i].offset, ByteSpan(stage.get() + at[i], run[i].n)});
    }
    return direct_->WriteBatch(batch);
  });
}

}  // namespace cdp::mt

// SPDX-License-Identifier: Apache-2.0
// VolumeFence: who may write one replicated volume, and what it is doing.
// A part of ReplicaVolume (master-target/replica_volume.h, whose header draws
// the state machine): the generation and its numbering (Numbering,
// replica_types.h), the re-protect an operator armed, the upstream the
// generation is bound to, and the state -- protecting, rolling back, failed
// over (by a rollback, or promoted by Failover with its FailoverInfo),
// failing back, failed back. Persisted in the volume's sqlite index (volume
// row, `history`, `upstream`, `failover`, `failback`; docs/formats/mt-index.md).
//
//   stream ---- VolumeOpen ----> Admit ------ refusal: Nack (kWrongGeneration:
//   (PS, or a                     |            fenced, stale, rolled back;
//    direct agent)                |            kPermissionDenied: unarmed
//                                 |            generation, another upstream)
//                                 +-- armed next generation: re-protect (kept history)
//                                 +-- first open of a generation: binds its upstream
//   each batch ---------------> RefuseBatch -- refusal: Nack kWrongGeneration
//   operator (cdpctl) --------> Failover / CommitFailover / UndoFailover /
//                               StartFailback / QuiesceFailback / EndFailback /
//                               ArmReprotect; rollback: CheckRollback,
//                               StageRollback + RollingBack, StageRolledBack + RolledBack
//
// A Refusal's text is what the stream is told; a fenced one starts with
// proto::kFailedOverText (proto::IsFailedOverNack).
//
// Thread safety: every mutation runs with the owning ReplicaVolume's apply
// lock held (the one writer of the index), which also makes the mutators'
// own reads safe; a mutation publishes under this part's mutex, which the
// readers (state(), failover(), Fence(), FillStatus, ...) take. A leaf
// lock: nothing else is taken under it.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include "common/base/clock.h"
#include "common/base/result.h"
#include "common/base/status.h"
#include "common/store/sqlite.h"
#include "common/wire/protocol.h"
#include "master-target/replica_types.h"

namespace cdp::mt {

class VolumeFence {
 public:
  // Why a stream is refused (the Nack it gets).
  struct Refusal {
    proto::NackReason reason = proto::NackReason::kWrongGeneration;
    std::string message;
  };

  // `db` and `clock` must outlive the fence.
  VolumeFence(sqlite::Db* db, const Clock* clock) : db_(db), clock_(clock) {}
  VolumeFence(const VolumeFence&) = delete;
  VolumeFence& operator=(const VolumeFence&) = delete;

  // At Open, from the volume row (generation, state, rollback_to) and the
  // fence's own tables. kCorruption for a bad state, or failover/failback rows
  // that disagree with it (`index` names the index in the error).
  Status Load(const std::string& volume, const std::string& index, uint64_t generation, int64_t state,
              uint64_t rollback_to);

  VolumeState state() const;
  std::optional<FailoverInfo> failover() const;
  // Failed over by a rollback: the point rolled back to (0 otherwise).
  uint64_t rollback_to() const;
  uint64_t generation() const { return generation_.load(); }
  // The history sequence the current generation's wire sequence 0 stands for.
  uint64_t seq_base() const { return seq_base_.load(); }
  Numbering numbering() const { return Numbering{seq_base()}; }
  // The generation an operator allowed (ArmReprotect), 0: none.
  uint64_t reprotect_armed() const { return reprotect_armed_.load(); }
  // The "failed over" refusal text (proto::IsFailedOverNack) the stream of
  // this volume gets now: failed over, or failed back; "" while it
  // replicates. Sessions tell it to a peer that has the volume open, so that
  // a peer with nothing to send learns of the fence too.
  std::string Fence() const;
  // Fills state, seq_base, upstream, rollback_to, reprotect_armed, failover.
  void FillStatus(VolumeStatus* s) const;

  // ---- Apply lock held.
  // A VolumeOpen of `generation` from `from` (the identity already checked):
  // nullopt when admitted. Admitting the armed next generation re-protects
  // (persisted: the new generation's sequence 1 follows `applied`); the first
  // open of a generation binds it to `from` (persisted). The index's Status
  // on failure.
  Result<std::optional<Refusal>> Admit(uint64_t generation, const Upstream& from, uint64_t applied);
  // A batch now: nullopt when the volume takes batches.
  std::optional<Refusal> RefuseBatch() const;
  // ReplicaVolume::ArmReprotect (`applied` for the log).
  Result<uint64_t> ArmReprotect(uint64_t applied);
  // ReplicaVolume::Failover, with the reachable range [horizon, applied].
  Result<bool> Failover(uint64_t point_seq, int64_t point_id, uint64_t horizon, uint64_t applied);
  Result<bool> CommitFailover();
  Result<bool> UndoFailover(uint64_t applied);
  Result<bool> StartFailback();
  Result<bool> QuiesceFailback();
  // OK when failing back with the export quiesced (ApplyFailback may run).
  Status CheckFailbackApply() const;
  Result<bool> EndFailback(uint64_t applied);
  // OK when a rollback may start (not failed over by Failover, not failing or
  // failed back).
  Status CheckRollback() const;
  // Inside the caller's transaction: the volume row says rolling back to `to`
  // (StageRollback), or failed over (StageRolledBack). After its commit,
  // RollingBack / RolledBack publish it.
  Status StageRollback(const sqlite::Transaction& tx, uint64_t to);
  void RollingBack(uint64_t to);
  Status StageRolledBack(const sqlite::Transaction& tx);
  void RolledBack();

 private:
  std::string FencedMessage(const FailoverInfo& f) const;
  std::string FailedBackMessage() const;
  Status Reprotect(uint64_t gen, uint64_t applied);
  Status BindUpstream(const Upstream& from, uint64_t applied);
  Status SetState(VolumeState s);  // the volume row's state, in the caller's transaction

  sqlite::Db* const db_;
  const Clock* const clock_;
  std::string name_;  // the volume's, for messages (set by Load)

  mutable std::mutex mu_;  // readers; writers hold the apply lock too
  VolumeState state_ = VolumeState::kReplicating;
  uint64_t rollback_to_ = 0;
  std::optional<FailoverInfo> failover_;
  // The generation the upstream was bound in, and the upstream.
  uint64_t upstream_generation_ = 0;
  Upstream upstream_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<uint64_t> seq_base_{0};
  std::atomic<uint64_t> reprotect_armed_{0};
};

}  // namespace cdp::mt

// SPDX-License-Identifier: Apache-2.0
#include "master-target/replica_fence.h"

#include "common/base/log.h"

namespace cdp::mt {

Status VolumeFence::Load(const std::string& volume, const std::string& index, uint64_t generation, int64_t state,
                         uint64_t rollback_to) {
  name_ = volume;
  if (state < 0 || state > int64_t(VolumeState::kFailedBack)) return Status::Corruption(index + ": bad state");
  const VolumeState vs = VolumeState(state);
  generation_.store(generation);
  {
    // Indexes made before re-protect existed have no history table yet.
    CDP_RETURN_IF_ERROR(db_->Exec("CREATE TABLE IF NOT EXISTS history(id INTEGER PRIMARY KEY CHECK (id = 1),"
                                  " seq_base INTEGER NOT NULL)"));
    CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare("SELECT seq_base FROM history WHERE id = 1"));
    CDP_ASSIGN_OR_RETURN(bool row, st.Step());
    seq_base_.store(row ? uint64_t(st.ColumnInt64(0)) : 0);
  }
  uint64_t upstream_generation = 0;
  Upstream upstream;
  {
    // CreateIndexSchema made the table for indexes older than it: such a
    // volume is bound by its next open.
    CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare("SELECT generation, role, name FROM upstream WHERE id = 1"));
    CDP_ASSIGN_OR_RETURN(bool row, st.Step());
    if (row) {
      upstream_generation = uint64_t(st.ColumnInt64(0));
      upstream.role = st.ColumnText(1);
      upstream.name = st.ColumnText(2);
    }
  }
  std::optional<FailoverInfo> failover;
  {
    // CreateIndexSchema made the table for indexes older than failover.
    CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare("SELECT point_seq, point_id, committed, time_us FROM failover WHERE id = 1"));
    CDP_ASSIGN_OR_RETURN(bool row, st.Step());
    if (row) {
      FailoverInfo f;
      f.point_seq = uint64_t(st.ColumnInt64(0));
      f.point_id = st.ColumnInt64(1);
      f.committed = st.ColumnInt64(2) != 0;
      f.time_us = uint64_t(st.ColumnInt64(3));
      if (vs != VolumeState::kFailedOver && vs != VolumeState::kFailingBack)
        return Status::Corruption(index + ": a failover row on a volume not failed over");
      CDP_ASSIGN_OR_RETURN(auto fb, db_->Prepare("SELECT quiesced FROM failback WHERE id = 1"));
      CDP_ASSIGN_OR_RETURN(bool fb_row, fb.Step());
      if (fb_row != (vs == VolumeState::kFailingBack))
        return Status::Corruption(index + ": a failback row disagrees with the volume's state");
      f.quiesced = fb_row && fb.ColumnInt64(0) != 0;
      failover = f;
    }
  }
  std::lock_guard<std::mutex> lk(mu_);
  state_ = vs;
  rollback_to_ = rollback_to;
  failover_ = failover;
  upstream_generation_ = upstream_generation;
  upstream_ = std::move(upstream);
  return Status::OK();
}

VolumeState VolumeFence::state() const {
  std::lock_guard<std::mutex> lk(mu_);
  return state_;
}

std::optional<FailoverInfo> VolumeFence::failover() const {
  std::lock_guard<std::mutex> lk(mu_);
  return failover_;
}

uint64_t VolumeFence::rollback_to() const {
  std::lock_guard<std::mutex> lk(mu_);
  return rollback_to_;
}

std::string VolumeFence::FencedMessage(const FailoverInfo& f) const {
  std::string point = f.point_id != 0 ? "point " + std::to_string(f.point_id) + ", " : "";
  return std::string(proto::kFailedOverText) + ": volume " + name_ + " failed over at the master target (" + point +
         "sequence " + std::to_string(numbering().Wire(f.point_seq)) +
         "); this stream is fenced and nothing of it is applied" +
         (f.committed ? " (the failover is committed)" : " (an operator may undo: cdpctl failover " + name_ + " --undo)");
}

std::string VolumeFence::FailedBackMessage() const {
  return std::string(proto::kFailedOverText) + ": volume " + name_ +
         " was failed back from the master target; generation " + std::to_string(generation()) +
         " is fenced until the operator re-protects it (cdpctl reprotect " + name_ + ")";
}

std::string VolumeFence::Fence() const {
  if (std::optional<FailoverInfo> f = failover()) return FencedMessage(*f);
  if (state() == VolumeState::kFailedBack) return FailedBackMessage();
  return "";
}

void VolumeFence::FillStatus(VolumeStatus* s) const {
  s->seq_base = seq_base();
  s->reprotect_armed = reprotect_armed();
  std::lock_guard<std::mutex> lk(mu_);
  s->state = state_;
  if (upstream_generation_ == generation_.load()) s->upstream = upstream_;
  s->rollback_to = state_ == VolumeState::kFailedOver ? rollback_to_ : 0;
  s->failover = failover_;
}

Result<std::optional<VolumeFence::Refusal>> VolumeFence::Admit(uint64_t gen, const Upstream& from, uint64_t applied) {
  using R = std::optional<Refusal>;
  const uint64_t have = generation();
  // Fenced: whatever generation the old primary speaks, nothing it sends is taken.
  if (failover_) return R(Refusal{proto::NackReason::kWrongGeneration, FencedMessage(*failover_)});
  if (state_ == VolumeState::kFailedBack && gen <= have)
    return R(Refusal{proto::NackReason::kWrongGeneration, FailedBackMessage()});
  if (gen < have)
    return R(Refusal{proto::NackReason::kWrongGeneration,
                     "stale generation " + std::to_string(gen) + " < " + std::to_string(have)});
  if (gen == have && state_ != VolumeState::kReplicating)
    return R(Refusal{proto::NackReason::kWrongGeneration,
                     std::string("volume is ") + StateName(state_) +
                         "; re-protect is an operator command (cdpctl reprotect)"});
  if (gen > have) {
    if (gen != reprotect_armed_.load()) {
      return R(Refusal{proto::NackReason::kPermissionDenied,
                       "generation " + std::to_string(gen) + " > " + std::to_string(have) +
                           ": re-protect is an operator command (cdpctl reprotect at the master target)"});
    }
    CDP_RETURN_IF_ERROR(Reprotect(gen, applied));
  }
  if (upstream_generation_ == generation() && !(upstream_ == from)) {
    return R(Refusal{proto::NackReason::kPermissionDenied,
                     "volume " + name_ + " replicates through " + upstream_.Describe() + " in generation " +
                         std::to_string(generation()) + ", not through " + from.Describe() +
                         ": records still held there would interleave with this stream. To move the volume, "
                         "re-protect it (cdpctl reprotect " + name_ + "): the old path is fenced and every region "
                         "is compared"});
  }
  if (upstream_generation_ != generation()) CDP_RETURN_IF_ERROR(BindUpstream(from, applied));
  return R();
}

std::optional<VolumeFence::Refusal> VolumeFence::RefuseBatch() const {
  if (failover_) return Refusal{proto::NackReason::kWrongGeneration, FencedMessage(*failover_)};
  if (state_ == VolumeState::kFailedBack) return Refusal{proto::NackReason::kWrongGeneration, FailedBackMessage()};
  if (state_ != VolumeState::kReplicating)
    return Refusal{proto::NackReason::kWrongGeneration, std::string("volume is ") + StateName(state_) +
                                                            "; re-protect is an operator command (cdpctl reprotect)"};
  return std::nullopt;
}

Status VolumeFence::BindUpstream(const Upstream& from, uint64_t applied) {
  const uint64_t gen = generation();
  CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare("INSERT OR REPLACE INTO upstream(id, generation, role, name) VALUES(1, ?1, ?2, ?3)"));
  CDP_RETURN_IF_ERROR(st.BindAll(gen, from.role, from.name));
  CDP_RETURN_IF_ERROR(st.Run());
  {
    std::lock_guard<std::mutex> lk(mu_);
    upstream_generation_ = gen;
    upstream_ = from;
  }
  log::Get("mt.volume")->info("{} generation {} replicates through {}", log::Where{name_, "", applied}, gen,
                              from.Describe());
  return Status::OK();
}

Result<uint64_t> VolumeFence::ArmReprotect(uint64_t applied) {
  if (failover_)
    return Status::InvalidArgument(name_ + " is failed over at sequence " + std::to_string(failover_->point_seq) +
                                   ": re-protect after a failover needs a failback first (cdpctl failback); before a "
                                   "commit, cdpctl failover " + name_ + " --undo returns to protecting");
  const uint64_t next = generation() + 1;
  reprotect_armed_.store(next);
  log::Get("mt.volume")->warn("{} re-protect armed by the operator: generation {} will be accepted",
                              log::Where{name_, "", applied}, next);
  return next;
}

Status VolumeFence::Reprotect(uint64_t gen, uint64_t applied) {
  const uint64_t base = applied;
  {
    CDP_ASSIGN_OR_RETURN(auto tx, sqlite::Transaction::Begin(*db_));
    CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare("UPDATE volume SET generation = ?1, state = 0, rollback_to = 0 WHERE id = 1"));
    CDP_RETURN_IF_ERROR(st.BindAll(gen));
    CDP_RETURN_IF_ERROR(st.Run());
    CDP_ASSIGN_OR_RETURN(auto hs, db_->Prepare("INSERT OR REPLACE INTO history(id, seq_base) VALUES(1, ?1)"));
    CDP_RETURN_IF_ERROR(hs.BindAll(base));
    CDP_RETURN_IF_ERROR(hs.Run());
    CDP_RETURN_IF_ERROR(tx.Commit());
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    state_ = VolumeState::kReplicating;
    rollback_to_ = 0;
  }
  generation_.store(gen);
  seq_base_.store(base);
  reprotect_armed_.store(0);
  log::Get("mt.volume")->info("{} re-protected under generation {}: its sequence 1 follows history sequence {}; "
                              "every recovery point is kept", log::Where{name_, "", base}, gen, base);
  return Status::OK();
}

Status VolumeFence::SetState(VolumeState s) {
  CDP_ASSIGN_OR_RETURN(auto up, db_->Prepare("UPDATE volume SET state = ?1 WHERE id = 1"));
  CDP_RETURN_IF_ERROR(up.BindAll(int64_t(s)));
  return up.Run();
}

Result<bool> VolumeFence::Failover(uint64_t point_seq, int64_t point_id, uint64_t horizon, uint64_t applied) {
  if (failover_) {
    if (failover_->point_seq == point_seq) return false;
    return Status::AlreadyExists(name_ + " is already failed over at sequence " + std::to_string(failover_->point_seq) +
                                 "; undo it first (cdpctl failover " + name_ + " --undo)");
  }
  if (state_ != VolumeState::kReplicating)
    return Status::InvalidArgument(name_ + " is " + StateName(state_) +
                                   " (rolled back); a failover promotes a point of a protected volume");
  if (point_seq < horizon || point_seq > applied)
    return Status::OutOfRange(name_ + ": sequence " + std::to_string(point_seq) + " is not reachable");
  FailoverInfo f;
  f.point_seq = point_seq;
  f.point_id = point_id;
  f.time_us = clock_->WallMicros();
  {
    CDP_ASSIGN_OR_RETURN(auto tx, sqlite::Transaction::Begin(*db_));
    CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare(
        "INSERT OR REPLACE INTO failover(id, point_seq, point_id, committed, time_us) VALUES(1, ?1, ?2, 0, ?3)"));
    CDP_RETURN_IF_ERROR(st.BindAll(f.point_seq, f.point_id, f.time_us));
    CDP_RETURN_IF_ERROR(st.Run());
    CDP_RETURN_IF_ERROR(SetState(VolumeState::kFailedOver));
    CDP_RETURN_IF_ERROR(tx.Commit());
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    state_ = VolumeState::kFailedOver;
    failover_ = f;
  }
  log::Get("mt.volume")->warn("{} failed over: sequence {} promoted; the journal after it is kept as a branch, "
                              "the old primary is fenced",
                              log::Where{name_, "", point_seq}, point_seq);
  return true;
}

Result<bool> VolumeFence::CommitFailover() {
  if (!failover_) return Status::InvalidArgument(name_ + " is not failed over (cdpctl failover VOLUME --to POINT)");
  if (failover_->committed) return false;
  {
    CDP_ASSIGN_OR_RETURN(auto tx, sqlite::Transaction::Begin(*db_));
    CDP_RETURN_IF_ERROR(db_->Exec("UPDATE failover SET committed = 1 WHERE id = 1"));
    CDP_RETURN_IF_ERROR(tx.Commit());
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    failover_->committed = true;
  }
  log::Get("mt.volume")->warn("{} failover at sequence {} committed: undo is refused from now on",
                              log::Where{name_, "", failover_->point_seq}, failover_->point_seq);
  return true;
}

Result<bool> VolumeFence::UndoFailover(uint64_t applied) {
  if (!failover_) {
    if (state_ == VolumeState::kReplicating) return false;
    return Status::InvalidArgument(name_ + " is " + StateName(state_) +
                                   " by a rollback, not by cdpctl failover: nothing to undo");
  }
  if (failover_->committed)
    return Status::AlreadyExists(name_ + ": the failover at sequence " + std::to_string(failover_->point_seq) +
                                 " is committed; undo is refused (failback brings the volume home)");
  {
    CDP_ASSIGN_OR_RETURN(auto tx, sqlite::Transaction::Begin(*db_));
    CDP_RETURN_IF_ERROR(db_->Exec("DELETE FROM failover"));
    CDP_RETURN_IF_ERROR(SetState(VolumeState::kReplicating));
    CDP_RETURN_IF_ERROR(tx.Commit());
  }
  const uint64_t p = failover_->point_seq;
  {
    std::lock_guard<std::mutex> lk(mu_);
    state_ = VolumeState::kReplicating;
    failover_.reset();
  }
  log::Get("mt.volume")->warn("{} failover at sequence {} undone: protecting again from applied sequence {}",
                              log::Where{name_, "", p}, p, applied);
  return true;
}

Result<bool> VolumeFence::StartFailback() {
  if (state_ == VolumeState::kFailingBack) return false;
  if (!failover_)
    return Status::InvalidArgument(name_ + " is " + StateName(state_) +
                                   ": failback brings home a volume failed over by cdpctl failover");
  const uint64_t now = clock_->WallMicros();
  {
    CDP_ASSIGN_OR_RETURN(auto tx, sqlite::Transaction::Begin(*db_));
    CDP_RETURN_IF_ERROR(db_->Exec("UPDATE failover SET committed = 1 WHERE id = 1"));
    CDP_ASSIGN_OR_RETURN(auto fb, db_->Prepare("INSERT OR REPLACE INTO failback(id, quiesced, time_us) VALUES(1, 0, ?1)"));
    CDP_RETURN_IF_ERROR(fb.BindAll(now));
    CDP_RETURN_IF_ERROR(fb.Run());
    CDP_RETURN_IF_ERROR(SetState(VolumeState::kFailingBack));
    CDP_RETURN_IF_ERROR(tx.Commit());
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    state_ = VolumeState::kFailingBack;
    failover_->committed = true;
    failover_->quiesced = false;
  }
  log::Get("mt.volume")->warn("{} failing back: the failover at sequence {} is committed; the original site pulls "
                              "what differs",
                              log::Where{name_, "", failover_->point_seq}, failover_->point_seq);
  return true;
}

Result<bool> VolumeFence::QuiesceFailback() {
  if (state_ != VolumeState::kFailingBack)
    return Status::InvalidArgument(name_ + " is " + StateName(state_) + ", not failing back (cdpctl failback)");
  if (failover_->quiesced) return false;
  {
    CDP_ASSIGN_OR_RETURN(auto tx, sqlite::Transaction::Begin(*db_));
    CDP_RETURN_IF_ERROR(db_->Exec("UPDATE failback SET quiesced = 1 WHERE id = 1"));
    CDP_RETURN_IF_ERROR(tx.Commit());
  }
  std::lock_guard<std::mutex> lk(mu_);
  failover_->quiesced = true;
  return true;
}

Status VolumeFence::CheckFailbackApply() const {
  if (state_ != VolumeState::kFailingBack || !failover_->quiesced)
    return Status::InvalidArgument(name_ + " is not failing back with its export quiesced");
  return Status::OK();
}

Result<bool> VolumeFence::EndFailback(uint64_t applied) {
  if (state_ == VolumeState::kFailedBack) return false;
  CDP_RETURN_IF_ERROR(CheckFailbackApply());
  {
    CDP_ASSIGN_OR_RETURN(auto tx, sqlite::Transaction::Begin(*db_));
    CDP_RETURN_IF_ERROR(db_->Exec("DELETE FROM failover"));
    CDP_RETURN_IF_ERROR(db_->Exec("DELETE FROM failback"));
    CDP_RETURN_IF_ERROR(SetState(VolumeState::kFailedBack));
    CDP_RETURN_IF_ERROR(tx.Commit());
  }
  const uint64_t p = failover_->point_seq;
  {
    std::lock_guard<std::mutex> lk(mu_);
    state_ = VolumeState::kFailedBack;
    failover_.reset();
  }
  log::Get("mt.volume")->warn("{} failed back: the replica equals the promoted image at sequence {}; generation {} "
                              "stays fenced until cdpctl reprotect",
                              log::Where{name_, "", p}, applied, generation());
  return true;
}

Status VolumeFence::CheckRollback() const {
  if (failover_)
    return Status::InvalidArgument(name_ + " is failed over at sequence " + std::to_string(failover_->point_seq) +
                                   " (cdpctl failover); a rollback would rewrite the kept branch");
  if (state_ == VolumeState::kFailingBack || state_ == VolumeState::kFailedBack)
    return Status::InvalidArgument(name_ + " is " + StateName(state_) + "; re-protect it before a rollback");
  return Status::OK();
}

Status VolumeFence::StageRollback(const sqlite::Transaction&, uint64_t to) {
  CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare("UPDATE volume SET state = ?1, rollback_to = ?2 WHERE id = 1"));
  CDP_RETURN_IF_ERROR(st.BindAll(int64_t(VolumeState::kRollingBack), to));
  return st.Run();
}

void VolumeFence::RollingBack(uint64_t to) {
  std::lock_guard<std::mutex> lk(mu_);
  state_ = VolumeState::kRollingBack;
  rollback_to_ = to;
}

Status VolumeFence::StageRolledBack(const sqlite::Transaction&) { return SetState(VolumeState::kFailedOver); }

void VolumeFence::RolledBack() {
  std::lock_guard<std::mutex> lk(mu_);
  state_ = VolumeState::kFailedOver;
}

}  // namespace cdp::mt

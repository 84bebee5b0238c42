// SPDX-License-Identifier: Apache-2.0
#include "master-target/replica_volume.h"

#include <algorithm>
#include <bit>

#include "common/store/sqlite.h"
#include "master-target/replica_index.h"

namespace cdp::mt {

namespace {

// kIndexFormatVersion (replica_undo.h): 2 put the undo index in the tables
// `undo*` (undo_index.h); 3 added its long-record summary. An index of
// version 1 is opened and filled to the current version at open
// (UndoLog::RebuildIndex), one of version 2 gets the column (MigrateIndex); a
// binary that knows only an older version refuses it then, rather than apply
// batches without indexing their undo records or summing them up.

const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS volume(
  id INTEGER PRIMARY KEY CHECK (id = 1),
  format_version INTEGER NOT NULL,
  name TEXT NOT NULL,
  size INTEGER NOT NULL,
  block_size INTEGER NOT NULL,
  uuid BLOB NOT NULL,
  generation INTEGER NOT NULL,
  applied_seq INTEGER NOT NULL,
  journal_segment INTEGER NOT NULL,
  journal_offset INTEGER NOT NULL,
  horizon_seq INTEGER NOT NULL,
  state INTEGER NOT NULL,
  rollback_to INTEGER NOT NULL,
  created_us INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS segments(
  segment INTEGER PRIMARY KEY,
  min_seq INTEGER NOT NULL,
  max_seq INTEGER NOT NULL,
  first_time_us INTEGER NOT NULL,
  last_time_us INTEGER NOT NULL,
  bytes INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS history(
  id INTEGER PRIMARY KEY CHECK (id = 1),
  seq_base INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS failover(
  id INTEGER PRIMARY KEY CHECK (id = 1),
  point_seq INTEGER NOT NULL,
  point_id INTEGER NOT NULL,
  committed INTEGER NOT NULL,
  time_us INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS failback(
  id INTEGER PRIMARY KEY CHECK (id = 1),
  quiesced INTEGER NOT NULL,
  time_us INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS sealing(
  id INTEGER PRIMARY KEY CHECK (id = 1),
  unit INTEGER NOT NULL,
  mac_size INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS upstream(
  id INTEGER PRIMARY KEY CHECK (id = 1),
  generation INTEGER NOT NULL,
  role TEXT NOT NULL,
  name TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rollbacks(
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  to_seq INTEGER NOT NULL,
  from_seq INTEGER NOT NULL,
  end_seq INTEGER NOT NULL,
  time_us INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS anomalies(
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  seq INTEGER NOT NULL,
  clean_seq INTEGER NOT NULL,
  point_id INTEGER NOT NULL,
  time_us INTEGER NOT NULL,
  message TEXT NOT NULL,
  acknowledged INTEGER NOT NULL,
  hold_until_us INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS points(
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  seq INTEGER NOT NULL,
  time_us INTEGER NOT NULL,
  kind INTEGER NOT NULL,
  name TEXT NOT NULL,
  applied_us INTEGER NOT NULL DEFAULT 0);
)sql";

}  // namespace

Status CreateIndexSchema(sqlite::Db& db) {
  CDP_RETURN_IF_ERROR(db.Exec(kSchema));
  // Points made before issue 38 have no apply time (their time_us is it):
  // the column is added with 0, read as "the same as time_us".
  CDP_ASSIGN_OR_RETURN(auto cols, db.Prepare("SELECT 1 FROM pragma_table_info('points') WHERE name = 'applied_us'"));
  CDP_ASSIGN_OR_RETURN(bool has, cols.Step());
  if (has) return Status::OK();
  return db.Exec("ALTER TABLE points ADD COLUMN applied_us INTEGER NOT NULL DEFAULT 0");
}

Status ReplicaVolume::MigrateIndex() {
  CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare("SELECT format_version FROM volume WHERE id = 1"));
  CDP_ASSIGN_OR_RETURN(bool row, st.Step());
  if (!row || st.ColumnInt64(0) != 2) return Status::OK();
  CDP_RETURN_IF_ERROR(st.Reset());
  // Version 2 -> 3: the undo index's long-record summary, and the version,
  // in one transaction.
  CDP_ASSIGN_OR_RETURN(auto tx, sqlite::Transaction::Begin(*db_));
  CDP_RETURN_IF_ERROR(UndoIndex::AddLongSummary(db_.get()));
  CDP_RETURN_IF_ERROR(db_->Exec("UPDATE volume SET format_version = " + std::to_string(kIndexFormatVersion) +
                                " WHERE id = 1"));
  return tx.Commit();
}

Status ReplicaVolume::CreateFiles(const VolumeIdentity& id) {
  if (!ValidName(id.name)) return Status::InvalidArgument("bad volume name");
  if (!std::has_single_bit(id.block_size) || id.block_size < 512 || id.block_size > (1u << 20))
    return Status::InvalidArgument("bad block size " + std::to_string(id.block_size));
  if (id.size == 0 || id.size % id.block_size != 0)
    return Status::InvalidArgument("volume size must be a non-zero multiple of the block size");
  if (id.sealed && id.size % proto::kSealUnit != 0)
    return Status::InvalidArgument("a sealed volume's size must be a multiple of 4 KiB");
  Env* env = o_.env;
  CDP_RETURN_IF_ERROR(UndoLog::CreateJournal(env, JoinPath(o_.dir, "journal"), o_.segment_bytes));
  // The digests of an earlier volume of this name do not describe the new replica.
  CDP_RETURN_IF_ERROR(ReplicaStore::Create(env, o_.dir, id));
  CDP_RETURN_IF_ERROR(env->SyncDir(o_.dir));  // the journal directory and the replica
  CDP_ASSIGN_OR_RETURN(auto tx, sqlite::Transaction::Begin(*db_));
  {
    CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare(
        "INSERT INTO volume(id, format_version, name, size, block_size, uuid, generation, applied_seq,"
        " journal_segment, journal_offset, horizon_seq, state, rollback_to, created_us)"
        " VALUES(1, ?1, ?2, ?3, ?4, ?5, ?6, 0, 1, ?7, 0, 0, 0, ?8)"));
    CDP_RETURN_IF_ERROR(st.BindAll(int64_t(kIndexFormatVersion), id.name, id.size, int64_t(id.block_size),
                                   ByteSpan(id.uuid.data(), id.uuid.size()), id.generation,
                                   uint64_t(kSegmentHeaderSize), o_.clock->WallMicros()));
    CDP_RETURN_IF_ERROR(st.Run());
  }
  if (id.sealed) {
    CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare("INSERT INTO sealing(id, unit, mac_size) VALUES(1, ?1, ?2)"));
    CDP_RETURN_IF_ERROR(st.BindAll(int64_t(proto::kSealUnit), int64_t(proto::kSealMacSize)));
    CDP_RETURN_IF_ERROR(st.Run());
  }
  {
    CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare("INSERT INTO segments VALUES(1, 0, 0, 0, 0, ?1)"));
    CDP_RETURN_IF_ERROR(st.BindAll(uint64_t(kSegmentHeaderSize)));
    CDP_RETURN_IF_ERROR(st.Run());
  }
  return tx.Commit();
}

Status ReplicaVolume::LoadIndex(UndoLog::Row* jrow) {
  int64_t state = 0;
  uint64_t rollback_to = 0;
  {
    CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare(
        "SELECT format_version, name, size, block_size, uuid, generation, applied_seq, journal_segment,"
        " journal_offset, horizon_seq, state, rollback_to FROM volume WHERE id = 1"));
    CDP_ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) return Status::Corruption(o_.index_path + ": no volume row");
    if (st.ColumnInt64(0) != kIndexFormatVersion && st.ColumnInt64(0) != 1)  // 2: MigrateIndex
      return Status::Corruption(o_.index_path + ": unsupported index format " + std::to_string(st.ColumnInt64(0)));
    jrow->index_version = int(st.ColumnInt64(0));
    id_.name = st.ColumnText(1);
    id_.size = uint64_t(st.ColumnInt64(2));
    id_.block_size = uint32_t(st.ColumnInt64(3));
    Bytes uuid = st.ColumnBlob(4);
    if (uuid.size() != id_.uuid.size()) return Status::Corruption(o_.index_path + ": bad uuid");
    std::copy(uuid.begin(), uuid.end(), id_.uuid.begin());
    id_.generation = uint64_t(st.ColumnInt64(5));
    applied_.store(uint64_t(st.ColumnInt64(6)));
    jrow->committed_segment = uint64_t(st.ColumnInt64(7));
    jrow->committed_offset = uint64_t(st.ColumnInt64(8));
    jrow->horizon = uint64_t(st.ColumnInt64(9));
    state = st.ColumnInt64(10);
    rollback_to = uint64_t(st.ColumnInt64(11));
  }
  {
    // CreateIndexSchema made the table for indexes older than sealing.
    CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare("SELECT unit, mac_size FROM sealing WHERE id = 1"));
    CDP_ASSIGN_OR_RETURN(bool row, st.Step());
    id_.sealed = row;
    if (row && (st.ColumnInt64(0) != proto::kSealUnit || st.ColumnInt64(1) != proto::kSealMacSize))
      return Status::Corruption(o_.index_path + ": sealing of " + std::to_string(st.ColumnInt64(0)) + "-byte blocks with " +
                                std::to_string(st.ColumnInt64(1)) + "-byte MACs is not this version's");
  }
  CDP_RETURN_IF_ERROR(fence_->Load(id_.name, o_.index_path, id_.generation, state, rollback_to));
  return catalogue_->Load(id_.name);
}

Status ReplicaVolume::CommitBatch(uint64_t last_seq, UndoLog::Position pos,
                                  const std::map<uint64_t, SegmentInfo>& touched, const std::vector<UndoEntry>& undo,
                                  PointCatalogue::NewPoints* new_points) {
  CDP_ASSIGN_OR_RETURN(auto tx, sqlite::Transaction::Begin(*db_));
  CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare(
      "UPDATE volume SET applied_seq = ?1, journal_segment = ?2, journal_offset = ?3 WHERE id = 1"));
  CDP_RETURN_IF_ERROR(st.BindAll(last_seq, pos.segment, pos.offset));
  CDP_RETURN_IF_ERROR(st.Run());
  CDP_RETURN_IF_ERROR(journal_->StageCommit(tx, undo, touched));
  CDP_RETURN_IF_ERROR(catalogue_->StageNew(tx, new_points));
  return tx.Commit();
}

}  // namespace cdp::mt

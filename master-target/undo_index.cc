// SPDX-License-Identifier: Apache-2.0
#include "master-target/undo_index.h"

#include <algorithm>
#include <bit>

namespace cdp::mt {

namespace {

const char* kUndoSchema = R"sql(
CREATE TABLE IF NOT EXISTS undo(
  offset INTEGER NOT NULL,
  seq INTEGER NOT NULL,
  length INTEGER NOT NULL,
  kind INTEGER NOT NULL,
  segment INTEGER NOT NULL,
  file_offset INTEGER NOT NULL,
  crc INTEGER NOT NULL,
  time_us INTEGER NOT NULL,
  PRIMARY KEY (offset, seq)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS undo_by_seq ON undo(seq);
CREATE TABLE IF NOT EXISTS undo_regions(
  region INTEGER PRIMARY KEY,
  max_seq INTEGER NOT NULL,
  long_max_seq INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS undo_meta(
  id INTEGER PRIMARY KEY CHECK (id = 1),
  region_shift INTEGER NOT NULL,
  records INTEGER NOT NULL,
  max_length INTEGER NOT NULL,
  built INTEGER NOT NULL);
)sql";

constexpr const char* kColumns = "offset, seq, length, kind, segment, file_offset, crc, time_us";

UndoEntry RowEntry(const sqlite::Statement& st) {
  UndoEntry e;
  e.offset = uint64_t(st.ColumnInt64(0));
  e.seq = uint64_t(st.ColumnInt64(1));
  e.length = uint32_t(st.ColumnInt64(2));
  e.kind = UndoKind(st.ColumnInt64(3));
  e.segment = uint64_t(st.ColumnInt64(4));
  e.file_offset = uint64_t(st.ColumnInt64(5));
  e.crc = uint32_t(st.ColumnInt64(6));
  e.time_us = uint64_t(st.ColumnInt64(7));
  return e;
}

// The smallest power-of-two region of at least kMinRegionBytes that covers
// the volume in at most kMaxRegions regions.
int RegionShift(uint64_t volume_size) {
  uint64_t region = UndoIndex::kMinRegionBytes;
  while (region * UndoIndex::kMaxRegions < volume_size) region <<= 1;
  return std::countr_zero(region);
}

}  // namespace

std::vector<ReadPiece> PaintPieces(uint64_t offset, uint64_t len, std::vector<UndoEntry> cand) {
  const uint64_t end = offset + len;
  std::sort(cand.begin(), cand.end(), [](const UndoEntry& a, const UndoEntry& b) {
    return a.seq != b.seq ? a.seq < b.seq : a.offset < b.offset;
  });
  // Each candidate, oldest first, takes the bytes no older one took.
  std::vector<std::pair<uint64_t, uint64_t>> gaps{{offset, end}};
  std::vector<ReadPiece> pieces;
  for (const UndoEntry& e : cand) {
    if (gaps.empty()) break;
    uint64_t cs = e.offset, ce = e.offset + e.length;
    std::vector<std::pair<uint64_t, uint64_t>> next;
    next.reserve(gaps.size() + 1);
    for (auto [gs, ge] : gaps) {
      uint64_t s = std::max(gs, cs), t = std::min(ge, ce);
      if (s >= t) {
        next.emplace_back(gs, ge);
        continue;
      }
      if (gs < s) next.emplace_back(gs, s);
      ReadPiece p;
      p.offset = s;
      p.length = uint32_t(t - s);
      p.from_undo = true;
      p.entry = e;
      pieces.push_back(p);
      if (t < ge) next.emplace_back(t, ge);
    }
    gaps.swap(next);
  }
  for (auto [gs, ge] : gaps) {
    // Replica pieces may be long; split so each fits a uint32 length.
    while (gs < ge) {
      uint64_t n = std::min<uint64_t>(ge - gs, 1u << 30);
      ReadPiece p;
      p.offset = gs;
      p.length = uint32_t(n);
      pieces.push_back(p);
      gs += n;
    }
  }
  std::sort(pieces.begin(), pieces.end(), [](const ReadPiece& a, const ReadPiece& b) { return a.offset < b.offset; });
  return pieces;
}

UndoIndex::UndoIndex(sqlite::Db* db, std::unique_ptr<sqlite::Db> reader, uint64_t volume_size)
    : db_(db), region_shift_(RegionShift(volume_size)), reader_(std::move(reader)) {
  region_max_.assign(size_t((volume_size + (uint64_t(1) << region_shift_) - 1) >> region_shift_), 0);
  region_long_max_.assign(region_max_.size(), 0);
}

Result<std::unique_ptr<UndoIndex>> UndoIndex::Open(sqlite::Db* db, const std::string& db_path,
                                                   uint64_t volume_size, const std::string& vfs) {
  CDP_RETURN_IF_ERROR(db->Exec(kUndoSchema));
  sqlite::Db::Options ro;
  ro.read_only = true;
  ro.vfs = vfs;
  CDP_ASSIGN_OR_RETURN(auto reader, sqlite::Db::Open(db_path, ro));
  CDP_RETURN_IF_ERROR(reader->Exec("PRAGMA cache_size = -" + std::to_string(kReaderCacheKiB)));
  std::unique_ptr<UndoIndex> idx(new UndoIndex(db, std::move(reader), volume_size));
  CDP_RETURN_IF_ERROR(idx->LoadMeta());
  CDP_RETURN_IF_ERROR(idx->Prepare());
  return idx;
}

Status UndoIndex::AddLongSummary(sqlite::Db* db) {
  CDP_ASSIGN_OR_RETURN(auto st,
                       db->Prepare("SELECT COUNT(*) FROM pragma_table_info('undo_regions') WHERE name = 'long_max_seq'"));
  CDP_ASSIGN_OR_RETURN(bool row, st.Step());
  if (row && st.ColumnInt64(0) == 1) return Status::OK();
  return db->Exec(
      "ALTER TABLE undo_regions ADD COLUMN long_max_seq INTEGER NOT NULL DEFAULT 0;"
      "UPDATE undo_regions SET long_max_seq = max_seq;");
}

Status UndoIndex::LoadMeta() {
  {
    CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare("SELECT region_shift, records, max_length, built FROM undo_meta WHERE id = 1"));
    CDP_ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) {
      // A new index, or one made before the undo tables: empty, not built.
      CDP_ASSIGN_OR_RETURN(auto ins, db_->Prepare("INSERT INTO undo_meta VALUES(1, ?1, 0, 0, 0)"));
      CDP_RETURN_IF_ERROR(ins.BindAll(int64_t(region_shift_)));
      return ins.Run();
    }
    if (st.ColumnInt64(0) != region_shift_) {
      return Status::Corruption(db_->path() + ": undo summary regions of 2^" + std::to_string(st.ColumnInt64(0)) +
                                " bytes where this volume's size gives 2^" + std::to_string(region_shift_));
    }
    count_ = uint64_t(st.ColumnInt64(1));
    max_len_ = uint32_t(st.ColumnInt64(2));
    built_ = st.ColumnInt64(3) != 0;
  }
  CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare("SELECT region, max_seq, long_max_seq FROM undo_regions"));
  for (;;) {
    CDP_ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    uint64_t r = uint64_t(st.ColumnInt64(0));
    if (r >= region_max_.size()) return Status::Corruption(db_->path() + ": undo summary region past the volume");
    region_max_[r] = uint64_t(st.ColumnInt64(1));
    region_long_max_[r] = uint64_t(st.ColumnInt64(2));
  }
  return Status::OK();
}

Status UndoIndex::Prepare() {
  CDP_ASSIGN_OR_RETURN(auto ins, db_->Prepare(std::string("INSERT INTO undo(") + kColumns +
                                              ") VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"));
  insert_.emplace(std::move(ins));
  CDP_ASSIGN_OR_RETURN(auto reg, db_->Prepare("INSERT INTO undo_regions VALUES(?1, ?2, ?3) ON CONFLICT(region) DO "
                                              "UPDATE SET max_seq = MAX(max_seq, excluded.max_seq), "
                                              "long_max_seq = MAX(long_max_seq, excluded.long_max_seq)"));
  upsert_region_.emplace(std::move(reg));
  CDP_ASSIGN_OR_RETURN(auto up_to, db_->Prepare("DELETE FROM undo WHERE seq <= ?1"));
  remove_up_to_.emplace(std::move(up_to));
  CDP_ASSIGN_OR_RETURN(auto above, db_->Prepare("DELETE FROM undo WHERE seq > ?1"));
  remove_above_.emplace(std::move(above));
  CDP_ASSIGN_OR_RETURN(auto meta, db_->Prepare(
      "UPDATE undo_meta SET records = records + ?1, max_length = MAX(max_length, ?2) WHERE id = 1"));
  update_meta_.emplace(std::move(meta));
  CDP_ASSIGN_OR_RETURN(auto seek, reader_->Prepare(std::string("SELECT ") + kColumns +
                                                   " FROM undo WHERE (offset, seq) >= (?1, ?2)"
                                                   " ORDER BY offset, seq LIMIT 1"));
  seek_.emplace(std::move(seek));
  CDP_ASSIGN_OR_RETURN(auto begin, reader_->Prepare("BEGIN"));
  begin_read_.emplace(std::move(begin));
  CDP_ASSIGN_OR_RETURN(auto end, reader_->Prepare("COMMIT"));
  end_read_.emplace(std::move(end));
  return Status::OK();
}

void UndoIndex::Stage(const UndoEntry& e) { staged_.push_back(e); }

Status UndoIndex::Insert(std::span<const UndoEntry> entries) {
  if (entries.empty()) return Status::OK();
  uint32_t max_len = 0;
  std::vector<RegionMax> regions;  // one per record, sorted by region after the loop
  // In key order, so that the records of a batch that share a page of `undo`
  // change it in one run: in journal order, records at scattered offsets
  // each took a page that the small writer cache (kIndexCacheKiB) had
  // spilled to the WAL back from it, and spilled it again.
  std::vector<const UndoEntry*> order;
  order.reserve(entries.size());
  for (const UndoEntry& e : entries) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const UndoEntry* a, const UndoEntry* b) {
    return a->offset != b->offset ? a->offset < b->offset : a->seq < b->seq;
  });
  for (const UndoEntry* p : order) {
    const UndoEntry& e = *p;
    CDP_RETURN_IF_ERROR(insert_->Reset());
    CDP_RETURN_IF_ERROR(insert_->BindAll(e.offset, e.seq, int64_t(e.length), int64_t(e.kind), e.segment,
                                         e.file_offset, int64_t(e.crc), e.time_us));
    CDP_RETURN_IF_ERROR(insert_->Run());
    max_len = std::max(max_len, e.length);
    regions.push_back(RegionMax{e.offset >> region_shift_, e.seq, e.length > kShortRecordBytes ? e.seq : 0});
  }
  std::sort(regions.begin(), regions.end(),
            [](const RegionMax& a, const RegionMax& b) { return a.region < b.region; });
  for (size_t i = 0; i < regions.size();) {
    RegionMax m = regions[i];
    for (++i; i < regions.size() && regions[i].region == m.region; ++i) {
      m.max_seq = std::max(m.max_seq, regions[i].max_seq);
      m.long_max_seq = std::max(m.long_max_seq, regions[i].long_max_seq);
    }
    CDP_RETURN_IF_ERROR(upsert_region_->Reset());
    CDP_RETURN_IF_ERROR(upsert_region_->BindAll(m.region, m.max_seq, m.long_max_seq));
    CDP_RETURN_IF_ERROR(upsert_region_->Run());
    pending_regions_.push_back(m);
  }
  CDP_RETURN_IF_ERROR(update_meta_->Reset());
  CDP_RETURN_IF_ERROR(update_meta_->BindAll(int64_t(entries.size()), int64_t(max_len)));
  CDP_RETURN_IF_ERROR(update_meta_->Run());
  pending_count_ += int64_t(entries.size());
  pending_max_len_ = std::max(pending_max_len_, max_len);
  return Status::OK();
}

Status UndoIndex::RemoveWhere(sqlite::Statement& remove, uint64_t seq) {
  CDP_RETURN_IF_ERROR(remove.Reset());
  CDP_RETURN_IF_ERROR(remove.BindAll(seq));
  CDP_RETURN_IF_ERROR(remove.Run());
  const int64_t gone = db_->Changes();
  CDP_RETURN_IF_ERROR(update_meta_->Reset());
  CDP_RETURN_IF_ERROR(update_meta_->BindAll(-gone, int64_t(0)));
  CDP_RETURN_IF_ERROR(update_meta_->Run());
  pending_count_ -= gone;
  return Status::OK();
}

Status UndoIndex::RemoveUpTo(uint64_t seq) { return RemoveWhere(*remove_up_to_, seq); }

Status UndoIndex::RemoveAbove(uint64_t seq) { return RemoveWhere(*remove_above_, seq); }

Status UndoIndex::MarkBuilt() {
  CDP_RETURN_IF_ERROR(db_->Exec("UPDATE undo_meta SET built = 1 WHERE id = 1"));
  pending_built_ = true;
  return Status::OK();
}

Status UndoIndex::Clear() {
  CDP_RETURN_IF_ERROR(db_->Exec("DELETE FROM undo; DELETE FROM undo_regions; "
                                "UPDATE undo_meta SET records = 0, max_length = 0, built = 0 WHERE id = 1"));
  pending_clear_ = true;
  pending_count_ = 0;
  pending_max_len_ = 0;
  pending_regions_.clear();
  return Status::OK();
}

void UndoIndex::Committed() {
  if (pending_clear_) {
    count_ = 0;
    max_len_ = 0;
    built_ = false;
    std::fill(region_max_.begin(), region_max_.end(), 0);
    std::fill(region_long_max_.begin(), region_long_max_.end(), 0);
  }
  count_ = uint64_t(int64_t(count_) + pending_count_);
  max_len_ = std::max(max_len_, pending_max_len_);
  for (const RegionMax& m : pending_regions_) {
    region_max_[m.region] = std::max(region_max_[m.region], m.max_seq);
    region_long_max_[m.region] = std::max(region_long_max_[m.region], m.long_max_seq);
  }
  built_ = built_ || pending_built_;
  staged_.clear();
  Discarded();
}

void UndoIndex::Discarded() {
  staged_.clear();
  pending_count_ = 0;
  pending_max_len_ = 0;
  pending_regions_.clear();
  pending_built_ = false;
  pending_clear_ = false;
}

Result<bool> UndoIndex::Seek(uint64_t offset, uint64_t seq, UndoEntry* out) const {
  seeks_++;
  CDP_RETURN_IF_ERROR(seek_->Reset());
  CDP_RETURN_IF_ERROR(seek_->BindAll(offset, seq));
  CDP_ASSIGN_OR_RETURN(bool row, seek_->Step());
  if (row) *out = RowEntry(*seek_);
  CDP_RETURN_IF_ERROR(seek_->Reset());
  return row;
}

Result<std::vector<ReadPiece>> UndoIndex::Lookup(uint64_t point, uint64_t offset, uint64_t len) const {
  const uint64_t end = offset + len;
  std::vector<UndoEntry> cand;
  // Records of the batch being applied (all newer than any readable point).
  for (const UndoEntry& e : staged_) {
    if (e.seq > point && e.offset < end && e.offset + e.length > offset) cand.push_back(e);
  }
  if (max_len_ > 0) {
    std::lock_guard<std::mutex> lk(read_mu_);
    // The seeks of one lookup share one read transaction, begun at the first
    // seek: one snapshot, and one set of WAL read locks (fcntl) per lookup
    // instead of one per seek (issue 17: a 4 KiB read of an older point made
    // ~8 seeks, 32 fcntl calls). Ended before the lock is released.
    bool in_txn = false;
    struct EndRead {
      const UndoIndex* self;
      bool* in_txn;
      ~EndRead() {
        if (!*in_txn) return;
        Status s = self->end_read_->Step().status();
        (void)self->end_read_->Reset();
        if (!s.ok() && self->reader_->InTransaction()) {
          (void)self->reader_->Exec("ROLLBACK");  // never leave a reader pinning the WAL
        }
      }
    } end_read{this, &in_txn};
    // The last seek's answer: the first row at or after (at_off, at_seq) is
    // `row`, or there is none. A later seek from a key between the two has
    // the same answer without a B-tree descent; the read transaction keeps
    // the snapshot the same. (Walking one record's later rewrites ends on
    // the next offset's row, which is where the next seek starts.)
    struct Last {
      bool valid = false;
      uint64_t at_off = 0, at_seq = 0;
      bool found = false;
      UndoEntry row;
    } last;
    auto key_ge = [](uint64_t ao, uint64_t as, uint64_t bo, uint64_t bs) { return ao > bo || (ao == bo && as >= bs); };
    auto seek = [&](uint64_t off, uint64_t seq, UndoEntry* out) -> Result<bool> {
      if (last.valid && key_ge(off, seq, last.at_off, last.at_seq) &&
          (!last.found || key_ge(last.row.offset, last.row.seq, off, seq))) {
        if (last.found) *out = last.row;
        return last.found;
      }
      CDP_ASSIGN_OR_RETURN(bool found, Seek(off, seq, out));
      last.valid = true;
      last.at_off = off;
      last.at_seq = seq;
      last.found = found;
      if (found) last.row = *out;
      return found;
    };
    uint64_t cur = offset >= max_len_ - 1 ? offset - (max_len_ - 1) : 0;
    // A record of at most kShortRecordBytes that starts before `near` ends
    // before `offset`: there only the long records' summary counts.
    const uint64_t near = offset >= kShortRecordBytes - 1 ? offset - (kShortRecordBytes - 1) : 0;
    while (cur < end) {
      const uint64_t region = cur >> region_shift_;
      if (region >= region_max_.size()) break;
      const bool far = cur < near;
      if ((far ? region_long_max_[region] : region_max_[region]) <= point) {
        // Nothing newer than the point that can reach the read starts here.
        const uint64_t next = (region + 1) << region_shift_;
        cur = far ? std::min(next, near) : next;
        continue;
      }
      if (!in_txn) {
        CDP_RETURN_IF_ERROR(begin_read_->Step().status());
        CDP_RETURN_IF_ERROR(begin_read_->Reset());
        in_txn = true;
        lookup_txns_++;
      }
      UndoEntry e;
      CDP_ASSIGN_OR_RETURN(bool found, seek(cur, point + 1, &e));
      if (!found || e.offset >= end) break;
      if (e.seq <= point) {  // a later offset's older record: seek its first newer one
        cur = e.offset;
        CDP_ASSIGN_OR_RETURN(found, seek(cur, point + 1, &e));
        if (!found || e.offset >= end) break;
        if (e.offset != cur) {
          cur = e.offset;
          continue;  // its region may hold nothing newer than the point
        }
      }
      // e: the oldest record newer than the point starting at e.offset. Later
      // ones there matter only where they reach further.
      const uint64_t start = e.offset;
      uint64_t reach = start;
      for (;;) {
        const uint64_t e_end = e.offset + e.length;
        if (e_end > reach) {
          if (e_end > offset) cand.push_back(e);
          reach = e_end;
        }
        if (reach >= end || reach >= start + max_len_) break;
        CDP_ASSIGN_OR_RETURN(found, seek(start, e.seq + 1, &e));
        if (!found || e.offset != start) break;
      }
      cur = start + 1;
    }
  }
  return PaintPieces(offset, len, std::move(cand));
}

Result<std::vector<UndoEntry>> UndoIndex::EntriesBetween(uint64_t after, uint64_t up_to) const {
  std::lock_guard<std::mutex> lk(read_mu_);
  CDP_ASSIGN_OR_RETURN(auto st, reader_->Prepare(std::string("SELECT ") + kColumns +
                                                 " FROM undo WHERE seq > ?1 AND seq <= ?2"
                                                 " ORDER BY seq DESC, segment DESC, file_offset DESC"));
  CDP_RETURN_IF_ERROR(st.BindAll(after, up_to));
  std::vector<UndoEntry> out;
  // The batch being applied is newer than anything committed.
  for (auto it = staged_.rbegin(); it != staged_.rend(); ++it) {
    if (it->seq > after && it->seq <= up_to) out.push_back(*it);
  }
  for (;;) {
    CDP_ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    out.push_back(RowEntry(st));
  }
  return out;
}

}  // namespace cdp::mt

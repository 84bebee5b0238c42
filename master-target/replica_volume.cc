// SPDX-License-Identifier: Apache-2.0
#include "master-target/replica_volume.h"

#include <algorithm>
#include <bit>

#include "common/base/log.h"
#include "common/daemon/metrics.h"
#include "common/store/sqlite.h"
#include "common/wire/block_digest.h"
#include "common/wire/hash.h"
#include "master-target/replica_index.h"

namespace cdp::mt {


ReplicaVolume::~ReplicaVolume() {
  // A broken volume's replica may hold what the store does not know: its
  // store stays open, and the next Open starts it empty.
  std::lock_guard<std::mutex> lk(apply_mu_);
  if (store_ && !broken_) (void)store_->Close();
}

uint64_t ReplicaVolume::digest_store_hits() const {
  std::lock_guard<std::mutex> lk(apply_mu_);
  return store_ ? store_->hits() : 0;
}


Result<std::unique_ptr<ReplicaVolume>> ReplicaVolume::Open(VolumeOptions opts, const VolumeIdentity* create) {
  if (!opts.env || !opts.clock) return Status::InvalidArgument("volume: env and clock are required");
  if (opts.segment_bytes < kSegmentHeaderSize + kRecordHeaderSize)
    return Status::InvalidArgument("volume: segment_bytes too small");
  std::unique_ptr<ReplicaVolume> v(new ReplicaVolume(std::move(opts)));
  CDP_RETURN_IF_ERROR(v->Init(create));
  return v;
}

namespace {
constexpr int kIndexCacheKiB = 512;  // the index database's page cache (the writer's connection)
}  // namespace

Status ReplicaVolume::Init(const VolumeIdentity* create) {
  {
    sqlite::Db::Options dbo;
    dbo.vfs = o_.index_vfs;
    // An index in the Env (EnvVfs) is created in the volume's directory there.
    if (!dbo.vfs.empty()) CDP_RETURN_IF_ERROR(o_.env->CreateDirs(DirName(o_.index_path)));
    CDP_ASSIGN_OR_RETURN(db_, sqlite::Db::Open(o_.index_path, dbo));
  }
  fence_ = std::make_unique<VolumeFence>(db_.get(), o_.clock);
  catalogue_ = std::make_unique<PointCatalogue>(
      db_.get(), o_.clock, PointCatalogue::Options{o_.point_interval_us, o_.points_require_flush, o_.anomaly_hold_us, o_.retention});
  // Memory per volume stays bounded (sqlite's default cache is 2 MB): the
  // operating system's page cache holds the rest of the index.
  CDP_RETURN_IF_ERROR(db_->Exec("PRAGMA cache_size = -" + std::to_string(kIndexCacheKiB)));
  CDP_RETURN_IF_ERROR(CreateIndexSchema(*db_));
  bool exists = false;
  {
    CDP_ASSIGN_OR_RETURN(auto st, db_->Prepare("SELECT count(*) FROM volume"));
    CDP_ASSIGN_OR_RETURN(bool row, st.Step());
    exists = row && st.ColumnInt64(0) > 0;
  }
  if (!exists) {
    if (!create) return Status::NotFound("volume index " + o_.index_path + " holds no volume");
    CDP_RETURN_IF_ERROR(CreateFiles(*create));
  }
  CDP_RETURN_IF_ERROR(MigrateIndex());
  UndoLog::Row row;
  CDP_RETURN_IF_ERROR(LoadIndex(&row));
  CDP_ASSIGN_OR_RETURN(store_, ReplicaStore::Open(o_.env, o_.dir, id_, o_.replica_direct_io,
                                                  o_.metrics.disk_write_bytes.get()));
  journal_ = std::make_unique<UndoLog>(
      db_.get(), store_.get(), UndoLog::Options{o_.env, JoinPath(o_.dir, "journal"), id_.name, o_.segment_bytes, &o_.metrics});
  CDP_RETURN_IF_ERROR(journal_->Load(row, o_.index_path));
  CDP_RETURN_IF_ERROR(journal_->OpenIndex(o_.index_path, DeviceSize(id_), o_.index_vfs));
  CDP_RETURN_IF_ERROR(journal_->Recover(applied_.load()));
  CDP_RETURN_IF_ERROR(journal_->RebuildIndex());
  if (fence_->state() == VolumeState::kRollingBack) CDP_RETURN_IF_ERROR(FinishRollback());
  UpdateGauges();
  return Status::OK();
}

std::optional<ApplyStall> ReplicaVolume::stall() const {
  std::lock_guard<std::mutex> lk(stall_mu_);
  return stall_;
}

Status ReplicaVolume::ReadAt(uint64_t point_seq, uint64_t offset, uint64_t len, uint8_t* buf) const {
  if (offset > id_.size || len > id_.size - offset) return Status::OutOfRange(id_.name + ": read past the end");
  return ReadDeviceAt(point_seq, offset, len, buf);
}

Status ReplicaVolume::ReadMacsAt(uint64_t point_seq, uint64_t offset, uint64_t len, uint8_t* macs) const {
  if (!id_.sealed) return Status::InvalidArgument(id_.name + " is not sealed: it has no MACs");
  if (offset % proto::kSealUnit != 0 || len % proto::kSealUnit != 0)
    return Status::InvalidArgument(id_.name + ": MACs are read for whole 4 KiB blocks");
  if (offset > id_.size || len > id_.size - offset) return Status::OutOfRange(id_.name + ": read past the end");
  return ReadDeviceAt(point_seq, id_.size + proto::SealMacBytes(offset), proto::SealMacBytes(len), macs);
}

Status ReplicaVolume::ReadStoredAt(uint64_t point_seq, uint64_t offset, uint64_t len, uint8_t* buf) const {
  const uint64_t end = DeviceSize(id_);
  if (offset > end || len > end - offset) return Status::OutOfRange(id_.name + ": read past the end of the replica");
  return ReadDeviceAt(point_seq, offset, len, buf);
}

Status ReplicaVolume::ExtentsAt(uint64_t point_seq, uint64_t offset, uint64_t len,
                               std::vector<DeviceExtent>* out) const {
  const uint64_t end = DeviceSize(id_);
  if (offset > end || len > end - offset) return Status::OutOfRange(id_.name + ": extents past the end of the replica");
  return journal_->ExtentsAt(point_seq, offset, len, out);
}

Status ReplicaVolume::ReadDeviceAt(uint64_t point_seq, uint64_t offset, uint64_t len, uint8_t* buf) const {
  return journal_->ReadAt(point_seq, offset, len, buf);
}

Result<std::unique_ptr<PointPin>> ReplicaVolume::Pin(uint64_t point_seq) {
  std::unique_ptr<PointPin> pin;
  CDP_RETURN_IF_ERROR(journal_->WhileReachable(
      point_seq, applied_, [&] { pin = std::make_unique<PointPin>(catalogue_.get(), point_seq); }));
  return pin;
}

Result<ReplicaVolume::DigestAnswer> ReplicaVolume::Digests(const DigestQuery& q) {
  if (!ValidUnitSize(q.unit)) return Status::InvalidArgument("unit size must be a power of two in 4 KiB..1 GiB");
  if (q.count == 0 || q.count > proto::kMaxHashes) return Status::InvalidArgument("bad unit count");
  if (q.first >= (id_.size + q.unit - 1) / q.unit)
    return Status::OutOfRange(id_.name + ": unit past the end of the volume");
  DigestAnswer a;
  std::unique_lock<std::mutex> apply(apply_mu_);
  const uint64_t applied = applied_.load();
  if (applied < std::max(q.min_seq, q.at_seq)) {
    a.status = proto::HashStatus::kBehind;
    a.seq = applied;
    return a;
  }
  DigestSource src;
  src.size = id_.size;
  std::unique_ptr<PointPin> pin;
  if (q.at_seq == 0 || q.at_seq == applied) {
    // The current image: apply waits meanwhile, so the file is the image.
    a.seq = applied;
    src.read = [this](uint64_t off, size_t n, uint8_t* buf) { return store_->Read(off, n, buf); };
    src.next_data = [this](uint64_t off) { return store_->NextData(off); };
  } else {
    // A past image through the undo journal; apply goes on meanwhile.
    auto p = Pin(q.at_seq);
    if (!p.ok()) {
      a.status = proto::HashStatus::kPointGone;
      a.seq = q.at_seq;
      return a;
    }
    pin = std::move(*p);
    apply.unlock();
    a.seq = q.at_seq;
    src.read = [this, seq = q.at_seq](uint64_t off, size_t n, uint8_t* buf) { return ReadAt(seq, off, n, buf); };
  }
  DigestReader reader(std::move(src));
  if (id_.sealed) {
    CDP_ASSIGN_OR_RETURN(a.digests, SealedDigests(reader, q, pin ? q.at_seq : 0));
  } else if (pin || !q.cached) {
    CDP_ASSIGN_OR_RETURN(a.digests, reader.Units(q.unit, q.first, q.count));
  } else {
    CDP_ASSIGN_OR_RETURN(a.digests, CurrentDigests(reader, q, &a.bytes_skipped));
  }
  a.bytes_read = reader.stats().bytes_read;
  a.bytes_skipped += reader.stats().bytes_skipped;
  return a;
}

Result<std::vector<proto::Hash128>> ReplicaVolume::SealedDigests(DigestReader& reader, const DigestQuery& q,
                                                                 uint64_t at_seq) {
  const uint64_t units = (id_.size + q.unit - 1) / q.unit;
  const uint64_t last = std::min<uint64_t>(units, q.first + q.count);
  const uint64_t per_unit = q.unit / kLeafSize;
  const uint64_t window_units = std::max<uint64_t>(1, (uint64_t{1} << 16) / per_unit);
  std::vector<proto::Hash128> out;
  out.reserve(size_t(last - q.first));
  Bytes macs;
  for (uint64_t w = q.first; w < last; w += window_units) {
    const uint64_t begin = w * q.unit;
    const uint64_t end = std::min<uint64_t>(std::min(last, w + window_units) * q.unit, id_.size);
    CDP_ASSIGN_OR_RETURN(std::vector<proto::Hash128> leaves, reader.Leaves(begin, end - begin));
    macs.resize(size_t(proto::SealMacBytes(end - begin)));
    const uint64_t mac_off = id_.size + proto::SealMacBytes(begin);
    if (at_seq != 0) {
      CDP_RETURN_IF_ERROR(ReadDeviceAt(at_seq, mac_off, macs.size(), macs.data()));
    } else {
      CDP_RETURN_IF_ERROR(store_->Read(mac_off, macs.size(), macs.data()));
    }
    for (size_t k = 0; k < leaves.size(); ++k) {
      if (leaves[k] == kZeroDigest && IsAllZero(macs.data() + k * proto::kSealMacSize, proto::kSealMacSize))
        leaves[k] = kUnsealedZeroDigest;
    }
    std::vector<proto::Hash128> u = UnitsFromLeaves(leaves, q.unit);
    out.insert(out.end(), u.begin(), u.end());
  }
  return out;
}

Result<std::vector<proto::Hash128>> ReplicaVolume::CurrentDigests(DigestReader& reader, const DigestQuery& q,
                                                                  uint64_t* skipped) {
  const uint64_t units = (id_.size + q.unit - 1) / q.unit;
  const uint64_t last = std::min<uint64_t>(units, q.first + q.count);
  const uint64_t per_unit = q.unit / kLeafSize;
  const uint64_t volume_leaves = (id_.size + kLeafSize - 1) / kLeafSize;
  // The store is looked up a window of units at a time: 64 Ki leaves (1 MiB
  // of digests), or one unit when a unit is larger. Memory stays bounded
  // whatever the request asks (up to kMaxHashes units of 1 GiB).
  const uint64_t window_units = std::max<uint64_t>(1, (uint64_t{1} << 16) / per_unit);
  std::vector<proto::Hash128> out;
  out.reserve(size_t(last - q.first));
  std::vector<proto::Hash128> leaves;
  std::vector<bool> known;
  for (uint64_t w = q.first; w < last; w += window_units) {
    const uint64_t wend = std::min(last, w + window_units);
    const uint64_t first_leaf = w * per_unit;
    const uint64_t end_leaf = std::min(wend * per_unit, volume_leaves);
    store_->digests().Get(first_leaf, size_t(end_leaf - first_leaf), &leaves, &known);
    for (uint64_t u = w; u < wend; ++u) {
      const uint64_t begin = u * q.unit, end = std::min<uint64_t>(begin + q.unit, id_.size);
      const size_t i = size_t(u * per_unit - first_leaf);
      const size_t j = size_t(std::min(end_leaf, (u + 1) * per_unit) - first_leaf);
      if (std::find(known.begin() + long(i), known.begin() + long(j), false) != known.begin() + long(j)) {
        // A unit wholly in a hole costs one seek (and stays out of the store).
        CDP_ASSIGN_OR_RETURN(uint64_t data, store_->NextData(begin));
        if (data >= end) {
          out.push_back(kZeroDigest);
          *skipped += end - begin;
          continue;
        }
        // Read each run of unknown leaves, and remember them.
        for (size_t k = i; k < j;) {
          if (known[k]) {
            ++k;
            continue;
          }
          size_t e = k;
          while (e < j && !known[e]) ++e;
          const uint64_t off = (first_leaf + k) * kLeafSize;
          CDP_ASSIGN_OR_RETURN(auto got, reader.Leaves(off, uint64_t(e - k) * kLeafSize));
          store_->digests().Put(first_leaf + k, got);
          std::copy(got.begin(), got.end(), leaves.begin() + long(k));
          k = e;
        }
      }
      out.push_back(UnitDigest(std::span(leaves.data() + i, j - i)));
    }
  }
  return out;
}

VolumeStatus ReplicaVolume::GetStatus() const {
  VolumeStatus s;
  s.identity = id_;
  s.applied_seq = applied_.load();
  fence_->FillStatus(&s);
  journal_->FillStatus(&s);
  catalogue_->FillStatus(&s, o_.clock->WallMicros());
  s.stall = stall();
  return s;
}

Result<bool> ReplicaVolume::AcknowledgeAnomaly(int64_t id) {
  std::lock_guard<std::mutex> lk(apply_mu_);
  CDP_ASSIGN_OR_RETURN(bool changed, catalogue_->Acknowledge(id));
  if (!changed) return false;
  log::Get("mt.volume")->warn("{} anomaly {} acknowledged by the admin: its suspect-clean point is no longer held",
                              log::Where{id_.name, "", applied_.load()}, id);
  UpdateGauges();
  return true;
}

void ReplicaVolume::UpdateGauges() {
  const VolumeMetrics& m = o_.metrics;
  const uint64_t jbytes = journal_->bytes();
  const PointCatalogue::Gauges g = catalogue_->gauges(o_.clock->WallMicros());
  const uint64_t oldest = g.oldest_applied_us;
  if (m.anomalies_open) m.anomalies_open->Set(g.anomalies_open);
  if (m.journal_bytes) m.journal_bytes->Set(int64_t(jbytes));
  if (m.points) m.points->Set(int64_t(g.points));
  if (m.history_lock_seconds) m.history_lock_seconds->Set(int64_t(g.lock_us / 1'000'000));
  if (m.applied_seq) m.applied_seq->Set(int64_t(applied_.load()));
  if (m.retention_span_seconds) {
    uint64_t now = o_.clock->WallMicros();
    m.retention_span_seconds->Set(oldest && now > oldest ? double(now - oldest) / 1e6 : 0.0);
  }
}

}  // namespace cdp::mt

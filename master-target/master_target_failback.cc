// MasterTarget's failback steps (contract in master_target.h; the volume's
// states in replica_volume.h).
#include <algorithm>

#include "common/block_digest.h"
#include "master-target/master_target_impl.h"

namespace cdp::mt {

namespace {

constexpr uint64_t kReadChunk = 1u << 20;        // promoted-image reads
constexpr uint64_t kFinishBatchBytes = 16u << 20;  // replica writes per applied batch

// The blocks the MT side changed after the failover point: the journal after
// it and the provider's writes.
Result<std::vector<proto::BlockExtent>> ChangedBlocks(ReplicaVolume& v, PointInTimeDevice& dev) {
  CDP_ASSIGN_OR_RETURN(std::vector<proto::BlockExtent> all, v.JournalBlocksAfter(dev.point_seq()));
  std::vector<proto::BlockExtent> written = dev.WrittenExtents();
  all.insert(all.end(), written.begin(), written.end());
  return proto::MergeExtents(std::move(all));
}

// Adds block `b` (content at `p`, `bs` bytes) to `out` as kData or kZero,
// extending the last record when it is the same kind and adjacent.
void AppendBlock(std::vector<proto::Record>* out, uint64_t offset, const uint8_t* p, uint32_t bs) {
  const bool zero = IsAllZero(p, bs);
  const proto::RecordKind kind = zero ? proto::RecordKind::kZero : proto::RecordKind::kData;
  if (!out->empty()) {
    proto::Record& last = out->back();
    if (last.kind == kind && last.offset + last.length == offset && last.length + bs <= (1u << 20)) {
      last.length += bs;
      if (!zero) last.data.insert(last.data.end(), p, p + bs);
      return;
    }
  }
  proto::Record r;
  r.seq = out->size() + 1;
  r.offset = offset;
  r.length = bs;
  r.kind = kind;
  if (!zero) r.data.assign(p, p + bs);
  out->push_back(std::move(r));
}

}  // namespace

std::shared_ptr<PointInTimeDevice> MasterTarget::PromotedDevice(const std::string& tenant, const std::string& volume) {
  std::lock_guard<std::mutex> lk(impl_->export_mu);
  auto it = impl_->exports.find(PromotedExportName(tenant, volume));
  return it == impl_->exports.end() || !it->second.promoted ? nullptr : it->second.device;
}

Result<bool> MasterTarget::StartFailback(const std::string& tenant, const std::string& volume) {
  std::shared_ptr<ReplicaVolume> v = FindVolume(tenant, volume);
  if (!v) return Status::NotFound("no volume " + tenant + "/" + volume);
  std::lock_guard<std::mutex> fl(impl_->failover_mu);
  if (v->state() == VolumeState::kFailedBack) return false;
  return v->StartFailback();
}

Result<bool> MasterTarget::QuiesceFailback(const std::string& tenant, const std::string& volume) {
  std::shared_ptr<ReplicaVolume> v = FindVolume(tenant, volume);
  if (!v) return Status::NotFound("no volume " + tenant + "/" + volume);
  std::lock_guard<std::mutex> fl(impl_->failover_mu);
  if (v->state() == VolumeState::kFailedBack) return false;
  std::shared_ptr<PointInTimeDevice> dev = PromotedDevice(tenant, volume);
  if (!dev) return Status::Unavailable(volume + ": the promoted export is not served (see the log)");
  // The volume first: after a crash between the two, the restart quiesces the export again.
  CDP_ASSIGN_OR_RETURN(bool changed, v->QuiesceFailback());
  CDP_RETURN_IF_ERROR(dev->Quiesce());
  if (changed)
    impl_->log->warn("{} failback: the promoted export {} is quiesced (writes refused) for the final pass",
                     log::Where{volume, tenant, 0}, PromotedExportName(tenant, volume));
  return changed;
}

proto::FailbackPlan MasterTarget::FailbackPlan(const std::string& tenant, const proto::FailbackPlanRequest& req) {
  proto::FailbackPlan out;
  out.request_id = req.request_id;
  std::shared_ptr<ReplicaVolume> v = FindVolume(tenant, req.volume);
  if (!v || v->state() != VolumeState::kFailingBack) {
    out.status = proto::FailbackStatus::kNotFailingBack;
    return out;
  }
  std::shared_ptr<PointInTimeDevice> dev = PromotedDevice(tenant, req.volume);
  Result<std::vector<proto::BlockExtent>> all =
      dev ? ChangedBlocks(*v, *dev) : Result<std::vector<proto::BlockExtent>>(Status::Unavailable("no export"));
  if (!all.ok()) {
    impl_->log->error("{} failback plan: {}", log::Where{req.volume, tenant, 0}, all.status().ToString());
    out.status = proto::FailbackStatus::kFailed;
    return out;
  }
  for (const proto::BlockExtent& e : *all) {
    const uint64_t end = e.first_block + e.count;
    if (end <= req.from_block) continue;
    if (out.extents.size() == proto::kMaxExtents) {
      out.next_block = std::max(e.first_block, req.from_block);
      break;
    }
    const uint64_t first = std::max(e.first_block, req.from_block);
    out.extents.push_back(proto::BlockExtent{first, uint32_t(end - first)});
  }
  return out;
}

proto::PullResponse MasterTarget::Pull(const std::string& tenant, const proto::PullRequest& req, proto::Codec codec,
                                       int level) {
  proto::PullResponse out;
  out.request_id = req.request_id;
  out.codec = codec;
  out.level = level;
  std::shared_ptr<ReplicaVolume> v = FindVolume(tenant, req.volume);
  if (!v || v->state() != VolumeState::kFailingBack) {
    out.status = proto::FailbackStatus::kNotFailingBack;
    return out;
  }
  std::shared_ptr<PointInTimeDevice> dev = PromotedDevice(tenant, req.volume);
  const uint32_t bs = v->identity().block_size;
  const uint64_t blocks = v->identity().size / bs;
  auto fail = [&](const std::string& why) {
    impl_->log->error("{} failback pull: {}", log::Where{req.volume, tenant, 0}, why);
    out.status = proto::FailbackStatus::kFailed;
    out.records.clear();
    return out;
  };
  if (!dev) return fail("the promoted export is not served");
  if (bs != kLeafSize) return fail("block size " + std::to_string(bs) + " (failback compares 4 KiB blocks)");
  Bytes buf;
  size_t d = 0;
  for (const proto::BlockExtent& e : req.extents) {
    if (e.first_block >= blocks || e.count > blocks - e.first_block) return fail("extent past the end of the volume");
    for (uint64_t done = 0; done < e.count;) {
      const uint64_t n = std::min<uint64_t>(e.count - done, kReadChunk / bs);
      const uint64_t off = (e.first_block + done) * bs;
      buf.resize(n * bs);
      if (Status s = dev->Read(off, uint32_t(buf.size()), buf.data()); !s.ok()) return fail(s.ToString());
      for (uint64_t i = 0; i < n; ++i, ++d) {
        const uint8_t* p = buf.data() + i * bs;
        if (LeafDigest(p, bs) == req.digests[d]) continue;  // equal: never travels
        AppendBlock(&out.records, off + i * bs, p, bs);
      }
      done += n;
    }
  }
  return out;
}

Result<MasterTarget::FinishOutcome> MasterTarget::FinishFailback(const std::string& tenant,
                                                                 const std::string& volume) {
  Impl& m = *impl_;
  std::shared_ptr<ReplicaVolume> v = FindVolume(tenant, volume);
  if (!v) return Status::NotFound("no volume " + tenant + "/" + volume);
  std::lock_guard<std::mutex> fl(m.failover_mu);
  FinishOutcome out;
  if (v->state() == VolumeState::kFailedBack) return out;
  auto f = v->failover();
  if (v->state() != VolumeState::kFailingBack || !f || !f->quiesced)
    return Status::InvalidArgument(volume + " is " + StateName(v->state()) +
                                   (v->state() == VolumeState::kFailingBack ? " and its export is not quiesced" : "") +
                                   ": finish comes after cdpctl failback's final pass");
  std::shared_ptr<PointInTimeDevice> dev = PromotedDevice(tenant, volume);
  if (!dev) return Status::Unavailable(volume + ": the promoted export is not served (see the log)");
  CDP_ASSIGN_OR_RETURN(std::vector<proto::BlockExtent> changed, ChangedBlocks(*v, *dev));
  const uint32_t bs = v->identity().block_size;
  // The promoted image's content of every changed block, applied in batches.
  std::vector<proto::Record> batch;
  uint64_t batch_bytes = 0;
  Bytes buf;
  auto apply = [&]() -> Status {
    if (batch.empty()) return Status::OK();
    CDP_RETURN_IF_ERROR(v->ApplyFailback(std::move(batch)).status());
    batch.clear();
    batch_bytes = 0;
    return Status::OK();
  };
  for (const proto::BlockExtent& e : changed) {
    for (uint64_t done = 0; done < e.count;) {
      const uint64_t n = std::min<uint64_t>(e.count - done, kReadChunk / bs);
      const uint64_t off = (e.first_block + done) * bs;
      buf.resize(n * bs);
      CDP_RETURN_IF_ERROR(dev->Read(off, uint32_t(buf.size()), buf.data()));
      for (uint64_t i = 0; i < n; ++i) AppendBlock(&batch, off + i * bs, buf.data() + i * bs, bs);
      out.blocks += n;
      batch_bytes += n * bs;
      done += n;
      if (batch_bytes >= kFinishBatchBytes) CDP_RETURN_IF_ERROR(apply());
    }
  }
  proto::Record tag;
  tag.kind = proto::RecordKind::kTag;
  tag.data = Bytes{'f', 'a', 'i', 'l', 'b', 'a', 'c', 'k'};
  batch.push_back(std::move(tag));
  CDP_ASSIGN_OR_RETURN(out.seq, v->ApplyFailback(std::move(batch)));
  // The export goes before the state: a crash between leaves failing-back,
  // and the restart serves the export again.
  {
    std::lock_guard<std::mutex> lk(m.export_mu);
    if (m.nbd) {
      Status s = m.nbd->RemoveExport(PromotedExportName(tenant, volume));
      if (!s.ok() && !s.IsNotFound()) return s;
    }
    m.exports.erase(PromotedExportName(tenant, volume));
  }
  dev.reset();
  CDP_ASSIGN_OR_RETURN(out.changed, v->EndFailback());
  Status s = PointInTimeDevice::RemoveOverlay(o_.env, m.OverlayData(tenant, volume), m.OverlayBitmap(tenant, volume));
  if (!s.ok())
    m.log->warn("{} failover overlay not removed (removed at the next start): {}", log::Where{volume, tenant, 0},
                s.ToString());
  m.log->warn("{} failed back: {} blocks of the promoted image applied as history up to sequence {} (tag failback)",
              log::Where{volume, tenant, out.seq}, out.blocks, out.seq);
  return out;
}

}  // namespace cdp::mt

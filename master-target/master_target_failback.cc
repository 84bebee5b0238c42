// SPDX-License-Identifier: Apache-2.0
// MasterTarget's failback steps (contract in master_target.h; the volume's
// states in replica_volume.h).
#include <algorithm>

#include "common/wire/block_digest.h"
#include "master-target/master_target_impl.h"

namespace cdp::mt {

namespace {

constexpr uint64_t kReadChunk = 1u << 20;        // promoted-image reads
constexpr uint64_t kFinishBatchBytes = 16u << 20;  // replica writes per applied batch

// The blocks the MT side changed after the failover point: the journal after
// it and the provider's writes, inside the volume (a sealed volume's journal
// and overlay also hold its MACs, after the volume: they travel with their
// blocks).
Result<std::vector<proto::BlockExtent>> ChangedBlocks(ReplicaVolume& v, PointInTimeDevice& dev) {
  CDP_ASSIGN_OR_RETURN(std::vector<proto::BlockExtent> all, v.JournalBlocksAfter(dev.point_seq()));
  std::vector<proto::BlockExtent> written = dev.WrittenExtents();
  all.insert(all.end(), written.begin(), written.end());
  all = proto::MergeExtents(std::move(all));
  const uint64_t blocks = v.size() / v.identity().block_size;
  std::vector<proto::BlockExtent> out;
  for (const proto::BlockExtent& e : all) {
    if (e.first_block >= blocks) break;
    out.push_back(proto::BlockExtent{e.first_block, uint32_t(std::min<uint64_t>(e.count, blocks - e.first_block))});
  }
  return out;
}

// Adds a block (content at `p`, `bs` bytes; `mac` its MAC on a sealed volume,
// else null) to `out` as kData / kZero, or kSealed / kSealedZero, extending
// the last record when it is the same kind and adjacent.
void AppendBlock(std::vector<proto::Record>* out, uint64_t offset, const uint8_t* p, uint32_t bs,
                 const uint8_t* mac = nullptr) {
  const bool zero = IsAllZero(p, bs);
  const bool sealed = mac != nullptr;
  const proto::RecordKind kind = sealed ? (zero ? proto::RecordKind::kSealedZero : proto::RecordKind::kSealed)
                                        : (zero ? proto::RecordKind::kZero : proto::RecordKind::kData);
  if (!out->empty()) {
    proto::Record& last = out->back();
    if (last.kind == kind && last.offset + last.length == offset && last.length + bs <= (1u << 20)) {
      // A sealed record's blocks come before its MACs.
      if (!zero) last.data.insert(last.data.begin() + last.length, p, p + bs);
      if (sealed) last.data.insert(last.data.end(), mac, mac + proto::kSealMacSize);
      last.length += bs;
      return;
    }
  }
  proto::Record r;
  r.seq = out->size() + 1;
  r.offset = offset;
  r.length = bs;
  r.kind = kind;
  if (!zero) r.data.assign(p, p + bs);
  if (sealed) r.data.insert(r.data.end(), mac, mac + proto::kSealMacSize);
  out->push_back(std::move(r));
}

// The MACs of `n` blocks at `off` of a sealed volume's promoted overlay
// (after the volume in its space), or nothing for a plain volume.
Status ReadMacs(ReplicaVolume& v, PointInTimeDevice& dev, uint64_t off, uint64_t n, Bytes* macs) {
  macs->clear();
  if (!v.identity().sealed) return Status::OK();
  macs->resize(size_t(n * proto::kSealMacSize));
  return dev.Read(v.size() + proto::SealMacBytes(off), uint32_t(macs->size()), macs->data());
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
  if (v->fence().state() == VolumeState::kFailedBack) return false;
  return v->StartFailback();
}

Result<bool> MasterTarget::QuiesceFailback(const std::string& tenant, const std::string& volume) {
  std::shared_ptr<ReplicaVolume> v = FindVolume(tenant, volume);
  if (!v) return Status::NotFound("no volume " + tenant + "/" + volume);
  std::lock_guard<std::mutex> fl(impl_->failover_mu);
  if (v->fence().state() == VolumeState::kFailedBack) return false;
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
  if (!v || v->fence().state() != VolumeState::kFailingBack) {
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
  if (!v || v->fence().state() != VolumeState::kFailingBack) {
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
  Bytes buf, macs;
  size_t d = 0;
  for (const proto::BlockExtent& e : req.extents) {
    if (e.first_block >= blocks || e.count > blocks - e.first_block) return fail("extent past the end of the volume");
    for (uint64_t done = 0; done < e.count;) {
      const uint64_t n = std::min<uint64_t>(e.count - done, kReadChunk / bs);
      const uint64_t off = (e.first_block + done) * bs;
      buf.resize(n * bs);
      if (Status s = dev->Read(off, uint32_t(buf.size()), buf.data()); !s.ok()) return fail(s.ToString());
      if (Status s = ReadMacs(*v, *dev, off, n, &macs); !s.ok()) return fail(s.ToString());
      for (uint64_t i = 0; i < n; ++i, ++d) {
        const uint8_t* p = buf.data() + i * bs;
        // Equal (a sealed volume: the stored blocks, as the agent hashes them): never travels.
        if (LeafDigest(p, bs) == req.digests[d]) continue;
        AppendBlock(&out.records, off + i * bs, p, bs, macs.empty() ? nullptr : macs.data() + i * proto::kSealMacSize);
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
  if (v->fence().state() == VolumeState::kFailedBack) return out;
  auto f = v->fence().failover();
  if (v->fence().state() != VolumeState::kFailingBack || !f || !f->quiesced)
    return Status::InvalidArgument(volume + " is " + StateName(v->fence().state()) +
                                   (v->fence().state() == VolumeState::kFailingBack ? " and its export is not quiesced" : "") +
                                   ": finish comes after cdpctl failback's final pass");
  std::shared_ptr<PointInTimeDevice> dev = PromotedDevice(tenant, volume);
  if (!dev) return Status::Unavailable(volume + ": the promoted export is not served (see the log)");
  CDP_ASSIGN_OR_RETURN(std::vector<proto::BlockExtent> changed, ChangedBlocks(*v, *dev));
  const uint32_t bs = v->identity().block_size;
  // The promoted image's content of every changed block, applied in batches.
  std::vector<proto::Record> batch;
  uint64_t batch_bytes = 0;
  Bytes buf, macs;
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
      CDP_RETURN_IF_ERROR(ReadMacs(*v, *dev, off, n, &macs));
      for (uint64_t i = 0; i < n; ++i)
        AppendBlock(&batch, off + i * bs, buf.data() + i * bs, bs,
                    macs.empty() ? nullptr : macs.data() + i * proto::kSealMacSize);
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
  Status s = PointInTimeDevice::RemoveOverlay(m.store, m.OverlayData(tenant, volume), m.OverlayBitmap(tenant, volume));
  if (!s.ok())
    m.log->warn("{} failover overlay not removed (removed at the next start): {}", log::Where{volume, tenant, 0},
                s.ToString());
  m.log->warn("{} failed back: {} blocks of the promoted image applied as history up to sequence {} (tag failback)",
              log::Where{volume, tenant, out.seq}, out.blocks, out.seq);
  return out;
}

}  // namespace cdp::mt

#include "master-target/export.h"

#include <algorithm>
#include <cstring>

namespace cdp::mt {

Result<std::shared_ptr<PointInTimeDevice>> PointInTimeDevice::Open(std::shared_ptr<ReplicaVolume> volume, uint64_t point_seq,
                                                                   Env* env, const std::string& overlay_path) {
  CDP_ASSIGN_OR_RETURN(auto pin, volume->Pin(point_seq));
  ReplicaVolume* v = volume.get();
  std::shared_ptr<PointInTimeDevice> d(new PointInTimeDevice(std::move(volume), std::move(pin)));
  d->size_ = v->size();
  d->block_ = v->identity().block_size;
  if (!overlay_path.empty()) {
    OpenOptions o;
    o.create = true;
    o.exclusive = true;
    CDP_ASSIGN_OR_RETURN(d->overlay_, env->Open(overlay_path, o));
    d->env_ = env;
    d->overlay_path_ = overlay_path;
    CDP_RETURN_IF_ERROR(d->overlay_->Truncate(d->size_));
    d->in_overlay_.assign((d->size_ + d->block_ - 1) / d->block_, false);
  }
  return d;
}

PointInTimeDevice::~PointInTimeDevice() {
  if (overlay_) {
    overlay_.reset();
    (void)env_->Remove(overlay_path_);
  }
}

BlockDeviceFeatures PointInTimeDevice::features() const {
  BlockDeviceFeatures f;
  f.multi_conn = true;
  if (overlay_) {
    f.flush = true;
    f.fua = true;
    f.trim = true;
    f.write_zeroes = true;
  }
  return f;
}

uint64_t PointInTimeDevice::overlay_blocks() const {
  std::lock_guard<std::mutex> lk(mu_);
  return uint64_t(std::count(in_overlay_.begin(), in_overlay_.end(), true));
}

Status PointInTimeDevice::Read(uint64_t offset, uint32_t len, uint8_t* buf) {
  if (offset > size_ || len > size_ - offset) return Status::OutOfRange("read past the end of the export");
  if (!overlay_) return volume_->ReadAt(pin_->seq(), offset, len, buf);
  std::lock_guard<std::mutex> lk(mu_);
  uint64_t pos = offset, end = offset + len;
  while (pos < end) {
    uint64_t blk = pos / block_;
    bool ov = in_overlay_[blk];
    uint64_t run_end = pos;
    while (run_end < end && in_overlay_[run_end / block_] == ov) run_end = std::min(end, (run_end / block_ + 1) * block_);
    uint8_t* dst = buf + (pos - offset);
    if (ov) {
      CDP_RETURN_IF_ERROR(overlay_->Read(pos, run_end - pos, dst));
    } else {
      CDP_RETURN_IF_ERROR(volume_->ReadAt(pin_->seq(), pos, run_end - pos, dst));
    }
    pos = run_end;
  }
  return Status::OK();
}

Status PointInTimeDevice::WriteLocked(uint64_t offset, const uint8_t* data, uint64_t len) {
  if (!overlay_) return Status::PermissionDenied("read-only export");
  if (offset > size_ || len > size_ - offset) return Status::OutOfRange("write past the end of the export");
  static const std::vector<uint8_t> zeros(1u << 20, 0);
  uint64_t pos = offset, end = offset + len;
  Bytes blockbuf;
  while (pos < end) {
    uint64_t blk = pos / block_;
    uint64_t bstart = blk * block_, bend = std::min(size_, bstart + block_);
    uint64_t s = pos, t = std::min(end, bend);
    if (!in_overlay_[blk] && (s != bstart || t != bend)) {
      // First touch of a block by a partial write: copy its point-in-time content.
      blockbuf.resize(bend - bstart);
      CDP_RETURN_IF_ERROR(volume_->ReadAt(pin_->seq(), bstart, bend - bstart, blockbuf.data()));
      CDP_RETURN_IF_ERROR(overlay_->Write(bstart, blockbuf));
    }
    const uint8_t* src = data ? data + (s - offset) : zeros.data();
    CDP_RETURN_IF_ERROR(overlay_->Write(s, ByteSpan(src, t - s)));
    in_overlay_[blk] = true;
    pos = t;
  }
  return Status::OK();
}

Status PointInTimeDevice::Write(uint64_t offset, ByteSpan data, bool fua) {
  std::lock_guard<std::mutex> lk(mu_);
  CDP_RETURN_IF_ERROR(WriteLocked(offset, data.data(), data.size()));
  return fua ? overlay_->Sync() : Status::OK();
}

Status PointInTimeDevice::WriteZeroes(uint64_t offset, uint64_t len, bool fua, bool) {
  std::lock_guard<std::mutex> lk(mu_);
  CDP_RETURN_IF_ERROR(WriteLocked(offset, nullptr, len));
  return fua ? overlay_->Sync() : Status::OK();
}

Status PointInTimeDevice::Trim(uint64_t offset, uint64_t len, bool fua) { return WriteZeroes(offset, len, fua, true); }

Status PointInTimeDevice::Flush() {
  if (!overlay_) return Status::OK();
  std::lock_guard<std::mutex> lk(mu_);
  return overlay_->Sync();
}

}  // namespace cdp::mt

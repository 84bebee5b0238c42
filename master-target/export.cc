// SPDX-License-Identifier: Apache-2.0
#include "master-target/export.h"

#include <algorithm>
#include <cstring>

#include "common/base/coding.h"
#include "common/base/crc32c.h"

namespace cdp::mt {

namespace {

// docs/formats/failover-overlay.md
constexpr char kBitmapMagic[8] = {'C', 'D', 'P', 'F', 'O', 'V', 'L', '1'};
constexpr uint32_t kBitmapVersion = 1;
constexpr uint64_t kBitmapHeaderSize = 56;  // crc over the first 52 bytes, at 52
constexpr uint64_t kBitsOffset = 64;

Bytes BitmapHeader(const VolumeIdentity& id, uint64_t blocks, uint64_t point_seq) {
  Bytes h(kBitmapHeaderSize, 0);
  std::memcpy(h.data(), kBitmapMagic, 8);
  EncodeFixed32(h.data() + 8, kBitmapVersion);
  EncodeFixed32(h.data() + 12, id.block_size);
  EncodeFixed64(h.data() + 16, blocks);
  EncodeFixed64(h.data() + 24, point_seq);
  std::memcpy(h.data() + 32, id.uuid.data(), 16);
  EncodeFixed32(h.data() + 48, 0);
  EncodeFixed32(h.data() + 52, crc32c::Value(h.data(), 52));
  return h;
}

}  // namespace

PointInTimeDevice::PointInTimeDevice(std::shared_ptr<ReplicaVolume> v, std::unique_ptr<PointPin> pin)
    : volume_(std::move(v)),
      pin_(std::move(pin)),
      size_(DeviceSize(volume_->identity())),
      stored_space_(volume_->identity().sealed),
      block_(volume_->identity().block_size) {}

Status PointInTimeDevice::RemoveOverlay(Env* env, const std::string& data_path, const std::string& bitmap_path) {
  for (const std::string& p : {bitmap_path, data_path}) {
    if (!env->Exists(p)) continue;
    Status s = env->Remove(p);
    if (!s.ok() && !s.IsNotFound()) return s;
  }
  return env->SyncDir(DirName(data_path));
}

Result<std::shared_ptr<PointInTimeDevice>> PointInTimeDevice::OpenPersistent(std::shared_ptr<ReplicaVolume> volume,
                                                                             uint64_t point_seq, Env* env,
                                                                             const std::string& data_path,
                                                                             const std::string& bitmap_path,
                                                                             bool create) {
  CDP_ASSIGN_OR_RETURN(auto pin, volume->Pin(point_seq));
  std::shared_ptr<PointInTimeDevice> d(new PointInTimeDevice(std::move(volume), std::move(pin)));
  d->env_ = env;
  const uint64_t blocks = (d->size_ + d->block_ - 1) / d->block_;
  d->in_overlay_.assign(blocks, false);
  d->bits_.assign((blocks + 7) / 8, 0);
  if (create) {
    CDP_RETURN_IF_ERROR(RemoveOverlay(env, data_path, bitmap_path));
    OpenOptions o;
    o.create = true;
    o.exclusive = true;
    CDP_ASSIGN_OR_RETURN(d->overlay_, env->Open(data_path, o));
    CDP_RETURN_IF_ERROR(d->overlay_->Truncate(d->size_));
    CDP_RETURN_IF_ERROR(d->overlay_->Sync());
    CDP_ASSIGN_OR_RETURN(d->bitmap_, env->Open(bitmap_path, o));
    CDP_RETURN_IF_ERROR(d->bitmap_->Write(0, BitmapHeader(d->volume_->identity(), blocks, point_seq)));
    CDP_RETURN_IF_ERROR(d->bitmap_->Truncate(kBitsOffset + d->bits_.size()));
    CDP_RETURN_IF_ERROR(d->bitmap_->Sync());
    CDP_RETURN_IF_ERROR(env->SyncDir(DirName(data_path)));
    if (DirName(bitmap_path) != DirName(data_path)) CDP_RETURN_IF_ERROR(env->SyncDir(DirName(bitmap_path)));
  } else {
    OpenOptions o;
    CDP_ASSIGN_OR_RETURN(d->overlay_, env->Open(data_path, o));
    CDP_ASSIGN_OR_RETURN(uint64_t dsize, d->overlay_->Size());
    if (dsize < d->size_) return Status::Corruption(data_path + ": overlay shorter than the volume");
    CDP_ASSIGN_OR_RETURN(d->bitmap_, env->Open(bitmap_path, o));
    CDP_RETURN_IF_ERROR(d->LoadBitmap(point_seq));
  }
  return d;
}

Status PointInTimeDevice::LoadBitmap(uint64_t point_seq) {
  const std::string& path = bitmap_->path();
  Bytes h(kBitmapHeaderSize);
  if (!bitmap_->Read(0, h.size(), h.data()).ok()) return Status::Corruption(path + ": short overlay bitmap header");
  const VolumeIdentity& id = volume_->identity();
  if (h != BitmapHeader(id, in_overlay_.size(), point_seq)) {
    if (std::memcmp(h.data(), kBitmapMagic, 8) != 0) return Status::Corruption(path + ": not an overlay bitmap");
    if (DecodeFixed32(h.data() + 52) != crc32c::Value(h.data(), 52))
      return Status::Corruption(path + ": overlay bitmap header checksum mismatch");
    return Status::Corruption(path + ": overlay bitmap of another volume, block size or point (its sequence " +
                              std::to_string(DecodeFixed64(h.data() + 24)) + ", expected " +
                              std::to_string(point_seq) + ")");
  }
  Status s = bitmap_->Read(kBitsOffset, bits_.size(), bits_.data());
  if (!s.ok()) return Status::Corruption(path + ": overlay bitmap shorter than the volume: " + s.ToString());
  for (uint64_t b = 0; b < in_overlay_.size(); ++b) in_overlay_[b] = (bits_[b / 8] >> (b % 8)) & 1;
  return Status::OK();
}

Result<std::shared_ptr<PointInTimeDevice>> PointInTimeDevice::Open(std::shared_ptr<ReplicaVolume> volume, uint64_t point_seq,
                                                                   Env* env, const std::string& overlay_path) {
  CDP_ASSIGN_OR_RETURN(auto pin, volume->Pin(point_seq));
  std::shared_ptr<PointInTimeDevice> d(new PointInTimeDevice(std::move(volume), std::move(pin)));
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

Status PointInTimeDevice::ReadPoint(uint64_t offset, uint64_t len, uint8_t* buf) const {
  return stored_space_ ? volume_->ReadStoredAt(pin_->seq(), offset, len, buf)
                       : volume_->ReadAt(pin_->seq(), offset, len, buf);
}

PointInTimeDevice::~PointInTimeDevice() {
  if (overlay_ && !bitmap_) {
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
    f.fast_zero = true;  // whole blocks become holes punched in the overlay
  }
  return f;
}

uint64_t PointInTimeDevice::overlay_blocks() const {
  std::lock_guard<std::mutex> lk(mu_);
  return uint64_t(std::count(in_overlay_.begin(), in_overlay_.end(), true));
}

Status PointInTimeDevice::Quiesce() {
  std::lock_guard<std::mutex> lk(mu_);
  quiesced_ = true;
  return overlay_ ? FlushLocked() : Status::OK();
}

std::vector<proto::BlockExtent> PointInTimeDevice::WrittenExtents() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<proto::BlockExtent> out;
  for (uint64_t b = 0; b < in_overlay_.size(); ++b) {
    if (!in_overlay_[b]) continue;
    if (!out.empty() && out.back().first_block + out.back().count == b && out.back().count < UINT32_MAX) {
      ++out.back().count;
    } else {
      out.push_back(proto::BlockExtent{b, 1});
    }
  }
  return out;
}

Status PointInTimeDevice::Read(uint64_t offset, uint32_t len, uint8_t* buf) {
  if (offset > size_ || len > size_ - offset) return Status::OutOfRange("read past the end of the export");
  if (!overlay_) return ReadPoint(offset, len, buf);
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
      CDP_RETURN_IF_ERROR(ReadPoint(pos, run_end - pos, dst));
    }
    pos = run_end;
  }
  return Status::OK();
}

Status PointInTimeDevice::Extents(uint64_t offset, uint64_t len, std::vector<DeviceExtent>* out) {
  if (offset > size_ || len > size_ - offset) return Status::OutOfRange("extents past the end of the export");
  if (!overlay_) return volume_->ExtentsAt(pin_->seq(), offset, len, out);
  std::lock_guard<std::mutex> lk(mu_);
  const size_t first = out->size();
  uint64_t pos = offset, end = offset + len;
  while (pos < end && out->size() - first < kMaxDeviceExtents) {
    const bool ov = in_overlay_[pos / block_];
    uint64_t run_end = pos;
    while (run_end < end && in_overlay_[run_end / block_] == ov) run_end = std::min(end, (run_end / block_ + 1) * block_);
    // Blocks written here: the overlay file's allocation (zeroed blocks are
    // holes punched in it); the rest: the point's.
    CDP_RETURN_IF_ERROR(ov ? FileExtents(*overlay_, pos, run_end - pos, out)
                           : volume_->ExtentsAt(pin_->seq(), pos, run_end - pos, out));
    pos = run_end;
  }
  return Status::OK();
}

Status PointInTimeDevice::WriteLocked(uint64_t offset, const uint8_t* data, uint64_t len) {
  if (!overlay_) return Status::PermissionDenied("read-only export");
  if (quiesced_) return Status::PermissionDenied("export quiesced for failback: writes are refused");
  if (offset > size_ || len > size_ - offset) return Status::OutOfRange("write past the end of the export");
  static const std::vector<uint8_t> zeros(1u << 20, 0);
  uint64_t pos = offset, end = offset + len;
  Bytes blockbuf;
  while (pos < end) {
    uint64_t blk = pos / block_;
    uint64_t bstart = blk * block_, bend = std::min(size_, bstart + block_);
    uint64_t s = pos, t = std::min(end, bend);
    if (data == nullptr && s == bstart && t == bend) {
      // Whole blocks of zeros (a trim, WRITE_ZEROES): a hole in the overlay,
      // one punch for the run; where the file system cannot, zeros are written.
      const uint64_t run_end = std::min(size_, bstart + (end - bstart) / block_ * block_);
      if (overlay_->PunchHole(bstart, run_end - bstart).ok()) {
        for (uint64_t b = blk; b * block_ < run_end; ++b) {
          if (!in_overlay_[b] && bitmap_) unflushed_.push_back(b);
          in_overlay_[b] = true;
        }
        pos = run_end;
        continue;
      }
    }
    if (!in_overlay_[blk] && (s != bstart || t != bend)) {
      // First touch of a block by a partial write: copy its point-in-time content.
      blockbuf.resize(bend - bstart);
      CDP_RETURN_IF_ERROR(ReadPoint(bstart, bend - bstart, blockbuf.data()));
      CDP_RETURN_IF_ERROR(overlay_->Write(bstart, blockbuf));
    }
    const uint8_t* src = data ? data + (s - offset) : zeros.data();
    CDP_RETURN_IF_ERROR(overlay_->Write(s, ByteSpan(src, t - s)));
    if (!in_overlay_[blk] && bitmap_) unflushed_.push_back(blk);
    in_overlay_[blk] = true;
    pos = t;
  }
  return Status::OK();
}

Status PointInTimeDevice::Write(uint64_t offset, ByteSpan data, bool fua) {
  std::lock_guard<std::mutex> lk(mu_);
  CDP_RETURN_IF_ERROR(WriteLocked(offset, data.data(), data.size()));
  return fua ? FlushLocked() : Status::OK();
}

Status PointInTimeDevice::WriteZeroes(uint64_t offset, uint64_t len, bool fua, bool) {
  std::lock_guard<std::mutex> lk(mu_);
  CDP_RETURN_IF_ERROR(WriteLocked(offset, nullptr, len));
  return fua ? FlushLocked() : Status::OK();
}

Status PointInTimeDevice::Trim(uint64_t offset, uint64_t len, bool fua) { return WriteZeroes(offset, len, fua, true); }

Status PointInTimeDevice::Flush() {
  if (!overlay_) return Status::OK();
  std::lock_guard<std::mutex> lk(mu_);
  return FlushLocked();
}

Status PointInTimeDevice::FlushLocked() {
  // The order is the contract in export.h: data durable, then its bits.
  CDP_RETURN_IF_ERROR(overlay_->Sync());
  if (!bitmap_ || unflushed_.empty()) return Status::OK();
  Bytes next = bits_;
  uint64_t lo = next.size(), hi = 0;
  for (uint64_t b : unflushed_) {
    next[b / 8] = uint8_t(next[b / 8] | (1u << (b % 8)));
    lo = std::min(lo, b / 8);
    hi = std::max(hi, b / 8 + 1);
  }
  // Bytes between lo and hi that did not change are written with their
  // current value: a torn write cannot clear a bit.
  CDP_RETURN_IF_ERROR(bitmap_->Write(kBitsOffset + lo, ByteSpan(next.data() + lo, hi - lo)));
  CDP_RETURN_IF_ERROR(bitmap_->Sync());
  bits_ = std::move(next);
  unflushed_.clear();
  return Status::OK();
}

}  // namespace cdp::mt

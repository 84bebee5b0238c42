// SPDX-License-Identifier: Apache-2.0
#include "common/nbd/block_device.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace cdp {

bool ValidBlockSize(uint32_t b) { return b >= 512 && b <= (2u << 20) && (b & (b - 1)) == 0; }

namespace {

constexpr size_t kZeroChunk = 1u << 20;

}  // namespace

Result<std::shared_ptr<FileBlockDevice>> FileBlockDevice::Open(Env* env, const std::string& path,
                                                               const Options& opts) {
  if (!ValidBlockSize(opts.preferred_block_size)) {
    return Status::InvalidArgument("block size must be a power of two in [512, 2 MiB]: " +
                                   std::to_string(opts.preferred_block_size));
  }
  if (opts.read_only && opts.create_size != 0) {
    return Status::InvalidArgument(path + ": a read-only device cannot be created");
  }
  OpenOptions oo;
  oo.create = opts.create_size != 0;
  oo.read_only = opts.read_only;
  CDP_ASSIGN_OR_RETURN(std::unique_ptr<File> file, env->Open(path, oo));
  CDP_ASSIGN_OR_RETURN(uint64_t size, file->Size());
  if (opts.create_size > size) {
    CDP_RETURN_IF_ERROR(file->Truncate(opts.create_size));
    size = opts.create_size;
  }
  if (size == 0) return Status::InvalidArgument(path + ": device of size 0");
  return std::make_shared<FileBlockDevice>(std::move(file), size, opts);
}

FileBlockDevice::FileBlockDevice(std::unique_ptr<File> file, uint64_t size, const Options& opts)
    : file_(std::move(file)),
      size_(size),
      read_only_(opts.read_only),
      block_size_(ValidBlockSize(opts.preferred_block_size) ? opts.preferred_block_size : 4096) {}

BlockDeviceFeatures FileBlockDevice::features() const {
  BlockDeviceFeatures f;
  f.flush = true;
  f.fua = true;
  f.trim = !read_only_;
  f.write_zeroes = !read_only_;
  f.multi_conn = true;  // no cache of our own: every connection sees the same File
  f.fast_zero = !read_only_;  // may_trim punches a hole
  return f;
}

Status FileBlockDevice::CheckRange(uint64_t offset, uint64_t len) const {
  if (offset > size_ || len > size_ - offset) {
    return Status::OutOfRange(file_->path() + ": range [" + std::to_string(offset) + ", +" +
                              std::to_string(len) + ") past the end " + std::to_string(size_));
  }
  return Status::OK();
}

Status FileBlockDevice::SyncFile() {
  std::lock_guard<std::mutex> lock(sync_mu_);
  return file_->Sync();
}

void AppendExtent(std::vector<DeviceExtent>* out, DeviceExtent e) {
  if (e.length == 0) return;
  if (!out->empty() && out->back().hole == e.hole && out->back().zero == e.zero) {
    out->back().length += e.length;
  } else {
    out->push_back(e);
  }
}

Status BlockDevice::Extents(uint64_t offset, uint64_t len, std::vector<DeviceExtent>* out) {
  (void)offset;
  AppendExtent(out, DeviceExtent{len, false, false});
  return Status::OK();
}

Status BlockDevice::WriteShared(uint64_t offset, std::shared_ptr<const Bytes> data, bool fua) {
  return Write(offset, ByteSpan(data->data(), data->size()), fua);
}

Status FileExtents(const File& file, uint64_t offset, uint64_t len, std::vector<DeviceExtent>* out) {
  const uint64_t end = offset + len;
  const size_t first = out->size();
  uint64_t pos = offset;
  while (pos < end && out->size() - first < kMaxDeviceExtents) {
    CDP_ASSIGN_OR_RETURN(uint64_t data, file.NextData(pos));
    if (data > pos) {  // [pos, data) is a hole
      const uint64_t stop = std::min(data, end);
      AppendExtent(out, DeviceExtent{stop - pos, true, true});
      pos = stop;
      continue;
    }
    CDP_ASSIGN_OR_RETURN(uint64_t hole, file.NextHole(pos));
    // A file past whose size the device reaches reads zeros there, but say
    // data: only what the file system reports is a hole.
    const uint64_t stop = hole > pos ? std::min(hole, end) : end;
    AppendExtent(out, DeviceExtent{stop - pos, false, false});
    pos = stop;
  }
  return Status::OK();
}

Status FileBlockDevice::Extents(uint64_t offset, uint64_t len, std::vector<DeviceExtent>* out) {
  CDP_RETURN_IF_ERROR(CheckRange(offset, len));
  return FileExtents(*file_, offset, len, out);
}

Status FileBlockDevice::Read(uint64_t offset, uint32_t len, uint8_t* buf) {
  CDP_RETURN_IF_ERROR(CheckRange(offset, len));
  return file_->Read(offset, len, buf);
}

Status FileBlockDevice::Write(uint64_t offset, ByteSpan data, bool fua) {
  if (read_only_) return Status::PermissionDenied(file_->path() + ": read-only device");
  CDP_RETURN_IF_ERROR(CheckRange(offset, data.size()));
  CDP_RETURN_IF_ERROR(file_->Write(offset, data));
  return fua ? SyncFile() : Status::OK();
}

Status FileBlockDevice::WriteZeroes(uint64_t offset, uint64_t len, bool fua, bool may_trim) {
  if (read_only_) return Status::PermissionDenied(file_->path() + ": read-only device");
  CDP_RETURN_IF_ERROR(CheckRange(offset, len));
  // Punching a hole is the cheap way; when the file system refuses it, or
  // the client asked for no hole, zeros are written.
  if (!may_trim || !file_->PunchHole(offset, len).ok()) {
    Bytes zeros(std::min<uint64_t>(len, kZeroChunk), 0);
    uint64_t done = 0;
    while (done < len) {
      const size_t n = size_t(std::min<uint64_t>(len - done, zeros.size()));
      CDP_RETURN_IF_ERROR(file_->Write(offset + done, ByteSpan(zeros.data(), n)));
      done += n;
    }
  }
  return fua ? SyncFile() : Status::OK();
}

Status FileBlockDevice::Trim(uint64_t offset, uint64_t len, bool fua) {
  if (read_only_) return Status::PermissionDenied(file_->path() + ": read-only device");
  CDP_RETURN_IF_ERROR(CheckRange(offset, len));
  Status s = file_->PunchHole(offset, len);
  // TRIM is a hint: a file system that cannot punch holes simply keeps the data.
  if (!s.ok() && s.code() != Code::kNotSupported && s.errno_value() != EOPNOTSUPP) return s;
  return fua ? SyncFile() : Status::OK();
}

Status FileBlockDevice::Flush() { return SyncFile(); }


}  // namespace cdp

// SPDX-License-Identifier: Apache-2.0
#include "master-target/replica_store.h"

#include <algorithm>
#include <vector>

#include "common/base/log.h"
#include "common/daemon/metrics.h"

namespace cdp::mt {

namespace {
constexpr uint64_t kZeroChunk = 1u << 20;
std::string ReplicaPath(const std::string& dir) { return JoinPath(dir, "replica.img"); }
std::string DigestStorePath(const std::string& dir) { return JoinPath(dir, "digests"); }
}  // namespace

Status ReplicaStore::Create(Env* env, const std::string& dir, const VolumeIdentity& id) {
  {
    OpenOptions oo;
    oo.create = true;
    CDP_ASSIGN_OR_RETURN(auto f, env->Open(ReplicaPath(dir), oo));
    CDP_RETURN_IF_ERROR(f->Truncate(0));
    CDP_RETURN_IF_ERROR(f->Truncate(DeviceSize(id)));
    CDP_RETURN_IF_ERROR(f->Sync());
  }
  if (env->Exists(DigestStorePath(dir))) CDP_RETURN_IF_ERROR(env->Remove(DigestStorePath(dir)));
  return Status::OK();
}

Result<std::unique_ptr<ReplicaStore>> ReplicaStore::Open(Env* env, const std::string& dir, const VolumeIdentity& id,
                                                         bool direct_io, metrics::Counter* disk_write_bytes) {
  const std::string path = ReplicaPath(dir);
  CDP_ASSIGN_OR_RETURN(std::unique_ptr<File> file, env->Open(path, OpenOptions()));
  CDP_ASSIGN_OR_RETURN(uint64_t size, file->Size());
  if (size < DeviceSize(id)) return Status::Corruption(path + ": replica shorter than the volume");
  std::unique_ptr<File> direct;
  if (direct_io) {
    OpenOptions d;
    d.direct = true;
    auto f = env->Open(path, d);
    if (f.ok()) {
      direct = std::move(*f);
    } else {
      log::Get("mt.volume")
          ->warn("{} the replica cannot be opened with O_DIRECT ({}): apply uses buffered I/O",
                 log::Where{id.name, "", 0}, f.status().ToString());
    }
  }
  CDP_ASSIGN_OR_RETURN(std::unique_ptr<DigestStore> digests, DigestStore::Open(env, DigestStorePath(dir), id.uuid, id.size));
  return std::unique_ptr<ReplicaStore>(
      new ReplicaStore(std::move(file), std::move(direct), std::move(digests), disk_write_bytes));
}

ReplicaStore::ReplicaStore(std::unique_ptr<File> file, std::unique_ptr<File> direct,
                           std::unique_ptr<DigestStore> digests, metrics::Counter* disk_write_bytes)
    : file_(std::move(file)),
      io_(std::make_unique<ReplicaIo>(file_.get(), std::move(direct))),
      digests_(std::move(digests)),
      disk_write_bytes_(disk_write_bytes) {}

Status ReplicaStore::WriteBatch(std::span<const WriteOp> ops) {
  if (Status s = io_->Write(ops); !s.ok()) {
    for (const WriteOp& w : ops) digests_->Forget(w.offset, w.data.size());  // any may have landed in part
    return s;
  }
  for (const WriteOp& w : ops) digests_->Wrote(w.offset, w.data);
  return Status::OK();
}

Status ReplicaStore::Write(uint64_t offset, ByteSpan data) {
  if (Status s = file_->Write(offset, data); !s.ok()) {
    digests_->Forget(offset, data.size());  // the write may have landed in part
    return s;
  }
  digests_->Wrote(offset, data);
  return Status::OK();
}

Status ReplicaStore::Zero(uint64_t offset, uint64_t len) {
  Status s = file_->PunchHole(offset, len);
  if (s.ok()) {
    digests_->Zeroed(offset, len);
    return s;
  }
  digests_->Forget(offset, len);  // the punch may have changed part of the range
  static const std::vector<uint8_t> zeros(kZeroChunk, 0);
  while (len > 0) {
    uint64_t n = std::min(len, kZeroChunk);
    CDP_RETURN_IF_ERROR(file_->Write(offset, ByteSpan(zeros.data(), n)));
    if (disk_write_bytes_) disk_write_bytes_->Inc(n);
    offset += n;
    len -= n;
  }
  return Status::OK();
}

}  // namespace cdp::mt

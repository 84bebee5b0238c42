// SPDX-License-Identifier: Apache-2.0
// ReplicaStore: the replica of one replicated volume and its digests. A part
// of ReplicaVolume (master-target/replica_volume.h): the replica file
// (`replica.img`: the volume, then a sealed volume's MACs), apply's batched
// direct I/O into it (master-target/replica_io.h), and the digest store
// (`digests`, master-target/digest_store.h) that every write keeps right.
//
//   apply / undo / rollback --- ReadBatch, WriteBatch, Write, Zero, Sync ---> replica.img
//                                    (each write tells the digest store:        |
//                                     Wrote, Zeroed, or Forget on failure)      |
//   exports, hashes ---------------- Read, NextData (buffered handle) ---------+
//   current-image hashes ----------- digests() (Get / Put)
//
// No write reaches the replica but through this class, so the digest store
// never describes bytes that are not there. Nothing here syncs by itself:
// the caller's Sync is apply's second sync point.
//
// Thread safety: Read, NextData and file() may run on any thread; every
// other method runs with the owning ReplicaVolume's apply lock held.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "common/base/result.h"
#include "common/base/status.h"
#include "common/env/env.h"
#include "master-target/digest_store.h"
#include "master-target/replica_io.h"
#include "master-target/replica_types.h"

namespace cdp::mt {

class ReplicaStore {
 public:
  // A new, sparse replica of DeviceSize(id) in `dir` (synced; the directory
  // sync is the caller's), and no digest store: one left by an earlier
  // volume of this name does not describe the new replica.
  static Status Create(Env* env, const std::string& dir, const VolumeIdentity& id);
  // Opens them. kCorruption for a replica shorter than DeviceSize(id).
  // `direct_io`: apply's whole blocks through O_DIRECT when the Env honours
  // it (logged once when it does not; see VolumeOptions::replica_direct_io).
  // `disk_write_bytes` (may be null) counts the zeros Zero writes.
  static Result<std::unique_ptr<ReplicaStore>> Open(Env* env, const std::string& dir, const VolumeIdentity& id,
                                                    bool direct_io, metrics::Counter* disk_write_bytes);
  ReplicaStore(const ReplicaStore&) = delete;
  ReplicaStore& operator=(const ReplicaStore&) = delete;

  // ---- Any thread (the buffered handle).
  Status Read(uint64_t offset, uint64_t len, uint8_t* buf) const { return file_->Read(offset, len, buf); }
  Result<uint64_t> NextData(uint64_t offset) const { return file_->NextData(offset); }
  const File* file() const { return file_.get(); }

  // ---- Apply lock held.
  // Apply's old data, several ranges at once (ReplicaIo::Read).
  Status ReadBatch(std::span<const ReadOp> ops) { return io_->Read(ops); }
  // The batch's new data (ReplicaIo::Write); on failure the digests of every
  // range are forgotten (any may have landed in part).
  Status WriteBatch(std::span<const WriteOp> ops);
  // One range through the buffered handle (undo), likewise.
  Status Write(uint64_t offset, ByteSpan data);
  // Zeros: a punched hole, or written zeros where the file system cannot punch.
  Status Zero(uint64_t offset, uint64_t len);
  Status Sync() { return file_->Sync(); }
  // The current image's leaf digests (ReplicaVolume::Digests).
  DigestStore& digests() { return *digests_; }
  // Leaf digests the store knew, since Open.
  uint64_t hits() const { return digests_->hits(); }
  // Saves the digest store. Only for a replica the store describes: a volume
  // whose apply broke keeps its store unsaved, and the next Open starts it
  // empty.
  Status Close() { return digests_->Close(); }

 private:
  ReplicaStore(std::unique_ptr<File> file, std::unique_ptr<File> direct, std::unique_ptr<DigestStore> digests,
               metrics::Counter* disk_write_bytes);

  std::unique_ptr<File> file_;  // buffered
  std::unique_ptr<ReplicaIo> io_;
  std::unique_ptr<DigestStore> digests_;
  metrics::Counter* const disk_write_bytes_;
};

}  // namespace cdp::mt

// SPDX-License-Identifier: Apache-2.0
// CephEnv: an Env (common/env/env.h) whose files are RBD images in one Ceph pool,
// the master target's storage backend on Ceph (docs/operations.md, "The
// master target on a Ceph pool"). Everything the master target keeps of a
// volume goes through its Env — the replica, the undo journal's segments,
// the digest store, a failover's overlay, and, through sqlite's EnvVfs
// (common/store/sqlite_vfs.h), the index — so on a CephEnv all of it lives in the
// pool, and another master target pointed at the same pool and prefix can
// serve the volume after this one is gone.
//
// Names. A path "a/b/c" (relative, normalised; no '~' or '@' in it) is the
// image "<prefix>~a~b~c". Directories are implicit: a directory exists while
// an image lies under it; CreateDirs and RemoveDir do nothing.
//
// Files. An image holds its file's bytes from offset 0; its size in bytes is
// kept in the image's metadata ("opencdp.size") and the image itself grows
// in steps ahead of it (thin: never-written space costs nothing). Writes go
// straight to the OSDs (librbd's cache is off for the CephEnv's connection:
// several handles of one image in this process read what another wrote).
//
// Durability (the Env model): a Write is durable when Sync() returns (a
// flush, and the size's metadata when it changed). An image's creation, a
// Rename and a Remove are durable when the call returns; SyncDir does
// nothing. A Remove of a file still open in this process renames its image
// into a trash name at once (the open handles read on, the path is free for
// a new file) and deletes it when the last handle closes; should the process
// die first, the next CephEnv::Open with the prefix deletes it.
//
// Ownership (fencing). A handle opened for writing takes the image's
// exclusive lock (librbd's managed lock) and keeps it until the image is
// closed in this process. An image locked by another client is refused with
// kBusy naming the owner, unless `take_over` is set: then the other client's
// lock is broken and that client blocklisted by the cluster, so a master
// target thought dead can never write again (a takeover; the operator's
// decision). A lost lock (this process blocklisted) fails every later write.
//
// Thread safety: an Env and its Files are safe to use from several threads
// (the Env contract). The pool must outlive the CephEnv.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/env/env.h"
#include "storage/rbd_image.h"

namespace cdp::storage {

struct CephEnvOptions {
  // The first part of every image name: one namespace per site or MT group
  // (several master targets share it when they share volumes).
  std::string prefix = "opencdp";
  // Break another client's lock on an image this process opens for writing
  // (see above). Only for a takeover.
  bool take_over = false;
};

class CephEnv final : public Env {
 public:
  // `pool` must come from a cluster connected with CephEnvRadosSettings().
  static Result<std::unique_ptr<CephEnv>> Open(std::shared_ptr<RadosPool> pool, const CephEnvOptions& options);
  // A connection of its own to the cluster of `rados` (CephEnvRadosSettings()
  // added to its settings), then Open on `pool_name`.
  static Result<std::unique_ptr<CephEnv>> Connect(RadosOptions rados, const std::string& pool_name,
                                                  const CephEnvOptions& options);
  ~CephEnv() override;

  Result<std::unique_ptr<File>> Open(const std::string& path, const OpenOptions& opts) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status Remove(const std::string& path) override;
  Status SyncDir(const std::string& dir) override;
  Status CreateDirs(const std::string& dir) override;
  Status RemoveDir(const std::string& dir) override;
  bool Exists(const std::string& path) override;
  Result<std::vector<std::string>> ListDir(const std::string& dir) override;
  Result<uint64_t> FileSize(const std::string& path) override;

  // The image name of `path`, or kInvalidArgument.
  Result<std::string> ImageName(const std::string& path) const;
  const std::shared_ptr<RadosPool>& pool() const { return pool_; }

  struct Image;  // one open image, shared by the Files of its path

 private:
  CephEnv(std::shared_ptr<RadosPool> pool, CephEnvOptions options)
      : pool_(std::move(pool)), options_(std::move(options)) {}
  // The open image of `name` (opened now when not open), nullptr-free.
  Result<std::shared_ptr<Image>> OpenImage(const std::string& name, bool create, bool exclusive);
  Status TakeLock(Image& image);
  void Closed(Image* image);  // the last File of an image went away

  std::shared_ptr<RadosPool> pool_;
  const CephEnvOptions options_;
  std::mutex mu_;  // guards open_, trash_counter_ and each Image's name and removal flag
  std::map<std::string, std::weak_ptr<Image>> open_;
  uint64_t trash_counter_ = 0;
};

// The librados settings a CephEnv's connection needs (RadosOptions::settings):
// librbd's cache off, see above.
std::vector<std::pair<std::string, std::string>> CephEnvRadosSettings();

}  // namespace cdp::storage

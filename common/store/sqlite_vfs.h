// SPDX-License-Identifier: Apache-2.0
// EnvVfs: a sqlite VFS whose files are the files of a cdp::Env, so that a
// database can live wherever an Env stores (a Ceph pool: storage/ceph_env.h;
// an in-memory Env in tests) and not only on the local file system.
//
//   EnvVfs vfs(store);                      // registers "cdp-env-<n>" with sqlite
//   sqlite::Db::Options o;
//   o.vfs = vfs.name();
//   CDP_ASSIGN_OR_RETURN(auto db, sqlite::Db::Open("tenants/t/volumes/v/index.db", o));
//
// What sqlite asks of a VFS, and how it is answered:
//   - files (the database and its "-wal") are Env files; xSync is File::Sync,
//     the Env's durability model is sqlite's (docs: common/env/env.h);
//   - locks and the WAL index ("-shm") are kept in this process's memory,
//     shared by every connection of this EnvVfs to the same path. A database
//     of an EnvVfs must therefore be opened by one process only: the Env's
//     owner guarantees it (the Ceph Env holds an exclusive lock per image).
//     After a crash the WAL index is rebuilt from the WAL by sqlite's own
//     recovery, as after a reboot with the default VFS;
//   - temporary files are not supported (Db::Open sets temp_store=MEMORY);
//   - randomness, sleep and time come from sqlite's default VFS.
//
// Lifetime: the Env must outlive the EnvVfs, and the EnvVfs every database
// opened through it (the destructor unregisters the VFS).
//
// Thread safety: any number of connections, on any threads.
#pragma once

#include <memory>
#include <string>

#include "common/env/env.h"

namespace cdp::sqlite {

class EnvVfs {
 public:
  explicit EnvVfs(Env* env);
  ~EnvVfs();
  EnvVfs(const EnvVfs&) = delete;
  EnvVfs& operator=(const EnvVfs&) = delete;

  // The name to pass in Db::Options::vfs.
  const std::string& name() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace cdp::sqlite

// SPDX-License-Identifier: Apache-2.0
// FileCacheEnv: an Env filter that bounds how many files of its base Env are
// open at once (leveldb's table cache, for every file), so that a daemon
// serving thousands of volumes holds a fixed number of descriptors.
//
//   FileCacheEnv files(DefaultEnv(), 1000);
//   auto f = files.Open("vol/replica.img", {});   // a File as any other
//
// Every File opened through it is a handle of the cache: it remembers its
// path and options, and holds a file of the base Env only while it is among
// the `max_open` most recently used. Any call on a closed one opens the base
// file again (without create / exclusive / truncate, which applied once),
// and closes the least recently used ones over the bound.
//
// What a close must not lose:
//   - Unsynced writes. A base file with writes not yet synced is synced
//     before it is closed; if that sync fails, the next Sync() of the handle
//     returns the error (and every one after it: the bytes may be gone).
//     Sync() of a handle with nothing written since its last sync, and whose
//     base file is closed, returns ok without opening anything.
//   - The file itself. A file removed or renamed while a handle is open on
//     it keeps (POSIX) its content for that handle: Remove() and Rename()
//     through this Env first open the base file of every live handle of the
//     names concerned and keep it open until the handle is closed. Those
//     handles are not counted against `max_open` (there are few: the
//     daemons close files before removing them).
//   - Direct I/O: reopened with the same options, so DirectAlignment() and
//     ReadBatch / WriteBatch (forwarded to the base file) are unchanged.
//
// Calls in flight keep the base file they started with: one closed by the
// cache meanwhile is closed when they return, so the number of descriptors
// may exceed `max_open` by two per call in flight (the file it uses, and one
// the cache closed to make room for it).
//
// Not for an Env whose files carry state beyond their bytes (the Ceph Env's
// images hold an exclusive lock per writer): use it over local files.
//
// Thread safety: that of the base Env; a handle follows File's contract.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/env/env_wrapper.h"

namespace cdp {

// The daemons' `max_open_files` key: 0 (no cache, no bound) or at least
// kMinMaxOpenFiles; kInvalidArgument naming the key otherwise.
inline constexpr size_t kMinMaxOpenFiles = 16;
Status CheckMaxOpenFiles(size_t max_open_files);

class FileCacheEnv : public EnvWrapper {
 public:
  // `base` must outlive this Env, and this Env every File opened through it.
  // `max_open` >= 1.
  FileCacheEnv(Env* base, size_t max_open);
  ~FileCacheEnv() override;
  FileCacheEnv(const FileCacheEnv&) = delete;
  FileCacheEnv& operator=(const FileCacheEnv&) = delete;

  Result<std::unique_ptr<File>> Open(const std::string& path, const OpenOptions& opts) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status Remove(const std::string& path) override;

  size_t max_open() const { return max_open_; }
  // Base files open now on behalf of the cache (within max_open), plus those
  // kept open for removed or renamed names.
  size_t open_files() const;
  // Base files opened again after the cache had closed them, and closed to
  // stay within max_open, since this Env was made.
  uint64_t reopens() const { return reopens_.load(std::memory_order_relaxed); }
  uint64_t evictions() const { return evictions_.load(std::memory_order_relaxed); }

 private:
  class CachedFile;
  struct Victim;

  // The base file of `f`, opened again if the cache had closed it.
  Result<std::shared_ptr<File>> Acquire(const CachedFile* f);
  // Closes (outside the lock) what Acquire or Open took out of the cache.
  void CloseVictims(std::list<Victim>* victims);
  // Under mu_: moves the least recently used over max_open_ into `victims`.
  void TrimLocked(std::list<Victim>* victims);
  // Under mu_: every live handle of `path` keeps its base file from now on.
  void PinLocked(const std::string& path);
  void Forget(CachedFile* f);

  const size_t max_open_;
  mutable std::mutex mu_;
  std::list<CachedFile*> lru_;                       // open, unpinned; most recent first
  std::multimap<std::string, CachedFile*> by_path_;  // every live handle
  size_t pinned_ = 0;
  std::atomic<uint64_t> reopens_{0};
  std::atomic<uint64_t> evictions_{0};
};

}  // namespace cdp

// SPDX-License-Identifier: Apache-2.0
#include "common/env/file_cache_env.h"

#include <string>
#include <utility>

namespace cdp {

namespace {

// What a handle and the cache share about a handle's unsynced writes, so
// that the cache can sync a base file it closes even while the handle goes
// away on another thread.
struct SyncState {
  // `opened_changed`: the open created or truncated the file.
  explicit SyncState(bool opened_changed) : written(opened_changed ? 1 : 0) {}
  std::mutex mu;                      // serialises Sync, Append, Truncate and the sync at close
  std::atomic<uint64_t> written;      // calls that may have changed the file, the open included
  uint64_t synced = 0;                // under mu: `written` as of the last successful sync
  Status failed;                      // under mu: a sync at close failed; sticky
};

}  // namespace

struct FileCacheEnv::Victim {
  std::shared_ptr<SyncState> state;  // null: nothing to sync
  std::shared_ptr<File> file;
};

class FileCacheEnv::CachedFile final : public File {
 public:
  CachedFile(FileCacheEnv* env, std::string path, const OpenOptions& reopen, uint32_t alignment, bool opened_changed)
      : env_(env),
        path_(std::move(path)),
        reopen_(reopen),
        alignment_(alignment),
        state_(std::make_shared<SyncState>(opened_changed)) {}
  ~CachedFile() override { env_->Forget(this); }

  Status Read(uint64_t offset, size_t n, uint8_t* buf) const override {
    CDP_ASSIGN_OR_RETURN(auto f, Get());
    return f->Read(offset, n, buf);
  }
  Result<size_t> ReadUpTo(uint64_t offset, size_t n, uint8_t* buf) const override {
    CDP_ASSIGN_OR_RETURN(auto f, Get());
    return f->ReadUpTo(offset, n, buf);
  }
  Status ReadBatch(std::span<const ReadOp> ops) const override {
    CDP_ASSIGN_OR_RETURN(auto f, Get());
    return f->ReadBatch(ops);
  }
  Status Write(uint64_t offset, ByteSpan data) override {
    CDP_ASSIGN_OR_RETURN(auto f, Get());
    return Wrote(f->Write(offset, data));
  }
  Status WriteBatch(std::span<const WriteOp> ops) override {
    CDP_ASSIGN_OR_RETURN(auto f, Get());
    return Wrote(f->WriteBatch(ops));
  }
  Status Allocate(uint64_t offset, uint64_t len) override {
    CDP_ASSIGN_OR_RETURN(auto f, Get());
    return Wrote(f->Allocate(offset, len));
  }
  Status PunchHole(uint64_t offset, uint64_t len) override {
    CDP_ASSIGN_OR_RETURN(auto f, Get());
    return Wrote(f->PunchHole(offset, len));
  }
  // Append and Truncate take the sync lock: the cache must not sync the
  // base file at close in the middle of them (File: they never race Sync).
  Status Append(ByteSpan data) override {
    CDP_ASSIGN_OR_RETURN(auto f, Get());
    std::lock_guard l(state_->mu);
    return Wrote(f->Append(data));
  }
  Status Truncate(uint64_t size) override {
    CDP_ASSIGN_OR_RETURN(auto f, Get());
    std::lock_guard l(state_->mu);
    return Wrote(f->Truncate(size));
  }
  // Always syncs a base file, even with nothing written through this
  // handle: another handle of the same file (a direct one) may count on it.
  Status Sync() override {
    CDP_ASSIGN_OR_RETURN(auto f, Get());
    std::lock_guard l(state_->mu);
    if (!state_->failed.ok()) return state_->failed;
    const uint64_t written = state_->written.load();
    CDP_RETURN_IF_ERROR(f->Sync());
    if (written > state_->synced) state_->synced = written;
    return Status::OK();
  }
  Result<uint64_t> Size() const override {
    CDP_ASSIGN_OR_RETURN(auto f, Get());
    return f->Size();
  }
  Result<uint64_t> NextData(uint64_t offset) const override {
    CDP_ASSIGN_OR_RETURN(auto f, Get());
    return f->NextData(offset);
  }
  Result<uint64_t> NextHole(uint64_t offset) const override {
    CDP_ASSIGN_OR_RETURN(auto f, Get());
    return f->NextHole(offset);
  }
  const std::string& path() const override { return path_; }
  uint32_t DirectAlignment() const override { return alignment_; }

 private:
  friend class FileCacheEnv;

  Result<std::shared_ptr<File>> Get() const { return env_->Acquire(this); }
  // Counted after the call returns, failed or not (a failed write may have
  // changed some bytes): a sync at close that starts before it ends does
  // not take it as synced.
  Status Wrote(Status s) {
    state_->written.fetch_add(1);
    return s;
  }

  FileCacheEnv* const env_;
  const std::string path_;
  const OpenOptions reopen_;
  const uint32_t alignment_;
  const std::shared_ptr<SyncState> state_;

  // Under env_->mu_.
  std::shared_ptr<File> base_;  // null while the cache has it closed
  bool in_lru_ = false;
  bool pinned_ = false;
  std::list<CachedFile*>::iterator lru_it_;
  std::multimap<std::string, CachedFile*>::iterator path_it_;
};

Status CheckMaxOpenFiles(size_t max_open_files) {
  if (max_open_files == 0 || max_open_files >= kMinMaxOpenFiles) return Status::OK();
  return Status::InvalidArgument("'max_open_files' must be 0 (no bound) or at least " +
                                 std::to_string(kMinMaxOpenFiles));
}

FileCacheEnv::FileCacheEnv(Env* base, size_t max_open) : EnvWrapper(base), max_open_(max_open < 1 ? 1 : max_open) {}

FileCacheEnv::~FileCacheEnv() = default;

Result<std::unique_ptr<File>> FileCacheEnv::Open(const std::string& path, const OpenOptions& opts) {
  CDP_ASSIGN_OR_RETURN(std::unique_ptr<File> opened, base()->Open(path, opts));
  OpenOptions reopen = opts;
  reopen.create = reopen.exclusive = reopen.truncate = false;
  auto f = std::make_unique<CachedFile>(this, opened->path(), reopen, opened->DirectAlignment(),
                                        opts.create || opts.truncate);
  std::list<Victim> victims;
  {
    std::lock_guard l(mu_);
    f->base_ = std::move(opened);
    lru_.push_front(f.get());
    f->lru_it_ = lru_.begin();
    f->in_lru_ = true;
    f->path_it_ = by_path_.emplace(NormalizePath(path), f.get());
    TrimLocked(&victims);
  }
  CloseVictims(&victims);
  return std::unique_ptr<File>(std::move(f));
}

Result<std::shared_ptr<File>> FileCacheEnv::Acquire(const CachedFile* cf) {
  auto* f = const_cast<CachedFile*>(cf);  // the cache's fields of a handle are not its state
  {
    std::lock_guard l(mu_);
    if (f->base_) {
      if (f->in_lru_) lru_.splice(lru_.begin(), lru_, f->lru_it_);
      return f->base_;
    }
  }
  // Opened outside the lock: other files' calls need not wait for it.
  auto opened = base()->Open(f->path_, f->reopen_);
  std::list<Victim> victims;
  std::shared_ptr<File> out;
  {
    std::lock_guard l(mu_);
    if (f->base_) {
      // Opened meanwhile by a Remove or Rename of its name (or by another
      // call on this handle): use that one.
      out = f->base_;
      if (opened.ok()) victims.push_back({nullptr, std::shared_ptr<File>(std::move(*opened))});
    } else {
      if (!opened.ok()) return opened.status().WithContext("reopening a file the cache had closed");
      reopens_.fetch_add(1, std::memory_order_relaxed);
      f->base_ = std::move(*opened);
      lru_.push_front(f);
      f->lru_it_ = lru_.begin();
      f->in_lru_ = true;
      out = f->base_;
      TrimLocked(&victims);
    }
  }
  CloseVictims(&victims);
  return out;
}

void FileCacheEnv::TrimLocked(std::list<Victim>* victims) {
  while (lru_.size() > max_open_) {
    CachedFile* f = lru_.back();
    lru_.pop_back();
    f->in_lru_ = false;
    victims->push_back({f->state_, std::move(f->base_)});
    f->base_.reset();
    evictions_.fetch_add(1, std::memory_order_relaxed);
  }
}

void FileCacheEnv::CloseVictims(std::list<Victim>* victims) {
  for (Victim& v : *victims) {
    if (v.state) {
      std::lock_guard l(v.state->mu);
      const uint64_t written = v.state->written.load();
      if (written != v.state->synced && v.state->failed.ok()) {
        Status s = v.file->Sync();
        if (s.ok()) {
          v.state->synced = written;
        } else {
          v.state->failed = s.WithContext("syncing a file the cache closed");
        }
      }
    }
    v.file.reset();  // closes it, unless a call in flight still holds it
  }
  victims->clear();
}

void FileCacheEnv::PinLocked(const std::string& path) {
  auto [begin, end] = by_path_.equal_range(NormalizePath(path));
  for (auto it = begin; it != end; ++it) {
    CachedFile* f = it->second;
    if (f->pinned_) continue;
    if (!f->base_) {
      auto opened = base()->Open(f->path_, f->reopen_);
      // A name that no longer opens has nothing left to keep for its handles.
      if (!opened.ok()) continue;
      reopens_.fetch_add(1, std::memory_order_relaxed);
      f->base_ = std::move(*opened);
    } else if (f->in_lru_) {
      lru_.erase(f->lru_it_);
    }
    f->in_lru_ = false;
    f->pinned_ = true;
    ++pinned_;
  }
}

Status FileCacheEnv::Rename(const std::string& from, const std::string& to) {
  // Under the lock throughout, so that no handle of either name is closed
  // between the pin and the rename.
  std::lock_guard l(mu_);
  PinLocked(from);
  PinLocked(to);
  return base()->Rename(from, to);
}

Status FileCacheEnv::Remove(const std::string& path) {
  std::lock_guard l(mu_);
  PinLocked(path);
  return base()->Remove(path);
}

void FileCacheEnv::Forget(CachedFile* f) {
  std::shared_ptr<File> closing;
  {
    std::lock_guard l(mu_);
    by_path_.erase(f->path_it_);
    if (f->in_lru_) lru_.erase(f->lru_it_);
    if (f->pinned_) --pinned_;
    closing = std::move(f->base_);
  }
  // Closed outside the lock (File: closing does not sync).
}

size_t FileCacheEnv::open_files() const {
  std::lock_guard l(mu_);
  return lru_.size() + pinned_;
}

}  // namespace cdp

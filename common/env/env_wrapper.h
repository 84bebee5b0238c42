// SPDX-License-Identifier: Apache-2.0
// EnvWrapper / FileWrapper: an Env and a File that forward every call to
// another one (leveldb's EnvWrapper). A filter stacked on an Env -- a test
// that holds syncs at a gate, one that fails writes half way, a benchmark
// that counts I/O -- derives from them and overrides only what it changes.
// Files are wrapped by overriding EnvWrapper::Open:
//
//   Result<std::unique_ptr<File>> Open(const std::string& p, const OpenOptions& o) override {
//     CDP_ASSIGN_OR_RETURN(auto f, EnvWrapper::Open(p, o));
//     return std::unique_ptr<File>(new MyFile(std::move(f)));
//   }
//
// Thread safety: that of the wrapped Env and File.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/env/env.h"

namespace cdp {

class FileWrapper : public File {
 public:
  explicit FileWrapper(std::unique_ptr<File> base) : base_(std::move(base)) {}

  Status Read(uint64_t offset, size_t n, uint8_t* buf) const override { return base_->Read(offset, n, buf); }
  Result<size_t> ReadUpTo(uint64_t offset, size_t n, uint8_t* buf) const override {
    return base_->ReadUpTo(offset, n, buf);
  }
  Status Write(uint64_t offset, ByteSpan data) override { return base_->Write(offset, data); }
  Status Append(ByteSpan data) override { return base_->Append(data); }
  Status Sync() override { return base_->Sync(); }
  Status Allocate(uint64_t offset, uint64_t len) override { return base_->Allocate(offset, len); }
  Status PunchHole(uint64_t offset, uint64_t len) override { return base_->PunchHole(offset, len); }
  Status Truncate(uint64_t size) override { return base_->Truncate(size); }
  Result<uint64_t> Size() const override { return base_->Size(); }
  Result<uint64_t> NextData(uint64_t offset) const override { return base_->NextData(offset); }
  Result<uint64_t> NextHole(uint64_t offset) const override { return base_->NextHole(offset); }
  const std::string& path() const override { return base_->path(); }
  // ReadBatch / WriteBatch are not forwarded: File's defaults loop through
  // this wrapper's Read / Write, so a filter that overrides those sees every
  // op. A filter that only observes may forward the batches itself (base()).
  uint32_t DirectAlignment() const override { return base_->DirectAlignment(); }

 protected:
  File* base() const { return base_.get(); }

 private:
  std::unique_ptr<File> base_;
};

class EnvWrapper : public Env {
 public:
  // `base` must outlive this Env.
  explicit EnvWrapper(Env* base) : base_(base) {}

  Result<std::unique_ptr<File>> Open(const std::string& path, const OpenOptions& opts) override {
    return base_->Open(path, opts);
  }
  Status Rename(const std::string& from, const std::string& to) override { return base_->Rename(from, to); }
  Status Remove(const std::string& path) override { return base_->Remove(path); }
  Status SyncDir(const std::string& dir) override { return base_->SyncDir(dir); }
  Status CreateDirs(const std::string& dir) override { return base_->CreateDirs(dir); }
  Status RemoveDir(const std::string& dir) override { return base_->RemoveDir(dir); }
  bool Exists(const std::string& path) override { return base_->Exists(path); }
  Result<std::vector<std::string>> ListDir(const std::string& dir) override { return base_->ListDir(dir); }
  Result<uint64_t> FileSize(const std::string& path) override { return base_->FileSize(path); }
  Result<std::unique_ptr<FileLock>> LockFile(const std::string& path) override { return base_->LockFile(path); }

 protected:
  Env* base() const { return base_; }

 private:
  Env* base_;
};

}  // namespace cdp

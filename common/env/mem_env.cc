// SPDX-License-Identifier: Apache-2.0
// The in-memory Env: POSIX semantics without a disk.
//
// Files are inodes shared by their name and by open handles: a renamed or
// removed file stays usable through handles opened before, as on POSIX.
// Directories are tracked so ListDir, CreateDirs and RemoveDir behave like the
// real ones; "/" and "." always exist. Sync and SyncDir succeed at once (there
// is nothing to lose; FaultEnv models losses on top of this Env).
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "common/env/env.h"

namespace cdp {
namespace {

// Caps a file's size so a wild offset fails cleanly instead of allocating.
constexpr uint64_t kMaxMemFileSize = uint64_t(16) << 30;

Status Err(int err, const char* op, const std::string& path) {
  return Status::FromErrno(err, std::string(op) + " " + path);
}

struct Inode {
  std::mutex mu;
  Bytes data;
};

class MemFile final : public File {
 public:
  MemFile(std::shared_ptr<Inode> inode, std::string path, bool read_only)
      : inode_(std::move(inode)), path_(std::move(path)), read_only_(read_only) {}

  Status Read(uint64_t offset, size_t n, uint8_t* buf) const override {
    std::lock_guard<std::mutex> l(inode_->mu);
    const uint64_t size = inode_->data.size();
    if (offset > size || n > size - offset) {
      return Status::OutOfRange("read " + path_ + ": " + std::to_string(n) + " bytes at " +
                                std::to_string(offset) + " runs past the end of file (size " +
                                std::to_string(size) + ")");
    }
    if (n > 0) std::memcpy(buf, inode_->data.data() + offset, n);
    return Status::OK();
  }

  Result<size_t> ReadUpTo(uint64_t offset, size_t n, uint8_t* buf) const override {
    std::lock_guard<std::mutex> l(inode_->mu);
    const uint64_t size = inode_->data.size();
    if (offset >= size) return size_t(0);
    size_t got = size_t(std::min<uint64_t>(n, size - offset));
    if (got > 0) std::memcpy(buf, inode_->data.data() + offset, got);
    return got;
  }

  Status Write(uint64_t offset, ByteSpan data) override {
    std::lock_guard<std::mutex> l(inode_->mu);
    return WriteLocked(offset, data, "pwrite");
  }

  Status Append(ByteSpan data) override {
    std::lock_guard<std::mutex> l(inode_->mu);
    return WriteLocked(inode_->data.size(), data, "append");
  }

  Status Sync() override { return Status::OK(); }

  Status Allocate(uint64_t offset, uint64_t len) override {
    std::lock_guard<std::mutex> l(inode_->mu);
    if (read_only_) return Err(EBADF, "fallocate", path_);
    if (len == 0) return Status::OK();
    if (offset > kMaxMemFileSize || len > kMaxMemFileSize - offset) return Err(EFBIG, "fallocate", path_);
    if (offset + len > inode_->data.size()) inode_->data.resize(size_t(offset + len), 0);
    return Status::OK();
  }

  Status PunchHole(uint64_t offset, uint64_t len) override {
    std::lock_guard<std::mutex> l(inode_->mu);
    if (read_only_) return Err(EBADF, "punch hole", path_);
    const uint64_t size = inode_->data.size();
    if (offset >= size || len == 0) return Status::OK();
    const uint64_t end = len > size - offset ? size : offset + len;
    std::memset(inode_->data.data() + offset, 0, size_t(end - offset));
    return Status::OK();
  }

  Status Truncate(uint64_t size) override {
    std::lock_guard<std::mutex> l(inode_->mu);
    if (read_only_) return Err(EINVAL, "ftruncate", path_);  // what ftruncate says on O_RDONLY
    if (size > kMaxMemFileSize) return Err(EFBIG, "ftruncate", path_);
    inode_->data.resize(size_t(size), 0);
    return Status::OK();
  }

  Result<uint64_t> Size() const override {
    std::lock_guard<std::mutex> l(inode_->mu);
    return uint64_t(inode_->data.size());
  }

  const std::string& path() const override { return path_; }

 private:
  Status WriteLocked(uint64_t offset, ByteSpan data, const char* op) {
    if (read_only_) return Err(EBADF, op, path_);
    if (offset > kMaxMemFileSize || data.size() > kMaxMemFileSize - offset) return Err(EFBIG, op, path_);
    const uint64_t end = offset + data.size();
    if (end > inode_->data.size()) inode_->data.resize(size_t(end), 0);
    if (!data.empty()) std::memcpy(inode_->data.data() + offset, data.data(), data.size());
    return Status::OK();
  }

  std::shared_ptr<Inode> inode_;
  const std::string path_;
  const bool read_only_;
};

class MemEnv final : public Env {
 public:
  Result<std::unique_ptr<File>> Open(const std::string& path, const OpenOptions& opts) override {
    const std::string p = NormalizePath(path);
    if (p.empty()) return Err(ENOENT, "open", path);
    std::lock_guard<std::mutex> l(mu_);
    if (IsDirLocked(p)) return Err(EISDIR, "open", path);
    auto it = files_.find(p);
    std::shared_ptr<Inode> inode;
    if (it == files_.end()) {
      if (!opts.create) return Err(ENOENT, "open", path);
      if (!IsDirLocked(DirName(p))) return Err(ENOENT, "open", path);
      inode = std::make_shared<Inode>();
      files_.emplace(p, inode);
    } else {
      if (opts.create && opts.exclusive) return Err(EEXIST, "open", path);
      inode = it->second;
      if (opts.truncate && !opts.read_only) {
        std::lock_guard<std::mutex> il(inode->mu);
        inode->data.clear();
      }
    }
    return std::unique_ptr<File>(new MemFile(std::move(inode), path, opts.read_only));
  }

  Status Rename(const std::string& from_raw, const std::string& to_raw) override {
    const std::string from = NormalizePath(from_raw), to = NormalizePath(to_raw);
    const std::string ctx = from_raw + " -> " + to_raw;
    if (from.empty() || to.empty()) return Err(ENOENT, "rename", ctx);
    std::lock_guard<std::mutex> l(mu_);
    if (!IsDirLocked(DirName(to))) return Err(ENOENT, "rename", ctx);
    auto it = files_.find(from);
    if (it != files_.end()) {
      if (IsDirLocked(to)) return Err(EISDIR, "rename", ctx);
      if (from == to) return Status::OK();
      auto inode = it->second;
      files_.erase(it);
      files_[to] = std::move(inode);
      return Status::OK();
    }
    if (!IsDirLocked(from) || from == "/" || from == ".") return Err(ENOENT, "rename", ctx);
    // Renaming a directory moves everything under it.
    if (from == to) return Status::OK();
    if (to.compare(0, from.size() + 1, from + "/") == 0) return Err(EINVAL, "rename", ctx);
    if (files_.count(to)) return Err(ENOTDIR, "rename", ctx);
    if (IsDirLocked(to)) {
      if (HasChildrenLocked(to)) return Err(ENOTEMPTY, "rename", ctx);
      dirs_.erase(to);
    }
    MovePrefix(files_, from, to);
    std::set<std::string> moved;
    for (auto d = dirs_.begin(); d != dirs_.end();) {
      if (*d == from || d->compare(0, from.size() + 1, from + "/") == 0) {
        moved.insert(to + d->substr(from.size()));
        d = dirs_.erase(d);
      } else {
        ++d;
      }
    }
    dirs_.insert(moved.begin(), moved.end());
    return Status::OK();
  }

  Status Remove(const std::string& path) override {
    const std::string p = NormalizePath(path);
    std::lock_guard<std::mutex> l(mu_);
    if (IsDirLocked(p)) return Err(EISDIR, "unlink", path);
    if (files_.erase(p) == 0) return Err(ENOENT, "unlink", path);
    return Status::OK();
  }

  Status SyncDir(const std::string& dir) override {
    std::lock_guard<std::mutex> l(mu_);
    const std::string p = NormalizePath(dir);
    if (files_.count(p)) return Err(ENOTDIR, "open dir", dir);
    if (!IsDirLocked(p)) return Err(ENOENT, "open dir", dir);
    return Status::OK();
  }

  Status CreateDirs(const std::string& dir) override {
    const std::string p = NormalizePath(dir);
    if (p.empty()) return Status::InvalidArgument("CreateDirs: empty path");
    std::lock_guard<std::mutex> l(mu_);
    std::vector<std::string> chain;
    for (std::string d = p; !IsDirLocked(d); d = DirName(d)) chain.push_back(d);
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      if (files_.count(*it)) return Err(ENOTDIR, "mkdir", *it);
    }
    dirs_.insert(chain.begin(), chain.end());
    return Status::OK();
  }

  Status RemoveDir(const std::string& dir) override {
    const std::string p = NormalizePath(dir);
    std::lock_guard<std::mutex> l(mu_);
    if (files_.count(p)) return Err(ENOTDIR, "rmdir", dir);
    if (p == "/" || p == ".") return Err(EBUSY, "rmdir", dir);
    if (!dirs_.count(p)) return Err(ENOENT, "rmdir", dir);
    if (HasChildrenLocked(p)) return Err(ENOTEMPTY, "rmdir", dir);
    dirs_.erase(p);
    return Status::OK();
  }

  bool Exists(const std::string& path) override {
    const std::string p = NormalizePath(path);
    std::lock_guard<std::mutex> l(mu_);
    return !p.empty() && (files_.count(p) > 0 || IsDirLocked(p));
  }

  Result<std::vector<std::string>> ListDir(const std::string& dir) override {
    const std::string p = NormalizePath(dir);
    std::lock_guard<std::mutex> l(mu_);
    if (files_.count(p)) return Err(ENOTDIR, "opendir", dir);
    if (!IsDirLocked(p)) return Err(ENOENT, "opendir", dir);
    std::set<std::string> names;
    Collect(files_, p, &names);
    Collect(dirs_, p, &names);
    return std::vector<std::string>(names.begin(), names.end());
  }

  Result<uint64_t> FileSize(const std::string& path) override {
    const std::string p = NormalizePath(path);
    std::lock_guard<std::mutex> l(mu_);
    if (IsDirLocked(p)) return Err(EISDIR, "stat", path);
    auto it = files_.find(p);
    if (it == files_.end()) return Err(ENOENT, "stat", path);
    std::lock_guard<std::mutex> il(it->second->mu);
    return uint64_t(it->second->data.size());
  }

  Result<std::unique_ptr<FileLock>> LockFile(const std::string& path) override {
    class MemLock final : public FileLock {
     public:
      MemLock(MemEnv* env, std::string p) : env_(env), p_(std::move(p)) {}
      ~MemLock() override {
        std::lock_guard<std::mutex> l(env_->mu_);
        env_->locked_.erase(p_);
      }

     private:
      MemEnv* env_;
      std::string p_;
    };
    OpenOptions o;
    o.create = true;
    CDP_RETURN_IF_ERROR(Open(path, o).status());
    const std::string p = NormalizePath(path);
    std::lock_guard<std::mutex> l(mu_);
    if (!locked_.insert(p).second) return Status::Busy(path + " is locked by another holder");
    return std::unique_ptr<FileLock>(new MemLock(this, p));
  }

 private:
  bool IsDirLocked(const std::string& p) const { return p == "/" || p == "." || dirs_.count(p) > 0; }

  static std::string ChildPrefix(const std::string& dir) {
    if (dir == ".") return "";
    if (dir == "/") return "/";
    return dir + "/";
  }

  // Whether `name` (a normalized path) is a direct child of `dir`; sets *leaf.
  static bool ChildOf(const std::string& name, const std::string& dir, std::string* leaf) {
    if (name == dir || name == "/" || name == ".") return false;
    const std::string prefix = ChildPrefix(dir);
    if (name.compare(0, prefix.size(), prefix) != 0) return false;
    if (prefix.empty() && name[0] == '/') return false;
    std::string rest = name.substr(prefix.size());
    if (rest.empty() || rest.find('/') != std::string::npos) return false;
    *leaf = std::move(rest);
    return true;
  }

  template <typename C>
  static void Collect(const C& c, const std::string& dir, std::set<std::string>* out) {
    std::string leaf;
    for (const auto& e : c) {
      if (ChildOf(Key(e), dir, &leaf)) out->insert(leaf);
    }
  }
  static const std::string& Key(const std::string& s) { return s; }
  static const std::string& Key(const std::pair<const std::string, std::shared_ptr<Inode>>& e) {
    return e.first;
  }

  bool HasChildrenLocked(const std::string& dir) const {
    std::set<std::string> names;
    Collect(files_, dir, &names);
    Collect(dirs_, dir, &names);
    return !names.empty();
  }

  static void MovePrefix(std::map<std::string, std::shared_ptr<Inode>>& m, const std::string& from,
                         const std::string& to) {
    std::map<std::string, std::shared_ptr<Inode>> moved;
    for (auto it = m.begin(); it != m.end();) {
      if (it->first.compare(0, from.size() + 1, from + "/") == 0) {
        moved[to + it->first.substr(from.size())] = std::move(it->second);
        it = m.erase(it);
      } else {
        ++it;
      }
    }
    for (auto& [k, v] : moved) m[k] = std::move(v);
  }

  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Inode>> files_;
  std::set<std::string> dirs_;
  std::set<std::string> locked_;  // LockFile
};

}  // namespace

std::unique_ptr<Env> NewMemEnv() { return std::make_unique<MemEnv>(); }

}  // namespace cdp

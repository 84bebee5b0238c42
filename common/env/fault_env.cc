// SPDX-License-Identifier: Apache-2.0
#include "common/env/fault_env.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

namespace cdp {
namespace {

constexpr uint64_t kUndoBlock = 4096;

// The model is keyed by NormalizePath(path), as MemEnv is; the base Env always
// receives the caller's spelling.
}  // namespace

const char* FaultEnv::OpName(Op op) {
  switch (op) {
    case Op::kOpen: return "open";
    case Op::kRead: return "read";
    case Op::kWrite: return "write";
    case Op::kAppend: return "append";
    case Op::kSync: return "sync";
    case Op::kAllocate: return "allocate";
    case Op::kPunchHole: return "punch-hole";
    case Op::kTruncate: return "truncate";
    case Op::kRename: return "rename";
    case Op::kRemove: return "remove";
    case Op::kSyncDir: return "sync-dir";
    case Op::kCreateDirs: return "create-dirs";
    case Op::kCount: break;
  }
  return "?";
}

// One file as the model sees it (shared by its names and its open handles).
struct FaultEnv::Inode {
  uint64_t size = 0;          // current size
  uint64_t synced_size = 0;   // size at the last Sync
  // Original content of blocks below synced_size modified since the last Sync.
  std::map<uint64_t, Bytes> undo;
  // Synced content kept aside while no current name holds the file.
  std::optional<Bytes> detached;
};

struct FaultEnv::State {
  explicit State(Env* b) : base(b) {}

  struct Injection {
    bool armed = false;
    int err = 0;
    uint64_t fire_at = 0;  // call number (CallCount value) that fails first
    bool sticky = false;
  };

  Env* const base;
  mutable std::mutex mu;
  uint64_t epoch = 0;
  std::map<std::string, std::shared_ptr<Inode>> current;  // names the base Env has now
  std::map<std::string, std::shared_ptr<Inode>> durable;  // names a power cut would keep
  std::array<uint64_t, size_t(Op::kCount)> calls{};
  std::array<Injection, size_t(Op::kCount)> inject{};
  uint64_t injected_failures = 0;
  uint64_t sync_points = 0;
  std::optional<uint64_t> syncs_left;  // crash trigger
  bool crashed = false;
  std::optional<uint64_t> capacity;

  // Counts the call and decides whether it fails. `mutating` calls fail once the
  // power is gone; `sync_point` calls may be the one that cuts it.
  Status Admit(Op op, const std::string& ctx, bool mutating, bool sync_point = false) {
    const size_t i = size_t(op);
    const uint64_t n = ++calls[i];
    if (sync_point && syncs_left && *syncs_left == 0) crashed = true;
    if (crashed && mutating) return Status::FromErrno(EIO, ctx + " (power lost)");
    Injection& in = inject[i];
    if (in.armed && n >= in.fire_at) {
      if (!in.sticky) in.armed = false;
      ++injected_failures;
      return Status::FromErrno(in.err, ctx + " (injected)");
    }
    return Status::OK();
  }

  void SyncPointPassed() {
    ++sync_points;
    if (syncs_left && *syncs_left > 0) --*syncs_left;
  }

  // The model's inode for `path`, registering a file the base Env already has
  // (taken as durable). nullptr when there is no such file.
  std::shared_ptr<Inode> Track(const std::string& path) {
    const std::string key = NormalizePath(path);
    auto it = current.find(key);
    if (it != current.end()) return it->second;
    auto size = base->FileSize(path);
    if (!size.ok()) return nullptr;
    auto inode = std::make_shared<Inode>();
    inode->size = inode->synced_size = *size;
    current[key] = inode;
    durable[key] = inode;
    return inode;
  }

  size_t CurrentNames(const Inode* inode) const {
    size_t n = 0;
    for (const auto& [k, v] : current) n += v.get() == inode;
    return n;
  }
  bool IsDurable(const Inode* inode) const {
    for (const auto& [k, v] : durable) {
      if (v.get() == inode) return true;
    }
    return false;
  }

  uint64_t TotalSize() const {
    uint64_t total = 0;
    for (const auto& [k, v] : current) total += v->size;
    return total;
  }
  Status CheckCapacity(const Inode& inode, uint64_t new_size, const std::string& ctx) const {
    if (!capacity || new_size <= inode.size) return Status::OK();
    if (TotalSize() - inode.size + new_size > *capacity) return Status::FromErrno(ENOSPC, ctx);
    return Status::OK();
  }

  // Saves the synced bytes of [off, end) before they are modified.
  static Status SaveUndo(Inode& inode, const File& f, uint64_t off, uint64_t end) {
    end = std::min(end, inode.synced_size);
    if (off >= end) return Status::OK();
    for (uint64_t b = off / kUndoBlock; b * kUndoBlock < end; ++b) {
      if (inode.undo.count(b)) continue;
      const uint64_t start = b * kUndoBlock;
      Bytes blk(size_t(std::min(kUndoBlock, inode.synced_size - start)), 0);
      auto got = f.ReadUpTo(start, blk.size(), blk.data());
      if (!got.ok()) return got.status();
      inode.undo.emplace(b, std::move(blk));  // bytes past the current end were zero-filled
    }
    return Status::OK();
  }

  // The content a power cut would leave for `inode`, read through `f`.
  static Result<Bytes> SyncedContent(const Inode& inode, const File& f) {
    Bytes out(size_t(inode.synced_size), 0);
    auto got = f.ReadUpTo(0, out.size(), out.data());
    if (!got.ok()) return got.status();
    for (const auto& [b, blk] : inode.undo) {
      std::memcpy(out.data() + b * kUndoBlock, blk.data(), blk.size());
    }
    return out;
  }

  // Called before `inode` loses the name `key`: keeps its synced content if a
  // durable name still refers to it and no other current name will hold it.
  Status KeepIfOrphaned(const std::shared_ptr<Inode>& inode, const std::string& path) {
    if (CurrentNames(inode.get()) > 1 || !IsDurable(inode.get())) return Status::OK();
    OpenOptions o;
    o.read_only = true;
    auto f = base->Open(path, o);
    if (!f.ok()) return f.status();
    auto content = SyncedContent(*inode, **f);
    if (!content.ok()) return content.status();
    inode->detached = std::move(*content);
    return Status::OK();
  }
};

class FaultEnv::FaultFile final : public File {
 public:
  FaultFile(State* st, std::shared_ptr<Inode> inode, std::unique_ptr<File> base, std::string path)
      : st_(st), inode_(std::move(inode)), base_(std::move(base)), path_(std::move(path)), epoch_(st->epoch) {}

  Status Read(uint64_t offset, size_t n, uint8_t* buf) const override {
    std::lock_guard<std::mutex> l(st_->mu);
    CDP_RETURN_IF_ERROR(Live());
    CDP_RETURN_IF_ERROR(st_->Admit(Op::kRead, "read " + path_, false));
    return base_->Read(offset, n, buf);
  }

  Result<size_t> ReadUpTo(uint64_t offset, size_t n, uint8_t* buf) const override {
    std::lock_guard<std::mutex> l(st_->mu);
    CDP_RETURN_IF_ERROR(Live());
    CDP_RETURN_IF_ERROR(st_->Admit(Op::kRead, "read " + path_, false));
    return base_->ReadUpTo(offset, n, buf);
  }

  Status Write(uint64_t offset, ByteSpan data) override {
    std::lock_guard<std::mutex> l(st_->mu);
    CDP_RETURN_IF_ERROR(Live());
    const std::string ctx = "pwrite " + path_;
    CDP_RETURN_IF_ERROR(st_->Admit(Op::kWrite, ctx, true));
    if (data.empty()) return base_->Write(offset, data);
    CDP_RETURN_IF_ERROR(st_->CheckCapacity(*inode_, std::max(inode_->size, offset + data.size()), ctx));
    CDP_RETURN_IF_ERROR(State::SaveUndo(*inode_, *base_, offset, offset + data.size()));
    CDP_RETURN_IF_ERROR(base_->Write(offset, data));
    return Refresh();
  }

  Status Append(ByteSpan data) override {
    std::lock_guard<std::mutex> l(st_->mu);
    CDP_RETURN_IF_ERROR(Live());
    const std::string ctx = "append " + path_;
    CDP_RETURN_IF_ERROR(st_->Admit(Op::kAppend, ctx, true));
    if (data.empty()) return Status::OK();
    // Appends at the file's real end, whichever handle extended it last.
    const uint64_t at = inode_->size;
    CDP_RETURN_IF_ERROR(st_->CheckCapacity(*inode_, at + data.size(), ctx));
    CDP_RETURN_IF_ERROR(State::SaveUndo(*inode_, *base_, at, at + data.size()));
    CDP_RETURN_IF_ERROR(base_->Write(at, data));
    return Refresh();
  }

  Status Sync() override {
    std::lock_guard<std::mutex> l(st_->mu);
    CDP_RETURN_IF_ERROR(Live());
    CDP_RETURN_IF_ERROR(st_->Admit(Op::kSync, "fdatasync " + path_, true, true));
    CDP_RETURN_IF_ERROR(base_->Sync());
    CDP_RETURN_IF_ERROR(Refresh());
    inode_->synced_size = inode_->size;
    inode_->undo.clear();
    if (st_->CurrentNames(inode_.get()) == 0 && st_->IsDurable(inode_.get())) {
      // Unlinked but still durably named: the synced content lives aside.
      auto content = State::SyncedContent(*inode_, *base_);
      if (!content.ok()) return content.status();
      inode_->detached = std::move(*content);
    }
    st_->SyncPointPassed();
    return Status::OK();
  }

  Status Allocate(uint64_t offset, uint64_t len) override {
    std::lock_guard<std::mutex> l(st_->mu);
    CDP_RETURN_IF_ERROR(Live());
    const std::string ctx = "fallocate " + path_;
    CDP_RETURN_IF_ERROR(st_->Admit(Op::kAllocate, ctx, true));
    if (offset > UINT64_MAX - len) return Status::FromErrno(EFBIG, ctx);
    CDP_RETURN_IF_ERROR(st_->CheckCapacity(*inode_, std::max(inode_->size, offset + len), ctx));
    // Reserving keeps existing bytes; only the size can change, which
    // synced_size already undoes.
    CDP_RETURN_IF_ERROR(base_->Allocate(offset, len));
    return Refresh();
  }

  Result<uint64_t> NextData(uint64_t offset) const override {
    std::lock_guard<std::mutex> l(st_->mu);
    return base_->NextData(offset);
  }
  Result<uint64_t> NextHole(uint64_t offset) const override {
    std::lock_guard<std::mutex> l(st_->mu);
    return base_->NextHole(offset);
  }

  Status PunchHole(uint64_t offset, uint64_t len) override {
    std::lock_guard<std::mutex> l(st_->mu);
    CDP_RETURN_IF_ERROR(Live());
    CDP_RETURN_IF_ERROR(st_->Admit(Op::kPunchHole, "punch hole " + path_, true));
    const uint64_t end = offset > UINT64_MAX - len ? UINT64_MAX : offset + len;
    CDP_RETURN_IF_ERROR(State::SaveUndo(*inode_, *base_, offset, std::min(end, inode_->size)));
    CDP_RETURN_IF_ERROR(base_->PunchHole(offset, len));
    return Refresh();
  }

  Status Truncate(uint64_t size) override {
    std::lock_guard<std::mutex> l(st_->mu);
    CDP_RETURN_IF_ERROR(Live());
    const std::string ctx = "ftruncate " + path_;
    CDP_RETURN_IF_ERROR(st_->Admit(Op::kTruncate, ctx, true));
    CDP_RETURN_IF_ERROR(st_->CheckCapacity(*inode_, size, ctx));
    CDP_RETURN_IF_ERROR(State::SaveUndo(*inode_, *base_, size, inode_->size));
    CDP_RETURN_IF_ERROR(base_->Truncate(size));
    return Refresh();
  }

  Result<uint64_t> Size() const override {
    std::lock_guard<std::mutex> l(st_->mu);
    CDP_RETURN_IF_ERROR(Live());
    return base_->Size();
  }

  const std::string& path() const override { return path_; }

 private:
  Status Live() const {
    if (epoch_ != st_->epoch) {
      return Status::Aborted(path_ + ": file opened before a simulated power cut");
    }
    return Status::OK();
  }
  Status Refresh() {
    auto size = base_->Size();
    if (!size.ok()) return size.status();
    inode_->size = *size;
    return Status::OK();
  }

  State* const st_;
  const std::shared_ptr<Inode> inode_;
  const std::unique_ptr<File> base_;
  const std::string path_;
  const uint64_t epoch_;
};

FaultEnv::FaultEnv(Env* base) : st_(std::make_unique<State>(base)) {}
FaultEnv::~FaultEnv() = default;

Result<std::unique_ptr<File>> FaultEnv::Open(const std::string& path, const OpenOptions& opts) {
  std::lock_guard<std::mutex> l(st_->mu);
  const bool truncate = opts.truncate && !opts.read_only;
  CDP_RETURN_IF_ERROR(
      st_->Admit(Op::kOpen, "open " + path, !opts.read_only && (opts.create || truncate)));
  std::shared_ptr<Inode> inode = st_->Track(path);
  OpenOptions base_opts = opts;
  base_opts.truncate = false;  // done below, after saving what it destroys
  auto f = st_->base->Open(path, base_opts);
  if (!f.ok()) return f.status();
  if (!inode) {
    inode = std::make_shared<Inode>();  // created by this Open; nothing durable yet
    auto size = (*f)->Size();
    if (!size.ok()) return size.status();
    inode->size = *size;
    st_->current[NormalizePath(path)] = inode;
  }
  if (truncate && inode->size > 0) {
    CDP_RETURN_IF_ERROR(State::SaveUndo(*inode, **f, 0, inode->size));
    CDP_RETURN_IF_ERROR((*f)->Truncate(0));
    inode->size = 0;
  }
  return std::unique_ptr<File>(new FaultFile(st_.get(), std::move(inode), std::move(*f), path));
}

Status FaultEnv::Rename(const std::string& from, const std::string& to) {
  std::lock_guard<std::mutex> l(st_->mu);
  CDP_RETURN_IF_ERROR(st_->Admit(Op::kRename, "rename " + from + " -> " + to, true));
  auto src = st_->Track(from);
  if (!src) {
    if (st_->base->Exists(from) && !st_->base->FileSize(from).ok()) {
      return Status::NotSupported("rename " + from + ": FaultEnv does not model directory renames");
    }
    return st_->base->Rename(from, to);  // reports the base Env's error
  }
  const std::string kf = NormalizePath(from), kt = NormalizePath(to);
  if (kf == kt) return st_->base->Rename(from, to);
  auto dst = st_->Track(to);
  if (dst && dst != src) CDP_RETURN_IF_ERROR(st_->KeepIfOrphaned(dst, to));
  CDP_RETURN_IF_ERROR(st_->base->Rename(from, to));
  st_->current.erase(kf);
  st_->current[kt] = src;
  return Status::OK();
}

Status FaultEnv::Remove(const std::string& path) {
  std::lock_guard<std::mutex> l(st_->mu);
  CDP_RETURN_IF_ERROR(st_->Admit(Op::kRemove, "unlink " + path, true));
  auto inode = st_->Track(path);
  if (inode) CDP_RETURN_IF_ERROR(st_->KeepIfOrphaned(inode, path));
  CDP_RETURN_IF_ERROR(st_->base->Remove(path));
  st_->current.erase(NormalizePath(path));
  return Status::OK();
}

Status FaultEnv::SyncDir(const std::string& dir) {
  std::lock_guard<std::mutex> l(st_->mu);
  CDP_RETURN_IF_ERROR(st_->Admit(Op::kSyncDir, "fsync dir " + dir, true, true));
  CDP_RETURN_IF_ERROR(st_->base->SyncDir(dir));
  const std::string d = NormalizePath(dir);
  for (auto it = st_->durable.begin(); it != st_->durable.end();) {
    if (DirName(it->first) == d && !st_->current.count(it->first)) {
      it = st_->durable.erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& [k, v] : st_->current) {
    if (DirName(k) == d) st_->durable[k] = v;
  }
  st_->SyncPointPassed();
  return Status::OK();
}

Status FaultEnv::CreateDirs(const std::string& dir) {
  std::lock_guard<std::mutex> l(st_->mu);
  CDP_RETURN_IF_ERROR(st_->Admit(Op::kCreateDirs, "mkdir " + dir, true));
  return st_->base->CreateDirs(dir);
}

Status FaultEnv::RemoveDir(const std::string& dir) {
  std::lock_guard<std::mutex> l(st_->mu);
  if (st_->crashed) return Status::FromErrno(EIO, "rmdir " + dir + " (power lost)");
  return st_->base->RemoveDir(dir);
}

bool FaultEnv::Exists(const std::string& path) {
  std::lock_guard<std::mutex> l(st_->mu);
  return st_->base->Exists(path);
}

Result<std::vector<std::string>> FaultEnv::ListDir(const std::string& dir) {
  std::lock_guard<std::mutex> l(st_->mu);
  return st_->base->ListDir(dir);
}

Result<uint64_t> FaultEnv::FileSize(const std::string& path) {
  std::lock_guard<std::mutex> l(st_->mu);
  return st_->base->FileSize(path);
}

Result<std::unique_ptr<FileLock>> FaultEnv::LockFile(const std::string& path) {
  std::lock_guard<std::mutex> l(st_->mu);
  return st_->base->LockFile(path);
}

Status FaultEnv::DropUnsyncedData() {
  std::lock_guard<std::mutex> l(st_->mu);
  State& st = *st_;
  Env* base = st.base;
  OpenOptions ro;
  ro.read_only = true;

  // 1. Read, before anything moves, the synced content of every durable name
  //    whose file is not at that name any more.
  std::map<std::string, Bytes> copies;
  for (const auto& [key, inode] : st.durable) {
    auto cur = st.current.find(key);
    if (cur != st.current.end() && cur->second == inode) continue;  // restored in place
    std::string holder;
    for (const auto& [k, v] : st.current) {
      if (v == inode) {
        holder = k;
        break;
      }
    }
    if (holder.empty()) {
      if (!inode->detached) return Status::Corruption("FaultEnv: lost the synced content of " + key);
      copies[key] = *inode->detached;
      continue;
    }
    auto f = base->Open(holder, ro);
    if (!f.ok()) return f.status();
    auto content = State::SyncedContent(*inode, **f);
    if (!content.ok()) return content.status();
    copies[key] = std::move(*content);
  }

  // 2. Remove every name that is not durable (or names another file now).
  for (const auto& [key, inode] : st.current) {
    auto d = st.durable.find(key);
    if (d != st.durable.end() && d->second == inode) continue;
    CDP_RETURN_IF_ERROR(base->Remove(key));
  }

  // 3. Restore in place: back to the synced size, then the saved blocks.
  std::map<std::string, std::shared_ptr<Inode>> fresh;
  for (const auto& [key, inode] : st.durable) {
    auto node = std::make_shared<Inode>();
    auto cur = st.current.find(key);
    if (cur != st.current.end() && cur->second == inode) {
      auto f = base->Open(key, OpenOptions());
      if (!f.ok()) return f.status();
      CDP_RETURN_IF_ERROR((*f)->Truncate(inode->synced_size));
      for (const auto& [b, blk] : inode->undo) {
        CDP_RETURN_IF_ERROR((*f)->Write(b * kUndoBlock, blk));
      }
      CDP_RETURN_IF_ERROR((*f)->Sync());
      node->size = node->synced_size = inode->synced_size;
    } else {
      const Bytes& content = copies[key];
      CDP_RETURN_IF_ERROR(base->CreateDirs(DirName(key)));
      OpenOptions w;
      w.create = true;
      w.truncate = true;
      auto f = base->Open(key, w);
      if (!f.ok()) return f.status();
      CDP_RETURN_IF_ERROR((*f)->Write(0, content));
      CDP_RETURN_IF_ERROR((*f)->Sync());
      node->size = node->synced_size = content.size();
    }
    fresh[key] = std::move(node);
  }

  // 4. The durable state is now the whole state; handles from before are dead.
  st.current = fresh;
  st.durable = std::move(fresh);
  ++st.epoch;
  st.crashed = false;
  st.syncs_left.reset();
  return Status::OK();
}

void FaultEnv::InjectError(Op op, int err, uint64_t after_n_calls, bool sticky) {
  std::lock_guard<std::mutex> l(st_->mu);
  auto& in = st_->inject[size_t(op)];
  in.armed = true;
  in.err = err;
  in.fire_at = st_->calls[size_t(op)] + after_n_calls + 1;
  in.sticky = sticky;
}

void FaultEnv::ClearErrors() {
  std::lock_guard<std::mutex> l(st_->mu);
  for (auto& in : st_->inject) in = State::Injection();
  st_->syncs_left.reset();
}

uint64_t FaultEnv::CallCount(Op op) const {
  std::lock_guard<std::mutex> l(st_->mu);
  return st_->calls[size_t(op)];
}

uint64_t FaultEnv::InjectedFailures() const {
  std::lock_guard<std::mutex> l(st_->mu);
  return st_->injected_failures;
}

void FaultEnv::ResetCounters() {
  std::lock_guard<std::mutex> l(st_->mu);
  // Armed injections keep their place relative to the calls still to come.
  for (size_t i = 0; i < st_->calls.size(); ++i) {
    auto& in = st_->inject[i];
    if (in.armed) in.fire_at = in.fire_at > st_->calls[i] ? in.fire_at - st_->calls[i] : 1;
    st_->calls[i] = 0;
  }
  st_->injected_failures = 0;
  st_->sync_points = 0;
}

void FaultEnv::SetCrashAfterSyncs(uint64_t n) {
  std::lock_guard<std::mutex> l(st_->mu);
  st_->syncs_left = n;
}

void FaultEnv::CrashNow() {
  std::lock_guard<std::mutex> l(st_->mu);
  st_->crashed = true;
}

bool FaultEnv::crashed() const {
  std::lock_guard<std::mutex> l(st_->mu);
  return st_->crashed;
}

uint64_t FaultEnv::SyncPoints() const {
  std::lock_guard<std::mutex> l(st_->mu);
  return st_->sync_points;
}

void FaultEnv::SetCapacity(std::optional<uint64_t> bytes) {
  std::lock_guard<std::mutex> l(st_->mu);
  st_->capacity = bytes;
}

}  // namespace cdp

// SPDX-License-Identifier: Apache-2.0
#include "common/store/sqlite_vfs.h"

#include <sqlite3.h>

#include <array>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <vector>

#include "common/base/log.h"
#include "common/store/sqlite.h"

namespace cdp::sqlite {

namespace {

// What the connections of one EnvVfs to one path share: the file lock levels
// and the WAL index.
struct Node {
  std::mutex mu;
  int refs = 0;  // open files of this path (guarded by Impl::mu)
  // File locks (SHARED .. EXCLUSIVE), between this process's connections.
  int shared = 0;  // files holding SHARED or more
  const void* reserved = nullptr;
  const void* pending = nullptr;
  const void* exclusive = nullptr;
  // The WAL index: regions of sqlite's wal-index, and its slot locks.
  std::vector<std::unique_ptr<char[]>> regions;
  int shm_refs = 0;
  std::array<int, SQLITE_SHM_NLOCK> shm_shared{};
  std::array<const void*, SQLITE_SHM_NLOCK> shm_excl{};
};

struct VfsFile {
  sqlite3_file base;  // first: sqlite casts between the two
  EnvVfs::Impl* vfs;
  std::unique_ptr<File> file;
  std::shared_ptr<Node> node;
  std::string path;
  bool delete_on_close = false;
  bool sync_dir = false;  // created by this open: its name is durable at the first Sync
  int level = SQLITE_LOCK_NONE;
  bool shm_mapped = false;
  uint32_t shm_shared_mask = 0;
  uint32_t shm_excl_mask = 0;
};

VfsFile* F(sqlite3_file* f) { return reinterpret_cast<VfsFile*>(f); }

}  // namespace

struct EnvVfs::Impl {
  Env* env;
  std::string name;
  sqlite3_vfs vfs{};
  sqlite3_vfs* deflt = nullptr;
  std::mutex mu;
  std::map<std::string, std::shared_ptr<Node>> nodes;

  std::shared_ptr<Node> Acquire(const std::string& path) {
    std::lock_guard<std::mutex> lk(mu);
    auto& n = nodes[path];
    if (!n) n = std::make_shared<Node>();
    n->refs++;
    return n;
  }
  void Release(const std::string& path) {
    std::lock_guard<std::mutex> lk(mu);
    auto it = nodes.find(path);
    if (it != nodes.end() && --it->second->refs == 0) nodes.erase(it);
  }
};

namespace {

EnvVfs::Impl* I(sqlite3_vfs* v) { return static_cast<EnvVfs::Impl*>(v->pAppData); }

void LogFailure(const Status& s, const char* op) {
  if (!s.ok()) log::Get("sqlite")->warn("env vfs {}: {}", op, s.ToString());
}

int IoError(const Status& s, int code, const char* op) {
  LogFailure(s, op);
  return s.code() == Code::kNoSpace ? SQLITE_FULL : code;
}

// ---- io methods

int Close(sqlite3_file* f) {
  VfsFile* p = F(f);
  int rc = SQLITE_OK;
  p->file.reset();
  if (p->delete_on_close) {
    Status s = p->vfs->env->Remove(p->path);
    if (!s.ok() && !s.IsNotFound()) rc = IoError(s, SQLITE_IOERR_DELETE, "delete on close");
  }
  p->vfs->Release(p->path);
  p->~VfsFile();
  return rc;
}

int Read(sqlite3_file* f, void* buf, int amt, sqlite3_int64 off) {
  auto n = F(f)->file->ReadUpTo(uint64_t(off), size_t(amt), static_cast<uint8_t*>(buf));
  if (!n.ok()) return IoError(n.status(), SQLITE_IOERR_READ, "read");
  if (*n < size_t(amt)) {
    std::memset(static_cast<uint8_t*>(buf) + *n, 0, size_t(amt) - *n);
    return SQLITE_IOERR_SHORT_READ;
  }
  return SQLITE_OK;
}

int Write(sqlite3_file* f, const void* buf, int amt, sqlite3_int64 off) {
  Status s = F(f)->file->Write(uint64_t(off), ByteSpan(static_cast<const uint8_t*>(buf), size_t(amt)));
  return s.ok() ? SQLITE_OK : IoError(s, SQLITE_IOERR_WRITE, "write");
}

int Truncate(sqlite3_file* f, sqlite3_int64 size) {
  Status s = F(f)->file->Truncate(uint64_t(size));
  return s.ok() ? SQLITE_OK : IoError(s, SQLITE_IOERR_TRUNCATE, "truncate");
}

int Sync(sqlite3_file* f, int) {
  VfsFile* p = F(f);
  Status s = p->file->Sync();
  if (!s.ok()) return IoError(s, SQLITE_IOERR_FSYNC, "sync");
  if (p->sync_dir) {
    s = p->vfs->env->SyncDir(DirName(p->path));
    if (!s.ok()) return IoError(s, SQLITE_IOERR_DIR_FSYNC, "sync dir");
    p->sync_dir = false;
  }
  return SQLITE_OK;
}

int FileSize(sqlite3_file* f, sqlite3_int64* size) {
  auto n = F(f)->file->Size();
  if (!n.ok()) return IoError(n.status(), SQLITE_IOERR_FSTAT, "size");
  *size = sqlite3_int64(*n);
  return SQLITE_OK;
}

int Lock(sqlite3_file* f, int level) {
  VfsFile* p = F(f);
  if (p->level >= level) return SQLITE_OK;
  Node& n = *p->node;
  std::lock_guard<std::mutex> lk(n.mu);
  if (level == SQLITE_LOCK_SHARED) {
    if ((n.pending && n.pending != p) || (n.exclusive && n.exclusive != p)) return SQLITE_BUSY;
    n.shared++;
    p->level = SQLITE_LOCK_SHARED;
    return SQLITE_OK;
  }
  if (level == SQLITE_LOCK_RESERVED) {
    if (n.reserved && n.reserved != p) return SQLITE_BUSY;
    n.reserved = p;
    p->level = SQLITE_LOCK_RESERVED;
    return SQLITE_OK;
  }
  // EXCLUSIVE, through PENDING: no new reader gets in while the others leave.
  if ((n.pending && n.pending != p) || (n.exclusive && n.exclusive != p)) return SQLITE_BUSY;
  n.pending = p;
  if (n.shared > 1) {
    p->level = SQLITE_LOCK_PENDING;
    return SQLITE_BUSY;
  }
  n.exclusive = p;
  p->level = SQLITE_LOCK_EXCLUSIVE;
  return SQLITE_OK;
}

int Unlock(sqlite3_file* f, int level) {
  VfsFile* p = F(f);
  if (p->level <= level) return SQLITE_OK;
  Node& n = *p->node;
  std::lock_guard<std::mutex> lk(n.mu);
  if (n.exclusive == p) n.exclusive = nullptr;
  if (n.pending == p) n.pending = nullptr;
  if (level < SQLITE_LOCK_RESERVED && n.reserved == p) n.reserved = nullptr;
  if (level == SQLITE_LOCK_NONE) n.shared--;
  p->level = level;
  return SQLITE_OK;
}

int CheckReserved(sqlite3_file* f, int* out) {
  Node& n = *F(f)->node;
  std::lock_guard<std::mutex> lk(n.mu);
  *out = n.reserved != nullptr || n.pending != nullptr || n.exclusive != nullptr;
  return SQLITE_OK;
}

int FileControl(sqlite3_file*, int, void*) { return SQLITE_NOTFOUND; }
int SectorSize(sqlite3_file*) { return 4096; }
int DeviceCharacteristics(sqlite3_file*) { return 0; }

int ShmMap(sqlite3_file* f, int region, int size, int extend, void volatile** out) {
  VfsFile* p = F(f);
  Node& n = *p->node;
  std::lock_guard<std::mutex> lk(n.mu);
  if (!p->shm_mapped) {
    p->shm_mapped = true;
    n.shm_refs++;
  }
  if (size_t(region) >= n.regions.size()) {
    if (!extend) {
      *out = nullptr;
      return SQLITE_OK;
    }
    while (n.regions.size() <= size_t(region)) {
      std::unique_ptr<char[]> r(new (std::nothrow) char[size_t(size)]);
      if (!r) return SQLITE_NOMEM;
      std::memset(r.get(), 0, size_t(size));
      n.regions.push_back(std::move(r));
    }
  }
  *out = n.regions[size_t(region)].get();
  return SQLITE_OK;
}

int ShmLock(sqlite3_file* f, int ofst, int count, int flags) {
  VfsFile* p = F(f);
  Node& n = *p->node;
  std::lock_guard<std::mutex> lk(n.mu);
  uint32_t mask = ((1u << count) - 1) << ofst;
  if (flags & SQLITE_SHM_UNLOCK) {
    for (int i = ofst; i < ofst + count; i++) {
      if ((flags & SQLITE_SHM_SHARED) && (p->shm_shared_mask & (1u << i))) n.shm_shared[size_t(i)]--;
      if ((flags & SQLITE_SHM_EXCLUSIVE) && n.shm_excl[size_t(i)] == p) n.shm_excl[size_t(i)] = nullptr;
    }
    if (flags & SQLITE_SHM_SHARED) p->shm_shared_mask &= ~mask;
    if (flags & SQLITE_SHM_EXCLUSIVE) p->shm_excl_mask &= ~mask;
    return SQLITE_OK;
  }
  for (int i = ofst; i < ofst + count; i++) {
    const void* excl = n.shm_excl[size_t(i)];
    if (excl && excl != p) return SQLITE_BUSY;
    if (flags & SQLITE_SHM_EXCLUSIVE) {
      int others = n.shm_shared[size_t(i)] - ((p->shm_shared_mask & (1u << i)) ? 1 : 0);
      if (others > 0) return SQLITE_BUSY;
    }
  }
  for (int i = ofst; i < ofst + count; i++) {
    if (flags & SQLITE_SHM_EXCLUSIVE) {
      n.shm_excl[size_t(i)] = p;
    } else if (!(p->shm_shared_mask & (1u << i))) {
      n.shm_shared[size_t(i)]++;
    }
  }
  if (flags & SQLITE_SHM_EXCLUSIVE) {
    p->shm_excl_mask |= mask;
  } else {
    p->shm_shared_mask |= mask;
  }
  return SQLITE_OK;
}

void ShmBarrier(sqlite3_file*) { std::atomic_thread_fence(std::memory_order_seq_cst); }

int ShmUnmap(sqlite3_file* f, int) {
  VfsFile* p = F(f);
  Node& n = *p->node;
  std::lock_guard<std::mutex> lk(n.mu);
  for (int i = 0; i < SQLITE_SHM_NLOCK; i++) {
    if (p->shm_shared_mask & (1u << i)) n.shm_shared[size_t(i)]--;
    if (n.shm_excl[size_t(i)] == p) n.shm_excl[size_t(i)] = nullptr;
  }
  p->shm_shared_mask = p->shm_excl_mask = 0;
  if (p->shm_mapped) {
    p->shm_mapped = false;
    // The WAL index lives as long as a connection maps it; the next one
    // rebuilds it from the WAL (sqlite's recovery).
    if (--n.shm_refs == 0) n.regions.clear();
  }
  return SQLITE_OK;
}

const sqlite3_io_methods kMethods = {
    2,
    Close,
    Read,
    Write,
    Truncate,
    Sync,
    FileSize,
    Lock,
    Unlock,
    CheckReserved,
    FileControl,
    SectorSize,
    DeviceCharacteristics,
    ShmMap,
    ShmLock,
    ShmBarrier,
    ShmUnmap,
    nullptr,
    nullptr,
};

// ---- vfs methods

int Open(sqlite3_vfs* v, sqlite3_filename name, sqlite3_file* f, int flags, int* out_flags) {
  f->pMethods = nullptr;  // xClose is not called when xOpen fails
  if (name == nullptr) {
    log::Get("sqlite")->warn("env vfs: temporary files are not supported (set temp_store=MEMORY)");
    return SQLITE_CANTOPEN;
  }
  EnvVfs::Impl* impl = I(v);
  OpenOptions oo;
  oo.read_only = (flags & SQLITE_OPEN_READONLY) != 0;
  oo.create = (flags & SQLITE_OPEN_CREATE) != 0;
  oo.exclusive = (flags & SQLITE_OPEN_EXCLUSIVE) != 0;
  bool created = oo.create && !oo.read_only && !impl->env->Exists(name);
  auto file = impl->env->Open(name, oo);
  if (!file.ok()) {
    if (!file.status().IsNotFound()) LogFailure(file.status(), "open");
    // Busy (the file is another process's, e.g. a Ceph image locked by
    // another master target) stays busy for the caller; the log says whose.
    if (file.status().code() == Code::kBusy) return SQLITE_BUSY;
    if (file.status().code() == Code::kPermissionDenied) return SQLITE_PERM;
    return SQLITE_CANTOPEN;
  }
  auto* p = new (f) VfsFile{};
  p->vfs = impl;
  p->file = std::move(*file);
  p->path = name;
  p->node = impl->Acquire(p->path);
  p->delete_on_close = (flags & SQLITE_OPEN_DELETEONCLOSE) != 0;
  p->sync_dir = created;
  f->pMethods = &kMethods;
  if (out_flags) *out_flags = flags;
  return SQLITE_OK;
}

int Delete(sqlite3_vfs* v, const char* name, int sync_dir) {
  Status s = I(v)->env->Remove(name);
  if (s.IsNotFound()) return SQLITE_IOERR_DELETE_NOENT;
  if (!s.ok()) return IoError(s, SQLITE_IOERR_DELETE, "delete");
  if (sync_dir) {
    s = I(v)->env->SyncDir(DirName(name));
    if (!s.ok()) return IoError(s, SQLITE_IOERR_DIR_FSYNC, "sync dir");
  }
  return SQLITE_OK;
}

int Access(sqlite3_vfs* v, const char* name, int flags, int* out) {
  Env* env = I(v)->env;
  *out = 0;
  if (!env->Exists(name)) return SQLITE_OK;
  if (flags == SQLITE_ACCESS_EXISTS) {
    // As sqlite's unix VFS: an empty file counts as missing (a WAL left empty).
    auto size = env->FileSize(name);
    *out = size.ok() && *size > 0;
    return SQLITE_OK;
  }
  *out = 1;
  return SQLITE_OK;
}

int FullPathname(sqlite3_vfs*, const char* name, int n, char* out) {
  if (int(std::strlen(name)) >= n) return SQLITE_CANTOPEN;
  std::strcpy(out, name);
  return SQLITE_OK;
}

void* DlOpen(sqlite3_vfs*, const char*) { return nullptr; }
void DlError(sqlite3_vfs*, int n, char* out) {
  if (n > 0) std::snprintf(out, size_t(n), "%s", "loadable extensions are not supported");
}
void (*DlSym(sqlite3_vfs*, void*, const char*))(void) { return nullptr; }
void DlClose(sqlite3_vfs*, void*) {}
int Randomness(sqlite3_vfs* v, int n, char* out) { return I(v)->deflt->xRandomness(I(v)->deflt, n, out); }
int Sleep(sqlite3_vfs* v, int us) { return I(v)->deflt->xSleep(I(v)->deflt, us); }
int CurrentTime(sqlite3_vfs* v, double* t) { return I(v)->deflt->xCurrentTime(I(v)->deflt, t); }
int GetLastError(sqlite3_vfs*, int, char*) { return 0; }
int CurrentTimeInt64(sqlite3_vfs* v, sqlite3_int64* t) {
  sqlite3_vfs* d = I(v)->deflt;
  if (d->iVersion >= 2 && d->xCurrentTimeInt64) return d->xCurrentTimeInt64(d, t);
  double days = 0;
  int rc = d->xCurrentTime(d, &days);
  *t = sqlite3_int64(days * 86400000.0);
  return rc;
}

std::atomic<uint64_t> g_vfs_counter{0};

}  // namespace

EnvVfs::EnvVfs(Env* env) : impl_(std::make_unique<Impl>()) {
  RouteLogOnce();
  impl_->env = env;
  impl_->name = "cdp-env-" + std::to_string(++g_vfs_counter);
  impl_->deflt = sqlite3_vfs_find(nullptr);
  sqlite3_vfs& v = impl_->vfs;
  v.iVersion = 2;
  v.szOsFile = int(sizeof(VfsFile));
  v.mxPathname = 1024;
  v.zName = impl_->name.c_str();
  v.pAppData = impl_.get();
  v.xOpen = Open;
  v.xDelete = Delete;
  v.xAccess = Access;
  v.xFullPathname = FullPathname;
  v.xDlOpen = DlOpen;
  v.xDlError = DlError;
  v.xDlSym = DlSym;
  v.xDlClose = DlClose;
  v.xRandomness = Randomness;
  v.xSleep = Sleep;
  v.xCurrentTime = CurrentTime;
  v.xGetLastError = GetLastError;
  v.xCurrentTimeInt64 = CurrentTimeInt64;
  int rc = sqlite3_vfs_register(&v, 0);
  if (rc != SQLITE_OK) log::Get("sqlite")->error("env vfs: cannot register {}: {}", impl_->name, sqlite3_errstr(rc));
}

EnvVfs::~EnvVfs() { sqlite3_vfs_unregister(&impl_->vfs); }

const std::string& EnvVfs::name() const { return impl_->name; }

}  // namespace cdp::sqlite

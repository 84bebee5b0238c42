// SPDX-License-Identifier: Apache-2.0
#include "storage/ceph_env.h"

#include <rados/librados.h>
#include <rbd/librbd.h>

#include <algorithm>
#include <cerrno>
#include <set>
#include <span>

#include "common/base/log.h"

namespace cdp::storage {

namespace {

constexpr const char* kSizeKey = "opencdp.size";
// Images removed while open wait under "<prefix>~~trash~N-<name>" (no path
// makes "~~") until their last handle closes; a start removes leftovers.
constexpr const char* kTrash = "~~trash~";
constexpr uint64_t kGrowStep = 64ull << 20;  // an image grows ahead of its file by up to this
constexpr uint64_t kAlign = 4ull << 20;
constexpr size_t kAioDepth = 32;            // requests of one batch in flight at once
constexpr size_t kSmallWrite = 64u << 10;   // a Write() this small may wait (Image::pending)
constexpr size_t kPendingBytes = 4u << 20;  // pending writes are sent past this

uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

}  // namespace

std::vector<std::pair<std::string, std::string>> CephEnvRadosSettings() { return {{"rbd_cache", "false"}}; }

namespace {

// Issues `count` requests through `issue(i, completion)` (a librbd aio call),
// at most kAioDepth at a time, and waits for all of them. The first failure
// in op order, or OK.
template <class Issue>
Status Aio(size_t count, const std::string& what, Issue issue) {
  std::vector<Status> results(count);
  std::vector<rbd_completion_t> flight(count, nullptr);
  auto reap = [&](size_t i) {
    rbd_aio_wait_for_complete(flight[i]);
    ssize_t r = rbd_aio_get_return_value(flight[i]);
    rbd_aio_release(flight[i]);
    flight[i] = nullptr;
    if (r < 0) results[i] = FromCephError(int(r), what);
  };
  for (size_t i = 0; i < count; ++i) {
    if (i >= kAioDepth && flight[i - kAioDepth] != nullptr) reap(i - kAioDepth);
    int r = rbd_aio_create_completion(nullptr, nullptr, &flight[i]);
    if (r < 0) {
      flight[i] = nullptr;
      results[i] = FromCephError(r, "rbd: aio completion");
      continue;
    }
    r = issue(i, flight[i]);
    if (r < 0) {
      rbd_aio_release(flight[i]);
      flight[i] = nullptr;
      results[i] = FromCephError(r, what);
    }
  }
  for (size_t i = 0; i < count; ++i) {
    if (flight[i] != nullptr) reap(i);
  }
  for (auto& st : results) CDP_RETURN_IF_ERROR(st);
  return Status::OK();
}

}  // namespace

struct CephEnv::Image {
  CephEnv* env = nullptr;
  std::string name;
  std::unique_ptr<RbdImage> rbd;
  std::mutex mu;
  uint64_t size = 0;         // the file's size (pending writes included)
  uint64_t synced_size = 0;  // the size in the image's metadata
  uint64_t capacity = 0;     // the image's size
  bool locked = false;       // this process holds the exclusive lock
  bool removed = false;      // Remove()d while open: renamed to `trash`, deleted at close (env->mu_)
  std::string trash;         // (env->mu_)
  // Small writes not yet sent (offset -> bytes, disjoint): sent together, as
  // asynchronous requests, before any other operation of any handle of the
  // image, at Sync, at close and when they pass kPendingBytes. A write's
  // error then comes from that later call (as the page cache's from fsync).
  std::map<uint64_t, Bytes> pending;
  size_t pending_bytes = 0;

  rbd_image_t handle() const { return static_cast<rbd_image_t>(rbd->handle()); }

  // Grows the image to hold `end` bytes (mu held).
  Status Reserve(uint64_t end) {
    if (end <= capacity) return Status::OK();
    uint64_t want = RoundUp(std::max(end, capacity + std::min(std::max(capacity, kAlign), kGrowStep)), kAlign);
    CDP_RETURN_IF_ERROR(rbd->Resize(want));
    capacity = want;
    return Status::OK();
  }
  Status PersistSize(uint64_t s) {
    std::string v = std::to_string(s);
    return FromCephError(rbd_metadata_set(handle(), kSizeKey, v.c_str()), "rbd: set the size of " + name);
  }
  // Sends the pending writes (mu held).
  Status FlushPending() {
    if (pending.empty()) return Status::OK();
    std::vector<std::pair<uint64_t, Bytes>> ops(std::make_move_iterator(pending.begin()),
                                                std::make_move_iterator(pending.end()));
    pending.clear();
    pending_bytes = 0;
    return Aio(ops.size(), "rbd: write " + name, [&](size_t i, rbd_completion_t c) {
      return rbd_aio_write(handle(), ops[i].first, ops[i].second.size(),
                           reinterpret_cast<const char*>(ops[i].second.data()), c);
    });
  }
  // Keeps a small write pending (mu held); false when it overlaps a pending
  // one (the caller sends those first).
  bool Defer(uint64_t offset, ByteSpan data) {
    auto next = pending.lower_bound(offset);
    if (next != pending.end() && next->first < offset + data.size()) return false;
    if (next != pending.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second.size() > offset) return false;
    }
    pending.emplace(offset, Bytes(data.begin(), data.end()));
    pending_bytes += data.size();
    return true;
  }
};

namespace {

class CephFile final : public File {
 public:
  CephFile(std::shared_ptr<CephEnv::Image> image, std::string path, bool read_only)
      : image_(std::move(image)), path_(std::move(path)), read_only_(read_only) {}

  Status Read(uint64_t offset, size_t n, uint8_t* buf) const override {
    CDP_ASSIGN_OR_RETURN(uint64_t size, Settle());
    if (offset > size || n > size - offset) {
      return Status::OutOfRange("read " + path_ + " [" + std::to_string(offset) + ", +" + std::to_string(n) +
                                ") past its end " + std::to_string(size));
    }
    return image_->rbd->Read(offset, std::span<uint8_t>(buf, n));
  }
  Result<size_t> ReadUpTo(uint64_t offset, size_t n, uint8_t* buf) const override {
    CDP_ASSIGN_OR_RETURN(uint64_t size, Settle());
    if (offset >= size) return size_t(0);
    size_t m = size_t(std::min<uint64_t>(n, size - offset));
    CDP_RETURN_IF_ERROR(image_->rbd->Read(offset, std::span<uint8_t>(buf, m)));
    return m;
  }
  Status Write(uint64_t offset, ByteSpan data) override {
    CDP_RETURN_IF_ERROR(Writable());
    {
      std::lock_guard<std::mutex> lk(image_->mu);
      CDP_RETURN_IF_ERROR(image_->Reserve(offset + data.size()));
      if (data.size() <= kSmallWrite) {
        if (!image_->Defer(offset, data)) {
          CDP_RETURN_IF_ERROR(image_->FlushPending());
          image_->Defer(offset, data);
        }
        image_->size = std::max(image_->size, offset + data.size());
        if (image_->pending_bytes >= kPendingBytes) CDP_RETURN_IF_ERROR(image_->FlushPending());
        return Status::OK();
      }
      CDP_RETURN_IF_ERROR(image_->FlushPending());
    }
    CDP_RETURN_IF_ERROR(image_->rbd->Write(offset, data));
    std::lock_guard<std::mutex> lk(image_->mu);
    image_->size = std::max(image_->size, offset + data.size());
    return Status::OK();
  }
  Status Append(ByteSpan data) override {
    CDP_RETURN_IF_ERROR(Writable());
    uint64_t at;
    {
      std::lock_guard<std::mutex> lk(image_->mu);
      CDP_RETURN_IF_ERROR(image_->FlushPending());
      at = image_->size;
      CDP_RETURN_IF_ERROR(image_->Reserve(at + data.size()));
    }
    CDP_RETURN_IF_ERROR(image_->rbd->Write(at, data));
    std::lock_guard<std::mutex> lk(image_->mu);
    image_->size = std::max(image_->size, at + data.size());
    return Status::OK();
  }
  Status Sync() override {
    CDP_RETURN_IF_ERROR(Writable());
    std::lock_guard<std::mutex> lk(image_->mu);
    CDP_RETURN_IF_ERROR(image_->FlushPending());
    CDP_RETURN_IF_ERROR(image_->rbd->Flush());
    if (image_->size != image_->synced_size) {
      CDP_RETURN_IF_ERROR(image_->PersistSize(image_->size));
      image_->synced_size = image_->size;
    }
    return Status::OK();
  }
  Status Allocate(uint64_t offset, uint64_t len) override {
    // Thin images: the pool's space cannot be reserved; the size grows as POSIX fallocate's.
    CDP_RETURN_IF_ERROR(Writable());
    std::lock_guard<std::mutex> lk(image_->mu);
    CDP_RETURN_IF_ERROR(image_->Reserve(offset + len));
    image_->size = std::max(image_->size, offset + len);
    return Status::OK();
  }
  Status PunchHole(uint64_t offset, uint64_t len) override {
    CDP_RETURN_IF_ERROR(Writable());
    CDP_ASSIGN_OR_RETURN(uint64_t size, Settle());
    if (offset >= size) return Status::OK();
    return image_->rbd->Discard(offset, std::min(len, size - offset));
  }
  Status Truncate(uint64_t size) override {
    CDP_RETURN_IF_ERROR(Writable());
    std::lock_guard<std::mutex> lk(image_->mu);
    CDP_RETURN_IF_ERROR(image_->FlushPending());
    if (size < image_->capacity) {
      // Shrinking the image drops the bytes past `size`: a later growth reads zeros there.
      CDP_RETURN_IF_ERROR(image_->rbd->Resize(size));
      image_->capacity = size;
    } else {
      CDP_RETURN_IF_ERROR(image_->Reserve(size));
    }
    image_->size = size;
    return Status::OK();
  }
  Result<uint64_t> Size() const override {
    std::lock_guard<std::mutex> lk(image_->mu);
    return image_->size;
  }
  const std::string& path() const override { return path_; }

  // Batches: every op as an asynchronous librbd request, up to kAioDepth in
  // flight (the OSD round trips of a batch overlap).
  Status ReadBatch(std::span<const ReadOp> ops) const override {
    CDP_ASSIGN_OR_RETURN(uint64_t size, Settle());
    for (const ReadOp& op : ops) {
      if (op.offset > size || op.n > size - op.offset)
        return Status::OutOfRange("read " + path_ + " [" + std::to_string(op.offset) + ", +" + std::to_string(op.n) +
                                  ") past its end " + std::to_string(size));
    }
    return Aio(ops.size(), "rbd: read " + image_->name, [&](size_t i, rbd_completion_t c) {
      return rbd_aio_read(image_->handle(), ops[i].offset, ops[i].n, reinterpret_cast<char*>(ops[i].buf), c);
    });
  }
  Status WriteBatch(std::span<const WriteOp> ops) override {
    CDP_RETURN_IF_ERROR(Writable());
    uint64_t end = 0;
    for (const WriteOp& op : ops) end = std::max<uint64_t>(end, op.offset + op.data.size());
    {
      std::lock_guard<std::mutex> lk(image_->mu);
      CDP_RETURN_IF_ERROR(image_->FlushPending());
      CDP_RETURN_IF_ERROR(image_->Reserve(end));
    }
    CDP_RETURN_IF_ERROR(Aio(ops.size(), "rbd: write " + image_->name, [&](size_t i, rbd_completion_t c) {
      return rbd_aio_write(image_->handle(), ops[i].offset, ops[i].data.size(),
                           reinterpret_cast<const char*>(ops[i].data.data()), c);
    }));
    std::lock_guard<std::mutex> lk(image_->mu);
    image_->size = std::max(image_->size, end);
    return Status::OK();
  }

 private:
  // Sends the image's pending writes (any handle's), so that what follows
  // reads or changes the image after them; the file's size.
  Result<uint64_t> Settle() const {
    std::lock_guard<std::mutex> lk(image_->mu);
    CDP_RETURN_IF_ERROR(image_->FlushPending());
    return image_->size;
  }
  Status Writable() const {
    if (read_only_) return Status::PermissionDenied(path_ + " is open read-only");
    return Status::OK();
  }

  std::shared_ptr<CephEnv::Image> image_;
  std::string path_;
  bool read_only_;
};

}  // namespace

Result<std::unique_ptr<CephEnv>> CephEnv::Connect(RadosOptions rados, const std::string& pool_name,
                                                  const CephEnvOptions& options) {
  for (auto& setting : CephEnvRadosSettings()) rados.settings.push_back(std::move(setting));
  CDP_ASSIGN_OR_RETURN(auto cluster, RadosCluster::Connect(rados));
  CDP_ASSIGN_OR_RETURN(auto pool, cluster->OpenPool(pool_name));
  return Open(std::move(pool), options);
}

Result<std::unique_ptr<CephEnv>> CephEnv::Open(std::shared_ptr<RadosPool> pool, const CephEnvOptions& options) {
  if (!pool) return Status::InvalidArgument("ceph env: no pool");
  if (options.prefix.empty() || options.prefix.find_first_of("~@/") != std::string::npos)
    return Status::InvalidArgument("ceph env: bad prefix '" + options.prefix + "' (not empty, no '~', '@' or '/')");
  std::unique_ptr<CephEnv> env(new CephEnv(std::move(pool), options));
  // The pool must answer (and the user may list it) before the daemon goes on.
  CDP_ASSIGN_OR_RETURN(auto names, env->pool_->ListImages());
  // Files removed while open by a process that died before closing them.
  // One still open elsewhere (EBUSY) stays for a later start.
  const std::string trash = options.prefix + kTrash;
  for (const auto& n : names) {
    if (n.compare(0, trash.size(), trash) != 0) continue;
    Status s = env->pool_->RemoveImage(n);
    if (!s.ok() && !s.IsNotFound()) log::Get("ceph")->info("removed file {} stays: {}", n, s.ToString());
  }
  return env;
}

CephEnv::~CephEnv() = default;

Result<std::string> CephEnv::ImageName(const std::string& path) const {
  std::string p = NormalizePath(path);
  while (!p.empty() && p[0] == '/') p.erase(0, 1);
  if (p == ".") p.clear();
  if (p.find_first_of("~@") != std::string::npos || p.find("..") != std::string::npos)
    return Status::InvalidArgument("ceph env: path " + path + " cannot be an image name");
  std::string name = options_.prefix;
  if (!p.empty()) {
    name += '~';
    for (char c : p) name += c == '/' ? '~' : c;
  }
  return name;
}

Status CephEnv::TakeLock(Image& image) {
  int owner = 0;
  int r = rbd_is_exclusive_lock_owner(image.handle(), &owner);
  if (r < 0) return FromCephError(r, "rbd: lock state of " + image.name);
  if (owner) return Status::OK();
  rbd_lock_mode_t mode;
  char* owners[8];
  size_t n = 8;
  r = rbd_lock_get_owners(image.handle(), &mode, owners, &n);
  if (r < 0 && r != -ENOENT) return FromCephError(r, "rbd: lock owners of " + image.name);
  if (r >= 0 && n > 0) {
    std::vector<std::string> who(owners, owners + n);
    rbd_lock_get_owners_cleanup(owners, n);
    if (!options_.take_over) {
      return Status::Busy("rbd: " + image.name + " is locked by " + who[0] +
                          " (another master target serves it; a takeover breaks the lock)");
    }
    for (const auto& o : who) {
      log::Get("ceph")->warn("taking over {}: breaking the lock of {} (that client is blocklisted)", image.name, o);
      r = rbd_lock_break(image.handle(), RBD_LOCK_MODE_EXCLUSIVE, o.c_str());
      if (r < 0 && r != -ENOENT) return FromCephError(r, "rbd: break the lock of " + o + " on " + image.name);
    }
  }
  r = rbd_lock_acquire(image.handle(), RBD_LOCK_MODE_EXCLUSIVE);
  if (r == -EROFS || r == -EBUSY) {
    return Status::Busy("rbd: " + image.name + " is locked by another client (another master target serves it)");
  }
  return FromCephError(r, "rbd: lock " + image.name);
}

Result<std::shared_ptr<CephEnv::Image>> CephEnv::OpenImage(const std::string& name, bool create, bool exclusive) {
  std::lock_guard<std::mutex> lk(mu_);
  if (auto it = open_.find(name); it != open_.end()) {
    if (auto img = it->second.lock()) {
      if (exclusive) return Status::AlreadyExists("rbd: " + name + " exists");
      return img;
    }
  }
  auto rbd = RbdImage::Open(pool_, name);
  bool created = false;
  if (!rbd.ok() && rbd.status().IsNotFound() && create) {
    Status s = pool_->CreateImage(name, 0);
    if (!s.ok() && s.code() != Code::kAlreadyExists) return s;
    created = s.ok();
    rbd = RbdImage::Open(pool_, name);
  }
  if (!rbd.ok()) return rbd.status();
  if (exclusive && !created) return Status::AlreadyExists("rbd: " + name + " exists");
  auto img = std::shared_ptr<Image>(new Image(), [this](Image* i) {
    Closed(i);
    delete i;
  });
  img->env = this;
  img->name = name;
  img->rbd = std::move(*rbd);
  CDP_ASSIGN_OR_RETURN(img->capacity, img->rbd->Size());
  char value[32];
  size_t len = sizeof(value);
  int r = rbd_metadata_get(img->handle(), kSizeKey, value, &len);
  if (r == -ENOENT) {
    img->size = created ? 0 : img->capacity;
  } else if (r < 0) {
    return FromCephError(r, "rbd: the size of " + name);
  } else {
    img->size = std::strtoull(std::string(value, strnlen(value, len)).c_str(), nullptr, 10);
    if (img->size > img->capacity) return Status::Corruption("rbd: " + name + " is smaller than its recorded size");
  }
  img->synced_size = created ? uint64_t(-1) : img->size;
  open_[name] = img;
  return img;
}

void CephEnv::Closed(Image* image) {
  std::string remove;
  {
    std::lock_guard<std::mutex> lk(mu_);
    const std::string& key = image->removed ? image->trash : image->name;
    auto it = open_.find(key);
    if (it != open_.end() && it->second.expired()) open_.erase(it);
    if (image->removed) remove = image->trash;
  }
  {
    // Written but not synced: a close still sends it (as close(2) keeps the page cache's).
    std::lock_guard<std::mutex> lk(image->mu);
    Status s = image->FlushPending();
    if (!s.ok()) log::Get("ceph")->warn("closing {}: {}", image->name, s.ToString());
  }
  image->rbd.reset();  // closes the image, releasing the lock
  if (!remove.empty()) {
    Status s = pool_->RemoveImage(remove);
    if (!s.ok() && !s.IsNotFound()) log::Get("ceph")->warn("cannot remove {}: {}", remove, s.ToString());
  }
}

Result<std::unique_ptr<File>> CephEnv::Open(const std::string& path, const OpenOptions& opts) {
  CDP_ASSIGN_OR_RETURN(std::string name, ImageName(path));
  bool create = opts.create && !opts.read_only;
  CDP_ASSIGN_OR_RETURN(auto img, OpenImage(name, create, create && opts.exclusive));
  if (!opts.read_only) {
    std::lock_guard<std::mutex> lk(img->mu);
    if (!img->locked) {
      CDP_RETURN_IF_ERROR(TakeLock(*img));
      img->locked = true;
    }
    if (img->synced_size == uint64_t(-1)) {  // a new image: its size is 0 from now on
      CDP_RETURN_IF_ERROR(img->PersistSize(0));
      img->synced_size = 0;
    }
  }
  auto f = std::make_unique<CephFile>(img, path, opts.read_only);
  if (opts.truncate && !opts.read_only) CDP_RETURN_IF_ERROR(f->Truncate(0));
  return std::unique_ptr<File>(std::move(f));
}

Status CephEnv::Remove(const std::string& path) {
  CDP_ASSIGN_OR_RETURN(std::string name, ImageName(path));
  std::shared_ptr<Image> img;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = open_.find(name);
    if (it != open_.end()) img = it->second.lock();
    if (img) {
      // Open here: the image moves to a trash name (the handles, which know
      // it by id, read on) and is deleted when the last one closes. The name
      // is free at once, for a new file of the same path.
      std::string trash =
          options_.prefix + kTrash + std::to_string(++trash_counter_) + "-" + name.substr(options_.prefix.size() + 1);
      int r = rbd_rename(static_cast<rados_ioctx_t>(pool_->handle()), name.c_str(), trash.c_str());
      if (r < 0) return FromCephError(r, "rbd: remove (rename to the trash) " + name);
      open_.erase(it);
      img->removed = true;
      img->trash = trash;
      open_[trash] = img;
      return Status::OK();
    }
  }
  return pool_->RemoveImage(name);
}

Status CephEnv::Rename(const std::string& from, const std::string& to) {
  CDP_ASSIGN_OR_RETURN(std::string src, ImageName(from));
  CDP_ASSIGN_OR_RETURN(std::string dst, ImageName(to));
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& n : {src, dst}) {
      auto it = open_.find(n);
      if (it != open_.end() && !it->second.expired())
        return Status::Busy("rbd: rename " + src + " to " + dst + ": " + n + " is open");
    }
  }
  // Not atomic over an existing target: RBD has no rename-over. The target
  // goes first, so a crash between leaves the source (never neither).
  Status s = pool_->RemoveImage(dst);
  if (!s.ok() && !s.IsNotFound()) return s;
  return FromCephError(rbd_rename(static_cast<rados_ioctx_t>(pool_->handle()), src.c_str(), dst.c_str()),
                       "rbd: rename " + src + " to " + dst);
}

Status CephEnv::SyncDir(const std::string&) { return Status::OK(); }
Status CephEnv::CreateDirs(const std::string& dir) { return ImageName(dir).status(); }
Status CephEnv::RemoveDir(const std::string& dir) { return ImageName(dir).status(); }

bool CephEnv::Exists(const std::string& path) {
  auto name = ImageName(path);
  if (!name.ok()) return false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (auto it = open_.find(*name); it != open_.end() && !it->second.expired()) return true;
  }
  auto all = pool_->ListImages();
  if (!all.ok()) return false;
  const std::string under = *name + "~";
  for (const auto& n : *all) {
    if (n == *name || n.compare(0, under.size(), under) == 0) return true;
  }
  return false;
}

Result<std::vector<std::string>> CephEnv::ListDir(const std::string& dir) {
  CDP_ASSIGN_OR_RETURN(std::string name, ImageName(dir));
  CDP_ASSIGN_OR_RETURN(auto all, pool_->ListImages());
  const std::string under = name + "~";
  std::set<std::string> out;
  for (const auto& n : all) {
    if (n.compare(0, under.size(), under) != 0) continue;
    std::string rest = n.substr(under.size());
    out.insert(rest.substr(0, rest.find('~')));
  }
  if (out.empty() && std::find(all.begin(), all.end(), name) != all.end())
    return Status::InvalidArgument("ceph env: " + dir + " is a file");
  return std::vector<std::string>(out.begin(), out.end());
}

Result<uint64_t> CephEnv::FileSize(const std::string& path) {
  CDP_ASSIGN_OR_RETURN(auto f, Open(path, OpenOptions{.read_only = true}));
  return f->Size();
}

}  // namespace cdp::storage

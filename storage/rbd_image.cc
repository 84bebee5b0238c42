// SPDX-License-Identifier: Apache-2.0
#include "storage/rbd_image.h"

#include <rados/librados.h>
#include <rbd/librbd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace cdp::storage {
namespace {

// librbd returns byte counts as ssize_t but some paths go through int: stay
// well below 2 GiB per call.
constexpr uint64_t kMaxIoChunk = 64ull << 20;

std::string Ctx(std::string_view what, std::string_view name) {
  std::string s(what);
  s += ' ';
  s += name;
  return s;
}

// Seconds for a librados option, at least 1 (0 would mean "no timeout").
std::string Seconds(std::chrono::milliseconds ms) {
  return std::to_string(std::max<int64_t>(1, (ms.count() + 999) / 1000));
}

}  // namespace

Status FromCephError(int r, std::string_view context) {
  if (r >= 0) return Status::OK();
  const int err = -r;
  std::string msg(context);
  msg += ": ";
  msg += std::strerror(err);
  switch (err) {
    case ETIMEDOUT:
    case ENOTCONN:
    case ECONNREFUSED:
    case ESHUTDOWN:
    case EHOSTUNREACH:
    case ENETUNREACH:
      return Status::Unavailable(std::move(msg));
    case EACCES:
    case EPERM:
    case EROFS:
      return Status::PermissionDenied(std::move(msg));
    case ENOENT:
      return Status::NotFound(std::move(msg));
    case EEXIST:
      return Status::AlreadyExists(std::move(msg));
    case ENOSPC:
    case EDQUOT:
      return Status::NoSpace(std::move(msg));
    case EBUSY:
      return Status::Busy(std::move(msg));
    case EINVAL:
    case ERANGE:
      return Status::InvalidArgument(std::move(msg));
    default:
      return Status::FromErrno(err, context);
  }
}

// ---- RadosCluster

Result<std::shared_ptr<RadosCluster>> RadosCluster::Connect(const RadosOptions& options) {
  if (options.client_id.empty()) return Status::InvalidArgument("ceph: empty client id");
  const std::string who = "ceph client." + options.client_id;
  rados_t c = nullptr;
  int r = rados_create2(&c, "ceph", ("client." + options.client_id).c_str(), 0);
  if (r < 0) return FromCephError(r, who + ": rados_create2");
  std::shared_ptr<RadosCluster> cluster(new RadosCluster());
  cluster->cluster_ = c;  // from here the destructor shuts it down

  r = rados_conf_read_file(c, options.conf_path.empty() ? nullptr : options.conf_path.c_str());
  if (r < 0) {
    return FromCephError(r, who + ": read conf " + (options.conf_path.empty() ? "(default)" : options.conf_path));
  }
  const std::pair<const char*, std::string> settings[] = {
      {"client_mount_timeout", Seconds(options.timeout)},
      {"rados_mon_op_timeout", Seconds(options.timeout)},
      {"rados_osd_op_timeout", options.osd_op_timeout.count() > 0 ? Seconds(options.osd_op_timeout) : "0"},
  };
  for (const auto& [key, value] : settings) {
    r = rados_conf_set(c, key, value.c_str());
    if (r < 0) return FromCephError(r, who + ": set " + key);
  }
  for (const auto& [key, value] : options.settings) {
    r = rados_conf_set(c, key.c_str(), value.c_str());
    if (r < 0) return FromCephError(r, who + ": set " + key);
  }
  if (!options.keyring.empty()) {
    r = rados_conf_set(c, "keyring", options.keyring.c_str());
    if (r < 0) return FromCephError(r, who + ": set keyring");
  }
  r = rados_connect(c);
  if (r < 0) {
    // Connect failed: librados wants rados_shutdown on the unconnected handle.
    return FromCephError(r, who + ": connect (conf " + options.conf_path + ")");
  }
  return cluster;
}

RadosCluster::~RadosCluster() {
  if (cluster_ != nullptr) rados_shutdown(static_cast<rados_t>(cluster_));
}

Result<std::shared_ptr<RadosPool>> RadosCluster::OpenPool(const std::string& pool) {
  rados_ioctx_t io = nullptr;
  int r = rados_ioctx_create(static_cast<rados_t>(cluster_), pool.c_str(), &io);
  if (r < 0) return FromCephError(r, Ctx("ceph: open pool", pool));
  return std::shared_ptr<RadosPool>(new RadosPool(shared_from_this(), io, pool));
}

Result<std::string> RadosCluster::Fsid() {
  char buf[64] = {};
  int r = rados_cluster_fsid(static_cast<rados_t>(cluster_), buf, sizeof(buf) - 1);
  if (r < 0) return FromCephError(r, "ceph: fsid");
  return std::string(buf);
}

// ---- RadosPool

RadosPool::~RadosPool() {
  if (ioctx_ != nullptr) rados_ioctx_destroy(static_cast<rados_ioctx_t>(ioctx_));
}

Status RadosPool::CreateImage(const std::string& image, uint64_t size, const RbdImageOptions& options) {
  if (image.empty()) return Status::InvalidArgument("rbd: empty image name");
  if (options.order != 0 && (options.order < 12 || options.order > 26)) {
    return Status::InvalidArgument("rbd: image order " + std::to_string(options.order) + " outside 12..26");
  }
  rbd_image_options_t opts;
  rbd_image_options_create(&opts);
  int r = 0;
  if (options.order != 0) r = rbd_image_options_set_uint64(opts, RBD_IMAGE_OPTION_ORDER, uint64_t(options.order));
  if (r >= 0) r = rbd_create4(static_cast<rados_ioctx_t>(ioctx_), image.c_str(), size, opts);
  rbd_image_options_destroy(opts);
  return FromCephError(r, Ctx("rbd: create image", name_ + "/" + image));
}

Status RadosPool::RemoveImage(const std::string& image) {
  int r = rbd_remove(static_cast<rados_ioctx_t>(ioctx_), image.c_str());
  return FromCephError(r, Ctx("rbd: remove image", name_ + "/" + image));
}

Result<std::vector<std::string>> RadosPool::ListImages() {
  size_t n = 64;
  std::vector<rbd_image_spec_t> specs;
  int r;
  for (;;) {
    specs.resize(n);
    size_t max = n;
    r = rbd_list2(static_cast<rados_ioctx_t>(ioctx_), specs.data(), &max);
    if (r == -ERANGE && max > n) {  // `max` is now the number needed
      n = max;
      continue;
    }
    if (r < 0) return FromCephError(r, Ctx("rbd: list images of", name_));
    n = max;
    break;
  }
  std::vector<std::string> names;
  names.reserve(n);
  for (size_t i = 0; i < n; ++i) names.emplace_back(specs[i].name);
  rbd_image_spec_list_cleanup(specs.data(), n);
  std::sort(names.begin(), names.end());
  return names;
}

Status RadosPool::PutObject(const std::string& object, ByteSpan data) {
  int r = rados_write_full(static_cast<rados_ioctx_t>(ioctx_), object.c_str(),
                           reinterpret_cast<const char*>(data.data()), data.size());
  return FromCephError(r, Ctx("rados: put object", name_ + "/" + object));
}

Result<Bytes> RadosPool::GetObject(const std::string& object, size_t max_bytes) {
  const std::string ctx = Ctx("rados: get object", name_ + "/" + object);
  // One read operation stats and reads at once, so size and bytes agree. The
  // first try guesses a small buffer; an object larger than that is read
  // again with a buffer of its size (it may have grown in between: retry).
  size_t want = std::min<size_t>(max_bytes, 64 << 10);
  for (int attempt = 0; attempt < 8; ++attempt) {
    Bytes buf(want);
    uint64_t size = 0;
    time_t mtime = 0;
    int stat_rval = 0, read_rval = 0;
    size_t bytes_read = 0;
    rados_read_op_t op = rados_create_read_op();
    rados_read_op_stat(op, &size, &mtime, &stat_rval);
    rados_read_op_read(op, 0, buf.size(), reinterpret_cast<char*>(buf.data()), &bytes_read, &read_rval);
    int r = rados_read_op_operate(op, static_cast<rados_ioctx_t>(ioctx_), object.c_str(), 0);
    rados_release_read_op(op);
    if (r < 0) return FromCephError(r, ctx);
    if (stat_rval < 0) return FromCephError(stat_rval, ctx);
    if (read_rval < 0) return FromCephError(read_rval, ctx);
    if (size > max_bytes) {
      return Status::OutOfRange(ctx + ": " + std::to_string(size) + " bytes, more than " + std::to_string(max_bytes));
    }
    if (size <= buf.size()) {
      buf.resize(bytes_read);
      return buf;
    }
    want = size_t(size);
  }
  return Status::Busy(ctx + ": the object kept growing while read");
}

Status RadosPool::RemoveObject(const std::string& object) {
  int r = rados_remove(static_cast<rados_ioctx_t>(ioctx_), object.c_str());
  return FromCephError(r, Ctx("rados: remove object", name_ + "/" + object));
}

// ---- RbdImage

Result<std::unique_ptr<RbdImage>> RbdImage::Open(std::shared_ptr<RadosPool> pool, const std::string& image,
                                                 const OpenOptions& options) {
  if (!pool) return Status::InvalidArgument("rbd: open " + image + " without a pool");
  rbd_image_t img = nullptr;
  auto io = static_cast<rados_ioctx_t>(pool->handle());
  int r = options.read_only ? rbd_open_read_only(io, image.c_str(), &img, nullptr)
                            : rbd_open(io, image.c_str(), &img, nullptr);
  if (r < 0) return FromCephError(r, Ctx("rbd: open image", pool->name() + "/" + image));
  return std::unique_ptr<RbdImage>(new RbdImage(std::move(pool), img, image, options.read_only));
}

RbdImage::~RbdImage() {
  if (image_ != nullptr) rbd_close(static_cast<rbd_image_t>(image_));
}

Result<uint64_t> RbdImage::Size() {
  uint64_t size = 0;
  int r = rbd_get_size(static_cast<rbd_image_t>(image_), &size);
  if (r < 0) return FromCephError(r, Ctx("rbd: size of", name_));
  return size;
}

Status RbdImage::CheckRange(uint64_t offset, uint64_t len, const char* what) {
  CDP_ASSIGN_OR_RETURN(uint64_t size, Size());
  if (offset > size || len > size - offset) {
    return Status::OutOfRange(std::string("rbd: ") + what + " " + name_ + " [" + std::to_string(offset) + ", +" +
                              std::to_string(len) + ") past its end " + std::to_string(size));
  }
  return Status::OK();
}

Status RbdImage::Read(uint64_t offset, std::span<uint8_t> out) {
  CDP_RETURN_IF_ERROR(CheckRange(offset, out.size(), "read"));
  auto img = static_cast<rbd_image_t>(image_);
  size_t done = 0;
  while (done < out.size()) {
    const size_t n = std::min<uint64_t>(out.size() - done, kMaxIoChunk);
    ssize_t r = rbd_read(img, offset + done, n, reinterpret_cast<char*>(out.data() + done));
    if (r < 0) return FromCephError(int(r), Ctx("rbd: read", name_));
    if (size_t(r) != n) return Status::OutOfRange("rbd: short read of " + name_ + " (shrunk meanwhile?)");
    done += n;
  }
  return Status::OK();
}

Status RbdImage::Write(uint64_t offset, ByteSpan data) {
  if (read_only_) return Status::PermissionDenied("rbd: write to " + name_ + ", opened read-only");
  CDP_RETURN_IF_ERROR(CheckRange(offset, data.size(), "write"));
  auto img = static_cast<rbd_image_t>(image_);
  size_t done = 0;
  while (done < data.size()) {
    const size_t n = std::min<uint64_t>(data.size() - done, kMaxIoChunk);
    ssize_t r = rbd_write(img, offset + done, n, reinterpret_cast<const char*>(data.data() + done));
    if (r < 0) return FromCephError(int(r), Ctx("rbd: write", name_));
    if (size_t(r) != n) return Status::IOError("rbd: short write to " + name_);
    done += n;
  }
  return Status::OK();
}

Status RbdImage::Discard(uint64_t offset, uint64_t len) { return Zero(offset, len, false); }

Status RbdImage::WriteZeroes(uint64_t offset, uint64_t len) { return Zero(offset, len, true); }

Status RbdImage::Zero(uint64_t offset, uint64_t len, bool thick) {
  if (read_only_) return Status::PermissionDenied("rbd: zero " + name_ + ", opened read-only");
  CDP_RETURN_IF_ERROR(CheckRange(offset, len, "zero"));
  auto img = static_cast<rbd_image_t>(image_);
  uint64_t done = 0;
  while (done < len) {
    const uint64_t n = std::min<uint64_t>(len - done, kMaxIoChunk);
    // Not rbd_discard: it skips ranges below rbd_discard_granularity_bytes,
    // which would then keep their old data.
    ssize_t r = rbd_write_zeroes(img, offset + done, n, thick ? RBD_WRITE_ZEROES_FLAG_THICK_PROVISION : 0, 0);
    if (r < 0) return FromCephError(int(r), Ctx("rbd: zero", name_));
    done += n;
  }
  return Status::OK();
}

Status RbdImage::Flush() {
  return FromCephError(rbd_flush(static_cast<rbd_image_t>(image_)), Ctx("rbd: flush", name_));
}

Status RbdImage::Resize(uint64_t new_size) {
  if (read_only_) return Status::PermissionDenied("rbd: resize of " + name_ + ", opened read-only");
  return FromCephError(rbd_resize(static_cast<rbd_image_t>(image_), new_size),
                       Ctx("rbd: resize", name_ + " to " + std::to_string(new_size)));
}

}  // namespace cdp::storage

// SPDX-License-Identifier: Apache-2.0
// Ceph access for the master target: a connection to a cluster (RadosCluster),
// a pool in it (RadosPool: RBD images by name, and small RADOS objects for
// state blobs) and an open RBD image (RbdImage: read, write, discard, flush,
// resize). A thin RAII layer over the librbd and librados C APIs
// (rbd/librbd.h, rados/librados.h): every librados/librbd error becomes a
// Status in one place (FromCephError), nothing throws.
//
//   auto cluster = RadosCluster::Connect({.conf_path = "/etc/ceph/ceph.conf", .client_id = "opencdp"});
//   auto pool = (*cluster)->OpenPool("rbd");
//   CDP_RETURN_IF_ERROR((*pool)->CreateImage("vol1-replica", 10 * kGiB));
//   auto image = RbdImage::Open(*pool, "vol1-replica");
//   CDP_RETURN_IF_ERROR((*image)->Write(offset, data));
//   CDP_RETURN_IF_ERROR((*image)->Flush());   // durable on the OSDs from here
//
// Ownership: a RadosPool keeps its RadosCluster alive, an RbdImage its
// RadosPool (shared_ptr), so a handle may outlive the caller's copies of
// the objects it came from. Closing (the destructor) of an image flushes
// librbd's cache and releases its exclusive lock.
//
// Durability: librbd caches writes ("rbd cache", writethrough until the first
// flush); a Write is durable only after a later Flush() returned ok. Flush
// covers every write completed through the same RbdImage, from any thread.
//
// Thread safety: RadosCluster, RadosPool and RbdImage are safe to use from
// several threads at once (librados and librbd handles are); Resize and
// I/O may run concurrently, I/O past the new end then fails kOutOfRange.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/base/coding.h"
#include "common/base/result.h"
#include "common/base/status.h"

namespace cdp::storage {

// The one place a librados/librbd return value (a negative errno) becomes a
// Status "context: strerror". ENOENT -> kNotFound, EEXIST -> kAlreadyExists,
// ETIMEDOUT/ENOTCONN/ECONNREFUSED/ESHUTDOWN/EHOSTUNREACH -> kUnavailable
// (retryable), EACCES/EPERM/EROFS -> kPermissionDenied, ENOSPC/EDQUOT ->
// kNoSpace, EBUSY -> kBusy, EINVAL/ERANGE -> kInvalidArgument, anything else
// Status::FromErrno. `r` >= 0 is ok.
Status FromCephError(int r, std::string_view context);

struct RadosOptions {
  // The cluster's ceph.conf (monitor addresses, keyring path, auth). Empty:
  // librados' own search ($CEPH_CONF, /etc/ceph/ceph.conf, ...).
  std::string conf_path;
  // The cephx user without "client.": "opencdp" authenticates as
  // client.opencdp, with the key found in the keyring the conf names.
  std::string client_id = "admin";
  // A keyring file to use instead of the conf's ("" = the conf's).
  std::string keyring;
  // Bounds connecting (client_mount_timeout) and every monitor command
  // (rados_mon_op_timeout): an unreachable cluster fails with kUnavailable
  // after about this long instead of hanging.
  std::chrono::milliseconds timeout{std::chrono::seconds(10)};
  // Bounds each OSD operation (rados_osd_op_timeout); 0 = wait until the
  // OSDs answer. Leave 0 for images: an I/O failed by this timeout may still
  // be applied later, and librbd's exclusive lock does not expect it.
  std::chrono::milliseconds osd_op_timeout{0};
  // Further librados/librbd options (name, value), set before connecting.
  std::vector<std::pair<std::string, std::string>> settings;
};

class RadosPool;

// A connection to one Ceph cluster as one cephx user (a rados_t).
class RadosCluster : public std::enable_shared_from_this<RadosCluster> {
 public:
  // Reads the conf, applies the options and connects. kUnavailable when no
  // monitor answers within options.timeout; kPermissionDenied when cephx
  // refuses the user or key; kNotFound / kInvalidArgument for a conf or
  // keyring that cannot be read.
  static Result<std::shared_ptr<RadosCluster>> Connect(const RadosOptions& options);

  RadosCluster(const RadosCluster&) = delete;
  RadosCluster& operator=(const RadosCluster&) = delete;
  ~RadosCluster();  // rados_shutdown; every pool and image handle must be gone

  // Opens an I/O context on an existing pool: kNotFound when there is none.
  Result<std::shared_ptr<RadosPool>> OpenPool(const std::string& pool);

  // The cluster's fsid, e.g. for logs.
  Result<std::string> Fsid();

  // The raw handle, for librados calls this class does not wrap.
  void* handle() const { return cluster_; }

 private:
  RadosCluster() = default;
  void* cluster_ = nullptr;  // rados_t
};

struct RbdImageOptions {
  // log2 of the RADOS object size of the image's data (22 = 4 MiB, Ceph's
  // default); 0 = the pool's default. 12..26.
  int order = 0;
};

// An open pool (a rados_ioctx_t): RBD images by name and small RADOS objects.
class RadosPool {
 public:
  RadosPool(const RadosPool&) = delete;
  RadosPool& operator=(const RadosPool&) = delete;
  ~RadosPool();

  const std::string& name() const { return name_; }

  // --- RBD images (format 2, the cluster's default features).
  // Creates an image of `size` bytes (thin: nothing is written). kAlreadyExists
  // when the name is taken.
  Status CreateImage(const std::string& image, uint64_t size, const RbdImageOptions& options = {});
  // Deletes an image and its data. kNotFound when missing; kBusy while another
  // client has it open (librbd refuses to remove a watched image).
  Status RemoveImage(const std::string& image);
  // The names of the pool's images, sorted.
  Result<std::vector<std::string>> ListImages();

  // --- RADOS objects: small state blobs (a per-volume state record, a lease).
  // Each call is one atomic RADOS operation: a reader sees the whole old or
  // the whole new content, never a mix.
  // Replaces the object's whole content with `data` (creating it if missing).
  Status PutObject(const std::string& object, ByteSpan data);
  // The object's whole content. kNotFound when missing; kOutOfRange when it
  // is larger than `max_bytes`.
  Result<Bytes> GetObject(const std::string& object, size_t max_bytes = 16 << 20);
  // Deletes the object. kNotFound when missing.
  Status RemoveObject(const std::string& object);

  // The raw handle (rados_ioctx_t), for calls this class does not wrap.
  void* handle() const { return ioctx_; }
  const std::shared_ptr<RadosCluster>& cluster() const { return cluster_; }

 private:
  friend class RadosCluster;
  RadosPool(std::shared_ptr<RadosCluster> cluster, void* ioctx, std::string name)
      : cluster_(std::move(cluster)), ioctx_(ioctx), name_(std::move(name)) {}
  std::shared_ptr<RadosCluster> cluster_;
  void* ioctx_ = nullptr;  // rados_ioctx_t
  std::string name_;
};

// An open RBD image. Offsets and lengths are in bytes; any alignment works
// (librbd does read-modify-write below its object size), 4 KiB-aligned I/O
// is fastest.
class RbdImage {
 public:
  struct OpenOptions {
    bool read_only = false;  // rbd_open_read_only: no lock, writes refused
  };
  // Opens `image` in `pool`. kNotFound when there is no such image.
  static Result<std::unique_ptr<RbdImage>> Open(std::shared_ptr<RadosPool> pool, const std::string& image,
                                                const OpenOptions& options);
  static Result<std::unique_ptr<RbdImage>> Open(std::shared_ptr<RadosPool> pool, const std::string& image) {
    return Open(std::move(pool), image, OpenOptions{});
  }

  RbdImage(const RbdImage&) = delete;
  RbdImage& operator=(const RbdImage&) = delete;
  ~RbdImage();  // rbd_close: flushes the cache, releases the lock

  const std::string& name() const { return name_; }
  bool read_only() const { return read_only_; }

  // The current size, asked of librbd (another client may have resized it).
  Result<uint64_t> Size();

  // Reads exactly out.size() bytes at `offset`; never-written ranges read as
  // zeros. kOutOfRange when the range passes the end of the image.
  Status Read(uint64_t offset, std::span<uint8_t> out);
  // Writes `data` at `offset` (durable after a later Flush). kOutOfRange past
  // the end; kPermissionDenied on a read-only image.
  Status Write(uint64_t offset, ByteSpan data);
  // Makes [offset, offset+len) read as zeros, deallocating whole RADOS
  // objects inside it (rbd_write_zeroes: partial objects are zeroed, so the
  // contract holds for any alignment). kOutOfRange past the end.
  Status Discard(uint64_t offset, uint64_t len);
  // Makes [offset, offset+len) read as zeros and keeps it allocated: zeros
  // are written (RBD_WRITE_ZEROES_FLAG_THICK_PROVISION). kOutOfRange past the end.
  Status WriteZeroes(uint64_t offset, uint64_t len);
  // Makes every write completed through this handle durable on the OSDs.
  Status Flush();
  // Grows or shrinks the image. Shrinking drops the data past the new end; a
  // later grow reads zeros there.
  Status Resize(uint64_t new_size);

  // The raw handle (rbd_image_t), for calls this class does not wrap.
  void* handle() const { return image_; }

 private:
  RbdImage(std::shared_ptr<RadosPool> pool, void* image, std::string name, bool read_only)
      : pool_(std::move(pool)), image_(image), name_(std::move(name)), read_only_(read_only) {}
  Status CheckRange(uint64_t offset, uint64_t len, const char* what);
  Status Zero(uint64_t offset, uint64_t len, bool thick);

  std::shared_ptr<RadosPool> pool_;
  void* image_ = nullptr;  // rbd_image_t
  std::string name_;
  bool read_only_ = false;
};

}  // namespace cdp::storage

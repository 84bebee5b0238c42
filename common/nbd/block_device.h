// SPDX-License-Identifier: Apache-2.0
// BlockDevice: what an NBD export serves (common/nbd/nbd_server.h), and
// FileBlockDevice, a device over a file or block device through the Env. The
// agent's capture tap and the master target's point-in-time exports are
// BlockDevices too (filters over a device, in the nbdkit sense); none of them
// knows anything about sockets or the NBD protocol.
//
// Thread safety: see each class.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/base/coding.h"
#include "common/base/result.h"
#include "common/base/status.h"
#include "common/env/env.h"

namespace cdp {

// A block size a device may prefer: a power of two in 512 B..2 MiB (the NBD
// limits of NBD_INFO_BLOCK_SIZE).
bool ValidBlockSize(uint32_t block_size);

// What a BlockDevice can do beyond READ and WRITE. Each true feature is
// advertised to clients through the matching transmission flag.
struct BlockDeviceFeatures {
  bool flush = false;         // NBD_FLAG_SEND_FLUSH: Flush() makes writes durable
  bool fua = false;           // NBD_FLAG_SEND_FUA: the `fua` arguments are honoured
  bool trim = false;          // NBD_FLAG_SEND_TRIM: Trim() is implemented
  bool write_zeroes = false;  // NBD_FLAG_SEND_WRITE_ZEROES: WriteZeroes() is implemented
  // NBD_FLAG_CAN_MULTI_CONN: the device has no per-connection cache, so a
  // Flush() or FUA on one connection covers writes completed on any other.
  bool multi_conn = false;
  // NBD_FLAG_SEND_FAST_ZERO: WriteZeroes with may_trim punches holes, so it
  // costs no data writes. A WRITE_ZEROES with FAST_ZERO and NO_HOLE is then
  // refused with ENOTSUP by the server (zeros would be written), so that the
  // client writes its own zeros or skips them, as nbdcopy does.
  bool fast_zero = false;
};

// One run of a device's allocation, as NBD's base:allocation reports it
// (NBD_CMD_BLOCK_STATUS, and the holes of a structured READ reply).
struct DeviceExtent {
  uint64_t length = 0;
  bool hole = false;  // not allocated in the backing store
  bool zero = false;  // reads as zeros (known); false: data, or not known
  bool operator==(const DeviceExtent&) const = default;
};
// Most extents one Extents() call returns; the client asks again from where
// the answer stops.
inline constexpr size_t kMaxDeviceExtents = 1024;
// Appends to `out` the allocation of [offset, offset + len) of `file` (File::
// NextData / NextHole: SEEK_DATA, SEEK_HOLE): holes as hole + zero, the rest
// as data, adjacent runs merged, at most kMaxDeviceExtents, together at least
// 1 and at most `len` bytes. A file that cannot tell is one data extent.
Status FileExtents(const File& file, uint64_t offset, uint64_t len, std::vector<DeviceExtent>* out);
// Appends `e` to `out`, merged into the last extent when their flags match.
void AppendExtent(std::vector<DeviceExtent>* out, DeviceExtent e);

// A byte-addressed device the NBD server reads and writes. The server checks
// every range against size() before calling, so implementations see only
// requests with offset + len <= size() and len > 0 (a zero-length request
// is answered by the server without calling the device).
//
// Thread safety: methods may be called concurrently from several threads,
// for one connection or several. For one connection, a call that changes
// data (Write, WriteShared, WriteZeroes, Trim, Flush) runs alone and after
// every call for the requests before it; Reads and Extents between two such
// calls may run at once, in any order (NbdServer's read pool).
//
// Errors are returned as Status and mapped to NBD errors by
// nbd::ErrorFromStatus (common/nbd/nbd_proto.h): kNoSpace -> ENOSPC,
// kPermissionDenied -> EPERM, kInvalidArgument/kOutOfRange/kNotSupported ->
// EINVAL, kAborted -> ESHUTDOWN, everything else -> EIO.
class BlockDevice {
 public:
  virtual ~BlockDevice() = default;

  // Size in bytes; constant for the lifetime of the device.
  virtual uint64_t size() const = 0;
  // A read-only device gets NBD_FLAG_READ_ONLY; the server refuses WRITE,
  // TRIM and WRITE_ZEROES with EPERM without calling the device.
  virtual bool read_only() const = 0;
  virtual BlockDeviceFeatures features() const = 0;
  // Reported through NBD_INFO_BLOCK_SIZE (minimum is always 1). Must be a
  // power of two between 512 and 2 MiB.
  virtual uint32_t preferred_block_size() const { return 4096; }

  // Reads exactly `len` bytes at `offset` into `buf` (which holds >= len bytes).
  virtual Status Read(uint64_t offset, uint32_t len, uint8_t* buf) = 0;
  // Writes `data` at `offset`. With `fua`, returns only once the data is durable.
  virtual Status Write(uint64_t offset, ByteSpan data, bool fua) = 0;
  // Write() of a buffer the caller hands over and never changes again: a
  // device that keeps the written bytes (the agent's capture queue, until the
  // process server has them) may keep `data` itself instead of a copy. The
  // NBD server passes every WRITE's payload this way. `data` is not null.
  // Default: Write(offset, *data, fua).
  virtual Status WriteShared(uint64_t offset, std::shared_ptr<const Bytes> data, bool fua);
  // Makes [offset, offset+len) read as zeros. With `may_trim` the device may
  // deallocate the range (punch a hole); without it (NBD_CMD_FLAG_NO_HOLE)
  // the range must stay allocated. `fua` as for Write.
  virtual Status WriteZeroes(uint64_t offset, uint64_t len, bool fua, bool may_trim) = 0;
  // A hint that [offset, offset+len) is no longer needed; contents are
  // unspecified afterwards. `fua` as for Write.
  virtual Status Trim(uint64_t offset, uint64_t len, bool fua) = 0;
  // Makes every write completed so far durable.
  virtual Status Flush() = 0;
  // Appends the allocation of [offset, offset + len) to `out`, in order from
  // `offset` (see FileExtents for the shape: at least 1 byte, at most `len`,
  // at most kMaxDeviceExtents). An extent marked zero MUST read as zeros;
  // when in doubt say data. Default: one data extent of `len` bytes.
  virtual Status Extents(uint64_t offset, uint64_t len, std::vector<DeviceExtent>* out);
};

// A BlockDevice over a cdp::File. Trim and WriteZeroes(may_trim) punch holes;
// WriteZeroes without may_trim writes zero buffers; Flush and FUA call
// File::Sync(). Supports flush, fua, trim, write_zeroes and multi_conn.
// Thread safety: as BlockDevice (File allows concurrent Read/Write at
// distinct offsets; Sync is serialized internally).
class FileBlockDevice final : public BlockDevice {
 public:
  struct Options {
    bool read_only = false;
    // Create the file if missing and make it at least this size (sparse);
    // 0 = the file must exist and its current size is the device size.
    uint64_t create_size = 0;
    uint32_t preferred_block_size = 4096;
  };

  // Opens `path` through `env` ("env" must outlive the device). Fails with
  // the Env's status (kNotFound when missing and create_size == 0) or
  // kInvalidArgument for a zero-sized file or a bad block size.
  static Result<std::shared_ptr<FileBlockDevice>> Open(Env* env, const std::string& path,
                                                       const Options& opts);
  // Wraps an already open file of `size` bytes.
  FileBlockDevice(std::unique_ptr<File> file, uint64_t size, const Options& opts);

  uint64_t size() const override { return size_; }
  bool read_only() const override { return read_only_; }
  BlockDeviceFeatures features() const override;
  uint32_t preferred_block_size() const override { return block_size_; }
  Status Read(uint64_t offset, uint32_t len, uint8_t* buf) override;
  Status Write(uint64_t offset, ByteSpan data, bool fua) override;
  Status WriteZeroes(uint64_t offset, uint64_t len, bool fua, bool may_trim) override;
  Status Trim(uint64_t offset, uint64_t len, bool fua) override;
  Status Extents(uint64_t offset, uint64_t len, std::vector<DeviceExtent>* out) override;
  Status Flush() override;

 private:
  Status CheckRange(uint64_t offset, uint64_t len) const;
  Status SyncFile();

  std::unique_ptr<File> file_;
  uint64_t size_;
  bool read_only_;
  uint32_t block_size_;
  std::mutex sync_mu_;
};

}  // namespace cdp

// SPDX-License-Identifier: Apache-2.0
// Env: the only way OpenCDP code reaches the file system (leveldb's Env).
//
// Durable structures (spool, journal, dirty bitmap, replica) are written through
// an Env so that tests can run them on an in-memory Env, or on a FaultEnv that
// simulates a power cut (drops every byte that was not synced) and injects
// ENOSPC or EIO at chosen calls.
//
// Implementations:
//   NewPosixEnv()      real files (pread/pwrite/fdatasync/fallocate/rename/fsync dir)
//   NewMemEnv()        in-memory files; what is written is what is read
//   FaultEnv (fault_env.h)  a wrapper over another Env
//
// Durability model, which every implementation follows and FaultEnv checks:
//   - Data written to a File is durable only after File::Sync() returns ok.
//   - A file's creation, a Rename() or a Remove() is durable only after
//     SyncDir() on the parent directory returns ok.
//
// Thread safety: an Env is safe to use from many threads. A File may be used
// from several threads for Read/Write at distinct offsets; Append, Truncate and
// Sync must not race with each other on the same File.
//
// Direct I/O: OpenOptions::direct asks the Env to bypass its cache (O_DIRECT).
// A File opened so reports DirectAlignment() > 0, and then every Read, Write
// (and their batches) must have its offset and length multiples of it; buffers
// may have any address (the POSIX Env copies through an aligned one when they
// are not aligned). An Env that ignores the option (MemEnv, FaultEnv) reports
// 0: any range works. Linux keeps a direct and a buffered handle of one file
// coherent (a direct write flushes and drops the cached pages of its range, a
// direct read flushes them first) as long as no buffered write to the same
// pages runs at the same time as a direct one; callers keep that order.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/base/coding.h"
#include "common/base/result.h"
#include "common/base/status.h"

namespace cdp {

struct OpenOptions {
  bool create = false;      // create if missing
  bool exclusive = false;   // with create: fail with kAlreadyExists if it exists
  bool truncate = false;    // truncate to 0 on open
  bool read_only = false;
  bool direct = false;      // O_DIRECT where supported (ignored by MemEnv)
  // Permission bits of a file this Open creates (ignored by MemEnv). Every
  // file a daemon creates holds tenant data or secrets: 0600 by default, and
  // the umask can only take bits away, so it stays private whatever the umask.
  uint32_t mode = 0600;
};

// Threads of the POSIX Env's pool for direct batches (File::ReadBatch /
// WriteBatch of a direct file), started at the first such batch and shared
// by every file of the Env: a constant, whatever the number of files.
inline constexpr int kPosixDirectIoThreads = 31;

// One read of a batch (File::ReadBatch): `n` bytes at `offset` into `buf`.
struct ReadOp {
  uint64_t offset = 0;
  size_t n = 0;
  uint8_t* buf = nullptr;
};

// One write of a batch (File::WriteBatch): `data` at `offset`.
struct WriteOp {
  uint64_t offset = 0;
  ByteSpan data;
};

// An open file. Offsets are bytes. Closing happens in the destructor.
class File {
 public:
  virtual ~File() = default;

  // Reads exactly `n` bytes at `offset` into `buf`. Reading past the end of the
  // file returns kOutOfRange (nothing partial is reported as success).
  virtual Status Read(uint64_t offset, size_t n, uint8_t* buf) const = 0;
  // Like Read but returns the number of bytes read, short only at end of file.
  virtual Result<size_t> ReadUpTo(uint64_t offset, size_t n, uint8_t* buf) const = 0;
  // Writes all of `data` at `offset`, extending the file if needed.
  virtual Status Write(uint64_t offset, ByteSpan data) = 0;
  // Appends `data` at the current end of file.
  virtual Status Append(ByteSpan data) = 0;
  // Makes every byte written so far durable (fdatasync).
  virtual Status Sync() = 0;
  // Reserves space [offset, offset+len) so later writes cannot fail with ENOSPC.
  virtual Status Allocate(uint64_t offset, uint64_t len) = 0;
  // Deallocates [offset, offset+len): reads there return zeros afterwards.
  virtual Status PunchHole(uint64_t offset, uint64_t len) = 0;
  virtual Status Truncate(uint64_t size) = 0;
  virtual Result<uint64_t> Size() const = 0;
  // Allocation (SEEK_DATA / SEEK_HOLE): the first offset >= `offset` that may
  // hold data, so [offset, result) reads as zeros; the size when none follows.
  // A file that cannot tell answers `offset` (everything may be data).
  virtual Result<uint64_t> NextData(uint64_t offset) const { return offset; }
  // The first offset >= `offset` in a hole, or the size. Default: the size.
  virtual Result<uint64_t> NextHole(uint64_t offset) const {
    (void)offset;
    return Size();
  }
  virtual const std::string& path() const = 0;

  // Batches: every op of `ops` as Read / Write would do it, possibly several
  // at once and in any order (the POSIX Env runs the ops of a direct file on
  // a small pool of I/O threads, so a batch keeps the device's queue busy).
  // The ops of one WriteBatch must not overlap (their order is not kept);
  // a WriteBatch must not run at the same time as another write to the same
  // bytes. OK when every op succeeded; otherwise the first failure (in op
  // order), and any subset of the other ops may have been done. The buffers
  // must stay live until the call returns. Default: one op after the other.
  virtual Status ReadBatch(std::span<const ReadOp> ops) const {
    for (const ReadOp& op : ops) CDP_RETURN_IF_ERROR(Read(op.offset, op.n, op.buf));
    return Status::OK();
  }
  virtual Status WriteBatch(std::span<const WriteOp> ops) {
    for (const WriteOp& op : ops) CDP_RETURN_IF_ERROR(Write(op.offset, op.data));
    return Status::OK();
  }
  // > 0: the file bypasses the cache (OpenOptions::direct honoured) and
  // every Read / Write range must be aligned to this many bytes (see above);
  // a Sync() of any handle of the same file makes its completed writes
  // durable too (POSIX: fdatasync is per file). 0 (default): any range.
  virtual uint32_t DirectAlignment() const { return 0; }
};

// An exclusive lock on a file, held until destroyed (Env::LockFile).
class FileLock {
 public:
  virtual ~FileLock() = default;
};

class Env {
 public:
  virtual ~Env() = default;

  virtual Result<std::unique_ptr<File>> Open(const std::string& path, const OpenOptions& opts) = 0;
  virtual Status Rename(const std::string& from, const std::string& to) = 0;
  virtual Status Remove(const std::string& path) = 0;
  // Makes creations, renames and removals inside `dir` durable (fsync of the dir).
  virtual Status SyncDir(const std::string& dir) = 0;
  // Creates `dir` and its missing parents; ok if it exists. Directories it
  // creates are 0700 (private whatever the umask); existing ones are left as
  // they are.
  virtual Status CreateDirs(const std::string& dir) = 0;
  virtual Status RemoveDir(const std::string& dir) = 0;
  virtual bool Exists(const std::string& path) = 0;
  // Names (not paths) of the entries of `dir`, sorted.
  virtual Result<std::vector<std::string>> ListDir(const std::string& dir) = 0;
  virtual Result<uint64_t> FileSize(const std::string& path) = 0;
  // Creates `path` if missing and locks it until the returned lock is
  // destroyed (leveldb's LOCK file): kBusy while another holder, in this
  // process or another, has it. A process that dies releases its locks.
  // Default: kNotSupported.
  virtual Result<std::unique_ptr<FileLock>> LockFile(const std::string& path) {
    return Status::NotSupported("this Env cannot lock " + path);
  }
};

// Process-wide POSIX Env. Never deleted; safe to share.
Env* DefaultEnv();
std::unique_ptr<Env> NewPosixEnv();
std::unique_ptr<Env> NewMemEnv();

// Helpers built on any Env.
// Writes `data` to `path` atomically and durably: write "path.tmp", sync,
// rename over `path`, sync the directory. The file is created with `mode`
// (0600 by default: it is never readable by others, not even for a moment).
Status WriteFileAtomic(Env* env, const std::string& path, ByteSpan data, uint32_t mode = 0600);
Result<Bytes> ReadWholeFile(Env* env, const std::string& path);
// Refuses a file of secrets (a token, key or secret file) that group or
// others may access, as ssh refuses such keys: kPermissionDenied naming the
// path, its mode, `what` ("a token file", "tls_key", ...) and the fix. OK for
// a missing file (reading it reports that), and off the real file system
// (env other than DefaultEnv(): a MemEnv path is not on disk).
Status CheckPrivateFile(Env* env, const std::string& path, std::string_view what);
// Lexical normal form: "a//b/./c/" -> "a/b/c", "/" stays "/", "" stays "",
// a path with no parts -> ".". No "..", symlink or file-system look-up.
std::string NormalizePath(const std::string& path);
// The directory part of `path` ("." when there is none).
std::string DirName(const std::string& path);
std::string JoinPath(const std::string& a, const std::string& b);

}  // namespace cdp

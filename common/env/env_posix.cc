// SPDX-License-Identifier: Apache-2.0
// The POSIX Env: real files through pread/pwrite/fdatasync/fallocate.
//
// Every errno becomes a Status through Status::FromErrno with the path (and the
// operation) as context. Short reads and writes and EINTR are retried.
//
// O_DIRECT files (OpenOptions::direct; a file system that refuses O_DIRECT
// fails the Open with its errno): ranges must be kDirectAlign-aligned
// (kInvalidArgument otherwise, before any syscall); a buffer at an unaligned
// address goes through an aligned copy. Their ReadBatch / WriteBatch run on
// the Env's pool of kIoThreads I/O threads (started at the first batch), the
// calling thread included: up to kIoThreads + 1 requests in flight, so a
// batch of random 4 KiB reads or writes keeps the device's queue busy.
// Buffered files keep File's one-op-after-the-other batches (their writes
// only copy into the page cache).
#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/env/env.h"

namespace cdp {
namespace {

// O_DIRECT alignment of offsets, lengths and buffers: the largest logical
// block size of the devices we run on (512 or 4096), so always enough.
constexpr uint32_t kDirectAlign = 4096;
// I/O threads of an Env for direct batches (queue depth kIoThreads + 1).
constexpr int kIoThreads = kPosixDirectIoThreads;

// A fixed pool of threads that run the ops of batches. Shared (shared_ptr)
// by the Env and its files, so a file may outlive its Env.
class IoPool {
 public:
  ~IoPool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  // Runs fn(i) for every i in [0, count), on the pool's threads and the
  // caller's; returns when every call has returned.
  void ParallelFor(size_t count, const std::function<void(size_t)>& fn) {
    if (count == 0) return;
    auto job = std::make_shared<Job>();
    job->count = count;
    job->fn = &fn;
    const size_t helpers = std::min<size_t>(count - 1, kIoThreads);
    if (helpers > 0) {
      std::lock_guard<std::mutex> lk(mu_);
      if (threads_.empty()) {
        for (int i = 0; i < kIoThreads; ++i) threads_.emplace_back([this] { Loop(); });
      }
      for (size_t i = 0; i < helpers; ++i) queue_.push_back(job);
    }
    cv_.notify_all();
    Work(*job);
    std::unique_lock<std::mutex> lk(job->mu);
    job->cv.wait(lk, [&] { return job->done == job->count; });
  }

 private:
  struct Job {
    std::atomic<size_t> next{0};
    size_t count = 0;
    const std::function<void(size_t)>* fn = nullptr;  // valid while done < count
    std::mutex mu;
    std::condition_variable cv;
    size_t done = 0;  // mu
  };

  static void Work(Job& job) {
    for (size_t i; (i = job.next.fetch_add(1)) < job.count;) {
      (*job.fn)(i);
      std::lock_guard<std::mutex> lk(job.mu);
      if (++job.done == job.count) job.cv.notify_all();
    }
  }

  void Loop() {
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop_
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      Work(*job);
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::vector<std::thread> threads_;
  bool stop_ = false;
};

struct AlignedFree {
  void operator()(uint8_t* p) const { std::free(p); }
};
using AlignedBuf = std::unique_ptr<uint8_t[], AlignedFree>;

AlignedBuf AllocAligned(size_t n) {
  void* p = std::aligned_alloc(kDirectAlign, (n + kDirectAlign - 1) / kDirectAlign * kDirectAlign);
  return AlignedBuf(static_cast<uint8_t*>(p));
}

bool Aligned(uint64_t v) { return v % kDirectAlign == 0; }
bool AlignedPtr(const void* p) { return reinterpret_cast<uintptr_t>(p) % kDirectAlign == 0; }

Status Err(int err, const char* op, const std::string& path) {
  return Status::FromErrno(err, std::string(op) + " " + path);
}

class PosixFile final : public File {
 public:
  PosixFile(int fd, std::string path, uint64_t end, bool direct, std::shared_ptr<IoPool> pool)
      : fd_(fd), path_(std::move(path)), end_(end), direct_(direct), pool_(std::move(pool)) {}
  ~PosixFile() override { ::close(fd_); }

  uint32_t DirectAlignment() const override { return direct_ ? kDirectAlign : 0; }

  Status ReadBatch(std::span<const ReadOp> ops) const override {
    if (!direct_ || ops.size() < 2) return File::ReadBatch(ops);
    std::vector<Status> st(ops.size());
    pool_->ParallelFor(ops.size(), [&](size_t i) { st[i] = Read(ops[i].offset, ops[i].n, ops[i].buf); });
    for (Status& s : st) CDP_RETURN_IF_ERROR(std::move(s));
    return Status::OK();
  }

  Status WriteBatch(std::span<const WriteOp> ops) override {
    if (!direct_ || ops.size() < 2) return File::WriteBatch(ops);
    std::vector<Status> st(ops.size());
    pool_->ParallelFor(ops.size(), [&](size_t i) { st[i] = WriteAt(ops[i].offset, ops[i].data); });
    uint64_t end = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (st[i].ok()) end = std::max<uint64_t>(end, ops[i].offset + ops[i].data.size());
    }
    BumpEnd(end);
    for (Status& s : st) CDP_RETURN_IF_ERROR(std::move(s));
    return Status::OK();
  }

  Status Read(uint64_t offset, size_t n, uint8_t* buf) const override {
    auto got = ReadUpTo(offset, n, buf);
    if (!got.ok()) return got.status();
    if (*got != n) {
      return Status::OutOfRange("read " + path_ + ": " + std::to_string(n) + " bytes at " +
                                std::to_string(offset) + " runs past the end of file (got " +
                                std::to_string(*got) + ")");
    }
    return Status::OK();
  }

  Result<size_t> ReadUpTo(uint64_t offset, size_t n, uint8_t* buf) const override {
    if (direct_) {
      CDP_RETURN_IF_ERROR(CheckDirect("pread", offset, n));
      if (!AlignedPtr(buf) && n > 0) {
        AlignedBuf tmp = AllocAligned(n);
        if (!tmp) return Status::FromErrno(ENOMEM, "pread " + path_ + ": aligned buffer");
        CDP_ASSIGN_OR_RETURN(size_t got, PreadAll(offset, n, tmp.get()));
        std::memcpy(buf, tmp.get(), got);
        return got;
      }
    }
    return PreadAll(offset, n, buf);
  }

 private:
  Status CheckDirect(const char* op, uint64_t offset, size_t n) const {
    if (Aligned(offset) && Aligned(n)) return Status::OK();
    return Status::InvalidArgument(std::string(op) + " " + path_ + ": O_DIRECT needs " + std::to_string(kDirectAlign) +
                                   "-byte aligned ranges, got " + std::to_string(n) + " bytes at " +
                                   std::to_string(offset));
  }

  Result<size_t> PreadAll(uint64_t offset, size_t n, uint8_t* buf) const {
    size_t done = 0;
    while (done < n) {
      ssize_t r = ::pread(fd_, buf + done, n - done, off_t(offset + done));
      if (r < 0) {
        if (errno == EINTR) continue;
        return Err(errno, "pread", path_);
      }
      if (r == 0) break;  // end of file
      done += size_t(r);
    }
    return done;
  }

 public:
  Status Write(uint64_t offset, ByteSpan data) override {
    CDP_RETURN_IF_ERROR(WriteAt(offset, data));
    BumpEnd(offset + data.size());
    return Status::OK();
  }

  Status Append(ByteSpan data) override {
    const uint64_t at = end_.load();
    CDP_RETURN_IF_ERROR(WriteAt(at, data));
    BumpEnd(at + data.size());
    return Status::OK();
  }

  Status Sync() override {
#ifdef CDP_HAVE_FDATASYNC
    int r = ::fdatasync(fd_);
#else
    int r = ::fsync(fd_);
#endif
    if (r != 0) return Err(errno, "fdatasync", path_);
    return Status::OK();
  }

  Status Allocate(uint64_t offset, uint64_t len) override {
    if (len == 0) return Status::OK();
#ifdef CDP_HAVE_FALLOCATE
    int r;
    do {
      r = ::fallocate(fd_, 0, off_t(offset), off_t(len));
    } while (r != 0 && errno == EINTR);
    if (r == 0) {
      BumpEnd(offset + len);
      return Status::OK();
    }
    if (errno != EOPNOTSUPP && errno != ENOSYS) return Err(errno, "fallocate", path_);
    // The file system cannot reserve natively; posix_fallocate writes zeros.
#endif
    int e = ::posix_fallocate(fd_, off_t(offset), off_t(len));
    if (e != 0) return Err(e, "posix_fallocate", path_);
    BumpEnd(offset + len);
    return Status::OK();
  }

  Result<uint64_t> NextData(uint64_t offset) const override { return Seek(offset, SEEK_DATA); }
  Result<uint64_t> NextHole(uint64_t offset) const override { return Seek(offset, SEEK_HOLE); }

  Status PunchHole(uint64_t offset, uint64_t len) override {
    if (len == 0) return Status::OK();
#if defined(CDP_HAVE_FALLOCATE) && defined(FALLOC_FL_PUNCH_HOLE) && defined(FALLOC_FL_KEEP_SIZE)
    int r;
    do {
      r = ::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off_t(offset), off_t(len));
    } while (r != 0 && errno == EINTR);
    if (r == 0) return Status::OK();
    if (errno == EOPNOTSUPP || errno == ENOSYS) {
      return Status::NotSupported("punch hole " + path_ + ": the file system does not support it");
    }
    return Err(errno, "punch hole", path_);
#else
    return Status::NotSupported("punch hole " + path_ + ": not available on this platform");
#endif
  }

  Status Truncate(uint64_t size) override {
    int r;
    do {
      r = ::ftruncate(fd_, off_t(size));
    } while (r != 0 && errno == EINTR);
    if (r != 0) return Err(errno, "ftruncate", path_);
    end_.store(size);
    return Status::OK();
  }

  Result<uint64_t> Size() const override {
    struct stat st;
    if (::fstat(fd_, &st) != 0) return Err(errno, "fstat", path_);
    if (S_ISBLK(st.st_mode)) {
      uint64_t bytes = 0;
      if (::ioctl(fd_, BLKGETSIZE64, &bytes) != 0) return Err(errno, "BLKGETSIZE64", path_);
      return bytes;
    }
    return uint64_t(st.st_size);
  }

  const std::string& path() const override { return path_; }

 private:
  // lseek(SEEK_DATA / SEEK_HOLE). ENXIO (nothing of the kind at or after
  // `offset`) answers the size; a file system without support (EINVAL) is
  // treated as all data.
  Result<uint64_t> Seek(uint64_t offset, int whence) const {
    const off_t r = ::lseek(fd_, off_t(offset), whence);
    if (r >= 0) return uint64_t(r);
    if (errno == ENXIO) return Size();
    if (errno == EINVAL || errno == EOPNOTSUPP) {
      if (whence == SEEK_DATA) return offset;
      return Size();
    }
    return Err(errno, whence == SEEK_DATA ? "lseek(SEEK_DATA)" : "lseek(SEEK_HOLE)", path_);
  }

  Status WriteAt(uint64_t offset, ByteSpan data) {
    if (direct_) {
      CDP_RETURN_IF_ERROR(CheckDirect("pwrite", offset, data.size()));
      if (!AlignedPtr(data.data()) && !data.empty()) {
        AlignedBuf tmp = AllocAligned(data.size());
        if (!tmp) return Status::FromErrno(ENOMEM, "pwrite " + path_ + ": aligned buffer");
        std::memcpy(tmp.get(), data.data(), data.size());
        return PwriteAll(offset, ByteSpan(tmp.get(), data.size()));
      }
    }
    return PwriteAll(offset, data);
  }

  Status PwriteAll(uint64_t offset, ByteSpan data) {
    size_t done = 0;
    while (done < data.size()) {
      ssize_t r = ::pwrite(fd_, data.data() + done, data.size() - done, off_t(offset + done));
      if (r < 0) {
        if (errno == EINTR) continue;
        return Err(errno, "pwrite", path_);
      }
      if (r == 0) return Status::IOError("pwrite " + path_ + ": wrote nothing", 0);
      done += size_t(r);
    }
    return Status::OK();
  }

  void BumpEnd(uint64_t end) {
    uint64_t cur = end_.load();
    while (cur < end && !end_.compare_exchange_weak(cur, end)) {
    }
  }

  const int fd_;
  const std::string path_;
  std::atomic<uint64_t> end_;  // where the next Append writes
  const bool direct_;
  std::shared_ptr<IoPool> pool_;
};

class PosixEnv final : public Env {
 public:
  Result<std::unique_ptr<File>> Open(const std::string& path, const OpenOptions& opts) override {
    int flags = O_CLOEXEC | (opts.read_only ? O_RDONLY : O_RDWR);
    if (opts.create) flags |= O_CREAT;
    if (opts.create && opts.exclusive) flags |= O_EXCL;
    if (opts.truncate && !opts.read_only) flags |= O_TRUNC;
#ifdef O_DIRECT
    if (opts.direct) flags |= O_DIRECT;
#endif
    int fd;
    do {
      fd = ::open(path.c_str(), flags, static_cast<mode_t>(opts.mode));
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return Err(errno, opts.direct ? "open (O_DIRECT)" : "open", path);
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      int e = errno;
      ::close(fd);
      return Err(e, "fstat", path);
    }
    if (S_ISDIR(st.st_mode)) {
      ::close(fd);
      return Err(EISDIR, "open", path);
    }
#ifdef O_DIRECT
    const bool direct = opts.direct;
#else
    const bool direct = false;
#endif
    return std::unique_ptr<File>(new PosixFile(fd, path, uint64_t(st.st_size), direct, pool_));
  }

  Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) return Err(errno, "rename", from + " -> " + to);
    return Status::OK();
  }

  Status Remove(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return Err(errno, "unlink", path);
    return Status::OK();
  }

  Status SyncDir(const std::string& dir) override {
    int fd;
    do {
      fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return Err(errno, "open dir", dir);
    int r = ::fsync(fd);
    int e = errno;
    ::close(fd);
    if (r != 0) return Err(e, "fsync dir", dir);
    return Status::OK();
  }

  Status CreateDirs(const std::string& dir) override {
    if (dir.empty()) return Status::InvalidArgument("CreateDirs: empty path");
    size_t pos = 0;
    while (pos != std::string::npos) {
      pos = dir.find('/', pos + 1);
      std::string part = dir.substr(0, pos);
      if (part.empty() || part.back() == '/') continue;
      if (::mkdir(part.c_str(), 0700) != 0) {
        int e = errno;
        struct stat st;
        if (e == EEXIST && ::stat(part.c_str(), &st) == 0) {
          if (S_ISDIR(st.st_mode)) continue;
          return Err(ENOTDIR, "mkdir", part);
        }
        return Err(e, "mkdir", part);
      }
    }
    return Status::OK();
  }

  Status RemoveDir(const std::string& dir) override {
    if (::rmdir(dir.c_str()) != 0) return Err(errno, "rmdir", dir);
    return Status::OK();
  }

  bool Exists(const std::string& path) override {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0;
  }

  Result<std::vector<std::string>> ListDir(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return Err(errno, "opendir", dir);
    std::vector<std::string> names;
    for (;;) {
      errno = 0;
      struct dirent* e = ::readdir(d);
      if (e == nullptr) {
        int err = errno;
        ::closedir(d);
        if (err != 0) return Err(err, "readdir", dir);
        break;
      }
      std::string name(e->d_name);
      if (name == "." || name == "..") continue;
      names.push_back(std::move(name));
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  Result<uint64_t> FileSize(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return Err(errno, "stat", path);
    if (S_ISDIR(st.st_mode)) return Err(EISDIR, "stat", path);
    return uint64_t(st.st_size);
  }

  // flock: per open file description, so a second holder in this process
  // is refused too; the kernel drops it when the process dies.
  Result<std::unique_ptr<FileLock>> LockFile(const std::string& path) override {
    class PosixLock final : public FileLock {
     public:
      explicit PosixLock(int fd) : fd_(fd) {}
      ~PosixLock() override { ::close(fd_); }

     private:
      int fd_;
    };
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return Err(errno, "open", path);
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ::close(fd);
      if (err == EWOULDBLOCK) return Status::Busy(path + " is locked by another holder (another daemon?)");
      return Err(err, "flock", path);
    }
    return std::unique_ptr<FileLock>(new PosixLock(fd));
  }

 private:
  std::shared_ptr<IoPool> pool_ = std::make_shared<IoPool>();
};

}  // namespace

std::unique_ptr<Env> NewPosixEnv() { return std::make_unique<PosixEnv>(); }

}  // namespace cdp

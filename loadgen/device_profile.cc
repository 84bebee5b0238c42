// SPDX-License-Identifier: Apache-2.0
#include "loadgen/device_profile.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <algorithm>
#include <charconv>
#include <unordered_set>

namespace cdp::loadgen {

namespace {

constexpr uint64_t kBlock = 4096;
constexpr std::string_view kEvent = "block_rq_issue: ";
constexpr int64_t kDrainMs = 200;

Status Errno(const std::string& what) { return Status::IOError(what + ": " + std::strerror(errno)); }

Result<std::string> ReadText(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Errno("read " + path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

Status WriteText(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  if (fd < 0) return Errno("open " + path);
  const ssize_t n = ::write(fd, text.data(), text.size());
  const int e = errno;
  ::close(fd);
  errno = e;
  if (n != ssize_t(text.size())) return Errno("write '" + text + "' to " + path);
  return Status::OK();
}

bool IsDir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

struct Device {
  std::string path, name;
  uint32_t major = 0, minor = 0;
};

Result<Device> Resolve(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Errno("--device " + path);
  if (!S_ISBLK(st.st_mode)) return Status::InvalidArgument("--device " + path + " is not a block device");
  Device d;
  d.path = path;
  d.major = ::major(st.st_rdev);
  d.minor = ::minor(st.st_rdev);
  // The kernel's name (/proc/diskstats, sysfs), not the path's: /dev/disk/by-id/... -> sda.
  Result<std::string> uevent = ReadText("/sys/dev/block/" + std::to_string(d.major) + ":" + std::to_string(d.minor) + "/uevent");
  if (uevent.ok()) {
    std::istringstream in(*uevent);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("DEVNAME=", 0) == 0) d.name = line.substr(8);
    }
  }
  if (d.name.empty()) d.name = path.substr(path.rfind('/') + 1);
  return d;
}

// Counts one write into a device's interval.
void Count(const BlockEvent& e, DeviceInterval* iv, std::unordered_set<uint64_t>* blocks) {
  const uint64_t begin = e.sector * 512, end = begin + uint64_t(e.sectors) * 512;
  iv->bytes += end - begin;
  iv->writes++;
  for (uint64_t b = begin / kBlock; b * kBlock < end; ++b) blocks->insert(b);
}

// ---- tracefs ----

class TraceProfiler final : public DeviceProfiler {
 public:
  TraceProfiler(std::vector<Device> devs, std::string instance, uint32_t buffer_kb,
                const volatile std::sig_atomic_t* stop)
      : devs_(std::move(devs)), instance_(std::move(instance)), buffer_kb_(buffer_kb), stop_(stop) {
    for (const Device& d : devs_) names_.push_back(d.name);
  }
  ~TraceProfiler() override {
    if (fd_ >= 0) ::close(fd_);
    (void)WriteText(instance_ + "/events/block/block_rq_issue/enable", "0");
    (void)WriteText(instance_ + "/tracing_on", "0");
    ::rmdir(instance_.c_str());  // the kernel frees the instance's buffers
  }

  Status Init() {
    if (::mkdir(instance_.c_str(), 0700) != 0) return Errno("tracefs instance " + instance_);
    CDP_RETURN_IF_ERROR(WriteText(instance_ + "/buffer_size_kb", std::to_string(buffer_kb_)));
    CDP_RETURN_IF_ERROR(WriteText(instance_ + "/options/overwrite", "0"));
    std::string filter;
    for (const Device& d : devs_) {
      if (!filter.empty()) filter += " || ";
      filter += "dev == " + std::to_string((uint64_t(d.major) << 20) | d.minor);  // the kernel's dev_t
    }
    CDP_RETURN_IF_ERROR(WriteText(instance_ + "/events/block/block_rq_issue/filter", filter));
    CDP_RETURN_IF_ERROR(WriteText(instance_ + "/events/block/block_rq_issue/enable", "1"));
    CDP_RETURN_IF_ERROR(WriteText(instance_ + "/tracing_on", "1"));
    fd_ = ::open((instance_ + "/trace_pipe").c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd_ < 0) return Errno("open " + instance_ + "/trace_pipe");
    dropped_base_ = Dropped();
    return Status::OK();
  }

  Result<std::vector<DeviceInterval>> Collect(std::chrono::milliseconds duration) override {
    std::vector<DeviceInterval> out(devs_.size());
    std::vector<std::unordered_set<uint64_t>> blocks(devs_.size());
    const auto deadline = std::chrono::steady_clock::now() + duration;
    char buf[64 * 1024];
    for (;;) {
      const auto now = std::chrono::steady_clock::now();
      for (;;) {  // drain what is there
        const ssize_t n = ::read(fd_, buf, sizeof(buf));
        if (n > 0) {
          Feed(std::string_view(buf, size_t(n)), &out, &blocks);
          continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno != EAGAIN) return Errno("read trace_pipe");
        break;
      }
      if (now >= deadline || (stop_ != nullptr && *stop_ != 0)) break;
      // Drained every kDrainMs, not woken per event: poll(2) on trace_pipe
      // wakes the reader for nearly every event, and those wake-ups were
      // three quarters of the profiler's CPU (bench/profile_bench.sh). The
      // buffer holds seconds of events at 10k IOPS.
      const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - now).count();
      ::usleep(useconds_t(std::min<int64_t>(left, kDrainMs * 1000)));
    }
    for (size_t i = 0; i < out.size(); ++i) out[i].unique_bytes = blocks[i].size() * kBlock;
    // The kernel's count; trace_pipe's "[LOST N EVENTS]" lines say the same
    // thing when it has them, so the larger of the two, not their sum.
    const uint64_t dropped = Dropped() - dropped_base_;
    lost_ = std::max(dropped, lost_lines_);
    return out;
  }

  uint64_t lost_events() const override { return lost_; }
  bool has_unique() const override { return true; }
  std::string source() const override {
    return "tracefs block:block_rq_issue, buffer " + std::to_string(buffer_kb_) + " KiB per CPU";
  }
  const std::vector<std::string>& names() const override { return names_; }

 private:
  void Feed(std::string_view data, std::vector<DeviceInterval>* out, std::vector<std::unordered_set<uint64_t>>* blocks) {
    partial_.append(data);
    size_t start = 0;
    for (size_t nl; (nl = partial_.find('\n', start)) != std::string::npos; start = nl + 1) {
      BlockEvent e;
      uint64_t lost = 0;
      const std::string_view line(partial_.data() + start, nl - start);
      if (!ParseBlockEvent(line, &e, &lost)) {
        lost_lines_ += lost;
        continue;
      }
      if (!e.write || e.sectors == 0) continue;
      for (size_t i = 0; i < devs_.size(); ++i) {
        if (devs_[i].major == e.major && devs_[i].minor == e.minor) Count(e, &(*out)[i], &(*blocks)[i]);
      }
    }
    partial_.erase(0, start);
  }

  // The events the kernel dropped, all CPUs of the instance's buffer.
  uint64_t Dropped() const {
    uint64_t total = 0;
    for (int cpu = 0;; ++cpu) {
      Result<std::string> stats = ReadText(instance_ + "/per_cpu/cpu" + std::to_string(cpu) + "/stats");
      if (!stats.ok()) break;
      std::istringstream in(*stats);
      for (std::string line; std::getline(in, line);) {
        unsigned long long v = 0;
        if (std::sscanf(line.c_str(), "dropped events: %llu", &v) == 1 || std::sscanf(line.c_str(), "overrun: %llu", &v) == 1)
          total += v;
      }
    }
    return total;
  }

  const std::vector<Device> devs_;
  const std::string instance_;
  const uint32_t buffer_kb_;
  const volatile std::sig_atomic_t* const stop_;
  std::vector<std::string> names_;
  int fd_ = -1;
  std::string partial_;
  uint64_t dropped_base_ = 0;
  uint64_t lost_ = 0, lost_lines_ = 0;
};

// ---- /proc/diskstats ----

class DiskstatsProfiler final : public DeviceProfiler {
 public:
  DiskstatsProfiler(std::vector<Device> devs, const volatile std::sig_atomic_t* stop)
      : devs_(std::move(devs)), stop_(stop) {
    for (const Device& d : devs_) names_.push_back(d.name);
  }
  Status Init() {
    CDP_ASSIGN_OR_RETURN(last_, Sectors());
    return Status::OK();
  }
  Result<std::vector<DeviceInterval>> Collect(std::chrono::milliseconds duration) override {
    const auto deadline = std::chrono::steady_clock::now() + duration;
    while (std::chrono::steady_clock::now() < deadline && (stop_ == nullptr || *stop_ == 0)) {
      const auto left = deadline - std::chrono::steady_clock::now();
      ::usleep(useconds_t(std::min<int64_t>(std::chrono::duration_cast<std::chrono::microseconds>(left).count(), 100000)));
    }
    CDP_ASSIGN_OR_RETURN(std::vector<uint64_t> now, Sectors());
    std::vector<DeviceInterval> out(devs_.size());
    for (size_t i = 0; i < devs_.size(); ++i) out[i].bytes = (now[i] >= last_[i] ? now[i] - last_[i] : now[i]) * 512;
    last_ = std::move(now);
    return out;
  }
  uint64_t lost_events() const override { return 0; }
  bool has_unique() const override { return false; }
  std::string source() const override { return "/proc/diskstats (raw bytes only: no unique blocks)"; }
  const std::vector<std::string>& names() const override { return names_; }

 private:
  // Sectors written so far, per device (field 10 of /proc/diskstats).
  Result<std::vector<uint64_t>> Sectors() const {
    CDP_ASSIGN_OR_RETURN(std::string text, ReadText("/proc/diskstats"));
    std::vector<uint64_t> out(devs_.size());
    std::vector<bool> found(devs_.size());
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      unsigned maj = 0, min = 0;
      unsigned long long f[7] = {};
      char name[64];
      if (std::sscanf(line.c_str(), "%u %u %63s %llu %llu %llu %llu %llu %llu %llu", &maj, &min, name, &f[0], &f[1],
                      &f[2], &f[3], &f[4], &f[5], &f[6]) != 10)
        continue;
      for (size_t i = 0; i < devs_.size(); ++i) {
        if (devs_[i].major == maj && devs_[i].minor == min) out[i] = f[6], found[i] = true;
      }
    }
    for (size_t i = 0; i < devs_.size(); ++i) {
      if (!found[i]) return Status::NotFound(devs_[i].path + " is not in /proc/diskstats");
    }
    return out;
  }

  const std::vector<Device> devs_;
  const volatile std::sig_atomic_t* const stop_;
  std::vector<std::string> names_;
  std::vector<uint64_t> last_;
};

bool TracefsReady(const std::string& root) {
  if (IsDir(root + "/events/block")) return true;
  if (!IsDir(root)) return false;
  // tracefs is not mounted at its usual place: mount it (root only).
  if (::mount("nodev", root.c_str(), "tracefs", 0, nullptr) != 0) return false;
  return IsDir(root + "/events/block");
}

}  // namespace

bool ParseBlockEvent(std::string_view line, BlockEvent* out, uint64_t* lost) {
  *lost = 0;
  const size_t at = line.find(kEvent);
  if (at == std::string_view::npos) {
    unsigned long long n = 0;
    const std::string s(line.substr(0, 128));
    const size_t lp = s.find("[LOST ");
    if (lp != std::string::npos && std::sscanf(s.c_str() + lp, "[LOST %llu EVENTS]", &n) == 1) *lost = n;
    return false;
  }
  // "7,0 WS 4096 () 2048 + 8 ..." (the command, in the parentheses, is empty
  // for file system I/O). Parsed by hand: sscanf was a tenth of the cost.
  std::string_view rest = line.substr(at + kEvent.size());
  auto number = [&rest](uint64_t* v) {
    const auto r = std::from_chars(rest.data(), rest.data() + rest.size(), *v);
    if (r.ec != std::errc() || r.ptr == rest.data()) return false;
    rest.remove_prefix(size_t(r.ptr - rest.data()));
    return true;
  };
  auto skip = [&rest](std::string_view s) {
    if (rest.substr(0, s.size()) != s) return false;
    rest.remove_prefix(s.size());
    return true;
  };
  uint64_t maj = 0, min = 0, bytes = 0, sector = 0, nr = 0;
  if (!number(&maj) || !skip(",") || !number(&min) || !skip(" ")) return false;
  const size_t sp = rest.find(' ');
  if (sp == std::string_view::npos || sp > 15) return false;
  const std::string_view rwbs = rest.substr(0, sp);
  rest.remove_prefix(sp + 1);
  if (!number(&bytes) || !skip(" (")) return false;
  const size_t close = rest.find(") ");
  if (close == std::string_view::npos) return false;
  rest.remove_prefix(close + 2);
  if (!number(&sector) || !skip(" + ") || !number(&nr)) return false;
  if (maj > UINT32_MAX || min > UINT32_MAX || nr > UINT32_MAX) return false;
  out->major = uint32_t(maj);
  out->minor = uint32_t(min);
  out->write = rwbs.find('W') != std::string_view::npos && rwbs.find('D') == std::string_view::npos;
  out->sector = sector;
  out->sectors = uint32_t(nr);
  return true;
}

Result<std::unique_ptr<DeviceProfiler>> DeviceProfiler::Start(const DeviceProfileOptions& opts) {
  if (opts.devices.empty()) return Status::InvalidArgument("profile: no --device");
  std::vector<Device> devs;
  for (const std::string& p : opts.devices) {
    CDP_ASSIGN_OR_RETURN(Device d, Resolve(p));
    devs.push_back(std::move(d));
  }
  const bool want_trace = opts.source != DeviceProfileOptions::Source::kDiskstats;
  if (want_trace && TracefsReady(opts.tracefs)) {
    auto p = std::make_unique<TraceProfiler>(devs, opts.tracefs + "/instances/cdp-profile-" + std::to_string(::getpid()),
                                             opts.buffer_kb, opts.stop);
    Status s = p->Init();
    if (s.ok()) return std::unique_ptr<DeviceProfiler>(std::move(p));
    if (opts.source == DeviceProfileOptions::Source::kTracefs) return s.WithContext("tracefs");
  } else if (opts.source == DeviceProfileOptions::Source::kTracefs) {
    return Status::NotSupported("tracefs with block events is not available at " + opts.tracefs);
  }
  auto p = std::make_unique<DiskstatsProfiler>(std::move(devs), opts.stop);
  CDP_RETURN_IF_ERROR(p->Init());
  return std::unique_ptr<DeviceProfiler>(std::move(p));
}

}  // namespace cdp::loadgen

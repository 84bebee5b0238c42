// SPDX-License-Identifier: Apache-2.0
// Device profile: the churn of existing block devices, measured from the
// kernel, read-only and without touching their I/O path (issue #44). What
// `cdp-loadgen profile` runs, to size a WAN link before anything is
// installed in front of the volumes.
//
// Sources, in order of preference:
//   tracefs    the block layer's `block:block_rq_issue` tracepoint, in a
//              tracing instance of our own (instances/cdp-profile-PID, so
//              nothing of another tracer changes), filtered to the devices'
//              dev_t in the kernel. Every write request issued to a device
//              gives its sector and length: per interval the raw bytes
//              written and the unique 4 KiB blocks they touched (what a
//              catch-up, which ships each dirty block once, would send).
//              The ring buffer does not overwrite (options/overwrite = 0):
//              events that do not fit are dropped by the kernel and counted
//              ("dropped events" of per_cpu/cpuN/stats), and reported per
//              interval, never hidden.
//   diskstats  /proc/diskstats' sectors written, when tracefs is not
//              available: raw bytes only (unique_bytes empty), said so in the
//              CSV's header comment.
//
// What it sees: requests as the block layer issues them to the device's
// driver. A write merged from several application writes counts once, with
// its merged length; a write that never reaches the block layer (a page
// overwritten in the page cache before writeback) is not seen, exactly as
// the device does not see it either. Discards and flushes carry no data and
// are not counted. A device behind a hypervisor (a VM's disk seen from the
// host) must be profiled where its block layer runs.
//
// Thread safety: a DeviceProfiler is used by one thread.
#pragma once

#include <chrono>
#include <csignal>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/result.h"
#include "common/base/status.h"
#include "loadgen/profile.h"

namespace cdp::loadgen {

struct DeviceProfileOptions {
  std::vector<std::string> devices;  // block device paths (/dev/loop0)
  enum class Source { kAuto, kTracefs, kDiskstats } source = Source::kAuto;
  std::string tracefs = "/sys/kernel/tracing";
  uint32_t buffer_kb = 4096;  // ring buffer per CPU (buffer_size_kb)
  // When set and non-zero (a signal handler's flag), Collect returns early
  // with what it gathered.
  const volatile std::sig_atomic_t* stop = nullptr;
};

// One parsed `block_rq_issue` line of trace_pipe.
struct BlockEvent {
  uint32_t major = 0, minor = 0;
  bool write = false;  // carries data to the device (rwbs has 'W', not a discard)
  uint64_t sector = 0;
  uint32_t sectors = 0;
};
// Parses a trace_pipe line; false for any line that is not a block_rq_issue
// event. `lost` is set to N for a "CPU:c [LOST N EVENTS]" line (and false
// returned).
bool ParseBlockEvent(std::string_view line, BlockEvent* out, uint64_t* lost);

// One interval's figures for one device.
struct DeviceInterval {
  uint64_t bytes = 0;         // raw bytes written
  uint64_t unique_bytes = 0;  // 4 KiB blocks written at least once, x 4096
  uint64_t writes = 0;        // write requests
};

class DeviceProfiler {
 public:
  // Resolves the devices (kInvalidArgument: not a block device) and sets up
  // the source: kAuto takes tracefs when it can (mounting tracefs at its
  // usual place when it is not), else /proc/diskstats.
  static Result<std::unique_ptr<DeviceProfiler>> Start(const DeviceProfileOptions& opts);
  virtual ~DeviceProfiler() = default;

  // Collects until `duration` passed (or opts.stop is raised), then returns
  // the interval per device (in the order of opts.devices) and adds the
  // events lost meanwhile. Events the kernel buffered before the call are
  // read first: a workload run between two calls is counted in the second.
  virtual Result<std::vector<DeviceInterval>> Collect(std::chrono::milliseconds duration) = 0;
  // Events the kernel dropped since Start (tracefs; 0 for diskstats).
  virtual uint64_t lost_events() const = 0;
  virtual bool has_unique() const = 0;
  // "tracefs block:block_rq_issue, buffer 4096 KiB per CPU" or "/proc/diskstats (raw bytes only)".
  virtual std::string source() const = 0;
  // Device names, as in the CSV's per-device columns (loop0).
  virtual const std::vector<std::string>& names() const = 0;
};

}  // namespace cdp::loadgen

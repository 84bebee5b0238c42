// SPDX-License-Identifier: Apache-2.0
// Sweep: the seed's characterization experiment (seeds/004, appendix A) on
// OpenCDP, and the tables and charts it produced.
//
// For each phase (compression off, then on) and each size (1, 10, 50, 100,
// 150, 200, 250 MB), the driver (cdp-loadgen sweep, main.cc) runs the
// gentesttree loop -- write a tree of `size` MB with seed 8, pause, delete,
// repeat -- against the protected volume for a measurement window, and reads
// every daemon's /metrics at the start and end of the window (a SweepSample).
// ComputeRow() turns a sample into the seed's columns:
//
//   Pri VM Disk WR   MB/s    delta cdp_agent_captured_bytes_total / t / 1e6
//   PS BW (In)       Mbit/s  delta cdp_ps_bytes_in_total x 8 / t / 1e6
//   PS BW (Out)      Mbit/s  delta cdp_ps_bytes_out_total x 8 / t / 1e6
//   Pri VM CPU       MHz     delta agent process_cpu_seconds_total / t x core MHz
//   PS CPU, CPU (MT) MHz     the same for the process server and master target
//   Disk RR, Disk WR MB/s    delta cdp_mt_disk_read_bytes_total / _write_ / t / 1e6
//   CPU s/GB (agent, PS, MT) delta CPU seconds / (captured bytes / 1e9)
//
// "MHz = CPU share x core clock" is how vCenter reports a VM's CPU, so the
// figures compare with the seed's. Core clock: /proc/cpuinfo ("cpu MHz",
// the average over the listed CPUs) unless given.
//
// Samples are saved as JSON (version 1, docs/loadgen.md) so the tables and
// charts can be re-rendered from a recorded run (`sweep --from FILE`).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <boost/json/value.hpp>

#include "common/base/result.h"
#include "common/env/env.h"
#include "loadgen/scrape.h"

namespace cdp::loadgen {

struct DaemonSnapshot {
  double wall_s = 0;
  MetricSums agent, ps, mt;
};

struct SweepSample {
  uint32_t mode = 0;  // GenerateTestTree mode 0 = write
  uint64_t size_mb = 0;
  uint64_t seed = 8;
  bool compression = false;
  DaemonSnapshot begin, end;
};

struct SweepRow {
  uint32_t mode = 0;
  uint64_t size_mb = 0;
  uint64_t seed = 0;
  bool compression = false;
  double pri_wr_MBps = 0, ps_in_Mbps = 0, ps_out_Mbps = 0;
  double agent_mhz = 0, ps_mhz = 0, mt_mhz = 0;
  double mt_rr_MBps = 0, mt_wr_MBps = 0;
  double agent_s_per_gb = 0, ps_s_per_gb = 0, mt_s_per_gb = 0;  // 0 when nothing was captured
};

// Failure: kNotFound naming a metric missing from a snapshot ("ps: cdp_ps_bytes_in_total"),
// kInvalidArgument for a non-positive window or core clock.
Result<SweepRow> ComputeRow(const SweepSample& s, double core_mhz);

// The core clock in MHz from /proc/cpuinfo (average of the "cpu MHz" lines),
// read through `env`. Failure: kNotFound when no such line exists.
Result<double> CoreMhzFromCpuinfo(Env* env, const std::string& path = "/proc/cpuinfo");

// The seed's Figure table for the rows of one phase.
std::string SeedTableMarkdown(const std::vector<SweepRow>& rows);
std::string SeedTableCsv(const std::vector<SweepRow>& rows);
// CPU seconds per GB of change, per component.
std::string CpuPerGbMarkdown(const std::vector<SweepRow>& rows);
// Tables A-1 (process server) and A-2 (master target): rows of the two phases
// paired by size. % cost = (enabled - disabled) / disabled x 100.
std::string ComparisonMarkdown(const std::vector<SweepRow>& off, const std::vector<SweepRow>& on, bool master_target);
std::string ComparisonCsv(const std::vector<SweepRow>& off, const std::vector<SweepRow>& on, bool master_target);

// A line chart as standalone SVG: x and y axes with ticks, one polyline with
// markers per series, a legend. Values must be finite.
struct ChartSeries {
  std::string name;
  std::vector<double> x, y;
};
std::string LineChartSvg(const std::string& title, const std::string& x_label, const std::string& y_label,
                         const std::vector<ChartSeries>& series);
// The seed's figures: CPU (agent, PS, MT MHz) and bandwidth (PS in/out Mbit/s)
// against the primary write rate.
std::string CpuChartSvg(const std::vector<SweepRow>& rows, const std::string& title);
std::string BandwidthChartSvg(const std::vector<SweepRow>& rows, const std::string& title);

boost::json::value SamplesToJson(const std::vector<SweepSample>& samples, double core_mhz);
// Failure: kInvalidArgument naming what is malformed.
Result<std::vector<SweepSample>> SamplesFromJson(const boost::json::value& v, double* core_mhz);

}  // namespace cdp::loadgen

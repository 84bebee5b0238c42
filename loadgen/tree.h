// SPDX-License-Identifier: Apache-2.0
// Test tree: the seed's GenerateTestTree (seeds/004, appendix A) for OpenCDP.
//
//   GenerateTestTree.exe <mode=0(write)|1(verify)> <size MB> <seed> <dest dir>
//   cdp-loadgen tree --mode write|verify --size-mb N --seed S --dir D [--compressibility R]
//
// A tree is a pure function of (size, seed, compressibility, shape): PlanTree()
// draws the layout from the seed, and every file's content comes from a
// loadgen::DataGenerator seeded with MixSeed(seed, file index), so "verify"
// regenerates each file in memory and compares it with what is on disk.
//
// Layout (docs/loadgen.md): `fanout` directories per level, `depth` levels
// ("d3/d5/"), files "f000012.dat" placed in a leaf directory drawn from the seed;
// file sizes log-uniform in [min_file, max_file] bytes (most files small, most
// bytes in large files, as in a user's folder), the last file cut so that the
// total is exactly size_bytes.
//
// Thread safety: functions are reentrant; the Env must be thread-safe (all are).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/base/result.h"
#include "common/base/status.h"
#include "common/env/env.h"

namespace cdp::loadgen {

struct TreeOptions {
  uint64_t size_bytes = 10ull << 20;  // total file bytes
  uint64_t seed = 8;
  double compressibility = 0.75;      // loadgen::DataMix::compressibility
  uint32_t fanout = 8;                // directories per level (1..256)
  uint32_t depth = 2;                 // directory levels (0..8)
  uint64_t min_file = 4096;           // smallest drawn file size (> 0)
  uint64_t max_file = 1ull << 20;     // largest file (>= min_file, <= 64 MiB)
  bool sync = false;                  // write: File::Sync() each file
};

struct TreeFile {
  std::string path;  // relative to the tree root, '/'-separated
  uint64_t size = 0;
  uint64_t content_seed = 0;
};

struct TreePlan {
  std::vector<std::string> dirs;  // relative, parents before children
  std::vector<TreeFile> files;
};

// The layout for `opts`. Failure: kInvalidArgument for options out of range.
Result<TreePlan> PlanTree(const TreeOptions& opts);

// The whole content of `file`, as WriteTree writes it.
Bytes TreeFileContent(const TreeOptions& opts, const TreeFile& file);

struct TreeWriteStats {
  uint64_t files = 0;
  uint64_t dirs = 0;
  uint64_t bytes = 0;
};

// Creates `root` and writes the tree under it (existing files are truncated
// and rewritten). Failure: the Env's status naming the file.
Result<TreeWriteStats> WriteTree(Env* env, const std::string& root, const TreeOptions& opts);

struct VerifyReport {
  uint64_t files_checked = 0;
  uint64_t bytes_checked = 0;
  std::vector<std::string> missing;     // planned files absent on disk
  std::vector<std::string> mismatched;  // "path: reason" (size or first differing byte)
  std::vector<std::string> unexpected;  // files on disk that the plan does not have
  bool ok() const { return missing.empty() && mismatched.empty() && unexpected.empty(); }
};

// Regenerates the tree and compares it with `root`. A successful Result may
// still report differences (report.ok() false); a failed one means verify
// could not run (bad options, or an I/O error other than a missing file).
Result<VerifyReport> VerifyTree(Env* env, const std::string& root, const TreeOptions& opts);

}  // namespace cdp::loadgen

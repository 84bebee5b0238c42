// SPDX-License-Identifier: Apache-2.0
// undo_bench: the master target's undo index at scale (issue #15): memory,
// start-up time and point-in-time read rate against a volume with many undo
// records.
//
//   1. Applies --records 4 KiB zero records at random blocks of a sparse
//      volume (the journal then holds 40-byte headers only, so 10^7 records
//      need no 40 GB of disk), in batches of --batch records, a flush after
//      each; reports the apply rate, the index and journal sizes, and the
//      process's resident memory (VmRSS) before and after.
//   2. Closes and reopens the volume: start-up time and RSS.
//   3. Reads --read_mb of the volume in 64 KiB reads three ways, each after a
//      warm-up pass: the replica file directly (pread), the point-in-time
//      image at the newest sequence (every record is behind the point), and
//      at sequence 0 (every block written since is read from the journal).
//
// Exits 1 when --max_rss_mb is given and the RSS after the reopen and reads
// exceeds it.
//
// Usage: undo_bench [--dir DIR] [--records N] [--batch N] [--volume_gb N] [--read_mb N] [--max_rss_mb N]
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_flags.h"
#include "common/base/clock.h"
#include "common/daemon/metrics.h"
#include "common/env/env.h"
#include "master-target/replica_volume.h"

using namespace cdp;
using namespace cdp::mt;

namespace {

struct Config {
  std::string dir;
  uint64_t records = 1'000'000;
  uint64_t batch = 16384;
  uint64_t volume_gb = 4;
  uint64_t read_mb = 256;
  uint64_t max_rss_mb = 0;
};

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

uint64_t DirBytes(const std::string& path) {
  uint64_t n = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(path)) {
    if (e.is_regular_file()) n += e.file_size();
  }
  return n;
}

[[noreturn]] void Die(const std::string& what, const Status& s) {
  std::fprintf(stderr, "undo_bench: %s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}

VolumeOptions Opts(Env* env, const std::string& vdir) {
  VolumeOptions o;
  o.env = env;
  o.clock = SystemClock::Get();
  o.dir = vdir;
  o.index_path = vdir + "/index.db";
  o.segment_bytes = 64u << 20;
  o.point_interval_us = 0;
  return o;
}

// Reads [0, bytes) in 64 KiB pieces with `read`; returns MB/s.
template <typename F>
double ReadRate(uint64_t bytes, F read) {
  std::vector<uint8_t> buf(64 * 1024);
  auto pass = [&] {
    for (uint64_t off = 0; off < bytes; off += buf.size()) read(off, buf.size(), buf.data());
  };
  pass();  // warm: the page cache and sqlite's cache
  auto t0 = std::chrono::steady_clock::now();
  pass();
  return double(bytes) / 1e6 / Seconds(t0);
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  for (int i = 1; i < argc; ++i) {
    auto val = [&](const char* name) { return bench::FlagValue(argc, argv, &i, name); };
    if (const char* v = val("dir")) cfg.dir = v;
    else if (const char* v = val("records")) cfg.records = std::strtoull(v, nullptr, 10);
    else if (const char* v = val("batch")) cfg.batch = std::strtoull(v, nullptr, 10);
    else if (const char* v = val("volume_gb")) cfg.volume_gb = std::strtoull(v, nullptr, 10);
    else if (const char* v = val("read_mb")) cfg.read_mb = std::strtoull(v, nullptr, 10);
    else if (const char* v = val("max_rss_mb")) cfg.max_rss_mb = std::strtoull(v, nullptr, 10);
    else {
      std::fprintf(stderr,
                   "usage: undo_bench [--dir DIR] [--records N] [--batch N] [--volume_gb N] [--read_mb N] "
                   "[--max_rss_mb N]\n");
      return 2;
    }
  }
  const uint64_t size = cfg.volume_gb << 30;
  if (cfg.records < 1 || cfg.batch < 1 || cfg.batch > 65536 || size == 0 || (cfg.read_mb << 20) > size) {
    std::fprintf(stderr, "undo_bench: records >= 1, batch 1..65536, volume_gb >= 1, read_mb <= the volume\n");
    return 2;
  }
  bool own_dir = cfg.dir.empty();
  if (own_dir) {
    std::string t = (std::filesystem::temp_directory_path() / "undo-bench-XXXXXX").string();
    if (!mkdtemp(t.data())) return 1;
    cfg.dir = t;
  }
  const std::string vdir = cfg.dir + "/vol";
  std::filesystem::remove_all(vdir);
  std::filesystem::create_directories(vdir);
  VolumeIdentity id;
  id.name = "bench";
  id.size = size;
  id.block_size = 4096;
  id.uuid[0] = 1;
  id.generation = 1;

  auto env = NewPosixEnv();
  auto rss_mib = [&] { return metrics::ResidentMemoryBytes(env.get()) / (1 << 20); };
  const double rss0 = rss_mib();
  auto v = ReplicaVolume::Open(Opts(env.get(), vdir), &id);
  if (!v.ok()) Die("create", v.status());
  std::mt19937_64 rng(5);
  const uint64_t blocks = size / 4096;
  uint64_t seq = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (uint64_t done = 0; done < cfg.records;) {
    std::vector<proto::Record> b;
    const uint64_t n = std::min(cfg.batch, cfg.records - done);
    for (uint64_t i = 0; i < n; ++i) {
      proto::Record r;
      r.seq = ++seq;
      r.offset = (rng() % blocks) * 4096;
      r.length = 4096;
      r.kind = proto::RecordKind::kZero;
      b.push_back(std::move(r));
    }
    proto::Record f;
    f.seq = ++seq;
    f.kind = proto::RecordKind::kFlush;
    b.push_back(std::move(f));
    auto out = (*v)->ApplyBatch(b);
    if (!out.ok()) Die("apply", out.status());
    if (!out->ack) Die("apply", Status::IOError("refused: " + out->message));
    done += n;
  }
  const double apply_s = Seconds(t0);
  const double rss_applied = rss_mib();
  const uint64_t undo_records = (*v)->GetStatus().undo_records;
  const uint64_t index_bytes = std::filesystem::file_size(vdir + "/index.db") +
                               (std::filesystem::exists(vdir + "/index.db-wal")
                                    ? std::filesystem::file_size(vdir + "/index.db-wal")
                                    : 0);
  const uint64_t journal_bytes = DirBytes(vdir + "/journal");
  v->reset();

  t0 = std::chrono::steady_clock::now();
  v = ReplicaVolume::Open(Opts(env.get(), vdir), nullptr);
  if (!v.ok()) Die("reopen", v.status());
  const double open_s = Seconds(t0);
  const double rss_open = rss_mib();

  const uint64_t bytes = cfg.read_mb << 20;
  int fd = ::open((vdir + "/replica.img").c_str(), O_RDONLY);
  if (fd < 0) Die("open replica", Status::IOError(std::strerror(errno)));
  const double replica_rate = ReadRate(bytes, [&](uint64_t off, size_t n, uint8_t* buf) {
    if (::pread(fd, buf, n, off) != ssize_t(n)) Die("pread", Status::IOError(std::strerror(errno)));
  });
  ::close(fd);
  auto point_rate = [&](uint64_t point) {
    return ReadRate(bytes, [&](uint64_t off, size_t n, uint8_t* buf) {
      Status s = (*v)->ReadAt(point, off, n, buf);
      if (!s.ok()) Die("ReadAt", s);
    });
  };
  const double newest_rate = point_rate(seq);
  const double oldest_rate = point_rate(0);
  const double rss_end = rss_mib();

  std::printf("| undo records | apply (records/s) | index.db | journal | RSS start / applied / reopened / after reads "
              "(MiB) | reopen (s) | replica read (MB/s) | point behind all records (MB/s, ratio) | point 0 (MB/s, "
              "ratio) |\n");
  std::printf("|---:|---:|---:|---:|---|---:|---:|---|---|\n");
  std::printf("| %" PRIu64 " | %.0f | %.0f MB | %.0f MB | %.1f / %.1f / %.1f / %.1f | %.2f | %.0f | %.0f (%.2fx) | "
              "%.0f (%.2fx) |\n",
              undo_records, double(cfg.records) / apply_s, double(index_bytes) / 1e6, double(journal_bytes) / 1e6,
              rss0, rss_applied, rss_open, rss_end, open_s, replica_rate, newest_rate, newest_rate / replica_rate,
              oldest_rate, oldest_rate / replica_rate);
  v->reset();
  if (own_dir) std::filesystem::remove_all(cfg.dir);
  if (cfg.max_rss_mb != 0 && rss_end > double(cfg.max_rss_mb)) {
    std::fprintf(stderr, "undo_bench: RSS %.1f MiB over the limit of %" PRIu64 " MiB\n", rss_end, cfg.max_rss_mb);
    return 1;
  }
  return 0;
}

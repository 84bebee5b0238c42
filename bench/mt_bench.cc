// SPDX-License-Identifier: Apache-2.0
// mt_bench: master-target apply throughput and I/O amplification.
//
// Applies a stream of write batches to a Volume on the POSIX Env in a
// temporary directory (the full apply protocol: read old bytes, journal
// append + sync, replica write + sync, sqlite commit) and reports:
//   MB/s      change bytes applied per wall-clock second
//   CPU s/GB  user+system CPU per GB of change
//   read x    bytes read through the Env / change bytes
//   write x   bytes written through the Env / change bytes (journal + replica)
//   proc r/w  /proc/self/io read_bytes / write_bytes deltas / change bytes
//             (what reached the block layer, sqlite's WAL and index included;
//             reads served by the page cache do not count there)
//   RSS MiB   peak resident set during the apply (VmHWM, reset through
//             /proc/self/clear_refs before it): the bench's own data included
//             (the 64 MiB pool and the prebuilt records, change_mb)
//   RSS +MiB  that peak minus the resident set just before the apply: what
//             applying costs (buffers, I/O threads, sqlite's caches)
//
// --direct 1 (default) applies the replica's 4 KiB blocks through O_DIRECT in
// batches with several requests in flight (VolumeOptions::replica_direct_io,
// master-target/replica_io.h); --direct 0 is the buffered path of before
// (one pread / pwrite at a time; issue #15), so both can be measured in one run.
//
// The replica is filled with random bytes first, so every undo record carries
// data (the steady state; a write to a never-written area would cost only a
// 40-byte header in the journal).
//
// --text_pct P makes P% of every 4 KiB of data text that zstd shrinks (the
// rest random), so the old data in the journal compresses; --zstd_level is
// the journal's level (default 1, 0 = none).
//
// Usage: mt_bench [--dir DIR] [--volume_mb N] [--change_mb N] [--batch_kb N]
//                 [--workload random4k|seq1m|all] [--text_pct 0..100] [--zstd_level 0..19]
//                 [--direct 0|1] [--ceph_conf CONF [--ceph_user ID] [--ceph_pool POOL]]
//
// --ceph_conf puts the volume (replica, journal, index) in RBD images of that
// cluster's pool (storage/ceph_env.h, the master target's storage = ceph),
// e.g. the test cluster of scripts/ceph-micro.sh; the images are removed
// after each run. The "replica" column then says rbd.
#include <sys/resource.h>

#include <atomic>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_flags.h"
#include "common/base/clock.h"
#include "common/env/env.h"
#include "common/env/env_wrapper.h"
#include "common/store/sqlite_vfs.h"
#include "master-target/replica_volume.h"
#include "storage/ceph_env.h"

using namespace cdp;

namespace {

// Counts the bytes read and written through an Env (a measuring decorator).
struct Counts {
  std::atomic<uint64_t> read{0}, written{0};
};

class CountingFile final : public FileWrapper {
 public:
  CountingFile(std::unique_ptr<File> f, Counts* c) : FileWrapper(std::move(f)), c_(c) {}
  Status Read(uint64_t o, size_t n, uint8_t* b) const override {
    c_->read += n;
    return FileWrapper::Read(o, n, b);
  }
  Result<size_t> ReadUpTo(uint64_t o, size_t n, uint8_t* b) const override {
    auto r = FileWrapper::ReadUpTo(o, n, b);
    if (r.ok()) c_->read += *r;
    return r;
  }
  Status Write(uint64_t o, ByteSpan d) override {
    c_->written += d.size();
    return FileWrapper::Write(o, d);
  }
  Status Append(ByteSpan d) override {
    c_->written += d.size();
    return FileWrapper::Append(d);
  }
  // Batches are forwarded whole, so that a direct file keeps its requests in flight.
  Status ReadBatch(std::span<const ReadOp> ops) const override {
    for (const ReadOp& op : ops) c_->read += op.n;
    return base()->ReadBatch(ops);
  }
  Status WriteBatch(std::span<const WriteOp> ops) override {
    for (const WriteOp& op : ops) c_->written += op.data.size();
    return base()->WriteBatch(ops);
  }

 private:
  Counts* c_;
};

class CountingEnv final : public EnvWrapper {
 public:
  CountingEnv(Env* base, Counts* c) : EnvWrapper(base), c_(c) {}
  Result<std::unique_ptr<File>> Open(const std::string& p, const OpenOptions& o) override {
    CDP_ASSIGN_OR_RETURN(auto f, EnvWrapper::Open(p, o));
    return std::unique_ptr<File>(new CountingFile(std::move(f), c_));
  }

 private:
  Counts* c_;
};

struct ProcIo {
  uint64_t read_bytes = 0, write_bytes = 0;
};

ProcIo ReadProcIo() {
  ProcIo p;
  std::ifstream f("/proc/self/io");
  std::string k;
  uint64_t v;
  while (f >> k >> v) {
    if (k == "read_bytes:") p.read_bytes = v;
    if (k == "write_bytes:") p.write_bytes = v;
  }
  return p;
}

// A field of /proc/self/status ("VmHWM:", "VmRSS:") in MiB.
double StatusMiB(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const size_t k = std::strlen(key);
  while (std::getline(f, line)) {
    if (line.compare(0, k, key) == 0) return double(std::strtoull(line.c_str() + k, nullptr, 10)) / 1024.0;
  }
  return 0;
}

// Starts a new peak for VmHWM (Linux >= 4.0).
void ResetPeakRss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
}

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + double(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

[[noreturn]] void Die(const std::string& what, const Status& s) {
  std::fprintf(stderr, "mt_bench: %s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}

struct Config {
  std::string dir;
  uint64_t volume_mb = 512;
  uint64_t change_mb = 512;
  uint64_t batch_kb = 1024;
  std::string workload = "all";
  uint64_t text_pct = 0;  // of each 4 KiB of data: this share is text zstd shrinks, the rest random
  int zstd_level = 1;     // the journal's compression of old data (0 = none)
  bool direct = true;     // VolumeOptions::replica_direct_io
  // Non-empty: the volume lives in this Ceph cluster's pool instead (the
  // master target's storage = ceph; a cluster of scripts/ceph-micro.sh).
  std::string ceph_conf;
  std::string ceph_user = "opencdp";
  std::string ceph_pool = "rbd";
};

// The Ceph backend of a run: its Env, the index's VFS over it (not counted:
// the local runs do not count the index either) and the image prefix.
struct CephStore {
  std::unique_ptr<storage::CephEnv> env;
  std::unique_ptr<sqlite::EnvVfs> vfs;
};

CephStore OpenCeph(const Config& cfg, const std::string& prefix) {
  storage::RadosOptions ro;
  ro.conf_path = cfg.ceph_conf;
  ro.client_id = cfg.ceph_user;
  storage::CephEnvOptions eo;
  eo.prefix = prefix;
  auto env = storage::CephEnv::Connect(ro, cfg.ceph_pool, eo);
  if (!env.ok()) Die("ceph env", env.status());
  CephStore c;
  c.env = std::move(*env);
  c.vfs = std::make_unique<sqlite::EnvVfs>(c.env.get());
  return c;
}

// Removes every image of `store` (the bench's prefix).
void RemoveImages(CephStore& store) {
  auto names = store.env->ListDir("");
  if (!names.ok()) return;
  std::function<void(const std::string&)> remove = [&](const std::string& path) {
    auto sub = store.env->ListDir(path);
    if (sub.ok() && !sub->empty()) {
      for (const auto& n : *sub) remove(JoinPath(path, n));
    } else {
      (void)store.env->Remove(path);
    }
  };
  for (const auto& n : *names) remove(n);
}

void Run(const Config& cfg, const std::string& workload, const Bytes& pool) {
  const uint64_t vol_size = cfg.volume_mb << 20;
  const bool ceph = !cfg.ceph_conf.empty();
  CephStore store;
  std::unique_ptr<Env> posix;
  Env* base;
  std::string vdir;
  if (ceph) {
    store = OpenCeph(cfg, "mt-bench-" + std::to_string(::getpid()));
    base = store.env.get();
    vdir = workload;
  } else {
    vdir = cfg.dir + "/" + workload;
    std::filesystem::remove_all(vdir);
    std::filesystem::create_directories(vdir);
    posix = NewPosixEnv();
    base = posix.get();
  }
  Counts counts;
  CountingEnv env(base, &counts);
  mt::VolumeOptions vo;
  vo.env = &env;
  vo.clock = SystemClock::Get();
  vo.dir = vdir;
  vo.index_path = vdir + "/index.db";
  if (ceph) vo.index_vfs = store.vfs->name();
  vo.journal_zstd_level = cfg.zstd_level;
  vo.replica_direct_io = cfg.direct;
  mt::VolumeIdentity id;
  id.name = "bench";
  id.size = vol_size;
  id.block_size = 4096;
  id.generation = 1;
  {
    auto v = mt::ReplicaVolume::Open(vo, &id);
    if (!v.ok()) Die("create volume", v.status());
  }
  {
    // Fill the replica with random data (not counted).
    auto f = base->Open(vdir + "/replica.img", OpenOptions{});
    if (!f.ok()) Die("open replica", f.status());
    for (uint64_t off = 0; off < vol_size; off += 4 << 20) {
      uint64_t n = std::min<uint64_t>(4 << 20, vol_size - off);
      Status s = (*f)->Write(off, ByteSpan(pool.data() + (off % (pool.size() - n)), n));
      if (!s.ok()) Die("fill", s);
    }
    if (Status s = (*f)->Sync(); !s.ok()) Die("fill sync", s);
  }
  auto v = mt::ReplicaVolume::Open(vo, nullptr);
  if (!v.ok()) Die("open volume", v.status());

  const uint32_t rec_len = workload == "random4k" ? 4096 : (1u << 20);
  const uint64_t records = (cfg.change_mb << 20) / rec_len;
  const uint64_t per_batch = std::max<uint64_t>(1, (cfg.batch_kb << 10) / rec_len);
  std::mt19937_64 rng(42);
  // Records are built before the clock starts.
  std::vector<std::vector<proto::Record>> batches;
  uint64_t seq = 0, seq_off = 0;
  for (uint64_t i = 0; i < records;) {
    std::vector<proto::Record> b;
    for (uint64_t j = 0; j < per_batch && i < records; ++j, ++i) {
      proto::Record r;
      r.seq = ++seq;
      r.kind = proto::RecordKind::kData;
      r.length = rec_len;
      if (workload == "random4k") {
        r.offset = (rng() % (vol_size / 4096)) * 4096;
      } else {
        r.offset = seq_off;
        seq_off = (seq_off + rec_len) % vol_size;
      }
      uint64_t src = rng() % (pool.size() - rec_len);
      r.data.assign(pool.begin() + src, pool.begin() + src + rec_len);
      b.push_back(std::move(r));
    }
    proto::Record f;
    f.seq = ++seq;
    f.kind = proto::RecordKind::kFlush;
    b.push_back(std::move(f));
    batches.push_back(std::move(b));
  }

  counts.read = 0;
  counts.written = 0;
  ResetPeakRss();
  const double rss0 = StatusMiB("VmRSS:");
  ProcIo io0 = ReadProcIo();
  double cpu0 = CpuSeconds();
  auto t0 = std::chrono::steady_clock::now();
  for (const auto& b : batches) {
    auto o = (*v)->ApplyBatch(b);
    if (!o.ok()) Die("apply", o.status());
    if (!o->ack) Die("apply", Status::InvalidArgument(o->message));
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double cpu = CpuSeconds() - cpu0;
  ProcIo io1 = ReadProcIo();
  const double change = double(records) * rec_len;
  const double peak = StatusMiB("VmHWM:");
  std::printf("| %s | %s | %" PRIu64 " KiB | %.0f | %.1f | %.3f | %.3f | %.3f | %.3f | %.2f | %.0f | %.0f |\n",
              workload.c_str(), ceph ? "rbd" : cfg.direct ? "direct" : "buffered", cfg.batch_kb, change / 1e6 / secs,
              cpu / (change / 1e9), double(counts.read.load()) / change, double(counts.written.load()) / change,
              double(io1.read_bytes - io0.read_bytes) / change, double(io1.write_bytes - io0.write_bytes) / change,
              secs, peak, peak - rss0);
  std::fflush(stdout);
  v->reset();
  if (ceph) {
    RemoveImages(store);
  } else {
    std::filesystem::remove_all(vdir);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  for (int i = 1; i < argc; ++i) {
    auto val = [&](const char* name) { return bench::FlagValue(argc, argv, &i, name); };
    if (const char* v = val("dir")) cfg.dir = v;
    else if (const char* v = val("volume_mb")) cfg.volume_mb = std::strtoull(v, nullptr, 10);
    else if (const char* v = val("change_mb")) cfg.change_mb = std::strtoull(v, nullptr, 10);
    else if (const char* v = val("batch_kb")) cfg.batch_kb = std::strtoull(v, nullptr, 10);
    else if (const char* v = val("workload")) cfg.workload = v;
    else if (const char* v = val("text_pct")) cfg.text_pct = std::strtoull(v, nullptr, 10);
    else if (const char* v = val("zstd_level")) cfg.zstd_level = std::atoi(v);
    else if (const char* v = val("direct")) cfg.direct = std::atoi(v) != 0;
    else if (const char* v = val("ceph_conf")) cfg.ceph_conf = v;
    else if (const char* v = val("ceph_user")) cfg.ceph_user = v;
    else if (const char* v = val("ceph_pool")) cfg.ceph_pool = v;
    else {
      std::fprintf(stderr,
                   "usage: mt_bench [--dir DIR] [--volume_mb N] [--change_mb N] [--batch_kb N] "
                   "[--workload random4k|seq1m|all] [--text_pct 0..100] [--zstd_level 0..19] [--direct 0|1] "
                   "[--ceph_conf CONF [--ceph_user ID] [--ceph_pool POOL]]\n");
      return 2;
    }
  }
  if (cfg.volume_mb < 8 || cfg.change_mb < 1 || cfg.batch_kb < 4 || cfg.text_pct > 100 || cfg.zstd_level < 0 ||
      cfg.zstd_level > 19) {
    std::fprintf(stderr, "mt_bench: volume_mb >= 8, change_mb >= 1, batch_kb >= 4, text_pct <= 100, zstd_level 0..19\n");
    return 2;
  }
  bool own_dir = cfg.dir.empty();
  if (own_dir) {
    std::string t = (std::filesystem::temp_directory_path() / "mt-bench-XXXXXX").string();
    if (!mkdtemp(t.data())) return 1;
    cfg.dir = t;
  }
  Bytes pool(64u << 20);
  std::mt19937_64 rng(7);
  for (size_t i = 0; i + 8 <= pool.size(); i += 8) {
    uint64_t x = rng();
    std::memcpy(pool.data() + i, &x, 8);
  }
  // Text: words of a 16-letter alphabet (4 bits of entropy per byte).
  const size_t text = 4096 * cfg.text_pct / 100;
  for (size_t b = 0; b + 4096 <= pool.size(); b += 4096) {
    for (size_t i = 0; i < text; ++i) pool[b + i] = uint8_t('a' + (pool[b + i] & 15));
  }
  std::printf(
      "| workload | replica | batch | MB/s | CPU s/GB | read x | write x | proc read x | proc write x | seconds | "
      "RSS MiB | RSS +MiB |\n");
  std::printf("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const char* w : {"random4k", "seq1m"}) {
    if (cfg.workload == "all" || cfg.workload == w) Run(cfg, w, pool);
  }
  if (own_dir) std::filesystem::remove_all(cfg.dir);
  return 0;
}

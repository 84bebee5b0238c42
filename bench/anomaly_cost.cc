// SPDX-License-Identifier: Apache-2.0
// anomaly_cost: the CPU the agent's ransomware detector (agent/anomaly_detector.h)
// adds per GB written, on loadgen's data (bench/anomaly_bench.sh prints it
// beside the whole agent's CPU with detection on and off).
//
//   anomaly_cost [GB=1]
//
// For each data mix (loadgen/data.h: compressibility 0.75, and 0 = random),
// feeds GB of 64 KiB writes to an AnomalyDetector with the default options
// (1 block in 16 compressed with LZ4) at 100 MB/s of simulated time, and
// prints process CPU seconds per GB (CLOCK_PROCESS_CPUTIME_ID), less the same
// loop with detection disabled.
#include <time.h>

#include <cstdio>
#include <cstdlib>

#include "agent/anomaly_detector.h"
#include "loadgen/data.h"

namespace {

double CpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) / 1e9;
}

// CPU seconds to feed `bytes` of `pool` (in 64 KiB writes) to a detector.
double Feed(const cdp::Bytes& pool, uint64_t bytes, bool enabled, uint64_t* anomalies) {
  constexpr size_t kWrite = 64 * 1024;
  cdp::agent::AnomalyOptions o;
  o.enabled = enabled;
  cdp::agent::AnomalyDetector d(o);
  const double t0 = CpuSeconds();
  size_t at = 0;
  uint64_t now = 0, offset = 0;
  for (uint64_t done = 0; done < bytes; done += kWrite) {
    now += kWrite * 10;  // 100 MB/s of simulated time
    (void)d.OnWrite(offset, cdp::ByteSpan(pool.data() + at, kWrite), now, done / kWrite + 1);
    at = (at + kWrite) % pool.size();
    offset = (offset + 3 * kWrite) % (1ull << 34);
  }
  const double cpu = CpuSeconds() - t0;
  *anomalies = d.counters().anomalies;
  return cpu;
}

}  // namespace

int main(int argc, char** argv) {
  const double gb = argc > 1 ? std::atof(argv[1]) : 1.0;
  if (!(gb > 0)) {
    std::fprintf(stderr, "usage: anomaly_cost [GB > 0]\n");
    return 2;
  }
  const auto bytes = uint64_t(gb * 1e9);
  std::printf("| data (loadgen mix) | GB | detector CPU s/GB | loop alone CPU s/GB | added CPU s/GB | anomalies |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (double c : {0.75, 0.0}) {
    cdp::loadgen::DataMix mix;
    mix.compressibility = c;
    mix.seed = 44;
    cdp::loadgen::DataGenerator gen(mix);
    cdp::Bytes pool(32u << 20);
    gen.Fill(pool.data(), pool.size());
    uint64_t a_on = 0, a_off = 0;
    const double off = Feed(pool, bytes, false, &a_off);
    const double on = Feed(pool, bytes, true, &a_on);
    std::printf("| compressibility %.2f | %.2f | %.4f | %.4f | %.4f | %llu |\n", c, gb, on / gb, off / gb,
                (on - off) / gb, static_cast<unsigned long long>(a_on));
  }
  return 0;
}

// SPDX-License-Identifier: Apache-2.0
// Micro-benchmark of the per-batch data-path primitives: CRC32C, XXH3, lz4 and
// zstd on one encoded 1 MiB write-batch frame (256 records of 4 KiB), on the
// realistic mixed data of loadgen/data.h and on random data, beside memcpy of the
// same buffer in the same run. Not a test.
//
//   micro_bench [--write_samples=DIR] [google-benchmark flags]
//
// --write_samples=DIR writes the two frames to DIR/mixed_frame.bin and
// DIR/random_frame.bin and exits (for comparing with the zstd command line).
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

#include "common/base/crc32c.h"
#include "common/crypto/seal.h"
#include "common/wire/block_digest.h"
#include "common/wire/codec.h"
#include "common/wire/hash.h"
#include "common/wire/protocol.h"
#include "loadgen/data.h"

namespace cdp::bench {
namespace {

using loadgen::DataGenerator;
using loadgen::DataMix;
using loadgen::MakeWriteBatch;

constexpr size_t kRecords = 256;  // x 4 KiB = 1 MiB of record data

Bytes BuildFrame(double compressibility) {
  DataMix mix;
  mix.compressibility = compressibility;
  mix.seed = 42;
  DataGenerator gen(mix);
  const proto::WriteBatch batch = MakeWriteBatch(gen, 1, 1, 0, kRecords);
  Result<Bytes> frame = proto::EncodeMessage(batch, 1);
  if (!frame.ok()) {
    std::fprintf(stderr, "EncodeMessage: %s\n", frame.status().ToString().c_str());
    std::abort();
  }
  return std::move(frame).value();
}

// 0 = realistic mixed (default mix), 1 = random.
const Bytes& Sample(int64_t which) {
  static const Bytes mixed = BuildFrame(DataMix().compressibility);
  static const Bytes random = BuildFrame(0.0);
  return which == 0 ? mixed : random;
}

void Label(benchmark::State& state) { state.SetLabel(state.range(0) == 0 ? "mixed" : "random"); }

void Finish(benchmark::State& state, size_t bytes) {
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(bytes));
  Label(state);
}

void BM_Memcpy(benchmark::State& state) {
  const Bytes& in = Sample(state.range(0));
  Bytes out(in.size());
  for (auto _ : state) {
    std::memcpy(out.data(), in.data(), in.size());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  Finish(state, in.size());
}

void BM_Crc32cHw(benchmark::State& state) {
  if (!crc32c::HardwareAvailable()) {
    state.SkipWithError("no SSE4.2 on this CPU");
    return;
  }
  const Bytes& in = Sample(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(crc32c::Extend(0, in.data(), in.size()));
  Finish(state, in.size());
}

void BM_Crc32cPortable(benchmark::State& state) {
  const Bytes& in = Sample(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(crc32c::ExtendPortable(0, in.data(), in.size()));
  Finish(state, in.size());
}

void BM_Xxh3_64(benchmark::State& state) {
  const Bytes& in = Sample(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(Xxh3_64(in.data(), in.size()));
  Finish(state, in.size());
}

void BM_Xxh3_128(benchmark::State& state) {
  const Bytes& in = Sample(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(Xxh3_128(in.data(), in.size()));
  Finish(state, in.size());
}

// Block digests of 1 MiB (256 leaves and their unit digest): what a resync
// and the master target spend per byte compared. data 2 = all zeros (the
// zero check alone).
void BM_BlockDigest(benchmark::State& state) {
  static const Bytes zeros(1u << 20, 0);
  const Bytes& in = state.range(0) == 2 ? zeros : Sample(state.range(0));
  const size_t n = std::min<size_t>(in.size(), 1u << 20) / kLeafSize * kLeafSize;
  for (auto _ : state) benchmark::DoNotOptimize(DigestOf(in.data(), n));
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(n));
  state.SetLabel(state.range(0) == 2 ? "zeros" : state.range(0) == 0 ? "mixed" : "random");
}

// Tenant-side encryption (common/crypto/seal.h): 1 MiB of the volume sealed (AES-256-XTS
// + HMAC-SHA256 per 4 KiB block, what the agent adds per byte shipped), and
// opened again (what a keyed export adds per byte read). One core.
std::shared_ptr<const seal::BlockSealer> BenchSealer() {
  seal::TenantKey key;
  key.bytes.fill(0x42);
  return *seal::BlockSealer::Create(*seal::DeriveVolumeKeys(key, "bench"));
}

void BM_Seal(benchmark::State& state) {
  static const auto sealer = BenchSealer();
  const Bytes& in = Sample(state.range(0));
  const size_t n = std::min<size_t>(in.size(), 1u << 20) / seal::kUnit * seal::kUnit;
  Bytes buf(n), macs(seal::MacBytes(n));
  for (auto _ : state) {
    std::copy_n(in.begin(), n, buf.begin());
    if (!sealer->Seal(0, buf, macs.data()).ok()) return state.SkipWithError("seal failed");
    benchmark::DoNotOptimize(macs.data());
  }
  Finish(state, n);
}

void BM_Open(benchmark::State& state) {
  static const auto sealer = BenchSealer();
  const Bytes& in = Sample(state.range(0));
  const size_t n = std::min<size_t>(in.size(), 1u << 20) / seal::kUnit * seal::kUnit;
  Bytes sealed(in.begin(), in.begin() + long(n)), macs(seal::MacBytes(n)), buf(n);
  if (!sealer->Seal(0, sealed, macs.data()).ok()) return state.SkipWithError("seal failed");
  for (auto _ : state) {
    std::copy_n(sealed.begin(), n, buf.begin());
    if (!sealer->Open(0, buf, macs.data()).ok()) return state.SkipWithError("open failed");
    benchmark::DoNotOptimize(buf.data());
  }
  Finish(state, n);
}

// Args: data, codec, level. MB/s counts uncompressed bytes.
void BM_Compress(benchmark::State& state) {
  const Bytes& in = Sample(state.range(0));
  auto codec = NewCodec(static_cast<proto::Codec>(state.range(1)), int(state.range(2)));
  Bytes out;
  out.reserve(in.size() * 2);
  for (auto _ : state) {
    out.clear();
    if (!codec->Compress(in, &out).ok()) {
      state.SkipWithError("compress failed");
      return;
    }
    benchmark::DoNotOptimize(out.data());
  }
  Finish(state, in.size());
  state.counters["ratio"] = double(in.size()) / double(out.size());
}

void BM_Decompress(benchmark::State& state) {
  const Bytes& in = Sample(state.range(0));
  auto codec = NewCodec(static_cast<proto::Codec>(state.range(1)), int(state.range(2)));
  Bytes packed;
  if (!codec->Compress(in, &packed).ok()) {
    state.SkipWithError("compress failed");
    return;
  }
  Bytes out;
  out.reserve(in.size());
  for (auto _ : state) {
    out.clear();
    if (!codec->Decompress(packed, in.size(), &out).ok()) {
      state.SkipWithError("decompress failed");
      return;
    }
    benchmark::DoNotOptimize(out.data());
  }
  Finish(state, in.size());
  state.counters["ratio"] = double(in.size()) / double(packed.size());
}

void CodecArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"data", "codec", "level"});
  for (int64_t data : {0, 1}) {
    b->Args({data, int64_t(proto::Codec::kLz4), 0});
    b->Args({data, int64_t(proto::Codec::kZstd), 1});
    b->Args({data, int64_t(proto::Codec::kZstd), 3});
  }
}

BENCHMARK(BM_Memcpy)->ArgName("data")->Arg(0)->Arg(1);
BENCHMARK(BM_Crc32cHw)->ArgName("data")->Arg(0)->Arg(1);
BENCHMARK(BM_Crc32cPortable)->ArgName("data")->Arg(0)->Arg(1);
BENCHMARK(BM_Xxh3_64)->ArgName("data")->Arg(0)->Arg(1);
BENCHMARK(BM_Xxh3_128)->ArgName("data")->Arg(0)->Arg(1);
BENCHMARK(BM_BlockDigest)->ArgName("data")->Arg(0)->Arg(1)->Arg(2);
BENCHMARK(BM_Seal)->ArgName("data")->Arg(0)->Arg(1);
BENCHMARK(BM_Open)->ArgName("data")->Arg(0)->Arg(1);
BENCHMARK(BM_Compress)->Apply(CodecArgs);
BENCHMARK(BM_Decompress)->Apply(CodecArgs);

bool WriteFile(const std::string& path, const Bytes& b) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  const bool ok = std::fwrite(b.data(), 1, b.size(), f) == b.size();
  return std::fclose(f) == 0 && ok;
}

}  // namespace
}  // namespace cdp::bench

int main(int argc, char** argv) {
  using cdp::bench::Sample;
  constexpr std::string_view kFlag = "--write_samples=";
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a.substr(0, kFlag.size()) != kFlag) continue;
    const std::string dir(a.substr(kFlag.size()));
    for (int which : {0, 1}) {
      const std::string path = dir + (which == 0 ? "/mixed_frame.bin" : "/random_frame.bin");
      if (!cdp::bench::WriteFile(path, Sample(which))) {
        std::fprintf(stderr, "cannot write %s\n", path.c_str());
        return 1;
      }
      std::printf("%s %zu bytes\n", path.c_str(), Sample(which).size());
    }
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  std::printf("frame: %zu bytes (mixed), %zu bytes (random); crc32c hardware: %s\n",
              Sample(0).size(), Sample(1).size(),
              cdp::crc32c::HardwareAvailable() ? "yes" : "no");
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

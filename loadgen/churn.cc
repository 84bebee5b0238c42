// SPDX-License-Identifier: Apache-2.0
#include "loadgen/churn.h"

#include <algorithm>
#include <charconv>
#include <optional>

#include "loadgen/data.h"
#include "common/nbd/nbd_client.h"
#include "loadgen/pacer.h"
#include "loadgen/rng.h"

namespace cdp::loadgen {
namespace {

class FileTarget final : public ChurnTarget {
 public:
  FileTarget(std::unique_ptr<File> f, uint64_t size) : f_(std::move(f)), size_(size) {}
  uint64_t size() const override { return size_; }
  Status Write(uint64_t off, ByteSpan d) override { return f_->Write(off, d); }
  Status Flush() override { return f_->Sync(); }
  Status Close() override { return Status::OK(); }
  std::string name() const override { return f_->path(); }

 private:
  std::unique_ptr<File> f_;
  uint64_t size_;
};

class NbdTarget final : public ChurnTarget {
 public:
  NbdTarget(std::unique_ptr<NbdClient> c, std::string uri) : c_(std::move(c)), uri_(std::move(uri)) {}
  uint64_t size() const override { return c_->size(); }
  Status Write(uint64_t off, ByteSpan d) override { return c_->Write(off, d); }
  Status Flush() override { return c_->Flush(); }
  Status Close() override { return c_->Close(); }
  std::string name() const override { return uri_; }

 private:
  std::unique_ptr<NbdClient> c_;
  std::string uri_;
};

}  // namespace

Result<std::unique_ptr<ChurnTarget>> OpenFileTarget(Env* env, const std::string& path, uint64_t size) {
  OpenOptions oo;
  oo.create = size > 0;
  CDP_ASSIGN_OR_RETURN(auto f, env->Open(path, oo));
  CDP_ASSIGN_OR_RETURN(uint64_t cur, f->Size());
  if (size == 0) {
    if (cur == 0) return Status::InvalidArgument(path + ": empty file; give a size to create it");
    size = cur;
  } else if (cur < size) {
    CDP_RETURN_IF_ERROR(f->Truncate(size));
  }
  return std::unique_ptr<ChurnTarget>(new FileTarget(std::move(f), size));
}

Result<std::unique_ptr<ChurnTarget>> OpenTarget(Env* env, const std::string& spec, uint64_t file_size) {
  if (spec.rfind("nbd://", 0) == 0 || spec.rfind("nbd+unix://", 0) == 0) {
    CDP_ASSIGN_OR_RETURN(NbdUri uri, ParseNbdUri(spec));
    CDP_ASSIGN_OR_RETURN(auto c, NbdClient::Connect(uri));
    return std::unique_ptr<ChurnTarget>(new NbdTarget(std::move(c), spec));
  }
  return OpenFileTarget(env, spec, file_size);
}

Result<PatternSpec> ParsePattern(std::string_view t) {
  PatternSpec p;
  if (t == "seq" || t == "sequential") return p;
  if (t == "random") {
    p.kind = Pattern::kRandom;
    return p;
  }
  if (t.rfind("zipf", 0) == 0) {
    p.kind = Pattern::kZipf;
    if (t.size() > 4) {
      if (t[4] != ':') return Status::InvalidArgument("bad pattern '" + std::string(t) + "'");
      std::string num(t.substr(5));
      char* end = nullptr;
      double th = std::strtod(num.c_str(), &end);
      if (num.empty() || *end != '\0' || !(th > 0.0 && th < 1.0))
        return Status::InvalidArgument("zipf theta must be in (0, 1): '" + std::string(t) + "'");
      p.theta = th;
    }
    return p;
  }
  return Status::InvalidArgument("bad pattern '" + std::string(t) + "' (seq, random or zipf:THETA)");
}

Result<ChurnResult> RunChurn(ChurnTarget* target, const ChurnOptions& o, const Clock* clock, const Sleeper& sleep) {
  if (!(o.rate_bytes_per_sec > 0)) return Status::InvalidArgument("rate must be > 0");
  if (o.io_size == 0 || o.io_size > (32u << 20)) return Status::InvalidArgument("io size must be 1 B..32 MiB");
  const uint64_t blocks = target->size() / o.io_size;
  if (blocks == 0) return Status::InvalidArgument(target->name() + ": smaller than one I/O");
  loadgen::DataMix mix;
  mix.compressibility = o.compressibility;
  mix.seed = MixSeed(o.seed, 0x6461746100000000ull);
  loadgen::DataGenerator gen(mix);
  SplitMix64 rng(MixSeed(o.seed, 0x6f66667300000000ull));
  std::optional<ZipfSampler> zipf;
  if (o.pattern.kind == Pattern::kZipf) zipf.emplace(blocks, o.pattern.theta);

  const uint64_t burst = std::max<uint64_t>(o.io_size, uint64_t(o.rate_bytes_per_sec / 10));
  Pacer pacer(clock, o.rate_bytes_per_sec, burst);
  Bytes buf(o.io_size);
  ChurnResult res;
  const uint64_t start = clock->NowMicros();
  uint64_t next_block = 0, since_flush = 0, last_progress = start;
  for (;;) {
    uint64_t wait = pacer.Reserve(o.io_size);
    uint64_t now = clock->NowMicros();
    if (now + wait - start >= o.duration_us) break;
    if (wait) sleep(wait);
    uint64_t block = 0;
    switch (o.pattern.kind) {
      case Pattern::kSequential: block = next_block++ % blocks; break;
      case Pattern::kRandom: block = rng.Below(blocks); break;
      case Pattern::kZipf: block = zipf->Next(rng); break;
    }
    gen.Fill(buf.data(), buf.size());
    CDP_RETURN_IF_ERROR(target->Write(block * o.io_size, buf).WithContext(target->name()));
    res.bytes += o.io_size;
    ++res.ops;
    since_flush += o.io_size;
    if (o.flush_every_bytes && since_flush >= o.flush_every_bytes) {
      CDP_RETURN_IF_ERROR(target->Flush().WithContext(target->name()));
      ++res.flushes;
      since_flush = 0;
    }
    now = clock->NowMicros();
    if (o.progress && now - last_progress >= 1'000'000) {
      o.progress(now - start, res.bytes);
      last_progress = now;
    }
  }
  uint64_t now = clock->NowMicros();
  if (now - start < o.duration_us) sleep(start + o.duration_us - now);
  CDP_RETURN_IF_ERROR(target->Flush().WithContext(target->name()));
  ++res.flushes;
  res.elapsed_us = clock->NowMicros() - start;
  return res;
}

}  // namespace cdp::loadgen

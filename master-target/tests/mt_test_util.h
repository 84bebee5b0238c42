// SPDX-License-Identifier: Apache-2.0
// Test helpers for the master target: a temporary directory on the real file
// system (sqlite needs one), record builders, and a reference model of a
// volume that keeps the image after every sequence.
// Thread safety: none; each test owns its helpers.
#pragma once

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/base/coding.h"
#include "common/env/env_wrapper.h"
#include "common/tests/test_util.h"
#include "common/wire/protocol.h"

namespace cdp::mt::testing {

using TempDir = ::cdp::testing::ScratchDir;

// A filter that honours OpenOptions::direct the way O_DIRECT does, over an
// Env that ignores it (MemEnv, FaultEnv): a file opened direct reports
// DirectAlignment() 4096 and refuses (kInvalidArgument, counted in
// *violations) every Read / Write whose offset or length is not aligned, so
// the direct code paths run, crash tests included, on in-memory files.
// `base` and `violations` must outlive the Env.
class StrictDirectEnv final : public EnvWrapper {
 public:
  static constexpr uint32_t kAlign = 4096;
  StrictDirectEnv(Env* base, std::atomic<uint64_t>* violations) : EnvWrapper(base), violations_(violations) {}
  Result<std::unique_ptr<File>> Open(const std::string& p, const OpenOptions& o) override {
    CDP_ASSIGN_OR_RETURN(auto f, EnvWrapper::Open(p, o));
    if (!o.direct) return f;
    return std::unique_ptr<File>(new DirectFile(std::move(f), violations_));
  }

 private:
  class DirectFile final : public FileWrapper {
   public:
    DirectFile(std::unique_ptr<File> f, std::atomic<uint64_t>* v) : FileWrapper(std::move(f)), v_(v) {}
    uint32_t DirectAlignment() const override { return kAlign; }
    Status Read(uint64_t o, size_t n, uint8_t* b) const override {
      CDP_RETURN_IF_ERROR(Check(o, n));
      return FileWrapper::Read(o, n, b);
    }
    Result<size_t> ReadUpTo(uint64_t o, size_t n, uint8_t* b) const override {
      CDP_RETURN_IF_ERROR(Check(o, n));
      return FileWrapper::ReadUpTo(o, n, b);
    }
    Status Write(uint64_t o, ByteSpan d) override {
      CDP_RETURN_IF_ERROR(Check(o, d.size()));
      return FileWrapper::Write(o, d);
    }
    Status Append(ByteSpan d) override {
      ++*v_;
      return Status::InvalidArgument("StrictDirectEnv: no appends to a direct file (" + std::to_string(d.size()) + ")");
    }

   private:
    Status Check(uint64_t o, size_t n) const {
      if (o % kAlign == 0 && n % kAlign == 0) return Status::OK();
      ++*v_;
      return Status::InvalidArgument("StrictDirectEnv: unaligned direct I/O: " + std::to_string(n) + " bytes at " +
                                     std::to_string(o));
    }
    std::atomic<uint64_t>* v_;
  };
  std::atomic<uint64_t>* violations_;
};

// `n` bytes no compressor shrinks (the same for the same seed).
inline Bytes RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Bytes b(n);
  for (auto& x : b) x = uint8_t(rng());
  return b;
}

inline proto::Record DataRecord(uint64_t seq, uint64_t off, Bytes data) {
  proto::Record r;
  r.seq = seq;
  r.offset = off;
  r.length = uint32_t(data.size());
  r.kind = proto::RecordKind::kData;
  r.data = std::move(data);
  return r;
}
inline proto::Record ZeroRecord(uint64_t seq, uint64_t off, uint32_t len, bool trim = false) {
  proto::Record r;
  r.seq = seq;
  r.offset = off;
  r.length = len;
  r.kind = trim ? proto::RecordKind::kTrim : proto::RecordKind::kZero;
  return r;
}
inline proto::Record FlushRecord(uint64_t seq) {
  proto::Record r;
  r.seq = seq;
  r.kind = proto::RecordKind::kFlush;
  return r;
}
inline proto::Record TagRecord(uint64_t seq, const std::string& name) {
  proto::Record r;
  r.seq = seq;
  r.kind = proto::RecordKind::kTag;
  r.data.assign(name.begin(), name.end());
  return r;
}

// The image of a volume after each applied sequence (ImageAt(0): all zeros).
class Reference {
 public:
  explicit Reference(uint64_t size) : image_(size, 0) { at_[0] = image_; }
  void Apply(const std::vector<proto::Record>& batch) {
    for (const auto& r : batch) {
      if (r.kind == proto::RecordKind::kData) {
        std::memcpy(image_.data() + r.offset, r.data.data(), r.length);
      } else if (r.kind == proto::RecordKind::kZero || r.kind == proto::RecordKind::kTrim) {
        std::memset(image_.data() + r.offset, 0, r.length);
      }
      last_ = r.seq;
      at_[r.seq] = image_;
    }
  }
  const Bytes& image() const { return image_; }
  const Bytes& ImageAt(uint64_t seq) const {
    auto it = at_.upper_bound(seq);
    return std::prev(it)->second;
  }
  uint64_t last_seq() const { return last_; }

 private:
  Bytes image_;
  std::map<uint64_t, Bytes> at_;
  uint64_t last_ = 0;
};

struct PointRef {
  uint64_t seq;
  std::string name;  // "" for a flush
};

// A random stream of batches over a volume of `size` bytes: data writes of
// 512..32 KiB at 512-byte offsets (often overlapping earlier ones in the same
// batch), zero and trim records, flushes and tags.
class StreamGen {
 public:
  StreamGen(uint64_t size, uint64_t seed) : size_(size), rng_(seed), ref_(size) {}

  std::vector<std::vector<proto::Record>> Batches(int count, int max_per_batch) {
    std::vector<std::vector<proto::Record>> out;
    for (int i = 0; i < count; ++i) {
      std::vector<proto::Record> b;
      int n = 1 + int(rng_() % uint64_t(max_per_batch));
      for (int j = 0; j < n; ++j) b.push_back(Next(b));
      ref_.Apply(b);
      out.push_back(std::move(b));
    }
    return out;
  }

  const Bytes& image() const { return ref_.image(); }
  const Bytes& ImageAt(uint64_t seq) const { return ref_.ImageAt(seq); }
  uint64_t last_seq() const { return seq_; }
  const std::vector<PointRef>& points() const { return points_; }
  const Reference& reference() const { return ref_; }

 private:
  proto::Record Next(const std::vector<proto::Record>& batch) {
    uint64_t seq = ++seq_;
    unsigned k = unsigned(rng_() % 100);
    uint64_t off, len;
    bool overlap = false;
    for (const auto& r : batch) overlap |= (r.length > 0 && rng_() % 3 == 0);
    len = 512 * (1 + rng_() % 64);
    if (len > size_) len = size_;
    if (overlap) {
      const proto::Record* prev = nullptr;
      for (const auto& r : batch) {
        if (r.length > 0) prev = &r;
      }
      off = prev->offset + 512 * (rng_() % (prev->length / 512 + 1));
      if (off >= size_) off = size_ - 512;
    } else {
      off = 512 * (rng_() % (size_ / 512));
    }
    if (off + len > size_) len = size_ - off;
    if (k < 60) {
      Bytes d(len);
      bool zeros = rng_() % 10 == 0;
      for (auto& x : d) x = zeros ? 0 : uint8_t(rng_());
      return DataRecord(seq, off, std::move(d));
    }
    if (k < 70) return ZeroRecord(seq, off, uint32_t(len), false);
    if (k < 78) return ZeroRecord(seq, off, uint32_t(len), true);
    if (k < 94) {
      points_.push_back(PointRef{seq, ""});
      return FlushRecord(seq);
    }
    std::string name = "tag-" + std::to_string(seq);
    points_.push_back(PointRef{seq, name});
    return TagRecord(seq, name);
  }

  uint64_t size_;
  std::mt19937_64 rng_;
  Reference ref_;
  uint64_t seq_ = 0;
  std::vector<PointRef> points_;
};

}  // namespace cdp::mt::testing

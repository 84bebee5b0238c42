// SPDX-License-Identifier: Apache-2.0
#include "common/wire/codec.h"

#include <climits>
#include <string>

#include <lz4.h>
#include <zstd.h>

namespace cdp {
namespace {

Status CheckExpected(size_t expected_size) {
  if (expected_size > proto::kMaxBatchRaw) {
    return Status::InvalidArgument("decompress: expected size " + std::to_string(expected_size) +
                                   " exceeds cap " + std::to_string(proto::kMaxBatchRaw));
  }
  return Status::OK();
}

class NoneCodec final : public Codec {
 public:
  proto::Codec id() const override { return proto::Codec::kNone; }
  Status Compress(ByteSpan in, Bytes* out) override {
    PutBytes(*out, in);
    return Status::OK();
  }
  Status Decompress(ByteSpan in, size_t expected_size, Bytes* out) override {
    CDP_RETURN_IF_ERROR(CheckExpected(expected_size));
    if (in.size() != expected_size) {
      return Status::Corruption("none codec: " + std::to_string(in.size()) +
                                " bytes, expected " + std::to_string(expected_size));
    }
    PutBytes(*out, in);
    return Status::OK();
  }
};

class Lz4Codec final : public Codec {
 public:
  proto::Codec id() const override { return proto::Codec::kLz4; }

  Status Compress(ByteSpan in, Bytes* out) override {
    if (in.size() > size_t(LZ4_MAX_INPUT_SIZE)) {
      return Status::InvalidArgument("lz4: input of " + std::to_string(in.size()) +
                                     " bytes is too large");
    }
    const int bound = LZ4_compressBound(int(in.size()));
    const size_t base = out->size();
    out->resize(base + size_t(bound));
    const int n = LZ4_compress_default(reinterpret_cast<const char*>(in.data()),
                                       reinterpret_cast<char*>(out->data() + base),
                                       int(in.size()), bound);
    if (n <= 0) {
      out->resize(base);
      return Status::InvalidArgument("lz4: compression failed");
    }
    out->resize(base + size_t(n));
    return Status::OK();
  }

  Status Decompress(ByteSpan in, size_t expected_size, Bytes* out) override {
    CDP_RETURN_IF_ERROR(CheckExpected(expected_size));
    if (in.size() > size_t(INT_MAX)) return Status::Corruption("lz4: compressed input too large");
    const size_t base = out->size();
    out->resize(base + expected_size);
    // dstCapacity == expected_size: a block that would write one byte more fails.
    const int n = LZ4_decompress_safe(reinterpret_cast<const char*>(in.data()),
                                      reinterpret_cast<char*>(out->data() + base), int(in.size()),
                                      int(expected_size));
    if (n < 0 || size_t(n) != expected_size) {
      out->resize(base);
      if (n < 0) {
        return Status::Corruption("lz4: malformed block or output larger than " +
                                  std::to_string(expected_size) + " bytes");
      }
      return Status::Corruption("lz4: decompressed " + std::to_string(n) + " bytes, expected " +
                                std::to_string(expected_size));
    }
    return Status::OK();
  }
};

class ZstdCodec final : public Codec {
 public:
  explicit ZstdCodec(int level) : level_(level) {}
  ~ZstdCodec() override {
    ZSTD_freeCCtx(cctx_);
    ZSTD_freeDCtx(dctx_);
  }
  ZstdCodec(const ZstdCodec&) = delete;
  ZstdCodec& operator=(const ZstdCodec&) = delete;

  proto::Codec id() const override { return proto::Codec::kZstd; }

  Status Compress(ByteSpan in, Bytes* out) override {
    if (cctx_ == nullptr && (cctx_ = ZSTD_createCCtx()) == nullptr) {
      return Status::NoSpace("zstd: cannot allocate compression context");
    }
    const size_t bound = ZSTD_compressBound(in.size());
    if (ZSTD_isError(bound)) return Status::InvalidArgument("zstd: input too large");
    const size_t base = out->size();
    out->resize(base + bound);
    // One-shot compression records the content size in the frame header.
    const size_t n =
        ZSTD_compressCCtx(cctx_, out->data() + base, bound, in.data(), in.size(), level_);
    if (ZSTD_isError(n)) {
      out->resize(base);
      return Status::InvalidArgument(std::string("zstd: ") + ZSTD_getErrorName(n));
    }
    out->resize(base + n);
    return Status::OK();
  }

  Status Decompress(ByteSpan in, size_t expected_size, Bytes* out) override {
    CDP_RETURN_IF_ERROR(CheckExpected(expected_size));
    const unsigned long long declared = ZSTD_getFrameContentSize(in.data(), in.size());
    if (declared == ZSTD_CONTENTSIZE_ERROR) return Status::Corruption("zstd: not a zstd frame");
    if (declared != ZSTD_CONTENTSIZE_UNKNOWN && declared != expected_size) {
      return Status::Corruption("zstd: frame declares " + std::to_string(declared) +
                                " bytes, expected " + std::to_string(expected_size));
    }
    if (dctx_ == nullptr && (dctx_ = ZSTD_createDCtx()) == nullptr) {
      return Status::NoSpace("zstd: cannot allocate decompression context");
    }
    const size_t base = out->size();
    out->resize(base + expected_size);
    // The destination holds exactly expected_size bytes: more output is an error.
    const size_t n =
        ZSTD_decompressDCtx(dctx_, out->data() + base, expected_size, in.data(), in.size());
    if (ZSTD_isError(n) || n != expected_size) {
      out->resize(base);
      if (ZSTD_isError(n)) {
        return Status::Corruption(std::string("zstd: ") + ZSTD_getErrorName(n) + " (expected " +
                                  std::to_string(expected_size) + " bytes)");
      }
      return Status::Corruption("zstd: decompressed " + std::to_string(n) + " bytes, expected " +
                                std::to_string(expected_size));
    }
    return Status::OK();
  }

 private:
  int level_;
  ZSTD_CCtx* cctx_ = ZSTD_createCCtx();
  ZSTD_DCtx* dctx_ = ZSTD_createDCtx();
};

}  // namespace

bool SampleCompresses(Codec& codec, ByteSpan data) { return SampleCompresses(codec, std::span(&data, 1)); }

bool SampleCompresses(Codec& codec, std::span<const ByteSpan> pieces) {
  size_t size = 0;
  for (ByteSpan p : pieces) size += p.size();
  if (size <= kSampleMin) return true;
  Bytes sample;
  sample.reserve(kSampleSlice * kSampleSlices);
  const size_t stride = (size - kSampleSlice) / (kSampleSlices - 1);
  size_t piece = 0, piece_at = 0;  // the piece holding offset piece_at..
  for (size_t i = 0; i < kSampleSlices; ++i) {
    size_t at = i * stride, want = kSampleSlice;
    while (want > 0) {
      while (at >= piece_at + pieces[piece].size()) piece_at += pieces[piece++].size();
      const size_t n = std::min(want, piece_at + pieces[piece].size() - at);
      PutBytes(sample, pieces[piece].subspan(at - piece_at, n));
      at += n;
      want -= n;
    }
  }
  Bytes out;
  if (!codec.Compress(sample, &out).ok()) return true;  // let the real pass say
  return out.size() + sample.size() / 32 <= sample.size();
}

std::unique_ptr<Codec> NewCodec(proto::Codec id, int level) {
  switch (id) {
    case proto::Codec::kNone:
      return std::make_unique<NoneCodec>();
    case proto::Codec::kLz4:
      return std::make_unique<Lz4Codec>();
    case proto::Codec::kZstd: {
      if (level == 0) level = 3;
      if (level < 1) level = 1;
      if (level > 19) level = 19;
      return std::make_unique<ZstdCodec>(level);
    }
  }
  return nullptr;
}

Result<proto::Codec> ParseCodecName(std::string_view name) {
  if (name == "none") return proto::Codec::kNone;
  if (name == "lz4") return proto::Codec::kLz4;
  if (name == "zstd") return proto::Codec::kZstd;
  return Status::InvalidArgument("unknown codec '" + std::string(name) +
                                 "' (expected none, lz4 or zstd)");
}

std::string_view CodecName(proto::Codec id) {
  switch (id) {
    case proto::Codec::kNone:
      return "none";
    case proto::Codec::kLz4:
      return "lz4";
    case proto::Codec::kZstd:
      return "zstd";
  }
  return "unknown";
}

}  // namespace cdp

// SPDX-License-Identifier: Apache-2.0
// CRC32C, XXH3 and codec behaviour: both CRC paths agree, known vectors,
// round trips, and refusal of bombs, short and damaged inputs.
#include <catch2/catch.hpp>

#include <lz4.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "common/base/crc32c.h"
#include "common/tests/test_util.h"
#include "common/wire/codec.h"
#include "common/wire/hash.h"

namespace cdp {
namespace {

Bytes RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Bytes b(n);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t v = rng();
    std::memcpy(b.data() + i, &v, std::min<size_t>(8, n - i));
  }
  return b;
}

// 4 KiB blocks: zero, log-like text, and random, in a fixed rotation.
Bytes MixedBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Bytes b;
  b.reserve(n);
  static constexpr const char* kWords[] = {"INFO", "WARN", "request", "volume", "flush",
                                           "latency_us=", "seq=", "ok", "tenant=acme", "\n"};
  size_t block = 0;
  while (b.size() < n) {
    const size_t end = std::min(n, b.size() + 4096);
    switch (block++ % 4) {
      case 0:
        b.resize(end, 0);
        break;
      case 1:
      case 2:
        while (b.size() < end) {
          std::string w = kWords[rng() % 10];
          w += std::to_string(rng() % 1000) + " ";
          for (char c : w) {
            if (b.size() < end) b.push_back(uint8_t(c));
          }
        }
        break;
      default:
        while (b.size() < end) b.push_back(uint8_t(rng()));
    }
  }
  return b;
}

TEST_CASE("crc32c known vectors", "[crc]") {
  const std::string s = "123456789";
  CHECK(crc32c::Value(s.data(), s.size()) == 0xE3069283u);
  CHECK(crc32c::ExtendPortable(0, s.data(), s.size()) == 0xE3069283u);

  uint8_t buf[32];
  std::memset(buf, 0, sizeof buf);
  CHECK(crc32c::Value(buf, 32) == 0x8A9136AAu);
  CHECK(crc32c::ExtendPortable(0, buf, 32) == 0x8A9136AAu);
  std::memset(buf, 0xFF, sizeof buf);
  CHECK(crc32c::Value(buf, 32) == 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) buf[i] = uint8_t(i);
  CHECK(crc32c::Value(buf, 32) == 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) buf[i] = uint8_t(31 - i);
  CHECK(crc32c::Value(buf, 32) == 0x113FDB5Cu);
  CHECK(crc32c::Value(buf, 0) == 0u);
}

TEST_CASE("crc32c hardware equals portable on all short lengths and alignments", "[crc]") {
  INFO("hardware path available: " << crc32c::HardwareAvailable());
  const Bytes data = RandomBytes(64 + 16, 7);
  for (size_t align = 0; align < 16; ++align) {
    for (size_t len = 0; len <= 64; ++len) {
      const uint8_t* p = data.data() + align;
      INFO("align " << align << " len " << len);
      REQUIRE(crc32c::Extend(0, p, len) == crc32c::ExtendPortable(0, p, len));
      REQUIRE(crc32c::Extend(0x12345678u, p, len) == crc32c::ExtendPortable(0x12345678u, p, len));
    }
  }
}

TEST_CASE("crc32c hardware equals portable on random buffers, Extend chains", "[crc]") {
  std::mt19937_64 rng(11);
  for (int round = 0; round < 50; ++round) {
    const size_t n = rng() % (256 * 1024);
    const size_t off = rng() % 8;
    const Bytes b = RandomBytes(n + off, rng());
    const uint8_t* p = b.data() + off;
    const uint32_t whole = crc32c::Extend(0, p, n);
    REQUIRE(whole == crc32c::ExtendPortable(0, p, n));
    const size_t cut = n == 0 ? 0 : rng() % n;
    REQUIRE(crc32c::Extend(crc32c::Extend(0, p, cut), p + cut, n - cut) == whole);
    REQUIRE(crc32c::ExtendPortable(crc32c::ExtendPortable(0, p, cut), p + cut, n - cut) == whole);
  }
}

// Lengths around the hardware path's three-stream chunk boundaries (3 x 256 and
// 3 x 8192 bytes) and odd alignments.
TEST_CASE("crc32c hardware equals portable around chunk boundaries", "[crc]") {
  const Bytes data = RandomBytes(3 * 3 * 8192 + 64, 17);
  for (size_t base : {size_t(3 * 256), size_t(2 * 3 * 256), size_t(3 * 8192), size_t(2 * 3 * 8192)}) {
    for (size_t len = base - 9; len <= base + 9; ++len) {
      for (size_t align : {size_t(0), size_t(1), size_t(3), size_t(7)}) {
        INFO("align " << align << " len " << len);
        const uint8_t* p = data.data() + align;
        REQUIRE(crc32c::Extend(0, p, len) == crc32c::ExtendPortable(0, p, len));
        REQUIRE(crc32c::Extend(0xDEADBEEFu, p, len) == crc32c::ExtendPortable(0xDEADBEEFu, p, len));
      }
    }
  }
  // 1 MiB of zeros and of 0xFF: long runs through every path.
  for (uint8_t fill : {uint8_t(0), uint8_t(0xFF)}) {
    const Bytes b(1 << 20, fill);
    REQUIRE(crc32c::Extend(0, b.data(), b.size()) == crc32c::ExtendPortable(0, b.data(), b.size()));
  }
}

TEST_CASE("xxh3 known vectors and agreement with libxxhash", "[hash]") {
  CHECK(Xxh3_64("", 0) == 0x2D06800538D394C2ull);
  const proto::Hash128 e = Xxh3_128("", 0);
  CHECK(e.low == 0x6001C324468D497Full);
  CHECK(e.high == 0x99AA06D3014798D8ull);

  const Bytes b = RandomBytes(100000, 3);
  CHECK(Xxh3_64(b.data(), b.size()) == XXH3_64bits(b.data(), b.size()));
  const XXH128_hash_t ref = XXH3_128bits(b.data(), b.size());
  const proto::Hash128 h = Xxh3_128(b.data(), b.size());
  CHECK(h.low == ref.low64);
  CHECK(h.high == ref.high64);
  // One changed byte changes both hashes.
  Bytes c = b;
  c[5000] ^= 1;
  CHECK(Xxh3_64(c.data(), c.size()) != Xxh3_64(b.data(), b.size()));
  CHECK(!(Xxh3_128(c.data(), c.size()) == h));
}

TEST_CASE("xxh3-128 streaming in pieces equals one shot", "[hash]") {
  const Bytes b = RandomBytes(1 << 20, 5);
  std::mt19937_64 rng(9);
  for (int round = 0; round < 5; ++round) {
    Xxh3_128Stream s;
    size_t pos = 0;
    while (pos < b.size()) {
      const size_t step = std::min<size_t>(b.size() - pos, rng() % 70000);
      s.Update(b.data() + pos, step);
      pos += step;
    }
    REQUIRE(s.Digest() == Xxh3_128(b.data(), b.size()));
  }
  Xxh3_128Stream empty;
  CHECK(empty.Digest() == Xxh3_128("", 0));
}

TEST_CASE("codec names", "[codec]") {
  for (proto::Codec id : {proto::Codec::kNone, proto::Codec::kLz4, proto::Codec::kZstd}) {
    auto r = ParseCodecName(CodecName(id));
    REQUIRE(r.ok());
    CHECK(*r == id);
    CHECK(NewCodec(id)->id() == id);
  }
  CHECK(CodecName(proto::Codec::kZstd) == "zstd");
  auto bad = ParseCodecName("gzip");
  REQUIRE(!bad.ok());
  CHECK(bad.status().code() == Code::kInvalidArgument);
  CHECK(bad.status().message().find("gzip") != std::string::npos);
  CHECK(!ParseCodecName("ZSTD").ok());
  CHECK(NewCodec(static_cast<proto::Codec>(9)) == nullptr);
}

TEST_CASE("codecs round-trip zeros, mixed, random and empty data", "[codec]") {
  struct Case { const char* name; Bytes data; };
  const Case cases[] = {{"empty", {}},
                        {"one byte", {0x42}},
                        {"zeros", Bytes(1 << 20, 0)},
                        {"mixed", MixedBytes(1 << 20, 1)},
                        {"random", RandomBytes((1 << 20) + 3, 2)}};
  for (auto [id, level] : {std::pair{proto::Codec::kNone, 0}, std::pair{proto::Codec::kLz4, 0},
                           std::pair{proto::Codec::kZstd, 1}, std::pair{proto::Codec::kZstd, 3},
                           std::pair{proto::Codec::kZstd, 19}}) {
    auto codec = NewCodec(id, level);
    for (const Case& c : cases) {
      if (level == 19 && c.data.size() > 4096 && c.data[0] != 0) continue;  // keep it quick
      INFO(CodecName(id) << " level " << level << " on " << c.name);
      Bytes packed = {0xAA};  // Compress appends
      REQUIRE(codec->Compress(c.data, &packed).ok());
      REQUIRE(packed[0] == 0xAA);
      Bytes out = {0xBB};  // Decompress appends
      const Status s =
          codec->Decompress(ByteSpan(packed).subspan(1), c.data.size(), &out);
      REQUIRE(s.ok());
      REQUIRE(out.size() == c.data.size() + 1);
      REQUIRE(out[0] == 0xBB);
      REQUIRE(std::equal(c.data.begin(), c.data.end(), out.begin() + 1));
      if (id != proto::Codec::kNone && std::string(c.name) == "zeros") {
        CHECK(packed.size() < 10000);
      }
    }
  }
}

TEST_CASE("a sample tells incompressible data from compressible", "[codec]") {
  auto zstd = NewCodec(proto::Codec::kZstd, 1);
  auto lz4 = NewCodec(proto::Codec::kLz4);
  for (Codec* c : {zstd.get(), lz4.get()}) {
    INFO(CodecName(c->id()));
    CHECK_FALSE(SampleCompresses(*c, RandomBytes(1 << 20, 7)));
    CHECK(SampleCompresses(*c, MixedBytes(1 << 20, 8)));
    CHECK(SampleCompresses(*c, Bytes(1 << 20, 0)));
    // Up to kSampleMin bytes are not judged by a sample.
    CHECK(SampleCompresses(*c, RandomBytes(kSampleMin, 9)));
    CHECK_FALSE(SampleCompresses(*c, RandomBytes(kSampleMin + 1, 9)));
    // Random data with zeros after it: a slice of zeros is enough.
    Bytes half = RandomBytes(1 << 20, 10);
    std::fill(half.begin() + (1 << 19), half.end(), 0);
    CHECK(SampleCompresses(*c, half));
  }
}

TEST_CASE("a sample of pieces judges exactly what a sample of their concatenation does", "[codec]") {
  auto zstd = NewCodec(proto::Codec::kZstd, 1);
  // Random data with one run of zeros, which a slice hits or misses
  // depending on the size: slices that straddle a cut must gather the same
  // bytes, or the verdicts differ for some cut.
  Bytes data = RandomBytes(300'000, 11);
  std::fill(data.begin() + 150'000, data.begin() + 156'000, 0);
  std::mt19937_64 rng(12);
  int compresses = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const size_t size = kSampleMin + 1 + rng() % (data.size() - kSampleMin - 1);
    const ByteSpan whole = ByteSpan(data).first(size);
    std::vector<ByteSpan> pieces;
    for (size_t at = 0; at < size;) {
      const size_t n = std::min<size_t>(size - at, rng() % 3 == 0 ? 0 : 1 + rng() % 20'000);
      pieces.push_back(whole.subspan(at, n));  // empty pieces too
      at += n;
    }
    const bool flat = SampleCompresses(*zstd, whole);
    compresses += flat ? 1 : 0;
    INFO("trial " << trial << ", size " << size << ", " << pieces.size() << " pieces");
    CHECK(SampleCompresses(*zstd, std::span<const ByteSpan>(pieces)) == flat);
  }
  // Both verdicts occur, so the comparison above can fail.
  CHECK(compresses > 0);
  CHECK(compresses < 200);
}

TEST_CASE("a WriteBatch of random data travels raw and round-trips", "[codec]") {
  proto::WriteBatch b;
  b.volume_id = 3;
  b.codec = proto::Codec::kZstd;
  b.level = 1;
  for (uint64_t i = 0; i < 4; ++i) {
    proto::Record r;
    r.seq = 10 + i;
    r.offset = i << 18;
    r.length = 1u << 18;
    r.kind = proto::RecordKind::kData;
    r.data = RandomBytes(r.length, 20 + i);
    b.records.push_back(std::move(r));
  }
  Result<Bytes> raw = proto::EncodeMessage(b, 1);
  REQUIRE(raw.ok());
  proto::Frame f;
  REQUIRE(proto::DecodeFrame(*raw, &f).state == proto::DecodeState::kComplete);
  Result<proto::Message> back = proto::ParseMessage(f);
  REQUIRE(back.ok());
  const auto& got = std::get<proto::WriteBatch>(*back);
  CHECK(got.codec == proto::Codec::kNone);  // the sample said raw
  REQUIRE(got.records.size() == 4);
  for (size_t i = 0; i < 4; ++i) CHECK(got.records[i].data == b.records[i].data);
  // Text-like data of the same size is compressed.
  for (auto& r : b.records) r.data = MixedBytes(r.length, r.seq);
  Result<Bytes> packed = proto::EncodeMessage(b, 2);
  REQUIRE(packed.ok());
  CHECK(packed->size() < raw->size() / 2);
}

TEST_CASE("codec refuses a declared size above kMaxBatchRaw", "[codec]") {
  for (proto::Codec id : {proto::Codec::kNone, proto::Codec::kLz4, proto::Codec::kZstd}) {
    auto codec = NewCodec(id);
    Bytes packed;
    REQUIRE(codec->Compress(Bytes(100, 1), &packed).ok());
    Bytes out;
    const Status s = codec->Decompress(packed, size_t(proto::kMaxBatchRaw) + 1, &out);
    CHECK(s.code() == Code::kInvalidArgument);
    CHECK(out.empty());
    CHECK(out.capacity() == 0);
  }
}

// 64 MiB of zeros compressed, declared as 1 MiB: refused, and never more than
// 1 MiB allocated for the output.
TEST_CASE("decompression bomb refused with kCorruption", "[codec]") {
  const Bytes zeros(64u << 20, 0);
  const size_t declared = 1u << 20;
  for (proto::Codec id : {proto::Codec::kLz4, proto::Codec::kZstd}) {
    INFO(CodecName(id));
    auto codec = NewCodec(id, 1);
    Bytes packed;
    REQUIRE(codec->Compress(zeros, &packed).ok());
    REQUIRE(packed.size() < (1u << 20));
    Bytes out;
    const Status s = codec->Decompress(packed, declared, &out);
    CHECK(s.code() == Code::kCorruption);
    CHECK(out.empty());
    CHECK(out.capacity() <= declared);
  }

  // A zstd frame without the content-size field: only the bounded output buffer
  // can stop it.
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  REQUIRE(cctx != nullptr);
  REQUIRE(!ZSTD_isError(ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 0)));
  Bytes packed(ZSTD_compressBound(zeros.size()));
  ZSTD_inBuffer in{zeros.data(), zeros.size(), 0};
  ZSTD_outBuffer ob{packed.data(), packed.size(), 0};
  REQUIRE(ZSTD_compressStream2(cctx, &ob, &in, ZSTD_e_end) == 0);
  ZSTD_freeCCtx(cctx);
  packed.resize(ob.pos);
  REQUIRE(ZSTD_getFrameContentSize(packed.data(), packed.size()) == ZSTD_CONTENTSIZE_UNKNOWN);
  auto zstd = NewCodec(proto::Codec::kZstd);
  Bytes out;
  CHECK(zstd->Decompress(packed, declared, &out).code() == Code::kCorruption);
  CHECK(out.empty());
  CHECK(out.capacity() <= declared);
  // The same unsized frame with the right declared size decodes.
  Bytes full;
  REQUIRE(zstd->Decompress(packed, zeros.size(), &full).ok());
  CHECK(full == zeros);
}

TEST_CASE("codec refuses output shorter than the declared size", "[codec]") {
  const Bytes data = MixedBytes(100000, 4);
  for (proto::Codec id : {proto::Codec::kNone, proto::Codec::kLz4, proto::Codec::kZstd}) {
    INFO(CodecName(id));
    auto codec = NewCodec(id);
    Bytes packed;
    REQUIRE(codec->Compress(data, &packed).ok());
    Bytes out;
    CHECK(codec->Decompress(packed, data.size() + 1, &out).code() == Code::kCorruption);
    CHECK(codec->Decompress(packed, data.size() - 1, &out).code() == Code::kCorruption);
    CHECK(out.empty());
    // The codec object stays usable after a refusal.
    REQUIRE(codec->Decompress(packed, data.size(), &out).ok());
    CHECK(out == data);
  }
}

TEST_CASE("codec refuses truncated input and survives bit flips", "[codec]") {
  const Bytes data = MixedBytes(64 * 1024, 8);
  std::mt19937_64 rng(21);
  for (proto::Codec id : {proto::Codec::kLz4, proto::Codec::kZstd}) {
    INFO(CodecName(id));
    auto codec = NewCodec(id, 1);
    Bytes packed;
    REQUIRE(codec->Compress(data, &packed).ok());
    for (size_t cut : {size_t(0), size_t(1), size_t(5), packed.size() / 2, packed.size() - 1}) {
      INFO("truncated to " << cut);
      Bytes out;
      CHECK(codec->Decompress(ByteSpan(packed).first(cut), data.size(), &out).code() ==
            Code::kCorruption);
      CHECK(out.empty());
    }
    int refused = 0;
    for (int i = 0; i < 2000; ++i) {
      Bytes bad = packed;
      const size_t bit = rng() % (bad.size() * 8);
      bad[bit / 8] ^= uint8_t(1u << (bit % 8));
      Bytes out;
      const Status s = codec->Decompress(bad, data.size(), &out);
      // A flip inside literal bytes may decode to different data of the right
      // size; anything else must be refused as corruption, never a crash.
      if (s.ok()) {
        REQUIRE(out.size() == data.size());
      } else {
        REQUIRE(s.code() == Code::kCorruption);
        REQUIRE(out.empty());
        ++refused;
      }
    }
    CHECK(refused > 0);
  }
  // zstd: a damaged magic number is always refused.
  auto zstd = NewCodec(proto::Codec::kZstd, 1);
  Bytes packed;
  REQUIRE(zstd->Compress(data, &packed).ok());
  packed[0] ^= 0x01;
  Bytes out;
  CHECK(zstd->Decompress(packed, data.size(), &out).code() == Code::kCorruption);
}

// The ratio we get from zstd level 1 equals what the zstd command line gets on
// the same bytes (the CLI adds a 4-byte checksum and may block differently).
TEST_CASE("zstd -1 ratio matches the zstd CLI", "[codec]") {
  // zstd is in scripts/install-deps.sh; a machine without it fails here on purpose.
  REQUIRE(cdp::testing::HaveProgram("zstd"));
  const Bytes data = MixedBytes(1 << 20, 12);
  auto codec = NewCodec(proto::Codec::kZstd, 1);
  Bytes packed;
  REQUIRE(codec->Compress(data, &packed).ok());

  // The external CLI needs a real file, so this test writes one directly.
  char path[] = "/tmp/cdp_codec_test_XXXXXX";
  const int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  size_t written = 0;
  while (written < data.size()) {
    const ssize_t n = write(fd, data.data() + written, data.size() - written);
    REQUIRE(n > 0);
    written += size_t(n);
  }
  close(fd);
  const auto out = cdp::testing::RunCommand({"sh", "-c", std::string("zstd -q -1 -c ") + path + " | wc -c"}, 60000);
  unlink(path);
  REQUIRE(out.exit_code == 0);
  const unsigned long long cli_size = std::stoull(out.output);
  REQUIRE(cli_size > 0);
  const double ours = double(data.size()) / double(packed.size());
  const double cli = double(data.size()) / double(cli_size);
  INFO("ours " << packed.size() << " bytes, cli " << cli_size << " bytes");
  CHECK(std::abs(ours - cli) / cli < 0.01);
  CHECK(ours > 1.5);  // the mixed sample does compress
}

}  // namespace
}  // namespace cdp

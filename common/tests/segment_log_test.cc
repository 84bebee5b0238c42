// SPDX-License-Identifier: Apache-2.0
// common/segment_log: names, the segment header, record framing, the writer,
// and the scanner's torn-tail vs corruption verdicts, on MemEnv and FaultEnv
// (a crash at every sync point).
#include "common/store/segment_log.h"

#include <cerrno>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "common/base/coding.h"
#include "common/env/env.h"
#include "common/env/fault_env.h"

namespace {

using cdp::Bytes;
using cdp::ByteSpan;
using cdp::Env;
using cdp::File;
using cdp::Status;
namespace seglog = cdp::seglog;

constexpr uint16_t kKind = 7;
constexpr size_t kHead = 8;  // the test's payload head: a u64 index

// Record i: head = i, data = (i * 13) % 50 bytes of value i.
Bytes Rec(uint64_t i) {
  uint8_t head[kHead];
  cdp::EncodeFixed64(head, i);
  Bytes data(size_t((i * 13) % 50), uint8_t(i));
  Bytes out;
  seglog::AppendRecord(ByteSpan(head, kHead), data, &out);
  return out;
}

seglog::ScanOptions Opts(bool verify = true) {
  seglog::ScanOptions o;
  o.max_payload = 1024;
  o.head_size = kHead;
  o.verify = verify;
  return o;
}

struct Scanned {
  std::vector<uint64_t> ids;
  std::vector<uint64_t> offsets;
  seglog::ScanResult result;
};

Scanned ScanAll(const File& f, const seglog::ScanOptions& o) {
  Scanned s;
  auto r = seglog::Scan(f, kKind, o, [&](const seglog::RecordView& v) -> cdp::Result<bool> {
    uint64_t id = cdp::DecodeFixed64(v.head.data());
    if (o.verify) {
      REQUIRE(v.payload.size() == v.payload_len);
      REQUIRE(v.payload.size() == kHead + (id * 13) % 50);
      for (size_t i = kHead; i < v.payload.size(); ++i) REQUIRE(v.payload[i] == uint8_t(id));
    }
    s.ids.push_back(id);
    s.offsets.push_back(v.offset);
    return true;
  });
  REQUIRE(r.ok());
  s.result = *r;
  return s;
}

// Writes a segment with records 1..n to "/log/<number>.seg"; returns its path.
std::string WriteSegment(Env* env, uint64_t n) {
  REQUIRE(env->CreateDirs("/log").ok());
  std::string path = "/log/" + seglog::FileName(1, ".seg");
  auto w = seglog::Writer::Create(env, path, seglog::Header{kKind, 1, 100}, true);
  REQUIRE(w.ok());
  for (uint64_t i = 1; i <= n; ++i) REQUIRE((*w)->Append(Rec(i)).ok());
  REQUIRE((*w)->Sync().ok());
  return path;
}

std::unique_ptr<File> OpenRw(Env* env, const std::string& path) {
  auto f = env->Open(path, cdp::OpenOptions{});
  REQUIRE(f.ok());
  return std::move(*f);
}

void FlipByte(File* f, uint64_t at) {
  uint8_t b = 0;
  REQUIRE(f->Read(at, 1, &b).ok());
  b ^= 0x10;
  REQUIRE(f->Write(at, ByteSpan(&b, 1)).ok());
}

uint64_t SizeOf(uint64_t first, uint64_t last) {
  uint64_t n = 0;
  for (uint64_t i = first; i <= last; ++i) n += Rec(i).size();
  return n;
}

}  // namespace

TEST_CASE("segment file names are 16 lower-case hex digits and a suffix", "[segment_log]") {
  CHECK(seglog::FileName(0x1a, ".jnl") == "000000000000001a.jnl");
  uint64_t n = 0;
  REQUIRE(seglog::ParseFileName("000000000000001a.jnl", ".jnl", &n));
  CHECK(n == 0x1a);
  REQUIRE(seglog::ParseFileName("ffffffffffffffff.spl", ".spl", &n));
  CHECK(n == UINT64_MAX);
  CHECK_FALSE(seglog::ParseFileName("000000000000001A.jnl", ".jnl", &n));
  CHECK_FALSE(seglog::ParseFileName("00000000000001a.jnl", ".jnl", &n));
  CHECK_FALSE(seglog::ParseFileName("000000000000001a.spl", ".jnl", &n));
  CHECK_FALSE(seglog::ParseFileName("000000000000001a.jnl.tmp", ".jnl", &n));
}

TEST_CASE("segment header round-trips, every field is checked", "[segment_log]") {
  Bytes h = seglog::EncodeHeader(seglog::Header{kKind, 9, 42});
  REQUIRE(h.size() == seglog::kHeaderSize);
  CHECK(cdp::DecodeFixed32(h.data()) == seglog::kMagic);
  CHECK(cdp::DecodeFixed16(h.data() + 4) == seglog::kVersion);
  auto d = seglog::DecodeHeader(h, kKind);
  REQUIRE(d.ok());
  CHECK(d->kind == kKind);
  CHECK(d->number == 9);
  CHECK(d->first_seq == 42);
  CHECK(seglog::DecodeHeader(h, kKind + 1).status().IsCorruption());
  CHECK(seglog::DecodeHeader(ByteSpan(h).first(31), kKind).status().IsCorruption());
  for (size_t i : {0, 4, 6, 9, 17, 24, 29}) {
    Bytes bad = h;
    bad[i] ^= 0x40;
    CHECK(seglog::DecodeHeader(bad, kKind).status().IsCorruption());
  }
}

TEST_CASE("records frame with length and CRC, DecodeRecord tells short from bad", "[segment_log]") {
  Bytes r = Rec(3);
  REQUIRE(r.size() == seglog::kFrameSize + kHead + 39);
  CHECK(cdp::DecodeFixed32(r.data() + 4) == kHead + 39);
  ByteSpan payload;
  size_t size = 0;
  REQUIRE(seglog::DecodeRecord(r, 1024, &payload, &size) == seglog::Decode::kOk);
  CHECK(size == r.size());
  CHECK(payload.size() == kHead + 39);
  CHECK(cdp::DecodeFixed64(payload.data()) == 3);
  CHECK(seglog::DecodeRecord(ByteSpan(r).first(r.size() - 1), 1024, &payload, &size) == seglog::Decode::kTruncated);
  CHECK(seglog::DecodeRecord(ByteSpan(r).first(7), 1024, &payload, &size) == seglog::Decode::kTruncated);
  CHECK(seglog::DecodeRecord(r, kHead + 38, &payload, &size) == seglog::Decode::kBad);
  for (size_t i = 0; i < r.size(); ++i) {
    Bytes bad = r;
    bad[i] ^= 0x01;
    INFO("byte " << i);
    CHECK(seglog::DecodeRecord(bad, 1024, &payload, &size) != seglog::Decode::kOk);
  }
}

TEST_CASE("the writer appends and the scanner returns every record in order", "[segment_log]") {
  auto env = cdp::NewMemEnv();
  std::string path = WriteSegment(env.get(), 20);
  auto f = OpenRw(env.get(), path);
  Scanned s = ScanAll(*f, Opts());
  REQUIRE(s.ids.size() == 20);
  for (uint64_t i = 0; i < 20; ++i) CHECK(s.ids[i] == i + 1);
  CHECK(s.offsets[0] == seglog::kHeaderSize);
  CHECK(s.result.records == 20);
  CHECK(s.result.header.number == 1);
  CHECK(s.result.header.first_seq == 100);
  CHECK(s.result.file_size == seglog::kHeaderSize + SizeOf(1, 20));
  CHECK(s.result.valid_end == s.result.file_size);
  CHECK_FALSE(s.result.torn_tail);
  CHECK_FALSE(s.result.corrupt);

  SECTION("start and limit select records 5..9") {
    auto o = Opts(false);
    o.start = s.offsets[4];
    o.limit = s.offsets[9];
    Scanned part = ScanAll(*f, o);
    CHECK(part.ids == std::vector<uint64_t>{5, 6, 7, 8, 9});
    CHECK(part.result.valid_end == s.offsets[9]);
    CHECK_FALSE(part.result.torn_tail);
  }
  SECTION("a header of another number or kind is corruption") {
    auto o = Opts();
    o.number = 2;
    CHECK(seglog::Scan(*f, kKind, o, nullptr).status().IsCorruption());
    CHECK(seglog::Scan(*f, kKind + 1, Opts(), nullptr).status().IsCorruption());
  }
  SECTION("a rejected record ends the valid part; an error ends the scan") {
    int calls = 0;
    auto r = seglog::Scan(*f, kKind, Opts(), [&](const seglog::RecordView& v) -> cdp::Result<bool> {
      ++calls;
      return cdp::DecodeFixed64(v.head.data()) != 7;
    });
    REQUIRE(r.ok());
    CHECK(calls == 7);
    CHECK(r->records == 6);
    CHECK(r->valid_end == s.offsets[6]);
    CHECK(r->torn_tail);
    CHECK(r->corrupt);  // record 8 after it is sound
    auto e = seglog::Scan(*f, kKind, Opts(), [&](const seglog::RecordView&) -> cdp::Result<bool> {
      return Status::IOError("stop");
    });
    CHECK(e.status().code() == cdp::Code::kIOError);
  }
  SECTION("Reopen truncates to the given end and appends there") {
    auto w = seglog::Writer::Reopen(OpenRw(env.get(), path), s.offsets[10]);
    REQUIRE(w.ok());
    CHECK(*env->FileSize(path) == s.offsets[10]);
    auto at = (*w)->Append(Rec(11));
    REQUIRE(at.ok());
    CHECK(*at == s.offsets[10]);
    REQUIRE((*w)->Sync().ok());
    Scanned again = ScanAll(*OpenRw(env.get(), path), Opts());
    CHECK(again.ids.size() == 11);
    CHECK(again.result.valid_end == s.offsets[10] + Rec(11).size());
  }
}

TEST_CASE("a torn tail is reported where the valid part ends, not as corruption", "[segment_log]") {
  auto env = cdp::NewMemEnv();
  std::string path = WriteSegment(env.get(), 6);
  uint64_t good = *env->FileSize(path);
  Bytes next = Rec(7);
  for (size_t cut : {size_t(1), size_t(7), size_t(8), next.size() / 2, next.size() - 1}) {
    INFO("cut " << cut);
    auto f = OpenRw(env.get(), path);
    REQUIRE(f->Truncate(good).ok());
    REQUIRE(f->Append(ByteSpan(next).first(cut)).ok());
    Scanned s = ScanAll(*f, Opts());
    CHECK(s.ids.size() == 6);
    CHECK(s.result.valid_end == good);
    CHECK(s.result.file_size == good + cut);
    CHECK(s.result.torn_tail);
    CHECK_FALSE(s.result.corrupt);
  }
}

TEST_CASE("a flipped byte ends the valid part, a good record after it marks corruption", "[segment_log]") {
  auto env = cdp::NewMemEnv();
  std::string path = WriteSegment(env.get(), 10);
  auto f = OpenRw(env.get(), path);
  std::vector<uint64_t> offs = ScanAll(*f, Opts()).offsets;
  uint64_t size = *env->FileSize(path);

  SECTION("in the data of record 4 of 10") {
    FlipByte(f.get(), offs[3] + seglog::kFrameSize + kHead + 1);  // record 4 has 2 data bytes
    Scanned s = ScanAll(*f, Opts());
    CHECK(s.ids == std::vector<uint64_t>{1, 2, 3});
    CHECK(s.result.valid_end == offs[3]);
    CHECK(s.result.torn_tail);
    CHECK(s.result.corrupt);
    // Without verification the data is not read: all ten pass.
    Scanned quick = ScanAll(*f, Opts(false));
    CHECK(quick.ids.size() == 10);
    CHECK(quick.result.valid_end == size);
    CHECK_FALSE(quick.result.torn_tail);
  }
  SECTION("in the CRC of the last record: torn, not corrupt") {
    FlipByte(f.get(), offs[9]);
    Scanned s = ScanAll(*f, Opts());
    CHECK(s.ids.size() == 9);
    CHECK(s.result.valid_end == offs[9]);
    CHECK(s.result.torn_tail);
    CHECK_FALSE(s.result.corrupt);
  }
  SECTION("a length out of range is bad even without verification") {
    uint8_t big[4];
    cdp::EncodeFixed32(big, 5000);
    REQUIRE(f->Write(offs[6] + 4, ByteSpan(big, 4)).ok());
    Scanned s = ScanAll(*f, Opts(false));
    CHECK(s.ids.size() == 6);
    CHECK(s.result.valid_end == offs[6]);
    CHECK(s.result.torn_tail);
    CHECK_FALSE(s.result.corrupt);  // its length leads nowhere
  }
  SECTION("the valid() check rejects a record by its fields") {
    auto o = Opts();
    o.valid = [](const seglog::RecordView& v) { return cdp::DecodeFixed64(v.head.data()) != 5; };
    Scanned s = ScanAll(*f, o);
    CHECK(s.ids == std::vector<uint64_t>{1, 2, 3, 4});
    CHECK(s.result.torn_tail);
    CHECK(s.result.corrupt);
  }
}

TEST_CASE("a crash at every sync point leaves exactly the synced records", "[segment_log]") {
  constexpr uint64_t kRecords = 8;
  // Sync points: 1 the new segment's file, 2 its directory, then one per record.
  uint64_t runs = 0;
  for (uint64_t n = 0;; ++n) {
    INFO("crash after " << n << " sync points");
    auto mem = cdp::NewMemEnv();
    REQUIRE(mem->CreateDirs("/log").ok());
    cdp::FaultEnv fault(mem.get());
    fault.SetCrashAfterSyncs(n);
    const std::string path = "/log/" + seglog::FileName(1, ".seg");
    uint64_t acked = 0;  // records whose Sync returned ok
    bool named = false;  // the directory sync returned ok
    [&] {
      auto w = seglog::Writer::Create(&fault, path, seglog::Header{kKind, 1, 1}, true);
      if (!w.ok() || !(*w)->Sync().ok()) return;
      if (!fault.SyncDir("/log").ok()) return;
      named = true;
      for (uint64_t i = 1; i <= kRecords; ++i) {
        if (!(*w)->Append(Rec(i)).ok() || !(*w)->Sync().ok()) return;
        acked = i;
      }
    }();
    bool finished = !fault.crashed();
    REQUIRE(fault.DropUnsyncedData().ok());
    ++runs;
    CHECK(named == (n >= 2));
    CHECK(acked == (n >= 2 ? std::min(n - 2, kRecords) : 0));
    if (!named) {
      CHECK_FALSE(fault.Exists(path));
    } else {
      auto f = fault.Open(path, cdp::OpenOptions{});
      REQUIRE(f.ok());
      Scanned s = ScanAll(**f, Opts());
      CHECK(s.ids.size() == acked);
      CHECK(s.result.valid_end == seglog::kHeaderSize + SizeOf(1, acked));
      CHECK(s.result.valid_end == s.result.file_size);
      CHECK_FALSE(s.result.torn_tail);
    }
    if (finished) break;
  }
  CHECK(runs == kRecords + 3);
}

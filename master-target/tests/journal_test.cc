// SPDX-License-Identifier: Apache-2.0
#include <catch2/catch.hpp>

#include <random>

#include "common/store/sqlite.h"
#include "common/tests/test_util.h"
#include "common/wire/codec.h"
#include "master-target/journal.h"
#include "master-target/undo_index.h"

using namespace cdp;
using namespace cdp::mt;

namespace {

Bytes RandomBytes(std::mt19937_64& rng, size_t n) {
  Bytes b(n);
  for (auto& x : b) x = uint8_t(rng());
  return b;
}

}  // namespace

TEST_CASE("segment names round-trip and reject other names", "[journal]") {
  uint64_t seg = 0;
  REQUIRE(SegmentFileName(0x1a) == "000000000000001a.jnl");
  REQUIRE(ParseSegmentName("000000000000001a.jnl", &seg));
  REQUIRE(seg == 0x1a);
  REQUIRE_FALSE(ParseSegmentName("000000000000001A.jnl", &seg));
  REQUIRE_FALSE(ParseSegmentName("00000000000001a.jnl", &seg));
  REQUIRE_FALSE(ParseSegmentName("000000000000001a.jnx", &seg));
  REQUIRE_FALSE(ParseSegmentName("../00000000001a.jnl", &seg));
}

TEST_CASE("segment header rejects bad magic, version and CRC", "[journal]") {
  Bytes h = EncodeSegmentHeader(SegmentHeader{7, 42});
  REQUIRE(h.size() == kSegmentHeaderSize);
  auto d = DecodeSegmentHeader(h);
  REQUIRE(d.ok());
  REQUIRE(d->segment == 7);
  REQUIRE(d->first_seq == 42);
  for (size_t i : {0, 4, 9, 17, 29}) {
    Bytes bad = h;
    bad[i] ^= 0x40;
    REQUIRE(DecodeSegmentHeader(bad).status().IsCorruption());
  }
}

TEST_CASE("records written by SegmentWriter scan back, torn tails are found", "[journal]") {
  auto env = NewMemEnv();
  REQUIRE(env->CreateDirs("/j").ok());
  std::mt19937_64 rng(1);
  auto w = SegmentWriter::Open(env.get(), "/j", 1, true, 1, 0, 1 << 20);
  REQUIRE(w.ok());
  struct Rec {
    uint64_t seq, off;
    Bytes old;
    bool zero;
  };
  std::vector<Rec> recs;
  Bytes buf;
  for (uint64_t s = 1; s <= 20; ++s) {
    Rec r{s, s * 4096, RandomBytes(rng, 512 * (1 + rng() % 8)), s % 3 == 0};
    if (r.zero) r.old.assign(r.old.size(), 0);
    EncodeUndoRecord(r.zero ? UndoKind::kZeroes : UndoKind::kData, r.seq, r.off, uint32_t(r.old.size()), 1000 + s,
                     r.zero ? ByteSpan() : ByteSpan(r.old), &buf);
    recs.push_back(r);
  }
  REQUIRE((*w)->Append(buf, 1).ok());
  REQUIRE((*w)->Sync().ok());
  const uint64_t end = (*w)->end();
  REQUIRE(end == kSegmentHeaderSize + buf.size());

  auto f = env->Open("/j/" + SegmentFileName(1), OpenOptions{});
  REQUIRE(f.ok());
  std::vector<std::pair<UndoHeader, UndoLocation>> got;
  auto scan = ScanSegment(**f, 1, 0, true, UINT64_MAX, [&](const UndoHeader& h, const UndoLocation& l) {
    got.emplace_back(h, l);
    return Status::OK();
  });
  REQUIRE(scan.ok());
  REQUIRE_FALSE(scan->torn_tail);
  REQUIRE(scan->valid_end == end);
  REQUIRE(got.size() == recs.size());
  for (size_t i = 0; i < recs.size(); ++i) {
    REQUIRE(got[i].first.seq == recs[i].seq);
    REQUIRE(got[i].first.offset == recs[i].off);
    REQUIRE(got[i].first.length == recs[i].old.size());
    REQUIRE(got[i].first.time_us == 1000 + recs[i].seq);
    REQUIRE(got[i].first.kind == (recs[i].zero ? UndoKind::kZeroes : UndoKind::kData));
    Bytes data(recs[i].old.size());
    REQUIRE(ReadUndoData(**f, got[i].first, got[i].second, data.data()).ok());
    REQUIRE(data == recs[i].old);
    Bytes slice(100);
    REQUIRE(ReadUndoSlice(**f, got[i].first, got[i].second, 7, 100, slice.data()).ok());
    REQUIRE(std::equal(slice.begin(), slice.end(), recs[i].old.begin() + 7));
  }

  SECTION("a truncated last record is a torn tail") {
    REQUIRE((*f)->Truncate(end - 3).ok());
    size_t n = 0;
    auto s = ScanSegment(**f, 1, 0, true, UINT64_MAX, [&](const UndoHeader&, const UndoLocation&) {
      ++n;
      return Status::OK();
    });
    REQUIRE(s.ok());
    REQUIRE(s->torn_tail);
    REQUIRE(n == recs.size() - 1);
    REQUIRE(s->valid_end == got.back().second.file_offset);
  }
  SECTION("a flipped data byte ends a verifying scan, and fails ReadUndoData") {
    const auto& victim = got[4];
    REQUIRE_FALSE(recs[4].zero);
    uint8_t b;
    uint64_t at = victim.second.file_offset + kRecordHeaderSize + 10;
    REQUIRE((*f)->Read(at, 1, &b).ok());
    b ^= 1;
    REQUIRE((*f)->Write(at, ByteSpan(&b, 1)).ok());
    size_t n = 0;
    auto s = ScanSegment(**f, 1, 0, true, UINT64_MAX, [&](const UndoHeader&, const UndoLocation&) {
      ++n;
      return Status::OK();
    });
    REQUIRE(s.ok());
    REQUIRE(s->torn_tail);
    REQUIRE(n == 4);
    Bytes data(victim.first.length);
    REQUIRE(ReadUndoData(**f, victim.first, victim.second, data.data()).IsCorruption());
  }
  SECTION("scanning from a record boundary and up to a limit") {
    size_t n = 0;
    auto s = ScanSegment(**f, 1, got[3].second.file_offset, false, got[8].second.file_offset,
                         [&](const UndoHeader& h, const UndoLocation&) {
                           REQUIRE(h.seq == 4 + n);
                           ++n;
                           return Status::OK();
                         });
    REQUIRE(s.ok());
    REQUIRE(n == 5);
  }
}

TEST_CASE("SegmentWriter rolls over to a new segment past segment_bytes", "[journal]") {
  auto env = NewMemEnv();
  REQUIRE(env->CreateDirs("/j").ok());
  auto w = SegmentWriter::Open(env.get(), "/j", 3, true, 1, 0, 200);
  REQUIRE(w.ok());
  std::vector<uint64_t> created;
  (*w)->on_new_segment = [&](uint64_t s, std::shared_ptr<File>) { created.push_back(s); };
  Bytes rec;
  EncodeUndoRecord(UndoKind::kData, 1, 0, 200, 1, Bytes(200, 7), &rec);
  auto l1 = (*w)->Append(rec, 1);
  REQUIRE(l1.ok());
  REQUIRE(l1->segment == 3);
  auto l2 = (*w)->Append(rec, 2);
  REQUIRE(l2.ok());
  REQUIRE(l2->segment == 4);
  REQUIRE(l2->file_offset == kSegmentHeaderSize);
  REQUIRE(created == std::vector<uint64_t>{4});
  REQUIRE((*w)->Sync().ok());
  auto names = env->ListDir("/j");
  REQUIRE(names.ok());
  REQUIRE(*names == std::vector<std::string>{SegmentFileName(3), SegmentFileName(4)});
}

TEST_CASE("old data is journalled as zeroes, zstd or as it is, and reads back the same", "[journal][zstd]") {
  auto env = NewMemEnv();
  REQUIRE(env->CreateDirs("/j").ok());
  auto w = SegmentWriter::Open(env.get(), "/j", 1, true, 1, 0, 1 << 20);
  REQUIRE(w.ok());
  std::mt19937_64 rng(9);
  Bytes text(64 << 10);  // compressible: words from a small alphabet
  for (auto& c : text) c = uint8_t('a' + rng() % 6);
  const Bytes random = RandomBytes(rng, 8192), zeros(4096, 0);
  Bytes buf;
  CHECK(EncodeOldData(1, 0, 10, zeros, 1, &buf) == UndoKind::kZeroes);
  CHECK(EncodeOldData(2, 1 << 20, 11, text, 1, &buf) == UndoKind::kZstd);
  CHECK(buf.size() < kRecordHeaderSize * 2 + text.size() / 2);  // stored compressed
  CHECK(EncodeOldData(3, 0, 12, random, 1, &buf) == UndoKind::kData);
  CHECK(EncodeOldData(4, 0, 13, text, 0, &buf) == UndoKind::kData);  // level 0: never compressed
  CHECK(EncodeOldData(5, 0, 14, text, 19, &buf) == UndoKind::kZstd);
  REQUIRE((*w)->Append(buf, 1).ok());
  auto f = env->Open("/j/" + SegmentFileName(1), OpenOptions{});
  REQUIRE(f.ok());
  std::vector<std::pair<UndoHeader, UndoLocation>> got;
  auto scan = ScanSegment(**f, 1, 0, true, UINT64_MAX, [&](const UndoHeader& h, const UndoLocation& l) {
    got.emplace_back(h, l);
    return Status::OK();
  });
  REQUIRE(scan.ok());
  REQUIRE_FALSE(scan->torn_tail);
  REQUIRE(got.size() == 5);
  const std::vector<const Bytes*> want{&zeros, &text, &random, &text, &text};
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("record " << i);
    Bytes data(got[i].first.length);
    REQUIRE(ReadUndoData(**f, got[i].first, got[i].second, data.data()).ok());
    CHECK(data == *want[i]);
    Bytes slice(1000);
    REQUIRE(ReadUndoSlice(**f, got[i].first, got[i].second, 3000, 1000, slice.data()).ok());
    CHECK(std::equal(slice.begin(), slice.end(), want[i]->begin() + 3000));
  }
  CHECK(got[1].first.kind == UndoKind::kZstd);
  CHECK(got[1].first.data_len < text.size() / 2);

  SECTION("a damaged frame fails its CRC") {
    const uint64_t at = got[1].second.file_offset + kRecordHeaderSize + 5;
    uint8_t b = 0;
    REQUIRE((*f)->Read(at, 1, &b).ok());
    b ^= 0xff;
    REQUIRE((*f)->Write(at, ByteSpan(&b, 1)).ok());
    Bytes data(text.size());
    CHECK(ReadUndoData(**f, got[1].first, got[1].second, data.data()).IsCorruption());
    Bytes slice(10);
    CHECK(ReadUndoSlice(**f, got[1].first, got[1].second, 0, 10, slice.data()).IsCorruption());
  }
  // Appends `rec` as the sixth record; what a verifying scan then finds of it.
  auto append_sixth = [&](const Bytes& rec) {
    REQUIRE((*w)->Append(rec, 6).ok());
    std::vector<std::pair<UndoHeader, UndoLocation>> all;
    auto s = ScanSegment(**f, 1, 0, true, UINT64_MAX, [&](const UndoHeader& h, const UndoLocation& l) {
      all.emplace_back(h, l);
      return Status::OK();
    });
    REQUIRE(s.ok());
    REQUIRE(all.size() == 6);
    return all[5];
  };
  SECTION("a frame of another length is refused, though its CRC matches") {
    // A record that claims 64 KiB but holds the frame of 32 KiB.
    Bytes short_rec, half(text.begin(), text.begin() + (32 << 10));
    auto codec = NewCodec(proto::Codec::kZstd, 1);
    Bytes frame;
    REQUIRE(codec->Compress(half, &frame).ok());
    EncodeUndoRecord(UndoKind::kZstd, 6, 0, uint32_t(text.size()), 15, frame, &short_rec);
    const auto [h, loc] = append_sixth(short_rec);
    Bytes data(text.size());
    CHECK(ReadUndoData(**f, h, loc, data.data()).IsCorruption());
  }
  SECTION("bytes that are no zstd frame are refused, though their CRC matches, by a read and by a slice") {
    // Found by a long run of the journal fuzz target (fuzz/seeds.cc "zstd-not-a-frame").
    Bytes rec;
    EncodeUndoRecord(UndoKind::kZstd, 6, 0, 4096, 15, Bytes(33, 0x5a), &rec);
    const auto [h, loc] = append_sixth(rec);
    Bytes data(4096);
    const Status whole = ReadUndoData(**f, h, loc, data.data());
    CHECK(whole.IsCorruption());
    CHECK(whole.ToString().find("does not decompress to its 4096 bytes") != std::string::npos);
    CHECK(ReadUndoSlice(**f, h, loc, 100, 10, data.data()).IsCorruption());
  }
}

namespace {

// An undo index in a fresh index database of a volume of `size` bytes.
struct IndexFixture {
  explicit IndexFixture(uint64_t size = 1 << 30) {
    auto d = sqlite::Db::Open(path());
    REQUIRE(d.ok());
    db = std::move(*d);
    auto i = UndoIndex::Open(db.get(), path(), size);
    INFO(i.status().ToString());
    REQUIRE(i.ok());
    idx = std::move(*i);
  }
  std::string path() const { return dir.path() + "/index.db"; }
  // Inserts and commits `entries` (ascending seq).
  void Add(const std::vector<UndoEntry>& entries) {
    auto tx = sqlite::Transaction::Begin(*db);
    REQUIRE(tx.ok());
    REQUIRE(idx->Insert(entries).ok());
    REQUIRE(tx->Commit().ok());
    idx->Committed();
  }
  std::vector<ReadPiece> Lookup(uint64_t point, uint64_t off, uint64_t len) {
    auto p = idx->Lookup(point, off, len);
    INFO(p.status().ToString());
    REQUIRE(p.ok());
    return *p;
  }
  cdp::testing::ScratchDir dir;
  std::unique_ptr<sqlite::Db> db;
  std::unique_ptr<UndoIndex> idx;
};

UndoEntry Entry(uint64_t seq, uint64_t off, uint32_t len) {
  return UndoEntry{seq, off, len, UndoKind::kData, 1, seq * 1000, 0, 0};
}

}  // namespace

TEST_CASE("UndoIndex answers the oldest record newer than the point", "[journal][index]") {
  IndexFixture f;
  f.Add({Entry(2, 0, 4096), Entry(3, 2048, 4096)});
  f.Add({Entry(5, 0, 8192), Entry(6, 1024, 512)});
  // Point 1: bytes [0,4096) from seq 2, [4096,6144) from seq 3, [6144,8192) from seq 5.
  auto p = f.Lookup(1, 0, 8192);
  REQUIRE(p.size() == 3);
  REQUIRE((p[0].from_undo && p[0].entry.seq == 2 && p[0].offset == 0 && p[0].length == 4096));
  REQUIRE((p[1].from_undo && p[1].entry.seq == 3 && p[1].offset == 4096 && p[1].length == 2048));
  REQUIRE((p[2].from_undo && p[2].entry.seq == 5 && p[2].offset == 6144 && p[2].length == 2048));
  CHECK(p[2].entry.file_offset == 5000);
  // Point 4: everything from seq 5.
  p = f.Lookup(4, 0, 8192);
  REQUIRE(p.size() == 1);
  REQUIRE(p[0].entry.seq == 5);
  // Point 5: [1024,1536) from seq 6, the rest from the replica.
  p = f.Lookup(5, 0, 8192);
  REQUIRE(p.size() == 3);
  REQUIRE((!p[0].from_undo && p[0].offset == 0 && p[0].length == 1024));
  REQUIRE((p[1].from_undo && p[1].entry.seq == 6 && p[1].offset == 1024 && p[1].length == 512));
  REQUIRE((!p[2].from_undo && p[2].offset == 1536 && p[2].length == 8192 - 1536));
  // Point 6: all replica.
  p = f.Lookup(6, 100, 50);
  REQUIRE(p.size() == 1);
  REQUIRE((!p[0].from_undo && p[0].offset == 100 && p[0].length == 50));
  CHECK(f.idx->size() == 4);
  CHECK(f.idx->max_length() == 8192);

  auto above = f.idx->EntriesBetween(2, 6);
  REQUIRE(above.ok());
  REQUIRE(above->size() == 3);
  REQUIRE((*above)[0].seq == 6);
  REQUIRE((*above)[2].seq == 3);
  auto window = f.idx->EntriesBetween(2, 5);
  REQUIRE(window.ok());
  REQUIRE(window->size() == 2);
  CHECK(((*window)[0].seq == 5 && (*window)[1].seq == 3));
  {
    auto tx = sqlite::Transaction::Begin(*f.db);
    REQUIRE(tx.ok());
    REQUIRE(f.idx->RemoveAbove(3).ok());
    REQUIRE(tx->Commit().ok());
    f.idx->Committed();
  }
  REQUIRE(f.idx->size() == 2);
  p = f.Lookup(3, 0, 8192);
  REQUIRE(p.size() == 1);
  REQUIRE(!p[0].from_undo);
  {
    auto tx = sqlite::Transaction::Begin(*f.db);
    REQUIRE(tx.ok());
    REQUIRE(f.idx->RemoveUpTo(2).ok());
    REQUIRE(tx->Commit().ok());
    f.idx->Committed();
  }
  REQUIRE(f.idx->size() == 1);
  p = f.Lookup(2, 0, 8192);
  REQUIRE(p.size() == 3);
  CHECK((p[1].from_undo && p[1].entry.seq == 3 && p[1].offset == 2048 && p[1].length == 4096));
}

// Regression (issue 17, export reads of an older point slower than nbdkit
// file): every seek of a lookup ran in a read transaction of its own, so a
// 4 KiB read of a point with rewrites after it took ~8 WAL read-lock rounds
// (32 fcntl calls, bench/export_profile.sh strace). Now one lookup is one read
// transaction, whatever its seeks, and a lookup the summary answers takes none.
TEST_CASE("UndoIndex: a lookup runs its seeks in one read transaction, none when the summary answers", "[journal][index]") {
  IndexFixture f(64 << 20);
  std::vector<UndoEntry> batch;
  for (uint64_t b = 0; b < 64; ++b) batch.push_back(Entry(10 + b, b * 8192, 4096));  // every other 4 KiB block
  f.Add(batch);
  REQUIRE(f.idx->lookup_transactions() == 0);
  // A 256 KiB read at point 9: 32 records, many seeks, one transaction.
  auto p = f.Lookup(9, 0, 256 << 10);
  REQUIRE(p.size() == 64);
  for (size_t i = 0; i < p.size(); ++i) CHECK(p[i].from_undo == (i % 2 == 0));
  CHECK(f.idx->lookup_transactions() == 1);
  p = f.Lookup(40, 4096, 4096);  // one seek or two
  CHECK(f.idx->lookup_transactions() == 2);
  // Past every record (the summary knows): no transaction.
  p = f.Lookup(100, 0, 256 << 10);
  REQUIRE(p.size() == 1);
  CHECK(!p[0].from_undo);
  CHECK(f.idx->lookup_transactions() == 2);
  // The transaction ended with the lookup: the writer commits and a later
  // lookup sees the new records.
  f.Add({Entry(200, 4096, 4096)});
  p = f.Lookup(150, 4096, 4096);
  REQUIRE(p.size() == 1);
  CHECK((p[0].from_undo && p[0].entry.seq == 200));
  CHECK(f.idx->lookup_transactions() == 3);
}

namespace {

// The specification of Lookup, by brute force: every record newer than the
// point that overlaps the read, painted oldest first.
std::vector<ReadPiece> Reference(const std::vector<UndoEntry>& all, uint64_t point, uint64_t off, uint64_t len) {
  std::vector<UndoEntry> cand;
  for (const UndoEntry& e : all) {
    if (e.seq > point && e.offset < off + len && e.offset + e.length > off) cand.push_back(e);
  }
  return PaintPieces(off, len, cand);
}

std::string Describe(const std::vector<ReadPiece>& v) {
  std::string s;
  for (const ReadPiece& p : v) {
    s += "[" + std::to_string(p.offset) + "+" + std::to_string(p.length) + " " +
         (p.from_undo ? "seq " + std::to_string(p.entry.seq) : std::string("replica")) + "]";
  }
  return s;
}

}  // namespace

// Issue #41 (a point with 1/8 of its blocks in the journal read at 0.5-0.6x
// nbdkit, plain, 1 MiB reads; 83% of the master target's instructions in
// UndoIndex::Lookup): with a long record in the index (max_length 256 KiB,
// an initial copy), each rewrite found was followed by a seek for later
// records at its offset, which lands on the next rewrite, and then by a
// seek from just past the rewrite, which found that same row again. The
// second answer now comes from the first: 36 seeks (one per rewrite, one
// for each of the 3 older copy records the walk meets past offset 0, one
// past the read) where there were 71.
TEST_CASE("UndoIndex: the seek past one record's rewrites answers the seek for the next record", "[journal][index]") {
  IndexFixture f(64 << 20);
  std::vector<UndoEntry> all;
  for (uint64_t i = 0; i < 4; ++i) all.push_back(Entry(1 + i, i * (256 << 10), 256 << 10));  // 1 MiB copy
  f.Add(all);
  std::vector<UndoEntry> rewrites;
  for (uint64_t b = 0; b < 256; b += 8) rewrites.push_back(Entry(100 + b, b * 4096 + 4096, 4096));  // 1 in 8
  f.Add(rewrites);
  all.insert(all.end(), rewrites.begin(), rewrites.end());
  REQUIRE(f.idx->max_length() == (256u << 10));
  const uint64_t before = f.idx->seeks();
  auto p = f.Lookup(99, 0, 1 << 20);
  CHECK(Describe(p) == Describe(Reference(all, 99, 0, 1 << 20)));
  CHECK(f.idx->seeks() - before == 36);
  // Every point and a few windows still equal the reference.
  for (uint64_t point : {0, 3, 99, 150, 400}) {
    for (uint64_t off : {uint64_t(0), uint64_t(4096), uint64_t(300) << 10}) {
      auto q = f.Lookup(point, off, 512 << 10);
      CHECK(Describe(q) == Describe(Reference(all, point, off, 512 << 10)));
    }
  }
}


// Issue #41 (export reads of an older point at 0.6-0.75x nbdkit): a 4 KiB read
// of a point with 4 KiB rewrites after it sought every rewritten start in the
// max_length() window before the read (256 KiB here, made long by an old bulk
// copy): ~2 seeks per rewritten block. Short records can only reach from
// kShortRecordBytes before the read, and the old long ones are pruned by the
// long records' summary.
TEST_CASE("UndoIndex: short rewrites before the window of short records cost no seek when the long records are "
          "older than the point",
          "[journal][index]") {
  IndexFixture f(64 << 20);
  std::vector<UndoEntry> all;
  std::vector<UndoEntry> bulk;
  for (uint64_t i = 0; i < 64; ++i) bulk.push_back(Entry(1 + i, i * (256 << 10), 256 << 10));  // 16 MiB copy
  f.Add(bulk);
  all = bulk;
  std::vector<UndoEntry> rewrites;
  for (uint64_t b = 0; b < 4096; b += 8) rewrites.push_back(Entry(100 + b, b * 4096, 4096));  // 1 in 8 blocks
  f.Add(rewrites);
  all.insert(all.end(), rewrites.begin(), rewrites.end());
  REQUIRE(f.idx->max_length() == (256u << 10));
  // Point 99 (after the copy, before the rewrites), 4 KiB reads at 8 MiB + k.
  const uint64_t before = f.idx->seeks();
  for (uint64_t k = 0; k < 16; ++k) {
    const uint64_t off = (8 << 20) + k * 4096;
    auto p = f.Lookup(99, off, 4096);
    INFO(off << ": " << Describe(p) << " want " << Describe(Reference(all, 99, off, 4096)));
    CHECK(Describe(p) == Describe(Reference(all, 99, off, 4096)));
  }
  const uint64_t per_read = (f.idx->seeks() - before) / 16;
  INFO("seeks per 4 KiB read: " << per_read);
  // 64 KiB back hold 2 rewritten starts; the 256 KiB window held 8 (16+ seeks).
  CHECK(per_read <= 6);
}

TEST_CASE("UndoIndex: lookups equal the brute-force reference for random short and long records and points",
          "[journal][index]") {
  IndexFixture f(32 << 20);
  std::mt19937_64 rng(41);
  std::vector<UndoEntry> all;
  uint64_t seq = 1;
  const uint32_t lengths[] = {512, 4096, 16384, 65536, 65537 & ~511u, 131072, 1 << 20};
  for (int batch = 0; batch < 40; ++batch) {
    std::vector<UndoEntry> b;
    const int n = 1 + int(rng() % 20);
    for (int i = 0; i < n; ++i) {
      const uint32_t len = lengths[rng() % 7];
      const uint64_t off = (rng() % ((32u << 20) - len)) & ~uint64_t(511);
      b.push_back(Entry(seq++, off, len));
    }
    f.Add(b);
    all.insert(all.end(), b.begin(), b.end());
  }
  for (int q = 0; q < 600; ++q) {
    const uint64_t point = rng() % seq;
    const uint64_t len = 512 * (1 + rng() % 512);
    const uint64_t off = (rng() % ((32u << 20) - len)) & ~uint64_t(511);
    auto p = f.Lookup(point, off, len);
    auto want = Reference(all, point, off, len);
    INFO("point " << point << " read " << off << "+" << len);
    REQUIRE(Describe(p) == Describe(want));
  }
}

// An index written before the long records' summary gets the column, filled
// with each region's max_seq (an over-estimate: correct), and opens.
TEST_CASE("UndoIndex: an index from before the long-record summary gets the column, opens and keeps its answers",
          "[journal][index]") {
  cdp::testing::ScratchDir dir;
  const std::string path = dir.path() + "/index.db";
  {
    auto d = sqlite::Db::Open(path);
    REQUIRE(d.ok());
    REQUIRE((*d)->Exec(R"sql(
CREATE TABLE undo(offset INTEGER NOT NULL, seq INTEGER NOT NULL, length INTEGER NOT NULL, kind INTEGER NOT NULL,
  segment INTEGER NOT NULL, file_offset INTEGER NOT NULL, crc INTEGER NOT NULL, time_us INTEGER NOT NULL,
  PRIMARY KEY (offset, seq)) WITHOUT ROWID;
CREATE INDEX undo_by_seq ON undo(seq);
CREATE TABLE undo_regions(region INTEGER PRIMARY KEY, max_seq INTEGER NOT NULL);
CREATE TABLE undo_meta(id INTEGER PRIMARY KEY CHECK (id = 1), region_shift INTEGER NOT NULL,
  records INTEGER NOT NULL, max_length INTEGER NOT NULL, built INTEGER NOT NULL);
INSERT INTO undo_meta VALUES(1, 20, 2, 1048576, 1);
INSERT INTO undo VALUES(0, 5, 1048576, 0, 1, 5000, 0, 0);
INSERT INTO undo VALUES(1118208, 7, 4096, 0, 1, 7000, 0, 0);
INSERT INTO undo_regions VALUES(0, 5);
INSERT INTO undo_regions VALUES(1, 7);
)sql").ok());
  }
  auto d = sqlite::Db::Open(path);
  REQUIRE(d.ok());
  {
    auto tx = sqlite::Transaction::Begin(**d);
    REQUIRE(tx.ok());
    REQUIRE(UndoIndex::AddLongSummary(d->get()).ok());
    REQUIRE(UndoIndex::AddLongSummary(d->get()).ok());  // once there, nothing more
    REQUIRE(tx->Commit().ok());
  }
  auto i = UndoIndex::Open(d->get(), path, 64 << 20);
  INFO(i.status().ToString());
  REQUIRE(i.ok());
  // The old summary's answers: the 1 MiB record (seq 5) covers the last
  // 4 KiB of the first MiB, and the 4 KiB record (seq 7) is found at
  // 1 MiB + 64 KiB.
  auto p = (*i)->Lookup(4, (1 << 20) - 4096, 4096);
  REQUIRE(p.ok());
  REQUIRE(p->size() == 1);
  CHECK(((*p)[0].from_undo && (*p)[0].entry.seq == 5));
  p = (*i)->Lookup(6, 1118208, 4096);
  REQUIRE(p.ok());
  REQUIRE(p->size() == 1);
  CHECK(((*p)[0].from_undo && (*p)[0].entry.seq == 7));
  auto st = (*d)->Prepare("SELECT region, long_max_seq FROM undo_regions ORDER BY region");
  REQUIRE(st.ok());
  REQUIRE(*st->Step());
  CHECK(st->ColumnInt64(1) == 5);
  REQUIRE(*st->Step());
  CHECK(st->ColumnInt64(1) == 7);
}

TEST_CASE("UndoIndex: staged records are seen at once, a discarded batch leaves nothing and a reopened index keeps "
          "what was committed",
          "[journal][index]") {
  IndexFixture f;
  f.Add({Entry(1, 4096, 4096)});
  f.idx->Stage(Entry(2, 0, 8192));
  auto p = f.Lookup(1, 0, 8192);
  REQUIRE(p.size() == 1);
  CHECK((p[0].from_undo && p[0].entry.seq == 2));
  p = f.Lookup(0, 0, 8192);  // seq 1 is older: it wins [4096, 8192)
  REQUIRE(p.size() == 2);
  CHECK((p[0].entry.seq == 2 && p[0].length == 4096 && p[1].entry.seq == 1));
  // The batch failed before its commit.
  {
    auto tx = sqlite::Transaction::Begin(*f.db);
    REQUIRE(tx.ok());
    REQUIRE(f.idx->Insert(std::vector<UndoEntry>{Entry(2, 0, 8192)}).ok());
    // rolled back by the destructor
  }
  f.idx->Discarded();
  p = f.Lookup(1, 0, 8192);
  REQUIRE(p.size() == 1);
  CHECK(!p[0].from_undo);
  CHECK(f.idx->size() == 1);
  // Another index over the same database (a restart) sees the committed records.
  auto again = UndoIndex::Open(f.db.get(), f.path(), 1 << 30);
  REQUIRE(again.ok());
  CHECK((*again)->size() == 1);
  CHECK((*again)->max_length() == 4096);
  auto q = (*again)->Lookup(0, 0, 8192);
  REQUIRE(q.ok());
  REQUIRE(q->size() == 2);
  CHECK(((*q)[1].from_undo && (*q)[1].entry.seq == 1));
  // Another volume size gives another summary: refused, not misread.
  CHECK(UndoIndex::Open(f.db.get(), f.path(), uint64_t(1) << 40).status().IsCorruption());
}

TEST_CASE("UndoIndex matches a brute-force model over random records and points", "[journal][index]") {
  IndexFixture f(64u << 20);  // regions of 1 MiB
  std::mt19937_64 rng(17);
  std::vector<UndoEntry> all;
  uint64_t seq = 0;
  for (int batch = 0; batch < 60; ++batch) {
    std::vector<UndoEntry> b;
    int n = 1 + int(rng() % 20);
    for (int i = 0; i < n; ++i) {
      // Mostly 4 KiB blocks in a few hot MiBs, some longer and unaligned ones.
      uint64_t off = (rng() % 4) * (8u << 20) + (rng() % 512) * 4096 + (rng() % 8 == 0 ? rng() % 4096 : 0);
      uint32_t len = rng() % 6 == 0 ? uint32_t(1 + rng() % (256 * 1024)) : 4096;
      b.push_back(Entry(++seq, off, len));
    }
    f.Add(b);
    all.insert(all.end(), b.begin(), b.end());
  }
  for (int q = 0; q < 400; ++q) {
    uint64_t point = rng() % (seq + 1);
    uint64_t off = (rng() % 4) * (8u << 20) + rng() % (3u << 20);
    uint64_t len = 1 + rng() % (300 * 1024);
    auto pieces = f.Lookup(point, off, len);
    // Byte by byte: the oldest record newer than the point that covers it.
    uint64_t at = off;
    for (const ReadPiece& p : pieces) {
      REQUIRE(p.offset == at);
      for (uint64_t x = p.offset; x < p.offset + p.length; x += 509) {
        const UndoEntry* want = nullptr;
        for (const UndoEntry& e : all) {
          if (e.seq > point && e.offset <= x && x < e.offset + e.length && (!want || e.seq < want->seq)) want = &e;
        }
        INFO("point " << point << " byte " << x);
        REQUIRE(p.from_undo == (want != nullptr));
        if (want) REQUIRE(p.entry.seq == want->seq);
      }
      at += p.length;
    }
    REQUIRE(at == off + len);
  }
}

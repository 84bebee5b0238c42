// SPDX-License-Identifier: Apache-2.0
// BranchStore (the original site's saved branch during failback) and
// BranchDevice (its read-only image over the live source volume).
#include "agent/branch_store.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <cerrno>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <thread>

#include "agent/branch_device.h"
#include "common/base/crc32c.h"
#include "common/env/fault_env.h"
#include "common/nbd/block_device.h"
#include "common/tests/test_util.h"

using cdp::Bytes;
using cdp::ByteSpan;
using cdp::Code;
using cdp::agent::BranchDevice;
using cdp::agent::BranchStore;

namespace {

constexpr uint32_t kBlock = 4096;
constexpr uint64_t kBlocks = 64;
constexpr uint64_t kSize = kBlocks * kBlock;
const std::string kPrefix = "/br/vol0.branch";
const std::string kIdx = kPrefix + ".idx";
const std::string kImg = kPrefix + ".img";
constexpr size_t kHeaderSize = 64;
constexpr size_t kRecordSize = 16;

BranchStore::Options Opts(cdp::Env* env, uint64_t size = kSize) {
  BranchStore::Options o;
  o.env = env;
  o.prefix = kPrefix;
  o.volume_size = size;
  o.block_size = kBlock;
  for (uint8_t i = 0; i < 16; ++i) o.uuid[i] = uint8_t(0xa0 + i);
  o.time_us = 1'790'000'000'000'000ull;
  return o;
}

// `count` blocks starting at `first`, each filled with a pattern unique to
// (block, tag).
Bytes Pattern(uint64_t first, uint64_t count, uint8_t tag) {
  Bytes b(count * kBlock);
  for (uint64_t i = 0; i < b.size(); ++i) {
    const uint64_t block = first + i / kBlock;
    b[i] = uint8_t(tag * 37 + block * 11 + (i % kBlock) * 3 + (i % kBlock) / 251);
  }
  return b;
}

ByteSpan Span(const Bytes& b) { return ByteSpan(b.data(), b.size()); }

std::unique_ptr<BranchStore> MustOpen(cdp::Env* env, uint64_t size = kSize) {
  auto s = BranchStore::Open(Opts(env, size));
  INFO(s.status().ToString());
  REQUIRE(s.ok());
  return std::move(*s);
}

Bytes ReadAll(BranchStore& st) {
  Bytes b(kSize, 0xee);
  REQUIRE(st.ReadSaved(0, uint32_t(kSize), b.data()).ok());
  return b;
}

// The expected image: `content[block]` for the blocks listed, zeros elsewhere.
Bytes Image(const std::map<uint64_t, uint8_t>& tag_of) {
  Bytes b(kSize, 0);
  for (const auto& [block, tag] : tag_of) {
    Bytes p = Pattern(block, 1, tag);
    std::copy(p.begin(), p.end(), b.begin() + block * kBlock);
  }
  return b;
}

std::set<uint64_t> SavedSet(const BranchStore& st) {
  std::set<uint64_t> out;
  for (uint64_t b = 0; b < kBlocks; ++b) {
    if (st.Contains(b)) out.insert(b);
  }
  return out;
}

void Corrupt(cdp::Env* env, const std::string& path, uint64_t offset) {
  auto f = std::move(*env->Open(path, cdp::OpenOptions{}));
  uint8_t b = 0;
  REQUIRE(f->Read(offset, 1, &b).ok());
  b ^= 0x40;
  REQUIRE(f->Write(offset, ByteSpan(&b, 1)).ok());
}

void AppendTo(cdp::Env* env, const std::string& path, const Bytes& data) {
  auto f = std::move(*env->Open(path, cdp::OpenOptions{}));
  REQUIRE(f->Append(Span(data)).ok());
}

Bytes Record(uint64_t first, uint32_t count) {
  Bytes r;
  cdp::PutFixed64(r, first);
  cdp::PutFixed32(r, count);
  cdp::PutFixed32(r, cdp::crc32c::Value(r.data(), r.size()));
  return r;
}

}  // namespace

TEST_CASE("branch store: save, contains, extents and read round trip, reopen restores", "[branch]") {
  auto mem = cdp::NewMemEnv();
  cdp::FaultEnv env(mem.get());
  REQUIRE(env.CreateDirs("/br").ok());
  {
    auto st = MustOpen(&env);
    REQUIRE(st->saved_blocks() == 0);
    REQUIRE(st->Extents().empty());
    REQUIRE(*env.FileSize(kIdx) == kHeaderSize);
    REQUIRE(*env.FileSize(kImg) == kSize);

    REQUIRE(st->Save(2 * kBlock, Span(Pattern(2, 3, 1))).ok());
    REQUIRE(st->Save(10 * kBlock, Span(Pattern(10, 1, 1))).ok());
    REQUIRE(st->saved_blocks() == 4);
    REQUIRE(SavedSet(*st) == std::set<uint64_t>{2, 3, 4, 10});
    REQUIRE_FALSE(st->Contains(kBlocks));
    using Extents = std::vector<std::pair<uint64_t, uint64_t>>;
    REQUIRE(st->Extents() == Extents{{2 * kBlock, 3 * kBlock}, {10 * kBlock, kBlock}});
    REQUIRE(ReadAll(*st) == Image({{2, 1}, {3, 1}, {4, 1}, {10, 1}}));

    // Blocks 2..4 keep their first content; 0, 1 and 5 are new: two runs.
    REQUIRE(st->Save(0, Span(Pattern(0, 6, 2))).ok());
    REQUIRE(st->saved_blocks() == 7);
    REQUIRE(st->Extents() == Extents{{0, 6 * kBlock}, {10 * kBlock, kBlock}});
    REQUIRE(ReadAll(*st) == Image({{0, 2}, {1, 2}, {2, 1}, {3, 1}, {4, 1}, {5, 2}, {10, 1}}));
    REQUIRE(*env.FileSize(kIdx) == kHeaderSize + 4 * kRecordSize);

    // A range already saved costs no I/O at all.
    env.ResetCounters();
    REQUIRE(st->Save(kBlock, Span(Pattern(1, 4, 3))).ok());
    REQUIRE(st->Save(0, ByteSpan()).ok());
    for (int op = 0; op < int(cdp::FaultEnv::Op::kCount); ++op) {
      REQUIRE(env.CallCount(cdp::FaultEnv::Op(op)) == 0);
    }

    // Unaligned: from inside a saved block, across the hole, into block 10.
    const Bytes img = Image({{0, 2}, {1, 2}, {2, 1}, {3, 1}, {4, 1}, {5, 2}, {10, 1}});
    const uint64_t at = 3 * kBlock + 100;
    Bytes part(7 * kBlock + 200, 0xee);
    REQUIRE(st->ReadSaved(at, uint32_t(part.size()), part.data()).ok());
    REQUIRE(part == Bytes(img.begin() + at, img.begin() + at + part.size()));
  }
  REQUIRE(env.DropUnsyncedData().ok());  // everything Save acknowledged was synced
  auto st = MustOpen(&env);
  REQUIRE(st->saved_blocks() == 7);
  REQUIRE(SavedSet(*st) == std::set<uint64_t>{0, 1, 2, 3, 4, 5, 10});
  REQUIRE(ReadAll(*st) == Image({{0, 2}, {1, 2}, {2, 1}, {3, 1}, {4, 1}, {5, 2}, {10, 1}}));
  REQUIRE(st->created_us() == Opts(&env).time_us);
  REQUIRE(st->uuid() == Opts(&env).uuid);
  // Reopened with another creation time: the recorded one stays.
  st.reset();
  auto o = Opts(&env);
  o.time_us = 5;
  auto again = BranchStore::Open(o);
  REQUIRE(again.ok());
  REQUIRE((*again)->created_us() == Opts(&env).time_us);
}

TEST_CASE("branch store: a block's first saved content is kept on a later save", "[branch]") {
  auto env = cdp::NewMemEnv();
  REQUIRE(env->CreateDirs("/br").ok());
  {
    auto st = MustOpen(env.get());
    REQUIRE(st->Save(7 * kBlock, Span(Pattern(7, 1, 1))).ok());
    // Failback re-run after a crash: the source now holds what failback wrote.
    REQUIRE(st->Save(7 * kBlock, Span(Pattern(7, 1, 2))).ok());
    REQUIRE(st->saved_blocks() == 1);
    REQUIRE(ReadAll(*st) == Image({{7, 1}}));
  }
  auto st = MustOpen(env.get());
  REQUIRE(st->Save(6 * kBlock, Span(Pattern(6, 2, 3))).ok());
  REQUIRE(ReadAll(*st) == Image({{6, 3}, {7, 1}}));
  REQUIRE(*env->FileSize(kIdx) == kHeaderSize + 2 * kRecordSize);
}

TEST_CASE("branch store: on a real directory, and Remove", "[branch]") {
  cdp::testing::ScratchDir dir;
  REQUIRE_FALSE(dir.path().empty());
  cdp::Env* env = cdp::DefaultEnv();
  auto o = Opts(env);
  o.prefix = dir.Join("vol0.branch");
  {
    auto st = std::move(*BranchStore::Open(o));
    REQUIRE(st->Save(kSize - 2 * kBlock, Span(Pattern(kBlocks - 2, 2, 4))).ok());
    REQUIRE(st->Save(0, Span(Pattern(0, 1, 4))).ok());
  }
  {
    auto st = BranchStore::Open(o);
    REQUIRE(st.ok());
    REQUIRE((*st)->saved_blocks() == 3);
    REQUIRE(ReadAll(**st) == Image({{0, 4}, {kBlocks - 2, 4}, {kBlocks - 1, 4}}));
  }
  REQUIRE(BranchStore::Remove(env, o.prefix).ok());
  REQUIRE_FALSE(env->Exists(o.prefix + ".idx"));
  REQUIRE_FALSE(env->Exists(o.prefix + ".img"));
  REQUIRE(BranchStore::Remove(env, o.prefix).ok());  // missing files are fine
  auto st = BranchStore::Open(o);
  REQUIRE(st.ok());
  REQUIRE((*st)->saved_blocks() == 0);
}

TEST_CASE("branch store: unaligned and out-of-range requests get exact errors", "[branch]") {
  auto env = cdp::NewMemEnv();
  REQUIRE(env->CreateDirs("/br").ok());
  auto st = MustOpen(env.get());
  Bytes one = Pattern(0, 1, 1);
  REQUIRE(st->Save(100, Span(one)).code() == Code::kInvalidArgument);
  REQUIRE(st->Save(0, ByteSpan(one.data(), 100)).code() == Code::kInvalidArgument);
  REQUIRE(st->Save(kSize, Span(one)).code() == Code::kOutOfRange);
  REQUIRE(st->Save(kSize - kBlock, Span(Pattern(0, 2, 1))).code() == Code::kOutOfRange);
  const uint64_t top = std::numeric_limits<uint64_t>::max() - kBlock + 1;  // aligned, wraps when added
  REQUIRE(st->Save(top, Span(one)).code() == Code::kOutOfRange);
  REQUIRE(st->saved_blocks() == 0);
  Bytes buf(kBlock);
  REQUIRE(st->ReadSaved(kSize - 10, 20, buf.data()).code() == Code::kOutOfRange);
  REQUIRE(st->ReadSaved(kSize - 10, 10, buf.data()).ok());
  st.reset();

  auto o = Opts(env.get());
  o.volume_size = kSize + 512;
  REQUIRE(BranchStore::Open(o).status().code() == Code::kInvalidArgument);
  o = Opts(env.get());
  o.block_size = 1000;
  REQUIRE(BranchStore::Open(o).status().code() == Code::kInvalidArgument);
  o = Opts(env.get());
  o.env = nullptr;
  REQUIRE(BranchStore::Open(o).status().code() == Code::kInvalidArgument);
}

TEST_CASE("branch store: an index for another volume is refused", "[branch]") {
  auto env = cdp::NewMemEnv();
  REQUIRE(env->CreateDirs("/br").ok());
  { MustOpen(env.get()); }
  REQUIRE(BranchStore::Open(Opts(env.get(), 2 * kSize)).status().code() == Code::kInvalidArgument);
  auto o = Opts(env.get());
  o.uuid[15] ^= 1;
  REQUIRE(BranchStore::Open(o).status().code() == Code::kInvalidArgument);
  o = Opts(env.get());
  o.block_size = 512;
  REQUIRE(BranchStore::Open(o).status().code() == Code::kInvalidArgument);
  REQUIRE(BranchStore::Open(Opts(env.get())).ok());  // the files were left alone
}

TEST_CASE("branch store: a bad header is corruption", "[branch]") {
  auto env = cdp::NewMemEnv();
  REQUIRE(env->CreateDirs("/br").ok());
  { MustOpen(env.get()); }
  SECTION("magic") { Corrupt(env.get(), kIdx, 0); }
  SECTION("creation time (crc)") { Corrupt(env.get(), kIdx, 41); }
  SECTION("crc") { Corrupt(env.get(), kIdx, 61); }
  SECTION("cut short") {
    auto f = std::move(*env->Open(kIdx, cdp::OpenOptions{}));
    REQUIRE(f->Truncate(kHeaderSize - 1).ok());
  }
  REQUIRE(BranchStore::Open(Opts(env.get())).status().code() == Code::kCorruption);
}

TEST_CASE("branch store: a torn tail of the index is cut off, a bad middle record is corruption", "[branch]") {
  auto env = cdp::NewMemEnv();
  REQUIRE(env->CreateDirs("/br").ok());
  {
    auto st = MustOpen(env.get());
    REQUIRE(st->Save(1 * kBlock, Span(Pattern(1, 2, 1))).ok());
    REQUIRE(st->Save(9 * kBlock, Span(Pattern(9, 1, 1))).ok());
  }
  const uint64_t good_size = kHeaderSize + 2 * kRecordSize;
  auto expect_two_records = [&] {
    auto st = MustOpen(env.get());
    REQUIRE(SavedSet(*st) == std::set<uint64_t>{1, 2, 9});
    REQUIRE(ReadAll(*st) == Image({{1, 1}, {2, 1}, {9, 1}}));
    REQUIRE(*env->FileSize(kIdx) == good_size);
  };

  SECTION("a partial record") {
    Bytes r = Record(20, 3);
    AppendTo(env.get(), kIdx, Bytes(r.begin(), r.begin() + 7));
    expect_two_records();
  }
  SECTION("a whole record with a bad crc, then a partial one") {
    Bytes r = Record(20, 3);
    r[12] ^= 1;
    Bytes p = Record(30, 1);
    r.insert(r.end(), p.begin(), p.begin() + 5);
    AppendTo(env.get(), kIdx, r);
    expect_two_records();
  }
  SECTION("zero-filled records (the file grew, the data never came)") {
    AppendTo(env.get(), kIdx, Bytes(3 * kRecordSize, 0));
    expect_two_records();
  }
  SECTION("a valid record after a bad one") {
    Bytes r = Record(20, 3);
    r[0] ^= 1;
    Bytes p = Record(30, 1);
    r.insert(r.end(), p.begin(), p.end());
    AppendTo(env.get(), kIdx, r);
    REQUIRE(BranchStore::Open(Opts(env.get())).status().code() == Code::kCorruption);
  }
  SECTION("a corrupted middle record") {
    Corrupt(env.get(), kIdx, kHeaderSize + 3);
    REQUIRE(BranchStore::Open(Opts(env.get())).status().code() == Code::kCorruption);
  }
  SECTION("a corrupted last record is a torn tail") {
    Corrupt(env.get(), kIdx, kHeaderSize + kRecordSize + 3);
    auto st = MustOpen(env.get());
    REQUIRE(SavedSet(*st) == std::set<uint64_t>{1, 2});
    REQUIRE(*env->FileSize(kIdx) == kHeaderSize + kRecordSize);
  }
  SECTION("a valid record outside the volume") {
    AppendTo(env.get(), kIdx, Record(kBlocks - 1, 2));
    REQUIRE(BranchStore::Open(Opts(env.get())).status().code() == Code::kCorruption);
  }
  SECTION("the data file is missing") {
    REQUIRE(env->Remove(kImg).ok());
    REQUIRE(BranchStore::Open(Opts(env.get())).status().code() == Code::kCorruption);
  }
}

TEST_CASE("branch store: a data file missing under an empty index is recreated", "[branch]") {
  auto env = cdp::NewMemEnv();
  REQUIRE(env->CreateDirs("/br").ok());
  { MustOpen(env.get()); }
  REQUIRE(env->Remove(kImg).ok());
  auto st = MustOpen(env.get());
  REQUIRE(*env->FileSize(kImg) == kSize);
  REQUIRE(st->Save(0, Span(Pattern(0, 1, 1))).ok());
}

namespace {

// The fault workloads: blocks 2 and 3 saved with tag 1, then Save(blocks 0..7,
// tag 2) — 0, 1 and 4..7 are new, in two runs.
const std::set<uint64_t> kOldSet = {2, 3};
const std::set<uint64_t> kNewSet = {0, 1, 2, 3, 4, 5, 6, 7};

std::unique_ptr<BranchStore> SetUpBase(cdp::Env* env) {
  REQUIRE(env->CreateDirs("/br").ok());
  auto st = MustOpen(env);
  REQUIRE(st->Save(2 * kBlock, Span(Pattern(2, 2, 1))).ok());
  return st;
}

cdp::Status SaveNew(BranchStore& st) { return st.Save(0, Span(Pattern(0, 8, 2))); }

// Reopens and checks the state is the old or the new one, every saved block
// holding the data saved for it; then a retry (tag 3) completes. Returns true
// when the reopened state was the new one.
bool CheckRecoveryAndRetry(cdp::Env* env) {
  auto st = MustOpen(env);
  const std::set<uint64_t> saved = SavedSet(*st);
  const bool is_new = saved == kNewSet;
  REQUIRE((is_new || saved == kOldSet));
  REQUIRE(st->saved_blocks() == saved.size());
  std::map<uint64_t, uint8_t> tags = {{2, 1}, {3, 1}};
  for (uint64_t b : kNewSet) {
    if (!tags.count(b)) tags[b] = is_new ? 2 : 3;
  }
  std::map<uint64_t, uint8_t> now;
  for (uint64_t b : saved) now[b] = tags[b];
  REQUIRE(ReadAll(*st) == Image(now));

  REQUIRE(st->Save(0, Span(Pattern(0, 8, 3))).ok());
  REQUIRE(SavedSet(*st) == kNewSet);
  REQUIRE(ReadAll(*st) == Image(tags));
  st.reset();
  auto again = MustOpen(env);
  REQUIRE(ReadAll(*again) == Image(tags));
  return is_new;
}

}  // namespace

TEST_CASE("branch store: a fault at every operation of a save leaves the old or the new state", "[branch][fault]") {
  // Count the operations of a clean save.
  std::array<uint64_t, size_t(cdp::FaultEnv::Op::kCount)> calls{};
  {
    auto mem = cdp::NewMemEnv();
    cdp::FaultEnv fault(mem.get());
    auto st = SetUpBase(&fault);
    fault.ResetCounters();
    REQUIRE(SaveNew(*st).ok());
    for (size_t op = 0; op < calls.size(); ++op) calls[op] = fault.CallCount(cdp::FaultEnv::Op(op));
  }
  REQUIRE(calls[size_t(cdp::FaultEnv::Op::kWrite)] == 2);   // one per run
  REQUIRE(calls[size_t(cdp::FaultEnv::Op::kAppend)] == 1);  // both records at once
  REQUIRE(calls[size_t(cdp::FaultEnv::Op::kSync)] == 2);    // the two sync points

  int cases = 0, new_states = 0;
  for (size_t op = 0; op < calls.size(); ++op) {
    for (uint64_t k = 0; k < calls[op]; ++k) {
      for (bool power_cut : {false, true}) {
        CAPTURE(cdp::FaultEnv::OpName(cdp::FaultEnv::Op(op)), k, power_cut);
        auto mem = cdp::NewMemEnv();
        cdp::FaultEnv fault(mem.get());
        auto st = SetUpBase(&fault);
        fault.InjectError(cdp::FaultEnv::Op(op), EIO, k);
        cdp::Status s = SaveNew(*st);
        REQUIRE(s.code() == Code::kIOError);
        REQUIRE(fault.InjectedFailures() == 1);
        REQUIRE(SavedSet(*st) == kOldSet);  // nothing new counts as saved
        st.reset();
        fault.ClearErrors();
        if (power_cut) REQUIRE(fault.DropUnsyncedData().ok());
        new_states += CheckRecoveryAndRetry(&fault) ? 1 : 0;
        ++cases;
      }
    }
  }
  REQUIRE(cases == 10);
  // Only a failed index sync without a power cut leaves the records readable.
  REQUIRE(new_states == 1);
}

TEST_CASE("branch store: a power cut at every sync point of create and save", "[branch][fault]") {
  int finished_at = -1;
  for (uint64_t n = 0; n < 32; ++n) {
    CAPTURE(n);
    auto mem = cdp::NewMemEnv();
    cdp::FaultEnv fault(mem.get());
    REQUIRE(fault.CreateDirs("/br").ok());
    fault.SetCrashAfterSyncs(n);
    bool saved_ok = false;
    {
      auto st = BranchStore::Open(Opts(&fault));
      if (st.ok()) {
        saved_ok = (*st)->Save(2 * kBlock, Span(Pattern(2, 2, 1))).ok();
        if (saved_ok) saved_ok = SaveNew(**st).ok();
      }
    }
    const bool finished = !fault.crashed();
    REQUIRE(finished == saved_ok);
    REQUIRE(fault.DropUnsyncedData().ok());
    fault.ClearErrors();
    auto st = MustOpen(&fault);
    const std::set<uint64_t> saved = SavedSet(*st);
    // Whatever survived is a prefix of the two saves, with its data.
    REQUIRE((saved.empty() || saved == kOldSet || saved == kNewSet));
    std::map<uint64_t, uint8_t> want;
    for (uint64_t b : saved) want[b] = (b == 2 || b == 3) ? 1 : 2;
    REQUIRE(ReadAll(*st) == Image(want));
    if (finished) {
      REQUIRE(saved == kNewSet);
      finished_at = int(n);
      break;
    }
  }
  // Create: .img sync, tmp index sync, dir sync; each save: two sync points.
  REQUIRE(finished_at == 7);
}

TEST_CASE("branch store: after a failed index sync every save fails until reopened", "[branch][fault]") {
  auto mem = cdp::NewMemEnv();
  cdp::FaultEnv fault(mem.get());
  auto st = SetUpBase(&fault);
  fault.InjectError(cdp::FaultEnv::Op::kSync, EIO, 1);  // the .img sync passes, the index sync fails
  REQUIRE(SaveNew(*st).code() == Code::kIOError);
  fault.ClearErrors();
  fault.ResetCounters();
  REQUIRE(st->Save(20 * kBlock, Span(Pattern(20, 1, 5))).code() == Code::kIOError);
  REQUIRE(fault.CallCount(cdp::FaultEnv::Op::kWrite) == 0);
  REQUIRE(st->saved_blocks() == 2);
  // A save of blocks already saved needs no index: still fine.
  REQUIRE(st->Save(2 * kBlock, Span(Pattern(2, 1, 5))).ok());
  st.reset();
  REQUIRE(CheckRecoveryAndRetry(&fault));  // the records did reach the (unsynced) file
}

namespace {

// A BlockDevice filter over `base` that calls `before_read` first: a test runs
// one failback step there, i.e. in the middle of a BranchDevice read.
class HookDevice : public cdp::BlockDevice {
 public:
  explicit HookDevice(std::shared_ptr<cdp::BlockDevice> base) : base_(std::move(base)) {}
  std::function<void(uint64_t, uint32_t)> before_read;
  uint64_t size() const override { return base_->size(); }
  bool read_only() const override { return base_->read_only(); }
  cdp::BlockDeviceFeatures features() const override { return base_->features(); }
  cdp::Status Read(uint64_t o, uint32_t n, uint8_t* b) override {
    if (before_read) before_read(o, n);
    return base_->Read(o, n, b);
  }
  cdp::Status Write(uint64_t o, ByteSpan d, bool fua) override { return base_->Write(o, d, fua); }
  cdp::Status WriteZeroes(uint64_t o, uint64_t n, bool fua, bool t) override {
    return base_->WriteZeroes(o, n, fua, t);
  }
  cdp::Status Trim(uint64_t o, uint64_t n, bool fua) override { return base_->Trim(o, n, fua); }
  cdp::Status Flush() override { return base_->Flush(); }

 private:
  std::shared_ptr<cdp::BlockDevice> base_;
};

struct DeviceFixture {
  std::unique_ptr<cdp::Env> env = cdp::NewMemEnv();
  std::shared_ptr<cdp::BlockDevice> source;
  std::shared_ptr<BranchStore> store;

  DeviceFixture() {
    REQUIRE(env->CreateDirs("/br").ok());
    cdp::FileBlockDevice::Options fo;
    fo.create_size = kSize;
    source = std::move(*cdp::FileBlockDevice::Open(env.get(), "/br/source.img", fo));
    // The original site's image: tag 7 everywhere.
    REQUIRE(source->Write(0, Span(Pattern(0, kBlocks, 7)), false).ok());
    store = MustOpen(env.get());
  }
  // One failback step: save the source's blocks, then overwrite them (tag 8).
  void Failback(uint64_t first, uint64_t count) {
    Bytes old(count * kBlock);
    REQUIRE(source->Read(first * kBlock, uint32_t(old.size()), old.data()).ok());
    REQUIRE(store->Save(first * kBlock, Span(old)).ok());
    REQUIRE(source->Write(first * kBlock, Span(Pattern(first, count, 8)), false).ok());
  }
};

}  // namespace

TEST_CASE("branch device: saved blocks from the store, the others from the live volume", "[branch][device]") {
  DeviceFixture fx;
  fx.Failback(1, 2);
  fx.Failback(40, 1);
  auto dev = BranchDevice::Open(fx.store, fx.source);
  REQUIRE(dev.ok());
  REQUIRE((*dev)->read_only());
  REQUIRE((*dev)->size() == kSize);
  REQUIRE((*dev)->preferred_block_size() == kBlock);
  REQUIRE_FALSE((*dev)->features().flush);

  const Bytes original = Pattern(0, kBlocks, 7);
  Bytes all(kSize);
  REQUIRE((*dev)->Read(0, uint32_t(kSize), all.data()).ok());
  REQUIRE(all == original);
  // The live volume really holds failback's content there.
  Bytes live(kBlock);
  REQUIRE(fx.source->Read(kBlock, kBlock, live.data()).ok());
  REQUIRE(live == Pattern(1, 1, 8));

  // Unaligned, across saved and unsaved blocks.
  Bytes part(3 * kBlock + 1000);
  const uint64_t at = kBlock - 300;
  REQUIRE((*dev)->Read(at, uint32_t(part.size()), part.data()).ok());
  REQUIRE(part == Bytes(original.begin() + at, original.begin() + at + part.size()));

  REQUIRE((*dev)->Write(0, Span(live), false).code() == Code::kPermissionDenied);
  REQUIRE((*dev)->WriteZeroes(0, kBlock, false, true).code() == Code::kPermissionDenied);
  REQUIRE((*dev)->Trim(0, kBlock, false).code() == Code::kPermissionDenied);
  REQUIRE((*dev)->Flush().ok());
  REQUIRE((*dev)->Read(kSize - 1, 2, part.data()).code() == Code::kOutOfRange);
  REQUIRE(fx.source->Read(0, uint32_t(kSize), all.data()).ok());  // nothing written through the device
  Bytes want = original;
  for (uint64_t b : {1, 2, 40}) {
    Bytes p = Pattern(b, 1, 8);
    std::copy(p.begin(), p.end(), want.begin() + b * kBlock);
  }
  REQUIRE(all == want);
}

TEST_CASE("branch device: a block failback overwrites during a read comes from the store", "[branch][device]") {
  DeviceFixture fx;
  auto hook = std::make_shared<HookDevice>(fx.source);
  bool stepped = false;
  hook->before_read = [&](uint64_t, uint32_t) {
    if (stepped) return;
    stepped = true;
    fx.Failback(5, 3);  // between the device's look at the store and its read of the base
  };
  auto dev = std::move(*BranchDevice::Open(fx.store, hook));
  Bytes got(10 * kBlock);
  REQUIRE(dev->Read(0, uint32_t(got.size()), got.data()).ok());
  REQUIRE(stepped);
  REQUIRE(got == Pattern(0, 10, 7));
}

TEST_CASE("branch device: the base must have the branch's size", "[branch][device]") {
  DeviceFixture fx;
  cdp::FileBlockDevice::Options fo;
  fo.create_size = kSize / 2;
  auto small = cdp::FileBlockDevice::Open(fx.env.get(), "/br/small.img", fo);
  REQUIRE(small.ok());
  REQUIRE(BranchDevice::Open(fx.store, *small).status().code() == Code::kInvalidArgument);
  REQUIRE(BranchDevice::Open(nullptr, fx.source).status().code() == Code::kInvalidArgument);
}

TEST_CASE("branch store: concurrent saves keep exactly one first content per block", "[branch]") {
  auto env = cdp::NewMemEnv();
  REQUIRE(env->CreateDirs("/br").ok());
  auto st = MustOpen(env.get());
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (uint8_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      // Each thread walks the volume in 3-block steps from its own start.
      for (uint64_t i = 0; i < kBlocks; ++i) {
        const uint64_t b = (i * 3 + t * 16) % (kBlocks - 2);
        if (!st->Save(b * kBlock, Span(Pattern(b, 3, t))).ok()) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  REQUIRE(failures == 0);
  const Bytes image = ReadAll(*st);
  REQUIRE(st->saved_blocks() == kBlocks);
  for (uint64_t b = 0; b < kBlocks; ++b) {
    CAPTURE(b);
    const Bytes got(image.begin() + b * kBlock, image.begin() + (b + 1) * kBlock);
    bool one_of = false;
    for (uint8_t t = 0; t < 4; ++t) one_of = one_of || got == Pattern(b, 1, t);
    REQUIRE(one_of);
  }
  st.reset();
  auto again = MustOpen(env.get());
  REQUIRE(ReadAll(*again) == image);
}

TEST_CASE("branch store: SaveMany saves several ranges with one sync per sync point, a block named twice keeps "
          "its first bytes, and one bad range fails the call with nothing written",
          "[branch]") {
  auto mem = cdp::NewMemEnv();
  cdp::FaultEnv env(mem.get());
  REQUIRE(env.CreateDirs("/br").ok());
  auto st = MustOpen(&env);
  const Bytes a = Pattern(1, 2, 1), b = Pattern(2, 1, 2), c = Pattern(20, 3, 3);
  const uint64_t syncs = env.CallCount(cdp::FaultEnv::Op::kSync);
  std::vector<BranchStore::Piece> pieces = {{1 * kBlock, Span(a)}, {2 * kBlock, Span(b)}, {20 * kBlock, Span(c)}};
  REQUIRE(st->SaveMany(pieces).ok());
  CHECK(env.CallCount(cdp::FaultEnv::Op::kSync) == syncs + 2);
  CHECK(SavedSet(*st) == std::set<uint64_t>{1, 2, 20, 21, 22});
  Bytes got(kBlock);
  REQUIRE(st->ReadSaved(2 * kBlock, kBlock, got.data()).ok());
  CHECK(got == Bytes(a.begin() + long(kBlock), a.end()));  // block 2's first bytes (piece a)
  // A bad range: nothing of the call is written.
  const uint64_t writes = env.CallCount(cdp::FaultEnv::Op::kWrite);
  std::vector<BranchStore::Piece> bad = {{30 * kBlock, Span(Pattern(30, 1, 4))}, {kSize, Span(Pattern(0, 1, 4))}};
  CHECK(st->SaveMany(bad).code() == cdp::Code::kOutOfRange);
  CHECK(env.CallCount(cdp::FaultEnv::Op::kWrite) == writes);
  CHECK_FALSE(st->Contains(30));
  // Reopened: the same set.
  st.reset();
  auto again = MustOpen(&env);
  CHECK(SavedSet(*again) == std::set<uint64_t>{1, 2, 20, 21, 22});
}

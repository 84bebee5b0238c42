// SPDX-License-Identifier: Apache-2.0
#include "common/env/file_cache_env.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/env/env.h"
#include "common/env/env_wrapper.h"
#include "common/env/fault_env.h"
#include "common/tests/test_util.h"

namespace cdp {
namespace {

// Counts the files of its base Env open at each moment, and the most ever.
class CountingEnv : public EnvWrapper {
 public:
  explicit CountingEnv(Env* base) : EnvWrapper(base) {}
  Result<std::unique_ptr<File>> Open(const std::string& p, const OpenOptions& o) override {
    CDP_ASSIGN_OR_RETURN(auto f, EnvWrapper::Open(p, o));
    ++opens;
    return std::unique_ptr<File>(new Counted(std::move(f), this));
  }
  std::atomic<int> open{0};
  std::atomic<int> most{0};
  std::atomic<int> opens{0};

 private:
  class Counted : public FileWrapper {
   public:
    Counted(std::unique_ptr<File> f, CountingEnv* env) : FileWrapper(std::move(f)), env_(env) {
      const int now = ++env_->open;
      int m = env_->most.load();
      while (now > m && !env_->most.compare_exchange_weak(m, now)) {
      }
    }
    ~Counted() override { --env_->open; }
    Status ReadBatch(std::span<const ReadOp> ops) const override { return base()->ReadBatch(ops); }
    Status WriteBatch(std::span<const WriteOp> ops) override { return base()->WriteBatch(ops); }

   private:
    CountingEnv* env_;
  };
};

Bytes Fill(size_t n, uint8_t v) { return Bytes(n, v); }

// Opens `path` through `env`, creating it.
std::unique_ptr<File> Create(Env* env, const std::string& path) {
  OpenOptions o;
  o.create = true;
  auto f = env->Open(path, o);
  INFO(path << ": " << f.status().ToString());
  REQUIRE(f.ok());
  return std::move(*f);
}

Bytes ReadAll(File* f) {
  auto size = f->Size();
  REQUIRE(size.ok());
  Bytes b(*size);
  REQUIRE(f->Read(0, b.size(), b.data()).ok());
  return b;
}

}  // namespace

TEST_CASE("file cache: 20 files through a cache of 3 keep at most 3 base files open, and every byte reads back",
          "[env][file_cache]") {
  auto mem = NewMemEnv();
  CountingEnv count(mem.get());
  FileCacheEnv cache(&count, 3);
  std::vector<std::unique_ptr<File>> files;
  for (int i = 0; i < 20; ++i) {
    OpenOptions o;
    o.create = true;
    auto f = cache.Open("/f" + std::to_string(i), o);
    REQUIRE(f.ok());
    REQUIRE((*f)->Write(0, Fill(100, uint8_t(i))).ok());
    files.push_back(std::move(*f));
  }
  CHECK(count.most.load() == 4);  // 3 kept + the one being opened
  CHECK(cache.open_files() == 3);
  // Round and round: every access to a closed file opens it again.
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 20; ++i) {
      REQUIRE((*files[size_t(i)]).Append(Fill(10, uint8_t(100 + round))).ok());
      REQUIRE(files[size_t(i)]->Sync().ok());
    }
  }
  for (int i = 0; i < 20; ++i) {
    Bytes want = Fill(100, uint8_t(i));
    for (int round = 0; round < 3; ++round) {
      Bytes r = Fill(10, uint8_t(100 + round));
      want.insert(want.end(), r.begin(), r.end());
    }
    CHECK(ReadAll(files[size_t(i)].get()) == want);
    CHECK(files[size_t(i)]->path() == "/f" + std::to_string(i));
  }
  CHECK(count.most.load() == 4);
  CHECK(cache.open_files() == 3);
  CHECK(cache.reopens() == uint64_t(count.opens.load()) - 20);
  CHECK(cache.evictions() == cache.reopens() + 17);
  files.clear();
  CHECK(count.open.load() == 0);
  CHECK(cache.open_files() == 0);
}

TEST_CASE("file cache: reopening applies neither create, exclusive nor truncate again", "[env][file_cache]") {
  auto mem = NewMemEnv();
  FileCacheEnv cache(mem.get(), 1);
  OpenOptions o;
  o.create = o.exclusive = o.truncate = true;
  auto opened = cache.Open("/a", o);
  REQUIRE(opened.ok());
  auto a = std::move(*opened);
  REQUIRE(a->Write(0, Fill(4096, 7)).ok());
  auto b = Create(&cache, "/b");  // closes /a
  CHECK(cache.open_files() == 1);
  CHECK(ReadAll(a.get()) == Fill(4096, 7));
  CHECK(cache.reopens() == 1);
}

TEST_CASE("file cache: writes not synced when the cache closes a file are synced first and survive a power cut",
          "[env][file_cache][fault]") {
  auto mem = NewMemEnv();
  FaultEnv fault(mem.get());
  FileCacheEnv cache(&fault, 1);
  auto a = Create(&cache, "/a");
  REQUIRE(fault.SyncDir("/").ok());
  REQUIRE(a->Write(0, Fill(8192, 1)).ok());
  const uint64_t syncs = fault.CallCount(FaultEnv::Op::kSync);
  auto b = Create(&cache, "/b");  // closes /a: syncs it first
  CHECK(fault.CallCount(FaultEnv::Op::kSync) == syncs + 1);
  // A clean file is closed without a sync.
  REQUIRE(b->Sync().ok());
  REQUIRE(fault.SyncDir("/").ok());
  REQUIRE(a->Write(8192, Fill(4096, 2)).ok());  // reopens /a, closes /b (clean)
  CHECK(fault.CallCount(FaultEnv::Op::kSync) == syncs + 2);
  // A Sync through the reopened file covers what was written before the close.
  REQUIRE(a->Sync().ok());
  b.reset();
  a.reset();
  REQUIRE(fault.DropUnsyncedData().ok());
  auto again = mem->Open("/a", {});
  REQUIRE(again.ok());
  Bytes want = Fill(8192, 1);
  Bytes tail = Fill(4096, 2);
  want.insert(want.end(), tail.begin(), tail.end());
  CHECK(ReadAll(again->get()) == want);
}

TEST_CASE("file cache: a failed sync at close is returned by every later Sync of that file",
          "[env][file_cache][fault]") {
  auto mem = NewMemEnv();
  FaultEnv fault(mem.get());
  FileCacheEnv cache(&fault, 1);
  auto a = Create(&cache, "/a");
  REQUIRE(a->Write(0, Fill(4096, 1)).ok());
  fault.InjectError(FaultEnv::Op::kSync, EIO);
  auto b = Create(&cache, "/b");  // the close of /a fails its sync
  fault.ClearErrors();
  const Status s1 = a->Sync();
  CHECK(s1.code() == Code::kIOError);
  CHECK(a->Sync().code() == Code::kIOError);
  CHECK(b->Sync().ok());
}

TEST_CASE("file cache: a file removed or renamed over while its handle is closed still reads its own bytes",
          "[env][file_cache]") {
  auto mem = NewMemEnv();
  CountingEnv count(mem.get());
  FileCacheEnv cache(&count, 1);
  auto a = Create(&cache, "/a");
  REQUIRE(a->Write(0, Fill(100, 1)).ok());
  auto c = Create(&cache, "/c");
  REQUIRE(c->Write(0, Fill(50, 3)).ok());
  auto b = Create(&cache, "/b");  // /a and /c are closed now
  REQUIRE(b->Write(0, Fill(70, 2)).ok());
  CHECK(count.open.load() == 1);

  REQUIRE(cache.Remove("/a").ok());
  CHECK(!cache.Exists("/a"));
  CHECK(ReadAll(a.get()) == Fill(100, 1));
  REQUIRE(cache.Rename("/c", "/b").ok());  // over /b, whose handle is open
  CHECK(ReadAll(b.get()) == Fill(70, 2));
  CHECK(ReadAll(c.get()) == Fill(50, 3));
  // Pinned files stay open, and are not counted against the bound.
  CHECK(cache.open_files() == 3);
  a.reset();
  b.reset();
  c.reset();
  CHECK(count.open.load() == 0);
  CHECK(cache.open_files() == 0);
}

TEST_CASE("file cache: a direct file is reopened direct, and its batches reach the base file", "[env][file_cache]") {
  testing::ScratchDir dir;
  auto posix = NewPosixEnv();
  FileCacheEnv cache(posix.get(), 1);
  OpenOptions o;
  o.create = true;
  o.direct = true;
  auto d = cache.Open(dir.path() + "/direct", o);
  REQUIRE(d.ok());
  const uint32_t align = (*d)->DirectAlignment();
  o.direct = false;
  auto other = cache.Open(dir.path() + "/other", o);  // closes the direct one
  REQUIRE(other.ok());
  CHECK((*d)->DirectAlignment() == align);
  const size_t n = align == 0 ? 4096 : align;
  Bytes w1 = Fill(n, 5), w2 = Fill(n, 6);
  const WriteOp writes[] = {{0, w1}, {n, w2}};
  REQUIRE((*d)->WriteBatch(writes).ok());
  REQUIRE((*other)->Write(0, Fill(10, 1)).ok());  // closes it again
  Bytes r1(n), r2(n);
  const ReadOp reads[] = {{0, n, r1.data()}, {n, n, r2.data()}};
  REQUIRE((*d)->ReadBatch(reads).ok());
  CHECK(r1 == w1);
  CHECK(r2 == w2);
  REQUIRE((*d)->Sync().ok());
}

TEST_CASE("file cache: 8 threads over 32 files through a cache of 4 read back every byte they wrote",
          "[env][file_cache]") {
  auto mem = NewMemEnv();
  CountingEnv count(mem.get());
  FileCacheEnv cache(&count, 4);
  constexpr int kFiles = 32, kThreads = 8, kBlocks = 64;
  std::vector<std::unique_ptr<File>> files;
  for (int i = 0; i < kFiles; ++i) {
    OpenOptions o;
    o.create = true;
    auto f = cache.Open("/f" + std::to_string(i), o);
    REQUIRE(f.ok());
    files.push_back(std::move(*f));
  }
  // Thread t owns blocks t, t + 8, ... of every file: distinct offsets.
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng{uint32_t(t)};
      for (int i = 0; i < 2000; ++i) {
        File* f = files[rng() % kFiles].get();
        const uint64_t block = uint64_t(t + kThreads * int(rng() % (kBlocks / kThreads)));
        const uint8_t v = uint8_t(block);
        if (!f->Write(block * 512, Fill(512, v)).ok()) ++failures;
        Bytes r(512);
        if (!f->Read(block * 512, 512, r.data()).ok() || r != Fill(512, v)) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(failures.load() == 0);
  CHECK(cache.open_files() <= 4);
  // At most the 4 kept plus, per call in flight, the file it uses and one
  // the cache closed for it and is closing.
  CHECK(count.most.load() <= 4 + 2 * kThreads);
  files.clear();
  CHECK(count.open.load() == 0);
}

}  // namespace cdp

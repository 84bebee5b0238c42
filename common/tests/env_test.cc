// SPDX-License-Identifier: Apache-2.0
// Env behaviour, run identically on the POSIX Env (in a mkdtemp directory),
// the in-memory Env and FaultEnv wrappers; then the FaultEnv durability model
// and error injection.
#include "common/env/env.h"
#include "common/env/file_cache_env.h"

#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/env/env_wrapper.h"
#include "common/env/fault_env.h"
#include "common/tests/test_util.h"

namespace cdp {
namespace {

using Op = FaultEnv::Op;

Bytes B(std::string_view s) { return Bytes(s.begin(), s.end()); }

Bytes Pattern(size_t n, uint32_t seed) {
  Bytes b(n);
  std::mt19937 rng(seed);
  for (auto& x : b) x = uint8_t(rng());
  return b;
}

// Removes `dir` and everything under it, through the Env.
void RemoveTree(Env* env, const std::string& dir) {
  auto names = env->ListDir(dir);
  if (!names.ok()) return;
  for (const auto& n : *names) {
    const std::string p = JoinPath(dir, n);
    auto size = env->FileSize(p);
    if (size.ok()) {
      (void)env->Remove(p);
    } else {
      RemoveTree(env, p);
    }
  }
  (void)env->RemoveDir(dir);
}

// Every file under `dir` with its content; directories as "name/".
std::map<std::string, Bytes> Snapshot(Env* env, const std::string& dir, const std::string& rel = "") {
  std::map<std::string, Bytes> out;
  auto names = env->ListDir(dir);
  REQUIRE(names.ok());
  for (const auto& n : *names) {
    const std::string p = JoinPath(dir, n);
    if (env->FileSize(p).ok()) {
      auto content = ReadWholeFile(env, p);
      REQUIRE(content.ok());
      out[rel + n] = *content;
    } else {
      out[rel + n + "/"] = {};
      auto sub = Snapshot(env, p, rel + n + "/");
      out.insert(sub.begin(), sub.end());
    }
  }
  return out;
}

Bytes ReadAll(Env* env, const std::string& path) {
  auto r = ReadWholeFile(env, path);
  REQUIRE(r.ok());
  return *r;
}

std::unique_ptr<File> OpenOrDie(Env* env, const std::string& path, bool create = true, bool truncate = false) {
  OpenOptions o;
  o.create = create;
  o.truncate = truncate;
  auto f = env->Open(path, o);
  REQUIRE(f.ok());
  return std::move(*f);
}

// An Env of the named kind with an empty directory `root` to play in.
struct EnvFixture {
  explicit EnvFixture(const std::string& kind) {
    if (kind == "posix" || kind == "fault-posix" || kind == "cache-posix") {
      base = NewPosixEnv();
      char tmpl[] = "/tmp/cdp-env-test-XXXXXX";
      REQUIRE(::mkdtemp(tmpl) != nullptr);
      root = tmpl;
      posix_root = root;
    } else {
      base = NewMemEnv();
      root = "/t/root";
      REQUIRE(base->CreateDirs(root).ok());
    }
    env = base.get();
    if (kind == "fault" || kind == "fault-posix") {
      fault = std::make_unique<FaultEnv>(base.get());
      env = fault.get();
    }
    // Every behaviour again through a file cache that keeps one file open.
    if (kind == "cache-posix" || kind == "cache-mem") {
      cache = std::make_unique<FileCacheEnv>(base.get(), 1);
      env = cache.get();
    }
  }
  ~EnvFixture() {
    cache.reset();
    fault.reset();
    if (!posix_root.empty()) RemoveTree(base.get(), posix_root);
  }
  std::string P(const std::string& name) const { return JoinPath(root, name); }

  std::unique_ptr<Env> base;
  std::unique_ptr<FaultEnv> fault;
  std::unique_ptr<FileCacheEnv> cache;
  Env* env = nullptr;
  std::string root;
  std::string posix_root;
};

#define ENV_KINDS GENERATE(as<std::string>{}, "posix", "mem", "fault", "fault-posix", "cache-posix", "cache-mem")

TEST_CASE("DirName and JoinPath", "[env]") {
  CHECK(DirName("a/b/c") == "a/b");
  CHECK(DirName("/a") == "/");
  CHECK(DirName("/") == "/");
  CHECK(DirName("a") == ".");
  CHECK(DirName("") == ".");
  CHECK(DirName("a/b/") == "a");
  CHECK(DirName("/x//y") == "/x");
  CHECK(JoinPath("a", "b") == "a/b");
  CHECK(JoinPath("a/", "b") == "a/b");
  CHECK(JoinPath("a", "/b") == "a/b");
  CHECK(JoinPath("", "b") == "b");
  CHECK(JoinPath("a", "") == "a");
}

TEST_CASE("Env write and read back byte for byte", "[env]") {
  const std::string kind = ENV_KINDS;
  EnvFixture fx(kind);
  INFO(kind);
  auto f = OpenOrDie(fx.env, fx.P("f"));
  const Bytes data = Pattern(10000, 1);
  REQUIRE(f->Write(0, data).ok());
  Bytes back(data.size());
  REQUIRE(f->Read(0, back.size(), back.data()).ok());
  CHECK(back == data);
  CHECK(*f->Size() == 10000);
  CHECK(*fx.env->FileSize(fx.P("f")) == 10000);

  // Past the end: Read refuses with kOutOfRange, ReadUpTo is short.
  Bytes buf(100);
  Status s = f->Read(9950, 100, buf.data());
  CHECK(s.code() == Code::kOutOfRange);
  auto n = f->ReadUpTo(9950, 100, buf.data());
  REQUIRE(n.ok());
  CHECK(*n == 50);
  CHECK(Bytes(buf.begin(), buf.begin() + 50) == Bytes(data.begin() + 9950, data.end()));
  n = f->ReadUpTo(20000, 100, buf.data());
  REQUIRE(n.ok());
  CHECK(*n == 0);
  CHECK(f->Read(10000, 0, buf.data()).ok());
  CHECK(f->Read(10001, 1, buf.data()).code() == Code::kOutOfRange);
}

TEST_CASE("Env append tracks the end of file", "[env]") {
  const std::string kind = ENV_KINDS;
  EnvFixture fx(kind);
  INFO(kind);
  auto f = OpenOrDie(fx.env, fx.P("log"));
  REQUIRE(f->Append(B("abc")).ok());
  REQUIRE(f->Append(B("de")).ok());
  CHECK(ReadAll(fx.env, fx.P("log")) == B("abcde"));
  REQUIRE(f->Write(10, B("X")).ok());  // a gap reads as zeros
  REQUIRE(f->Append(B("yz")).ok());
  CHECK(ReadAll(fx.env, fx.P("log")) == B(std::string("abcde\0\0\0\0\0Xyz", 13)));
  REQUIRE(f->Truncate(2).ok());
  REQUIRE(f->Append(B("!")).ok());
  CHECK(ReadAll(fx.env, fx.P("log")) == B("ab!"));
  f.reset();
  // A new handle appends at the existing end.
  auto g = OpenOrDie(fx.env, fx.P("log"), false);
  REQUIRE(g->Append(B("?")).ok());
  CHECK(ReadAll(fx.env, fx.P("log")) == B("ab!?"));
}

TEST_CASE("Env open flags", "[env]") {
  const std::string kind = ENV_KINDS;
  EnvFixture fx(kind);
  INFO(kind);
  OpenOptions o;
  auto missing = fx.env->Open(fx.P("nope"), o);
  REQUIRE(!missing.ok());
  CHECK(missing.status().code() == Code::kNotFound);
  CHECK(missing.status().errno_value() == ENOENT);
  CHECK(missing.status().message().find(fx.P("nope")) != std::string::npos);

  REQUIRE(OpenOrDie(fx.env, fx.P("f"))->Write(0, B("hello")).ok());
  o.create = true;
  o.exclusive = true;
  auto excl = fx.env->Open(fx.P("f"), o);
  REQUIRE(!excl.ok());
  CHECK(excl.status().code() == Code::kAlreadyExists);

  o = OpenOptions();
  o.read_only = true;
  auto ro = fx.env->Open(fx.P("f"), o);
  REQUIRE(ro.ok());
  CHECK(!(*ro)->Write(0, B("x")).ok());
  CHECK(!(*ro)->Append(B("x")).ok());
  CHECK(ReadAll(fx.env, fx.P("f")) == B("hello"));

  auto t = OpenOrDie(fx.env, fx.P("f"), false, true);
  CHECK(*t->Size() == 0);
  CHECK(*fx.env->FileSize(fx.P("f")) == 0);

  // Creating inside a missing directory fails; opening a directory fails.
  o = OpenOptions();
  o.create = true;
  auto nodir = fx.env->Open(fx.P("no/such/f"), o);
  REQUIRE(!nodir.ok());
  CHECK(nodir.status().code() == Code::kNotFound);
  REQUIRE(fx.env->CreateDirs(fx.P("d")).ok());
  CHECK(!fx.env->Open(fx.P("d"), OpenOptions()).ok());
  CHECK(!fx.env->FileSize(fx.P("d")).ok());
}

TEST_CASE("Env truncate, allocate and punch hole", "[env]") {
  const std::string kind = ENV_KINDS;
  EnvFixture fx(kind);
  INFO(kind);
  auto f = OpenOrDie(fx.env, fx.P("f"));
  const Bytes data = Pattern(3 * 4096, 2);
  REQUIRE(f->Write(0, data).ok());

  REQUIRE(f->Allocate(0, 4096).ok());  // inside: nothing changes
  CHECK(ReadAll(fx.env, fx.P("f")) == data);
  REQUIRE(f->Allocate(3 * 4096, 4096).ok());  // beyond: the file grows with zeros
  CHECK(*f->Size() == 4 * 4096);
  Bytes expect = data;
  expect.resize(4 * 4096, 0);
  CHECK(ReadAll(fx.env, fx.P("f")) == expect);

  Status ph = f->PunchHole(4096, 4096);
  if (kind == "posix" || kind == "fault-posix") {
    // ext4/xfs/tmpfs punch holes; only a file system that refuses may say so.
    REQUIRE((ph.ok() || ph.code() == Code::kNotSupported));
  } else {
    REQUIRE(ph.ok());
  }
  if (ph.ok()) {
    std::fill(expect.begin() + 4096, expect.begin() + 8192, 0);
    CHECK(*f->Size() == 4 * 4096);
    CHECK(ReadAll(fx.env, fx.P("f")) == expect);
  }

  REQUIRE(f->Truncate(100).ok());
  CHECK(*f->Size() == 100);
  REQUIRE(f->Truncate(200).ok());
  Bytes t(expect.begin(), expect.begin() + 100);
  t.resize(200, 0);
  CHECK(ReadAll(fx.env, fx.P("f")) == t);
  REQUIRE(f->Sync().ok());
}

TEST_CASE("Env rename and remove", "[env]") {
  const std::string kind = ENV_KINDS;
  EnvFixture fx(kind);
  INFO(kind);
  REQUIRE(OpenOrDie(fx.env, fx.P("a"))->Write(0, B("AAA")).ok());
  REQUIRE(OpenOrDie(fx.env, fx.P("b"))->Write(0, B("BB")).ok());
  auto held = OpenOrDie(fx.env, fx.P("a"), false);

  REQUIRE(fx.env->Rename(fx.P("a"), fx.P("b")).ok());  // replaces b
  CHECK(!fx.env->Exists(fx.P("a")));
  CHECK(ReadAll(fx.env, fx.P("b")) == B("AAA"));
  // A handle follows the file, not the name.
  REQUIRE(held->Write(3, B("+")).ok());
  CHECK(ReadAll(fx.env, fx.P("b")) == B("AAA+"));

  Status s = fx.env->Rename(fx.P("a"), fx.P("c"));
  CHECK(s.code() == Code::kNotFound);

  REQUIRE(fx.env->Remove(fx.P("b")).ok());
  CHECK(!fx.env->Exists(fx.P("b")));
  CHECK(fx.env->Remove(fx.P("b")).code() == Code::kNotFound);
  // Still readable through the open handle after the unlink.
  Bytes buf(4);
  REQUIRE(held->Read(0, 4, buf.data()).ok());
  CHECK(buf == B("AAA+"));
}

TEST_CASE("Env LockFile: one holder at a time, released when the lock is destroyed", "[env]") {
  const std::string kind = ENV_KINDS;
  EnvFixture fx(kind);
  INFO(kind);
  auto first = fx.env->LockFile(fx.P("LOCK"));
  REQUIRE(first.ok());
  CHECK(fx.env->Exists(fx.P("LOCK")));
  auto second = fx.env->LockFile(fx.P("LOCK"));
  REQUIRE(!second.ok());
  CHECK(second.status().code() == Code::kBusy);
  first->reset();
  CHECK(fx.env->LockFile(fx.P("LOCK")).ok());
}

TEST_CASE("Env directories", "[env]") {
  const std::string kind = ENV_KINDS;
  EnvFixture fx(kind);
  INFO(kind);
  REQUIRE(fx.env->CreateDirs(fx.P("x/y/z")).ok());
  REQUIRE(fx.env->CreateDirs(fx.P("x/y/z")).ok());  // exists: ok
  REQUIRE(fx.env->CreateDirs(fx.P("x/y/")).ok());
  CHECK(fx.env->Exists(fx.P("x/y/z")));
  for (const char* n : {"x/c", "x/a", "x/b"}) REQUIRE(OpenOrDie(fx.env, fx.P(n))->Append(B("1")).ok());
  auto names = fx.env->ListDir(fx.P("x"));
  REQUIRE(names.ok());
  CHECK(*names == std::vector<std::string>{"a", "b", "c", "y"});
  auto top = fx.env->ListDir(fx.root);
  REQUIRE(top.ok());
  CHECK(*top == std::vector<std::string>{"x"});

  CHECK(fx.env->ListDir(fx.P("nope")).status().code() == Code::kNotFound);
  CHECK(!fx.env->RemoveDir(fx.P("x/y")).ok());  // not empty
  CHECK(!fx.env->Remove(fx.P("x/y")).ok());     // a directory is not unlinked
  CHECK(!fx.env->CreateDirs(fx.P("x/a/q")).ok());  // x/a is a file
  REQUIRE(fx.env->RemoveDir(fx.P("x/y/z")).ok());
  CHECK(!fx.env->Exists(fx.P("x/y/z")));
  CHECK(fx.env->RemoveDir(fx.P("x/y/z")).code() == Code::kNotFound);

  REQUIRE(fx.env->SyncDir(fx.P("x")).ok());
  CHECK(fx.env->SyncDir(fx.P("nope")).code() == Code::kNotFound);
}

TEST_CASE("Env WriteFileAtomic and ReadWholeFile", "[env]") {
  const std::string kind = ENV_KINDS;
  EnvFixture fx(kind);
  INFO(kind);
  const Bytes one = Pattern(5000, 3), two = Pattern(70, 4);
  REQUIRE(WriteFileAtomic(fx.env, fx.P("meta"), one).ok());
  CHECK(ReadAll(fx.env, fx.P("meta")) == one);
  REQUIRE(WriteFileAtomic(fx.env, fx.P("meta"), two).ok());
  CHECK(ReadAll(fx.env, fx.P("meta")) == two);
  CHECK(*fx.env->ListDir(fx.root) == std::vector<std::string>{"meta"});  // no .tmp left
  auto missing = ReadWholeFile(fx.env, fx.P("none"));
  CHECK(missing.status().code() == Code::kNotFound);
}

TEST_CASE("Env concurrent writes at distinct offsets", "[env]") {
  const std::string kind = ENV_KINDS;
  EnvFixture fx(kind);
  INFO(kind);
  auto f = OpenOrDie(fx.env, fx.P("shared"));
  constexpr int kThreads = 4, kBlocks = 64, kBlock = 512;
  std::vector<std::thread> threads;
  std::vector<Status> results(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = t; i < kBlocks; i += kThreads) {
        Status s = f->Write(uint64_t(i) * kBlock, Pattern(kBlock, uint32_t(100 + i)));
        if (!s.ok()) {
          results[t] = s;
          return;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const auto& s : results) REQUIRE(s.ok());
  Bytes expect;
  for (int i = 0; i < kBlocks; ++i) PutBytes(expect, Pattern(kBlock, uint32_t(100 + i)));
  CHECK(ReadAll(fx.env, fx.P("shared")) == expect);
}

TEST_CASE("POSIX Env O_DIRECT open and aligned I/O", "[env]") {
  EnvFixture fx("posix");
  OpenOptions o;
  o.create = true;
  o.direct = true;
  auto f = fx.env->Open(fx.P("direct"), o);
  // ext4 accepts O_DIRECT; a file system that refuses must say so with EINVAL.
  if (!f.ok()) {
    CHECK(f.status().errno_value() == EINVAL);
    return;
  }
  void* mem = nullptr;
  REQUIRE(::posix_memalign(&mem, 4096, 8192) == 0);
  std::unique_ptr<uint8_t, decltype(&std::free)> buf(static_cast<uint8_t*>(mem), &std::free);
  const Bytes data = Pattern(8192, 9);
  std::copy(data.begin(), data.end(), buf.get());
  REQUIRE((*f)->Write(0, ByteSpan(buf.get(), 8192)).ok());
  std::fill(buf.get(), buf.get() + 8192, 0);
  REQUIRE((*f)->Read(0, 8192, buf.get()).ok());
  CHECK(Bytes(buf.get(), buf.get() + 8192) == data);
}

// ---------------------------------------------------------------------------
// FaultEnv: the durability model.

struct FaultFixture {
  FaultFixture() : base(NewMemEnv()), fault(base.get()) { REQUIRE(fault.CreateDirs(dir).ok()); }
  std::string P(const std::string& n) const { return JoinPath(dir, n); }
  // Creates `name` with `content`, synced and durably named.
  void Durable(const std::string& name, const Bytes& content) {
    auto f = OpenOrDie(&fault, P(name));
    REQUIRE(f->Write(0, content).ok());
    REQUIRE(f->Sync().ok());
    REQUIRE(fault.SyncDir(dir).ok());
  }
  std::unique_ptr<Env> base;
  FaultEnv fault;
  const std::string dir = "/data";
};

TEST_CASE("FaultEnv drops bytes written after the last sync and keeps those before", "[fault]") {
  FaultFixture fx;
  auto f = OpenOrDie(&fx.fault, fx.P("log"));
  REQUIRE(fx.fault.SyncDir(fx.dir).ok());
  const Bytes synced = Pattern(10000, 5);
  REQUIRE(f->Append(synced).ok());
  REQUIRE(f->Sync().ok());
  REQUIRE(f->Append(Pattern(3000, 6)).ok());
  REQUIRE(fx.fault.DropUnsyncedData().ok());
  CHECK(ReadAll(&fx.fault, fx.P("log")) == synced);
  CHECK(ReadAll(fx.base.get(), fx.P("log")) == synced);
  // The handle belongs to the process that "died".
  CHECK(f->Append(B("x")).code() == Code::kAborted);
  CHECK(f->Read(0, 1, Bytes(1).data()).code() == Code::kAborted);
}

TEST_CASE("FaultEnv undoes unsynced overwrites, truncates, holes and O_TRUNC", "[fault]") {
  FaultFixture fx;
  const Bytes original = Pattern(5 * 4096 + 123, 7);
  fx.Durable("f", original);

  SECTION("overwrite across blocks") {
    auto f = OpenOrDie(&fx.fault, fx.P("f"), false);
    REQUIRE(f->Write(4000, Pattern(9000, 8)).ok());
    REQUIRE(f->Write(5 * 4096, Pattern(9000, 9)).ok());  // and past the end
  }
  SECTION("truncate then regrow") {
    auto f = OpenOrDie(&fx.fault, fx.P("f"), false);
    REQUIRE(f->Truncate(10).ok());
    REQUIRE(f->Write(7000, B("zz")).ok());
  }
  SECTION("punch hole and allocate") {
    auto f = OpenOrDie(&fx.fault, fx.P("f"), false);
    REQUIRE(f->PunchHole(100, 9000).ok());
    REQUIRE(f->Allocate(0, 1 << 20).ok());
  }
  SECTION("open with truncate") {
    auto f = OpenOrDie(&fx.fault, fx.P("f"), false, true);
    REQUIRE(f->Append(B("new")).ok());
  }
  CHECK(ReadAll(&fx.fault, fx.P("f")) != original);
  REQUIRE(fx.fault.DropUnsyncedData().ok());
  CHECK(ReadAll(&fx.fault, fx.P("f")) == original);
}

TEST_CASE("FaultEnv keeps everything that was synced", "[fault]") {
  FaultFixture fx;
  fx.Durable("f", B("first"));
  auto f = OpenOrDie(&fx.fault, fx.P("f"), false);
  REQUIRE(f->Write(0, B("FI")).ok());
  REQUIRE(f->Append(B("-second")).ok());
  REQUIRE(f->Sync().ok());
  REQUIRE(fx.fault.DropUnsyncedData().ok());
  CHECK(ReadAll(&fx.fault, fx.P("f")) == B("FIrst-second"));
}

TEST_CASE("FaultEnv: a file whose directory was not synced disappears", "[fault]") {
  FaultFixture fx;
  fx.Durable("old", B("kept"));
  auto f = OpenOrDie(&fx.fault, fx.P("new"));
  REQUIRE(f->Append(B("data")).ok());
  REQUIRE(f->Sync().ok());  // the data is synced, the name is not
  REQUIRE(fx.fault.DropUnsyncedData().ok());
  CHECK(!fx.fault.Exists(fx.P("new")));
  CHECK(*fx.fault.ListDir(fx.dir) == std::vector<std::string>{"old"});
  CHECK(ReadAll(&fx.fault, fx.P("old")) == B("kept"));

  // With the directory synced the file survives, with its synced bytes only.
  auto g = OpenOrDie(&fx.fault, fx.P("new"));
  REQUIRE(fx.fault.SyncDir(fx.dir).ok());
  REQUIRE(g->Append(B("unsynced")).ok());
  REQUIRE(fx.fault.DropUnsyncedData().ok());
  CHECK(fx.fault.Exists(fx.P("new")));
  CHECK(ReadAll(&fx.fault, fx.P("new")).empty());
}

TEST_CASE("FaultEnv: a rename not made durable reverts", "[fault]") {
  FaultFixture fx;
  fx.Durable("a", B("AAAA"));
  fx.Durable("b", B("BB"));
  REQUIRE(fx.fault.Rename(fx.P("a"), fx.P("b")).ok());
  CHECK(ReadAll(&fx.fault, fx.P("b")) == B("AAAA"));

  SECTION("not synced: both names come back") {
    REQUIRE(fx.fault.DropUnsyncedData().ok());
    CHECK(ReadAll(&fx.fault, fx.P("a")) == B("AAAA"));
    CHECK(ReadAll(&fx.fault, fx.P("b")) == B("BB"));
  }
  SECTION("synced: the rename holds") {
    REQUIRE(fx.fault.SyncDir(fx.dir).ok());
    REQUIRE(fx.fault.DropUnsyncedData().ok());
    CHECK(!fx.fault.Exists(fx.P("a")));
    CHECK(ReadAll(&fx.fault, fx.P("b")) == B("AAAA"));
  }
  SECTION("across directories: each side needs its own SyncDir") {
    REQUIRE(fx.fault.CreateDirs("/other").ok());
    REQUIRE(fx.fault.Rename(fx.P("b"), "/other/b").ok());
    REQUIRE(fx.fault.SyncDir("/other").ok());  // new name durable, old removal not
    REQUIRE(fx.fault.DropUnsyncedData().ok());
    CHECK(ReadAll(&fx.fault, "/other/b") == B("AAAA"));  // b named a's file then
    CHECK(ReadAll(&fx.fault, fx.P("a")) == B("AAAA"));
    CHECK(ReadAll(&fx.fault, fx.P("b")) == B("BB"));
  }
}

TEST_CASE("FaultEnv: a remove not made durable reverts", "[fault]") {
  FaultFixture fx;
  fx.Durable("f", B("synced"));
  auto h = OpenOrDie(&fx.fault, fx.P("f"), false);
  REQUIRE(h->Append(B("+lost")).ok());
  REQUIRE(fx.fault.Remove(fx.P("f")).ok());
  CHECK(!fx.fault.Exists(fx.P("f")));

  SECTION("not synced") {
    REQUIRE(fx.fault.DropUnsyncedData().ok());
    CHECK(ReadAll(&fx.fault, fx.P("f")) == B("synced"));
  }
  SECTION("synced") {
    REQUIRE(fx.fault.SyncDir(fx.dir).ok());
    REQUIRE(fx.fault.DropUnsyncedData().ok());
    CHECK(!fx.fault.Exists(fx.P("f")));
  }
  SECTION("a new file under the removed name, not synced") {
    REQUIRE(OpenOrDie(&fx.fault, fx.P("f"))->Append(B("other")).ok());
    REQUIRE(fx.fault.DropUnsyncedData().ok());
    CHECK(ReadAll(&fx.fault, fx.P("f")) == B("synced"));
  }
}

TEST_CASE("FaultEnv takes files already in the base Env as durable", "[fault]") {
  auto base = NewMemEnv();
  REQUIRE(base->CreateDirs("/d").ok());
  REQUIRE(OpenOrDie(base.get(), "/d/pre")->Write(0, B("before")).ok());
  FaultEnv fault(base.get());
  REQUIRE(OpenOrDie(&fault, "/d/pre", false)->Write(0, B("AFTER!")).ok());
  REQUIRE(fault.DropUnsyncedData().ok());
  CHECK(ReadAll(&fault, "/d/pre") == B("before"));
}

// A random workload of writes, appends, truncates, holes and syncs on one file
// against a shadow copy of what was synced.
TEST_CASE("FaultEnv random workload matches a shadow of the synced content", "[fault]") {
  std::mt19937 rng(42);
  for (int round = 0; round < 30; ++round) {
    FaultFixture fx;
    auto f = OpenOrDie(&fx.fault, fx.P("f"));
    REQUIRE(fx.fault.SyncDir(fx.dir).ok());
    Bytes live, synced;
    const int ops = 1 + int(rng() % 60);
    for (int i = 0; i < ops; ++i) {
      const uint64_t off = rng() % 20000, len = 1 + rng() % 9000;
      switch (rng() % 6) {
        case 0: {
          Bytes d = Pattern(len, rng());
          REQUIRE(f->Write(off, d).ok());
          if (live.size() < off + len) live.resize(off + len, 0);
          std::copy(d.begin(), d.end(), live.begin() + long(off));
          break;
        }
        case 1: {
          Bytes d = Pattern(len, rng());
          REQUIRE(f->Append(d).ok());
          PutBytes(live, d);
          break;
        }
        case 2:
          REQUIRE(f->Truncate(off).ok());
          live.resize(off, 0);
          break;
        case 3:
          REQUIRE(f->PunchHole(off, len).ok());
          if (off < live.size()) {
            std::fill(live.begin() + long(off), live.begin() + long(std::min<uint64_t>(live.size(), off + len)), 0);
          }
          break;
        case 4:
          REQUIRE(f->Allocate(off, len).ok());
          if (live.size() < off + len) live.resize(off + len, 0);
          break;
        default:
          REQUIRE(f->Sync().ok());
          synced = live;
          break;
      }
    }
    CHECK(ReadAll(&fx.fault, fx.P("f")) == live);
    REQUIRE(fx.fault.DropUnsyncedData().ok());
    INFO("round " << round);
    CHECK(ReadAll(&fx.fault, fx.P("f")) == synced);
  }
}

// ---------------------------------------------------------------------------
// FaultEnv: error injection.

TEST_CASE("FaultEnv injects ENOSPC and EIO at the chosen call", "[fault]") {
  FaultFixture fx;
  auto f = OpenOrDie(&fx.fault, fx.P("f"));
  const uint64_t before = fx.fault.CallCount(Op::kWrite);
  fx.fault.InjectError(Op::kWrite, ENOSPC, 2);
  REQUIRE(f->Write(0, B("one")).ok());
  REQUIRE(f->Write(3, B("two")).ok());
  Status s = f->Write(6, B("three"));
  CHECK(s.code() == Code::kNoSpace);
  CHECK(s.errno_value() == ENOSPC);
  CHECK(ReadAll(&fx.fault, fx.P("f")) == B("onetwo"));
  REQUIRE(f->Write(6, B("four")).ok());  // not sticky
  CHECK(fx.fault.CallCount(Op::kWrite) == before + 4);
  CHECK(fx.fault.InjectedFailures() == 1);

  fx.fault.InjectError(Op::kAppend, EIO, 0, /*sticky=*/true);
  for (int i = 0; i < 3; ++i) {
    Status e = f->Append(B("x"));
    CHECK(e.code() == Code::kIOError);
    CHECK(e.errno_value() == EIO);
  }
  CHECK(ReadAll(&fx.fault, fx.P("f")) == B("onetwofour"));
  fx.fault.ClearErrors();
  REQUIRE(f->Append(B("!")).ok());
  CHECK(ReadAll(&fx.fault, fx.P("f")) == B("onetwofour!"));
}

// Every operation, failed once with EIO and once with ENOSPC: the Status is
// exactly that, and neither the current nor the durable state changes.
TEST_CASE("FaultEnv: an injected failure of each operation changes nothing", "[fault]") {
  const Op op = GENERATE(Op::kOpen, Op::kRead, Op::kWrite, Op::kAppend, Op::kSync, Op::kAllocate,
                         Op::kPunchHole, Op::kTruncate, Op::kRename, Op::kRemove, Op::kSyncDir,
                         Op::kCreateDirs);
  const int err = GENERATE(EIO, ENOSPC);
  INFO(FaultEnv::OpName(op) << " errno " << err);
  FaultFixture fx;
  fx.Durable("f", Pattern(6000, 10));
  auto f = OpenOrDie(&fx.fault, fx.P("f"), false);
  REQUIRE(f->Write(100, B("unsynced")).ok());  // so a Sync would change durable state
  auto g = OpenOrDie(&fx.fault, fx.P("g"));    // so a SyncDir would too
  const auto live_before = Snapshot(&fx.fault, "/");

  fx.fault.InjectError(op, err);
  Status s;
  Bytes buf(10);
  switch (op) {
    case Op::kOpen: s = fx.fault.Open(fx.P("h"), OpenOptions{.create = true}).status(); break;
    case Op::kRead: s = f->Read(0, 10, buf.data()); break;
    case Op::kWrite: s = f->Write(0, B("zzzz")); break;
    case Op::kAppend: s = f->Append(B("zzzz")); break;
    case Op::kSync: s = f->Sync(); break;
    case Op::kAllocate: s = f->Allocate(0, 100000); break;
    case Op::kPunchHole: s = f->PunchHole(0, 5000); break;
    case Op::kTruncate: s = f->Truncate(1); break;
    case Op::kRename: s = fx.fault.Rename(fx.P("f"), fx.P("r")); break;
    case Op::kRemove: s = fx.fault.Remove(fx.P("f")); break;
    case Op::kSyncDir: s = fx.fault.SyncDir(fx.dir); break;
    case Op::kCreateDirs: s = fx.fault.CreateDirs("/newdir"); break;
    case Op::kCount: break;
  }
  CHECK(s.code() == (err == EIO ? Code::kIOError : Code::kNoSpace));
  CHECK(s.errno_value() == err);
  CHECK(fx.fault.InjectedFailures() == 1);
  CHECK(Snapshot(&fx.fault, "/") == live_before);
  // Durable state unchanged too: after a power cut exactly f's synced content.
  f.reset();
  g.reset();
  REQUIRE(fx.fault.DropUnsyncedData().ok());
  auto after = Snapshot(&fx.fault, "/");
  CHECK(after == std::map<std::string, Bytes>{{"data/", {}}, {"data/f", Pattern(6000, 10)}});
}

TEST_CASE("FaultEnv counts calls per operation", "[fault]") {
  FaultFixture fx;
  fx.fault.ResetCounters();
  auto f = OpenOrDie(&fx.fault, fx.P("f"));
  REQUIRE(f->Append(B("a")).ok());
  REQUIRE(f->Append(B("b")).ok());
  REQUIRE(f->Write(0, B("c")).ok());
  REQUIRE(f->Sync().ok());
  REQUIRE(fx.fault.SyncDir(fx.dir).ok());
  Bytes buf(2);
  REQUIRE(f->Read(0, 2, buf.data()).ok());
  CHECK(fx.fault.CallCount(Op::kOpen) == 1);
  CHECK(fx.fault.CallCount(Op::kAppend) == 2);
  CHECK(fx.fault.CallCount(Op::kWrite) == 1);
  CHECK(fx.fault.CallCount(Op::kSync) == 1);
  CHECK(fx.fault.CallCount(Op::kSyncDir) == 1);
  CHECK(fx.fault.CallCount(Op::kRead) == 1);
  CHECK(fx.fault.CallCount(Op::kRename) == 0);
  CHECK(fx.fault.SyncPoints() == 2);
}

TEST_CASE("FaultEnv loses power after the n-th sync point", "[fault]") {
  FaultFixture fx;
  auto f = OpenOrDie(&fx.fault, fx.P("f"));
  fx.fault.SetCrashAfterSyncs(2);
  REQUIRE(fx.fault.SyncDir(fx.dir).ok());  // sync point 1
  REQUIRE(f->Append(B("one")).ok());
  REQUIRE(f->Sync().ok());  // sync point 2
  REQUIRE(f->Append(B("two")).ok());  // accepted, never durable
  CHECK(!fx.fault.crashed());
  Status s = f->Sync();  // the power goes here
  CHECK(s.code() == Code::kIOError);
  CHECK(s.errno_value() == EIO);
  CHECK(fx.fault.crashed());
  CHECK(f->Append(B("three")).errno_value() == EIO);
  CHECK(fx.fault.Rename(fx.P("f"), fx.P("g")).errno_value() == EIO);
  CHECK(fx.fault.Exists(fx.P("f")));
  REQUIRE(fx.fault.DropUnsyncedData().ok());
  CHECK(!fx.fault.crashed());
  CHECK(ReadAll(&fx.fault, fx.P("f")) == B("one"));
}

TEST_CASE("FaultEnv capacity gives ENOSPC without a partial write", "[fault]") {
  FaultFixture fx;
  fx.fault.SetCapacity(10000);
  auto f = OpenOrDie(&fx.fault, fx.P("a"));
  auto g = OpenOrDie(&fx.fault, fx.P("b"));
  REQUIRE(f->Append(Pattern(6000, 1)).ok());
  REQUIRE(g->Append(Pattern(4000, 2)).ok());
  Status s = g->Append(B("x"));
  CHECK(s.code() == Code::kNoSpace);
  CHECK(*g->Size() == 4000);
  CHECK(g->Allocate(0, 4001).code() == Code::kNoSpace);
  REQUIRE(g->Write(0, B("overwrite in place is fine")).ok());
  REQUIRE(f->Truncate(1000).ok());
  REQUIRE(g->Append(Pattern(5000, 3)).ok());
}

// WriteFileAtomic: whatever the crash point, the file holds the old or the new
// content, never a mix, and the new one once WriteFileAtomic returned ok.
TEST_CASE("WriteFileAtomic survives a power cut at every sync point", "[fault]") {
  const Bytes old_content = Pattern(9000, 11), new_content = Pattern(7000, 12);
  int finished_at = -1;
  for (int n = 0; n < 10 && finished_at < 0; ++n) {
    FaultFixture fx;
    fx.Durable("meta", old_content);
    fx.fault.SetCrashAfterSyncs(uint64_t(n));
    Status s = WriteFileAtomic(&fx.fault, fx.P("meta"), new_content);
    const bool finished = !fx.fault.crashed();
    CHECK(s.ok() == finished);
    REQUIRE(fx.fault.DropUnsyncedData().ok());
    const Bytes got = ReadAll(&fx.fault, fx.P("meta"));
    INFO("crash after " << n << " sync points");
    if (finished) {
      CHECK(got == new_content);
      finished_at = n;
    } else {
      CHECK((got == old_content || got == new_content));
    }
  }
  CHECK(finished_at == 2);  // two sync points: the file, then the directory
}

TEST_CASE("WriteFileAtomic survives a failure of any single call", "[fault]") {
  const Bytes old_content = Pattern(9000, 13), new_content = Pattern(100, 14);
  for (Op op : {Op::kOpen, Op::kWrite, Op::kSync, Op::kRename, Op::kSyncDir}) {
    INFO(FaultEnv::OpName(op));
    FaultFixture fx;
    fx.Durable("meta", old_content);
    fx.fault.InjectError(op, EIO);
    Status s = WriteFileAtomic(&fx.fault, fx.P("meta"), new_content);
    CHECK(s.errno_value() == EIO);
    // Before the power cut: still the old content unless the rename happened.
    const Bytes live = ReadAll(&fx.fault, fx.P("meta"));
    CHECK(live == (op == Op::kSyncDir ? new_content : old_content));
    REQUIRE(fx.fault.DropUnsyncedData().ok());
    CHECK(ReadAll(&fx.fault, fx.P("meta")) == old_content);
    CHECK(*fx.fault.ListDir(fx.dir) == std::vector<std::string>{"meta"});
  }
}

TEST_CASE("FaultEnv: a rename without SyncDir is lost (why WriteFileAtomic syncs the dir)", "[fault]") {
  FaultFixture fx;
  fx.Durable("meta", B("old"));
  auto t = OpenOrDie(&fx.fault, fx.P("meta.tmp"));
  REQUIRE(t->Write(0, B("new")).ok());
  REQUIRE(t->Sync().ok());
  REQUIRE(fx.fault.Rename(fx.P("meta.tmp"), fx.P("meta")).ok());
  REQUIRE(fx.fault.DropUnsyncedData().ok());
  CHECK(ReadAll(&fx.fault, fx.P("meta")) == B("old"));
  CHECK(!fx.fault.Exists(fx.P("meta.tmp")));
}

TEST_CASE("Env batches: ReadBatch and WriteBatch do every op, on a direct file too", "[env][direct]") {
  const std::string kind = ENV_KINDS;
  const bool direct = GENERATE(false, true);
  CAPTURE(kind, direct);
  EnvFixture fx(kind);
  OpenOptions o;
  o.create = true;
  o.direct = direct;
  auto f = fx.env->Open(fx.P("f"), o);
  REQUIRE(f.ok());
  // Only the POSIX Env honours `direct`; FaultEnv's files are its own.
  CHECK((*f)->DirectAlignment() == (direct && (kind == "posix" || kind == "cache-posix") ? 4096u : 0u));
  std::vector<Bytes> blocks;
  std::vector<WriteOp> writes;
  for (uint32_t i = 0; i < 64; ++i) blocks.push_back(Pattern(4096, 100 + i));
  for (size_t i = 0; i < 64; ++i) writes.push_back(WriteOp{uint64_t(63 - i) * 4096, ByteSpan(blocks[i])});
  REQUIRE((*f)->WriteBatch(writes).ok());
  REQUIRE(*(*f)->Size() == 64 * 4096);
  std::vector<Bytes> got(64, Bytes(4096));
  std::vector<ReadOp> reads;
  for (size_t i = 0; i < 64; ++i) reads.push_back(ReadOp{uint64_t(63 - i) * 4096, 4096, got[i].data()});
  REQUIRE((*f)->ReadBatch(reads).ok());
  for (size_t i = 0; i < 64; ++i) REQUIRE(got[i] == blocks[i]);
  // A failing op is reported (reading past the end of the file).
  reads.push_back(ReadOp{1u << 30, 4096, got[0].data()});
  REQUIRE((*f)->ReadBatch(reads).code() == Code::kOutOfRange);
  REQUIRE(ReadAll(fx.env, fx.P("f")).size() == 64 * 4096);
}

TEST_CASE("POSIX Env: a direct file takes buffers at any address and refuses unaligned ranges", "[env][direct]") {
  EnvFixture fx("posix");
  OpenOptions d;
  d.direct = true;
  d.create = true;
  auto f = fx.env->Open(fx.P("f"), d);
  REQUIRE(f.ok());
  REQUIRE((*f)->DirectAlignment() == 4096);
  // A std::vector's bytes, one byte in: never 4 KiB-aligned (O_DIRECT itself answers EINVAL to those).
  const Bytes raw = Pattern(3 * 4096 + 1, 5);
  const ByteSpan data(raw.data() + 1, 3 * 4096);
  REQUIRE((*f)->Write(8192, data).ok());
  Bytes back(3 * 4096 + 1);
  REQUIRE((*f)->Read(8192, 3 * 4096, back.data() + 1).ok());
  REQUIRE(std::equal(data.begin(), data.end(), back.begin() + 1));
  CHECK((*f)->Write(100, data).code() == Code::kInvalidArgument);
  CHECK((*f)->Read(8192, 100, back.data()).code() == Code::kInvalidArgument);
}

TEST_CASE("POSIX Env: a buffered and a direct handle of one file see each other's latest bytes", "[env][direct]") {
  EnvFixture fx("posix");
  auto buffered = OpenOrDie(fx.env, fx.P("f"));
  REQUIRE(buffered->Write(0, Pattern(16 * 4096, 1)).ok());
  REQUIRE(buffered->Sync().ok());
  OpenOptions d;
  d.direct = true;
  auto f = fx.env->Open(fx.P("f"), d);
  REQUIRE(f.ok());
  Bytes image = Pattern(16 * 4096, 1);
  for (uint32_t round = 0; round < 20; ++round) {
    // Cached by a buffered read, then overwritten directly: the buffered handle sees the new bytes.
    Bytes seen(16 * 4096);
    REQUIRE(buffered->Read(0, seen.size(), seen.data()).ok());
    REQUIRE(seen == image);
    const uint64_t blk = round % 16;
    const Bytes direct_bytes = Pattern(4096, 1000 + round);
    REQUIRE((*f)->Write(blk * 4096, direct_bytes).ok());
    std::copy(direct_bytes.begin(), direct_bytes.end(), image.begin() + long(blk * 4096));
    REQUIRE(buffered->Read(0, seen.size(), seen.data()).ok());
    REQUIRE(seen == image);
    // A buffered write of part of a neighbouring block, not synced: the direct handle reads it.
    const uint64_t part = ((blk + 1) % 16) * 4096 + 100 + round;
    const Bytes small = Pattern(300, 2000 + round);
    REQUIRE(buffered->Write(part, small).ok());
    std::copy(small.begin(), small.end(), image.begin() + long(part));
    Bytes direct_seen(16 * 4096);
    REQUIRE((*f)->Read(0, direct_seen.size(), direct_seen.data()).ok());
    REQUIRE(direct_seen == image);
  }
}

TEST_CASE("FileWrapper: batches go through the wrapper's own Read and Write", "[env]") {
  // A filter that overrides Read / Write (to count, delay or fail them) sees
  // every op of a batch: FileWrapper leaves the batches to File's loops.
  struct Counting final : FileWrapper {
    explicit Counting(std::unique_ptr<File> f) : FileWrapper(std::move(f)) {}
    Status Read(uint64_t o, size_t n, uint8_t* b) const override {
      ++reads;
      return FileWrapper::Read(o, n, b);
    }
    Status Write(uint64_t o, ByteSpan d) override {
      ++writes;
      return FileWrapper::Write(o, d);
    }
    mutable int reads = 0;
    int writes = 0;
  };
  auto mem = NewMemEnv();
  REQUIRE(mem->CreateDirs("/t").ok());
  Counting f(OpenOrDie(mem.get(), "/t/f"));
  const Bytes a = Pattern(10, 1), b = Pattern(20, 2);
  const std::vector<WriteOp> w{{0, ByteSpan(a)}, {100, ByteSpan(b)}};
  REQUIRE(f.WriteBatch(w).ok());
  Bytes ra(10), rb(20);
  const std::vector<ReadOp> r{{0, 10, ra.data()}, {100, 20, rb.data()}};
  REQUIRE(f.ReadBatch(r).ok());
  CHECK(f.writes == 2);
  CHECK(f.reads == 2);
  CHECK(ra == a);
  CHECK(rb == b);
}

}  // namespace
}  // namespace cdp

// Issue 40 ("Files"): every file and directory the POSIX Env creates is
// private whatever the umask (0600 files, 0700 directories, lock files
// included), and a file of secrets open to group or others is refused.
TEST_CASE("posix env: files 0600 and directories 0700, whatever the umask", "[env][files]") {
  cdp::testing::ScratchDir dir;
  cdp::Env* env = cdp::DefaultEnv();
  const mode_t old_umask = ::umask(0);  // the most permissive: only the Env's modes count
  const std::string sub = dir.Join("a/b/c");
  REQUIRE(env->CreateDirs(sub).ok());
  cdp::OpenOptions o;
  o.create = true;
  auto f = env->Open(sub + "/data", o);
  REQUIRE(f.ok());
  f->reset();
  const std::string text = "x";
  REQUIRE(cdp::WriteFileAtomic(env, sub + "/meta", cdp::ByteSpan(reinterpret_cast<const uint8_t*>(text.data()), 1)).ok());
  auto lock = env->LockFile(sub + "/LOCK");
  REQUIRE(lock.ok());
  ::umask(old_umask);
  auto mode = [](const std::string& p) {
    struct stat st {};
    REQUIRE(::stat(p.c_str(), &st) == 0);
    return unsigned(st.st_mode & 07777);
  };
  for (const char* d : {"a", "a/b", "a/b/c"}) CHECK(mode(dir.Join(d)) == 0700);
  for (const char* name : {"data", "meta", "LOCK"}) {
    INFO(name);
    CHECK(mode(sub + "/" + name) == 0600);
  }
}

TEST_CASE("CheckPrivateFile refuses a secret file open to group or others", "[env][files]") {
  cdp::testing::ScratchDir dir;
  const std::string path = dir.Join("key");
  const std::string text = "k";
  REQUIRE(cdp::WriteFileAtomic(cdp::DefaultEnv(), path, cdp::ByteSpan(reinterpret_cast<const uint8_t*>(text.data()), 1)).ok());
  CHECK(cdp::CheckPrivateFile(cdp::DefaultEnv(), path, "key_file").ok());
  for (mode_t m : {0644, 0640, 0604}) {
    REQUIRE(::chmod(path.c_str(), m) == 0);
    cdp::Status s = cdp::CheckPrivateFile(cdp::DefaultEnv(), path, "key_file");
    CHECK(s.code() == cdp::Code::kPermissionDenied);
    CHECK(s.message().find(": key_file must not be open to group or others (chmod 600 " + path + ")") !=
          std::string::npos);
  }
  CHECK(cdp::CheckPrivateFile(cdp::DefaultEnv(), dir.Join("missing"), "key_file").ok());
}

// SPDX-License-Identifier: Apache-2.0
#include <catch2/catch.hpp>

#include <set>

#include "common/env/env.h"
#include "loadgen/tree.h"

using namespace cdp;
using namespace cdp::loadgen;

namespace {

TreeOptions Small(uint64_t size, uint64_t seed) {
  TreeOptions t;
  t.size_bytes = size;
  t.seed = seed;
  return t;
}

}  // namespace

TEST_CASE("PlanTree is deterministic, sums to the size, and spreads over directories", "[tree]") {
  auto a = PlanTree(Small(10ull << 20, 8));
  auto b = PlanTree(Small(10ull << 20, 8));
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(a->files.size() == b->files.size());
  uint64_t total = 0;
  std::set<std::string> leaf_dirs;
  for (size_t i = 0; i < a->files.size(); ++i) {
    CHECK(a->files[i].path == b->files[i].path);
    CHECK(a->files[i].size == b->files[i].size);
    CHECK(a->files[i].size <= (1u << 20));
    total += a->files[i].size;
    leaf_dirs.insert(a->files[i].path.substr(0, a->files[i].path.rfind('/')));
  }
  CHECK(total == (10ull << 20));
  CHECK(a->files.size() > 20);
  CHECK(leaf_dirs.size() > 8);
  auto c = PlanTree(Small(10ull << 20, 9));
  REQUIRE(c.ok());
  CHECK((c->files.size() != a->files.size() || c->files[0].size != a->files[0].size ||
         c->files[0].path != a->files[0].path));
}

TEST_CASE("PlanTree rejects bad options", "[tree]") {
  TreeOptions t = Small(1 << 20, 1);
  t.fanout = 0;
  CHECK(PlanTree(t).status().code() == Code::kInvalidArgument);
  t = Small(1 << 20, 1);
  t.max_file = 128ull << 20;
  CHECK(PlanTree(t).status().code() == Code::kInvalidArgument);
  t = Small(1 << 20, 1);
  t.compressibility = 1.5;
  CHECK(PlanTree(t).status().code() == Code::kInvalidArgument);
}

TEST_CASE("Tree write then verify round trip on MemEnv", "[tree]") {
  auto env = NewMemEnv();
  TreeOptions t = Small(3ull << 20, 8);
  auto w = WriteTree(env.get(), "/t", t);
  REQUIRE(w.ok());
  CHECK(w->bytes == (3ull << 20));
  auto v = VerifyTree(env.get(), "/t", t);
  REQUIRE(v.ok());
  CHECK(v->ok());
  CHECK(v->files_checked == w->files);
  CHECK(v->bytes_checked == (3ull << 20));
  // Another seed does not verify against this tree.
  auto other = VerifyTree(env.get(), "/t", Small(3ull << 20, 9));
  REQUIRE(other.ok());
  CHECK_FALSE(other->ok());
}

TEST_CASE("Tree verify names a flipped byte, a missing file, a truncated file and an extra file", "[tree]") {
  auto env = NewMemEnv();
  TreeOptions t = Small(2ull << 20, 8);
  REQUIRE(WriteTree(env.get(), "/t", t).ok());
  auto plan = PlanTree(t);
  REQUIRE(plan.ok());
  REQUIRE(plan->files.size() >= 3);
  const auto& f0 = plan->files[0];
  const auto& f1 = plan->files[1];
  const auto& f2 = plan->files[2];
  {
    auto f = env->Open("/t/" + f0.path, {});
    REQUIRE(f.ok());
    uint8_t b = 0;
    REQUIRE((*f)->Read(f0.size / 2, 1, &b).ok());
    b ^= 0x01;
    REQUIRE((*f)->Write(f0.size / 2, ByteSpan(&b, 1)).ok());
  }
  REQUIRE(env->Remove("/t/" + f1.path).ok());
  {
    auto f = env->Open("/t/" + f2.path, {});
    REQUIRE(f.ok());
    REQUIRE((*f)->Truncate(f2.size - 1).ok());
  }
  {
    OpenOptions oo;
    oo.create = true;
    auto f = env->Open("/t/stray.txt", oo);
    REQUIRE(f.ok());
  }
  auto v = VerifyTree(env.get(), "/t", t);
  REQUIRE(v.ok());
  CHECK_FALSE(v->ok());
  REQUIRE(v->missing.size() == 1);
  CHECK(v->missing[0] == f1.path);
  REQUIRE(v->mismatched.size() == 2);
  CHECK(v->mismatched[0] == f0.path + ": differs at byte " + std::to_string(f0.size / 2));
  CHECK(v->mismatched[1] == f2.path + ": size " + std::to_string(f2.size - 1) + ", expected " + std::to_string(f2.size));
  REQUIRE(v->unexpected.size() == 1);
  CHECK(v->unexpected[0] == "stray.txt");
}

TEST_CASE("Tree compressibility changes content, not layout", "[tree]") {
  TreeOptions a = Small(1 << 20, 8), b = Small(1 << 20, 8);
  b.compressibility = 0.0;
  auto pa = PlanTree(a), pb = PlanTree(b);
  REQUIRE(pa.ok());
  REQUIRE(pb.ok());
  REQUIRE(pa->files.size() == pb->files.size());
  CHECK(pa->files[0].path == pb->files[0].path);
  CHECK(TreeFileContent(a, pa->files[0]) != TreeFileContent(b, pb->files[0]));
  CHECK(TreeFileContent(a, pa->files[0]) == TreeFileContent(a, pa->files[0]));
}

#include "loadgen/tests/test_util.h"

TEST_CASE("cdp-loadgen tree: verify exits non-zero naming each bad file - gentesttree.sh loops and deletes", "[tree][cli][e2e]") {
  cdp::testing::ScratchDir tmp;
  REQUIRE(!tmp.path().empty());
  const std::string bin = CDP_LOADGEN_BIN;
  const std::string dir = tmp.path() + "/tree";
  auto w = RunShell(bin + " tree --mode write --size-mb 4 --seed 8 --dir " + dir);
  REQUIRE(w.exit_code == 0);
  auto ok = RunShell(bin + " tree --mode verify --size-mb 4 --seed 8 --dir " + dir);
  CHECK(ok.exit_code == 0);
  CHECK(ok.output.find("OK (0 missing, 0 mismatched, 0 unexpected)") != std::string::npos);

  TreeOptions t;
  t.size_bytes = 4ull << 20;
  t.seed = 8;
  auto plan = PlanTree(t);
  REQUIRE(plan.ok());
  const auto& f0 = plan->files[0];
  const auto& f1 = plan->files[1];
  REQUIRE(RunShell("printf 'Z' | dd of=" + dir + "/" + f0.path + " bs=1 seek=7 conv=notrunc").exit_code == 0);
  REQUIRE(RunShell("rm " + dir + "/" + f1.path).exit_code == 0);
  auto bad = RunShell(bin + " tree --mode 1 --size-mb 4 --seed 8 --dir " + dir);
  CHECK(bad.exit_code == 1);
  CHECK(bad.output.find("MISSING " + f1.path + "\n") != std::string::npos);
  // (byte 7 of the seed-8 tree's first file is not 'Z', so the write is a change)
  CHECK(bad.output.find("MISMATCH " + f0.path + ": differs at byte 7\n") != std::string::npos);

  auto loop = RunShell(std::string(CDP_GENTESTTREE_SH) + " -s 1 -p 0.1 -n 3 -d " + tmp.path() + "/loop -b " + bin);
  CHECK(loop.exit_code == 0);
  CHECK(loop.output.find("iteration 3: wrote 1 MiB") != std::string::npos);
  CHECK(RunShell("test -e " + tmp.path() + "/loop").exit_code == 1);  // deleted after the last pause
}

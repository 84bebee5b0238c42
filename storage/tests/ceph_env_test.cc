// SPDX-License-Identifier: Apache-2.0
// CephEnv against the real single-node cluster of scripts/ceph-micro.sh
// ([ceph][e2e]): the Env contract on RBD images, the size kept across
// connections, directories, removal of an open file, fencing by the
// exclusive lock (refused, then a takeover that blocklists the old owner),
// and a sqlite database through EnvVfs.
#include "storage/ceph_env.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <random>

#include "common/store/sqlite.h"
#include "common/store/sqlite_vfs.h"
#include "storage/tests/ceph_cluster.h"

namespace cdp::storage {
namespace {

using testing::CephTestCluster;
using testing::ScopedImages;

Bytes Pattern(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  Bytes b(n);
  for (auto& x : b) x = uint8_t(rng());
  return b;
}

// A connection of its own (a separate Ceph client, as another MT would be).
std::unique_ptr<CephEnv> NewEnv(const CephTestCluster& c, const std::string& prefix, bool take_over = false) {
  RadosOptions o;
  o.conf_path = c.conf;
  o.client_id = c.client_id;
  CephEnvOptions eo;
  eo.prefix = prefix;
  eo.take_over = take_over;
  auto env = CephEnv::Connect(o, c.pool, eo);
  INFO(env.status().ToString());
  REQUIRE(env.ok());
  return std::move(*env);
}

Bytes ReadAll(File& f) {
  auto size = f.Size();
  REQUIRE(size.ok());
  Bytes b(*size);
  REQUIRE(f.Read(0, b.size(), b.data()).ok());
  return b;
}

TEST_CASE("ceph env: files on RBD images keep the Env contract, and a synced size survives the connection",
          "[ceph][e2e]") {
  CDP_CEPH_CLUSTER_OR_SKIP(cluster);
  ScopedImages images(*cluster, "envt");
  const std::string& prefix = images.prefix();
  Bytes a = Pattern(5000, 1), b = Pattern(70000, 2);
  {
    auto env = NewEnv(*cluster, prefix);
    REQUIRE(env->CreateDirs("tenants/t1/volumes/v1/journal").ok());
    CHECK_FALSE(env->Exists("tenants/t1/volumes/v1/journal/1.jnl"));
    auto missing = env->Open("tenants/t1/volumes/v1/journal/1.jnl", {});
    CHECK(missing.status().code() == Code::kNotFound);

    auto f = env->Open("tenants/t1/volumes/v1/journal/1.jnl", {.create = true});
    REQUIRE(f.ok());
    CHECK(*(*f)->Size() == 0);
    REQUIRE((*f)->Append(a).ok());
    REQUIRE((*f)->Append(b).ok());
    CHECK(*(*f)->Size() == a.size() + b.size());
    Bytes got(b.size());
    REQUIRE((*f)->Read(a.size(), b.size(), got.data()).ok());
    CHECK(got == b);
    CHECK((*f)->Read(a.size(), b.size() + 1, got.data()).code() == Code::kOutOfRange);
    Bytes tail(100000);
    auto n = (*f)->ReadUpTo(60000, tail.size(), tail.data());
    REQUIRE(n.ok());
    CHECK(*n == a.size() + b.size() - 60000);
    REQUIRE((*f)->Sync().ok());
    // Written after the last sync: may be lost with the process (the Env model).
    REQUIRE((*f)->Append(a).ok());

    // A second handle of the same file sees the first one's writes at once.
    auto r = env->Open("tenants/t1/volumes/v1/journal/1.jnl", {.read_only = true});
    REQUIRE(r.ok());
    CHECK(*(*r)->Size() == 2 * a.size() + b.size());
    CHECK((*r)->Write(0, a).code() == Code::kPermissionDenied);

    auto g = env->Open("tenants/t1/volumes/v1/replica.img", {.create = true});
    REQUIRE(g.ok());
    REQUIRE((*g)->Truncate(10 << 20).ok());
    REQUIRE((*g)->Write(5 << 20, b).ok());
    REQUIRE((*g)->PunchHole((5 << 20) + 4096, 8192).ok());
    REQUIRE((*g)->Sync().ok());
    auto exclusive = env->Open("tenants/t1/volumes/v1/replica.img", {.create = true, .exclusive = true});
    CHECK(exclusive.status().code() == Code::kAlreadyExists);

    auto names = env->ListDir("tenants/t1/volumes/v1");
    REQUIRE(names.ok());
    CHECK(*names == std::vector<std::string>{"journal", "replica.img"});
    CHECK(*env->ListDir("tenants") == std::vector<std::string>{"t1"});
    CHECK(env->Exists("tenants/t1/volumes"));
  }
  // Another client (every handle above closed): the synced sizes and bytes.
  auto env = NewEnv(*cluster, prefix);
  auto f = env->Open("tenants/t1/volumes/v1/journal/1.jnl", {});
  REQUIRE(f.ok());
  Bytes ab = a;
  ab.insert(ab.end(), b.begin(), b.end());
  CHECK(ReadAll(**f) == ab);
  CHECK(*env->FileSize("tenants/t1/volumes/v1/replica.img") == uint64_t(10 << 20));
  auto g = env->Open("tenants/t1/volumes/v1/replica.img", {});
  REQUIRE(g.ok());
  Bytes got(b.size());
  REQUIRE((*g)->Read(5 << 20, got.size(), got.data()).ok());
  Bytes want = b;
  std::fill(want.begin() + 4096, want.begin() + 4096 + 8192, 0);
  CHECK(got == want);

  // Shrink, then grow: the bytes past the cut read as zeros.
  REQUIRE((*f)->Truncate(100).ok());
  REQUIRE((*f)->Write(6000, a).ok());
  Bytes all = ReadAll(**f);
  REQUIRE(all.size() == 6000 + a.size());
  CHECK(std::equal(all.begin(), all.begin() + 100, ab.begin()));
  CHECK(std::all_of(all.begin() + 100, all.begin() + 6000, [](uint8_t x) { return x == 0; }));

  // Removing a file still open frees its name at once (a new file of the
  // same path is another image) while the open handle reads the old bytes
  // on; the old image goes at its last close.
  REQUIRE(env->Remove("tenants/t1/volumes/v1/journal/1.jnl").ok());
  CHECK_FALSE(env->Exists("tenants/t1/volumes/v1/journal/1.jnl"));
  CHECK(env->ListDir("tenants/t1/volumes/v1")->size() == 1);
  CHECK(env->Remove("tenants/t1/volumes/v1/journal/1.jnl").code() == Code::kNotFound);
  auto again = env->Open("tenants/t1/volumes/v1/journal/1.jnl", {.create = true, .exclusive = true});
  INFO(again.status().ToString());
  REQUIRE(again.ok());
  REQUIRE((*again)->Append(b).ok());
  REQUIRE((*again)->Sync().ok());
  CHECK(ReadAll(**f) == all);
  CHECK(ReadAll(**again) == b);
  auto image_count = [&] {
    auto names = env->pool()->ListImages();
    REQUIRE(names.ok());
    return std::count_if(names->begin(), names->end(),
                         [&](const std::string& n) { return n.compare(0, prefix.size() + 1, prefix + "~") == 0; });
  };
  const auto with_old = image_count();
  f->reset();
  CHECK(image_count() == with_old - 1);
  again->reset();
  CHECK(ReadAll(**env->Open("tenants/t1/volumes/v1/journal/1.jnl", {})) == b);
  CHECK(env->Open("a~b", {.create = true}).status().code() == Code::kInvalidArgument);
}

TEST_CASE("ceph env: batches of reads and writes run as asynchronous requests and equal one by one I/O",
          "[ceph][e2e]") {
  CDP_CEPH_CLUSTER_OR_SKIP(cluster);
  ScopedImages images(*cluster, "batch");
  auto env = NewEnv(*cluster, images.prefix());
  auto f = env->Open("v/replica.img", {.create = true});
  REQUIRE(f.ok());
  REQUIRE((*f)->Truncate(1 << 20).ok());
  // 100 disjoint 4 KiB writes at random blocks, one past the end (the file grows).
  std::mt19937 rng(9);
  std::vector<uint64_t> blocks(256);
  for (size_t i = 0; i < blocks.size(); i++) blocks[i] = i;
  std::shuffle(blocks.begin(), blocks.end(), rng);
  blocks.resize(100);
  blocks.push_back(300);
  Bytes data = Pattern(blocks.size() * 4096, 12);
  std::vector<WriteOp> writes;
  for (size_t i = 0; i < blocks.size(); i++)
    writes.push_back({blocks[i] * 4096, ByteSpan(data.data() + i * 4096, 4096)});
  REQUIRE((*f)->WriteBatch(writes).ok());
  CHECK(*(*f)->Size() == 301 * 4096);
  Bytes back(data.size());
  std::vector<ReadOp> reads;
  for (size_t i = 0; i < blocks.size(); i++) reads.push_back({blocks[i] * 4096, 4096, back.data() + i * 4096});
  REQUIRE((*f)->ReadBatch(reads).ok());
  CHECK(back == data);
  for (size_t i = 0; i < blocks.size(); i++) {
    Bytes one(4096);
    REQUIRE((*f)->Read(blocks[i] * 4096, 4096, one.data()).ok());
    CHECK(std::equal(one.begin(), one.end(), data.begin() + i * 4096));
  }
  // Small writes wait to go out together: another handle, a read, a batch or
  // a sync sees them, overlapping ones land in their order.
  REQUIRE((*f)->Write(100, Pattern(16, 1)).ok());
  REQUIRE((*f)->Write(108, Pattern(16, 2)).ok());          // overlaps the one before
  REQUIRE((*f)->Write(4096 * 400, Pattern(100, 3)).ok());  // and grows the file
  CHECK(*(*f)->Size() == 4096 * 400 + 100);
  {
    auto other = env->Open("v/replica.img", {.read_only = true});
    REQUIRE(other.ok());
    Bytes got(24);
    REQUIRE((*other)->Read(100, 24, got.data()).ok());
    Bytes want = Pattern(16, 1);
    want.resize(8);
    Bytes second = Pattern(16, 2);
    want.insert(want.end(), second.begin(), second.end());
    CHECK(got == want);
    Bytes tail(100);
    REQUIRE((*other)->Read(4096 * 400, 100, tail.data()).ok());
    CHECK(tail == Pattern(100, 3));
  }
  std::vector<ReadOp> past{{300 * 4096, 8192, back.data()}};
  CHECK((*f)->ReadBatch(past).code() == Code::kOk);  // the file grew past it
  std::vector<ReadOp> beyond{{4096 * 400, 8192, back.data()}};
  CHECK((*f)->ReadBatch(beyond).code() == Code::kOutOfRange);
  auto ro = env->Open("v/replica.img", {.read_only = true});
  REQUIRE(ro.ok());
  CHECK((*ro)->WriteBatch(writes).code() == Code::kPermissionDenied);
}

TEST_CASE("ceph env: a file open for writing is fenced, and a takeover blocklists the old owner", "[ceph][e2e]") {
  CDP_CEPH_CLUSTER_OR_SKIP(cluster);
  ScopedImages images(*cluster, "lock");
  const std::string& prefix = images.prefix();
  auto first = NewEnv(*cluster, prefix);
  auto f = first->Open("v/replica.img", {.create = true});
  REQUIRE(f.ok());
  REQUIRE((*f)->Write(0, Pattern(8192, 3)).ok());
  REQUIRE((*f)->Sync().ok());

  auto second = NewEnv(*cluster, prefix);
  // Reading needs no lock; writing is refused while the first holds it.
  auto r = second->Open("v/replica.img", {.read_only = true});
  REQUIRE(r.ok());
  CHECK(ReadAll(**r) == Pattern(8192, 3));
  auto w = second->Open("v/replica.img", {});
  INFO(w.status().ToString());
  CHECK(w.status().code() == Code::kBusy);
  CHECK(w.status().message().find("another master target") != std::string::npos);

  // The takeover: the lock is broken, the first client blocklisted.
  auto third = NewEnv(*cluster, prefix, true);
  auto t = third->Open("v/replica.img", {});
  INFO(t.status().ToString());
  REQUIRE(t.ok());
  REQUIRE((*t)->Write(0, Pattern(4096, 4)).ok());
  REQUIRE((*t)->Sync().ok());
  Status late = (*f)->Write(4096, Pattern(4096, 5));
  if (late.ok()) late = (*f)->Sync();
  INFO(late.ToString());
  CHECK_FALSE(late.ok());
  Bytes want = Pattern(8192, 3);
  Bytes four = Pattern(4096, 4);
  std::copy(four.begin(), four.end(), want.begin());
  CHECK(ReadAll(**t) == want);
}

TEST_CASE("ceph env: a sqlite database through EnvVfs lives in the pool", "[ceph][e2e]") {
  CDP_CEPH_CLUSTER_OR_SKIP(cluster);
  ScopedImages images(*cluster, "sql");
  const std::string& prefix = images.prefix();
  {
    auto env = NewEnv(*cluster, prefix);
    sqlite::EnvVfs vfs(env.get());
    sqlite::Db::Options o;
    o.vfs = vfs.name();
    auto db = sqlite::Db::Open("t/v/index.db", o);
    INFO(db.status().ToString());
    REQUIRE(db.ok());
    REQUIRE((*db)->Exec("CREATE TABLE t(k INTEGER PRIMARY KEY, v BLOB)").ok());
    REQUIRE((*db)
                ->Exec("BEGIN; WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM c WHERE i < 300) "
                       "INSERT INTO t SELECT i, randomblob(2000) FROM c; COMMIT")
                .ok());
    o.read_only = true;
    auto reader = sqlite::Db::Open("t/v/index.db", o);
    REQUIRE(reader.ok());
    auto st = (*reader)->Prepare("SELECT count(*) FROM t");
    REQUIRE(st.ok());
    REQUIRE(*st->Step());
    CHECK(st->ColumnInt64(0) == 300);
  }
  auto env = NewEnv(*cluster, prefix);
  sqlite::EnvVfs vfs(env.get());
  sqlite::Db::Options o;
  o.vfs = vfs.name();
  auto db = sqlite::Db::Open("t/v/index.db", o);
  REQUIRE(db.ok());
  auto st = (*db)->Prepare("SELECT count(*), sum(length(v)) FROM t");
  REQUIRE(st.ok());
  REQUIRE(*st->Step());
  CHECK(st->ColumnInt64(0) == 300);
  CHECK(st->ColumnInt64(1) == 600000);
  auto check = (*db)->Prepare("PRAGMA integrity_check");
  REQUIRE(check.ok());
  REQUIRE(*check->Step());
  CHECK(check->ColumnText(0) == "ok");
}

}  // namespace
}  // namespace cdp::storage

// SPDX-License-Identifier: Apache-2.0
// EnvVfs: a sqlite database whose files are the files of a cdp::Env. On the
// in-memory Env (nothing reaches the disk) and on a FaultEnv, whose power cut
// at every sync point must leave exactly the committed transactions.
#include "common/store/sqlite_vfs.h"

#include <catch2/catch.hpp>
#include <string>

#include "common/env/fault_env.h"
#include "common/store/sqlite.h"

namespace cdp {
namespace {

sqlite::Db::Options Through(const sqlite::EnvVfs& vfs, bool read_only = false) {
  sqlite::Db::Options o;
  o.vfs = vfs.name();
  o.read_only = read_only;
  o.create = !read_only;
  return o;
}

Result<int64_t> Count(sqlite::Db& db) {
  CDP_ASSIGN_OR_RETURN(auto st, db.Prepare("SELECT count(*) FROM t"));
  CDP_ASSIGN_OR_RETURN(bool row, st.Step());
  if (!row) return Status::Corruption("count(*) returned no row");
  return st.ColumnInt64(0);
}

TEST_CASE("env vfs keeps the database and its WAL in the Env, and a reopen finds the data", "[sqlite]") {
  auto env = NewMemEnv();
  REQUIRE(env->CreateDirs("vols/v1").ok());
  sqlite::EnvVfs vfs(env.get());
  {
    auto db = sqlite::Db::Open("vols/v1/index.db", Through(vfs));
    REQUIRE(db.ok());
    REQUIRE((*db)->Exec("CREATE TABLE t(k INTEGER PRIMARY KEY, v BLOB)").ok());
    for (int i = 0; i < 500; i++) {
      auto ins = (*db)->Prepare("INSERT INTO t VALUES(?1, zeroblob(1000))");
      REQUIRE(ins.ok());
      REQUIRE(ins->BindAll(int64_t(i)).ok());
      REQUIRE(ins->Run().ok());
    }
    CHECK(env->Exists("vols/v1/index.db"));
    CHECK(env->Exists("vols/v1/index.db-wal"));
    CHECK(*env->FileSize("vols/v1/index.db-wal") > 0);
  }
  auto db = sqlite::Db::Open("vols/v1/index.db", Through(vfs));
  REQUIRE(db.ok());
  auto n = Count(**db);
  REQUIRE(n.ok());
  CHECK(*n == 500);
}

TEST_CASE("env vfs readers see committed transactions only, and a writer waits for no reader", "[sqlite]") {
  auto env = NewMemEnv();
  sqlite::EnvVfs vfs(env.get());
  auto w = sqlite::Db::Open("index.db", Through(vfs));
  REQUIRE(w.ok());
  REQUIRE((*w)->Exec("CREATE TABLE t(k INTEGER PRIMARY KEY); INSERT INTO t VALUES(1)").ok());
  auto r = sqlite::Db::Open("index.db", Through(vfs, true));
  REQUIRE(r.ok());
  CHECK(*Count(**r) == 1);

  auto tx = sqlite::Transaction::Begin(**w);
  REQUIRE(tx.ok());
  REQUIRE((*w)->Exec("INSERT INTO t VALUES(2); INSERT INTO t VALUES(3)").ok());
  CHECK(*Count(**r) == 1);  // not committed yet
  {
    // A read transaction open across the commit keeps its snapshot.
    REQUIRE((*r)->Exec("BEGIN").ok());
    CHECK(*Count(**r) == 1);
    REQUIRE(tx->Commit().ok());
    CHECK(*Count(**r) == 1);
    REQUIRE((*r)->Exec("COMMIT").ok());
  }
  CHECK(*Count(**r) == 3);
  // A second writer of the same file is refused while the first writes.
  auto w2 = sqlite::Db::Open("index.db", Through(vfs));
  REQUIRE(w2.ok());
  REQUIRE((*w)->Exec("BEGIN IMMEDIATE").ok());
  Status busy = (*w2)->Exec("PRAGMA busy_timeout=0; BEGIN IMMEDIATE");
  CHECK(busy.code() == Code::kBusy);
  REQUIRE((*w)->Exec("COMMIT").ok());
}

TEST_CASE("env vfs on a FaultEnv: a power cut at every sync point keeps exactly the committed rows", "[sqlite]") {
  constexpr int kTransactions = 6;
  for (uint64_t n = 0;; ++n) {
    auto base = NewMemEnv();
    FaultEnv fault(base.get());
    fault.SetCrashAfterSyncs(n);
    int committed = 0;
    {
      sqlite::EnvVfs vfs(&fault);
      auto db = sqlite::Db::Open("index.db", Through(vfs));
      if (db.ok() && (*db)->Exec("CREATE TABLE IF NOT EXISTS t(k INTEGER PRIMARY KEY, v BLOB)").ok()) {
        for (int i = 0; i < kTransactions; i++) {
          std::string sql = "BEGIN; INSERT INTO t VALUES(" + std::to_string(2 * i) + ", randomblob(3000)); " +
                            "INSERT INTO t VALUES(" + std::to_string(2 * i + 1) + ", randomblob(3000)); COMMIT";
          if (!(*db)->Exec(sql).ok()) break;
          committed++;
        }
      }
    }
    bool finished = !fault.crashed();
    REQUIRE(fault.DropUnsyncedData().ok());
    INFO("crash after " << n << " sync points, " << committed << " transactions acknowledged");
    sqlite::EnvVfs vfs(&fault);
    auto db = sqlite::Db::Open("index.db", Through(vfs));
    REQUIRE(db.ok());
    REQUIRE((*db)->Exec("CREATE TABLE IF NOT EXISTS t(k INTEGER PRIMARY KEY, v BLOB)").ok());
    auto count = Count(**db);
    REQUIRE(count.ok());
    // Every acknowledged transaction is there; at most the one in flight
    // besides (its commit may have reached the WAL before the cut), never half of one.
    CHECK(*count >= 2 * committed);
    CHECK(*count <= 2 * (committed + 1));
    CHECK(*count % 2 == 0);
    auto check = (*db)->Prepare("PRAGMA integrity_check");
    REQUIRE(check.ok());
    REQUIRE(*check->Step());
    CHECK(check->ColumnText(0) == "ok");
    if (finished) {
      CHECK(committed == kTransactions);
      CHECK(n > 4);
      break;
    }
  }
}

}  // namespace
}  // namespace cdp

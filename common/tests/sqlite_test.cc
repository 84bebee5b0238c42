// SPDX-License-Identifier: Apache-2.0
#include "common/store/sqlite.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "common/tests/test_util.h"

namespace cdp {
namespace {

// sqlite opens files itself (not through cdp::Env), so these tests use the
// real file system.
using TempDir = testing::ScratchDir;

TEST_CASE("sqlite round trip of every column type, reopen keeps data, WAL mode", "[sqlite]") {
  TempDir dir;
  std::string path = dir.path() + "/state.db";
  Bytes blob = {0, 1, 2, 255, 0, 7};
  {
    auto db = sqlite::Db::Open(path);
    REQUIRE(db.ok());
    REQUIRE((*db)->Exec("CREATE TABLE t(k TEXT PRIMARY KEY, i INTEGER, d REAL, b BLOB, n)").ok());
    auto ins = (*db)->Prepare("INSERT INTO t VALUES(?1, ?2, ?3, ?4, ?5)");
    REQUIRE(ins.ok());
    REQUIRE(ins->BindAll("vol-1", int64_t(-1) << 40, 2.5, ByteSpan(blob)).ok());
    REQUIRE(ins->BindNull(5).ok());
    REQUIRE(ins->Run().ok());
    CHECK((*db)->LastInsertRowId() == 1);
    CHECK((*db)->Changes() == 1);
    REQUIRE(ins->Reset().ok());
    REQUIRE(ins->BindAll(std::string("vol-2"), uint64_t(7), 0.0, ByteSpan()).ok());
    REQUIRE(ins->Run().ok());
    // Duplicate primary key.
    REQUIRE(ins->Reset().ok());
    REQUIRE(ins->BindAll("vol-1", 1, 1.0, ByteSpan(blob)).ok());
    Status dup = ins->Run();
    CHECK(dup.code() == Code::kAlreadyExists);
    CHECK(dup.message().find("UNIQUE constraint failed: t.k") != std::string::npos);
    CHECK(ins->Bind(1, uint64_t(1) << 63).code() == Code::kOutOfRange);

    auto mode = (*db)->Prepare("PRAGMA journal_mode");
    REQUIRE(mode.ok());
    REQUIRE(*mode->Step());
    CHECK(mode->ColumnText(0) == "wal");
    auto sync = (*db)->Prepare("PRAGMA synchronous");
    REQUIRE(sync.ok());
    REQUIRE(*sync->Step());
    CHECK(sync->ColumnInt64(0) == 2);  // FULL
  }
  auto db = sqlite::Db::Open(path);
  REQUIRE(db.ok());
  auto q = (*db)->Prepare("SELECT k, i, d, b, n FROM t ORDER BY k");
  REQUIRE(q.ok());
  CHECK(q->ColumnCount() == 5);
  REQUIRE(*q->Step());
  CHECK(q->ColumnText(0) == "vol-1");
  CHECK(q->ColumnInt64(1) == int64_t(-1) << 40);
  CHECK(q->ColumnDouble(2) == 2.5);
  CHECK(q->ColumnBlob(3) == blob);
  CHECK(q->ColumnIsNull(4));
  REQUIRE(*q->Step());
  CHECK(q->ColumnText(0) == "vol-2");
  CHECK(q->ColumnInt64(1) == 7);
  CHECK_FALSE(q->ColumnIsNull(3));  // an empty blob is not NULL
  CHECK(q->ColumnBlob(3).empty());
  CHECK_FALSE(*q->Step());
}

int64_t CountRows(sqlite::Db& db) {
  auto q = db.Prepare("SELECT count(*) FROM t");
  REQUIRE(q.ok());
  REQUIRE(*q->Step());
  return q->ColumnInt64(0);
}

TEST_CASE("sqlite transaction commits, rolls back on destruction and on Rollback", "[sqlite]") {
  TempDir dir;
  std::string path = dir.path() + "/tx.db";
  {
    auto db = sqlite::Db::Open(path);
    REQUIRE(db.ok());
    REQUIRE((*db)->Exec("CREATE TABLE t(v INTEGER)").ok());
    {
      auto tx = sqlite::Transaction::Begin(**db);
      REQUIRE(tx.ok());
      REQUIRE((*db)->Exec("INSERT INTO t VALUES(1); INSERT INTO t VALUES(2)").ok());
      CHECK(sqlite::Transaction::Begin(**db).status().code() == Code::kInvalidArgument);  // no nesting
      REQUIRE(tx->Commit().ok());
      CHECK(tx->Commit().code() == Code::kInvalidArgument);
    }
    {
      auto tx = sqlite::Transaction::Begin(**db);
      REQUIRE(tx.ok());
      REQUIRE((*db)->Exec("INSERT INTO t VALUES(3)").ok());
      CHECK(CountRows(**db) == 3);
      // destroyed without Commit
    }
    CHECK(CountRows(**db) == 2);
    {
      auto tx = sqlite::Transaction::Begin(**db);
      REQUIRE(tx.ok());
      REQUIRE((*db)->Exec("DELETE FROM t").ok());
      REQUIRE(tx->Rollback().ok());
      REQUIRE(tx->Rollback().ok());
    }
    CHECK(CountRows(**db) == 2);
    // An uncommitted transaction open at close is not persisted either.
    auto tx = sqlite::Transaction::Begin(**db);
    REQUIRE(tx.ok());
    REQUIRE((*db)->Exec("INSERT INTO t VALUES(4)").ok());
  }
  auto db = sqlite::Db::Open(path);
  REQUIRE(db.ok());
  CHECK(CountRows(**db) == 2);
}

TEST_CASE("sqlite errors carry sqlite's message, busy is kBusy", "[sqlite]") {
  TempDir dir;
  std::string path = dir.path() + "/e.db";
  sqlite::Db::Options fast;
  fast.busy_timeout_ms = 50;
  auto a = sqlite::Db::Open(path, fast);
  auto b = sqlite::Db::Open(path, fast);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  auto bad = (*a)->Prepare("SELEKT 1");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == Code::kInvalidArgument);
  CHECK(bad.status().message().find("syntax error") != std::string::npos);
  Status missing = (*a)->Exec("INSERT INTO nope VALUES(1)");
  CHECK(missing.message().find("no such table: nope") != std::string::npos);

  REQUIRE((*a)->Exec("CREATE TABLE t(v)").ok());
  auto tx = sqlite::Transaction::Begin(**a);
  REQUIRE(tx.ok());
  auto tx2 = sqlite::Transaction::Begin(**b);
  REQUIRE_FALSE(tx2.ok());
  CHECK(tx2.status().code() == Code::kBusy);
  CHECK(tx2.status().retryable());
  REQUIRE(tx->Commit().ok());
  auto tx3 = sqlite::Transaction::Begin(**b);
  CHECK(tx3.ok());

  sqlite::Db::Options no_create;
  no_create.create = false;
  auto none = sqlite::Db::Open(dir.path() + "/absent.db", no_create);
  REQUIRE_FALSE(none.ok());
  CHECK(none.status().code() == Code::kIOError);
  CHECK(none.status().message().find(dir.path() + "/absent.db") != std::string::npos);
}

}  // namespace
}  // namespace cdp

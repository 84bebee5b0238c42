// SPDX-License-Identifier: Apache-2.0
// sqlite: a thin wrapper over sqlite3 for the state daemons keep (volume
// catalogue, recovery points, tags, resync progress).
//
//   CDP_ASSIGN_OR_RETURN(auto db, sqlite::Db::Open("/var/lib/cdp/mt.db"));
//   CDP_RETURN_IF_ERROR(db->Exec("CREATE TABLE IF NOT EXISTS t(k TEXT PRIMARY KEY, v BLOB)"));
//   CDP_ASSIGN_OR_RETURN(auto tx, sqlite::Transaction::Begin(*db));
//   CDP_ASSIGN_OR_RETURN(auto ins, db->Prepare("INSERT INTO t VALUES(?1, ?2)"));
//   CDP_RETURN_IF_ERROR(ins.BindAll("db1", ByteSpan(data)));
//   CDP_RETURN_IF_ERROR(ins.Run());
//   CDP_RETURN_IF_ERROR(tx.Commit());   // without Commit(), ~Transaction rolls back
//
// Durability: Open() sets journal_mode=WAL, synchronous=FULL (a committed
// transaction survives a power cut), foreign_keys=ON and a busy timeout.
//
// NOTE: by default sqlite opens and syncs its files itself, NOT through
// cdp::Env, so a FaultEnv cannot inject faults into it or drop its unsynced
// data. Keep durable data-path structures (spool, journal, replica) out of
// sqlite. Options::vfs with an EnvVfs (common/store/sqlite_vfs.h) puts a database
// in an Env instead (the master target's index on a Ceph pool).
//
// Logging: sqlite's own log (sqlite3_config(SQLITE_CONFIG_LOG)) is routed into
// the spdlog logger "sqlite", once per process, before the first Open(). That
// configuration is process-wide by sqlite's design.
//
// Errors: every failure is a Status carrying sqlite's message and code name:
//   SQLITE_BUSY/LOCKED -> kBusy (retryable), SQLITE_FULL -> kNoSpace,
//   SQLITE_CORRUPT/NOTADB -> kCorruption, SQLITE_CONSTRAINT (unique/primary key)
//   -> kAlreadyExists, other constraints/misuse/range -> kInvalidArgument,
//   SQLITE_READONLY/PERM/AUTH -> kPermissionDenied, SQLITE_CANTOPEN/IOERR -> kIOError.
//
// Thread safety: a Db is opened in serialized mode, so distinct threads may
// call it, but a Statement or Transaction belongs to one thread at a time and a
// transaction spans the whole connection: use one Db per thread, or one thread.
// A Statement and a Transaction must not outlive their Db.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include "common/base/coding.h"
#include "common/base/result.h"
#include "common/base/status.h"

struct sqlite3;
struct sqlite3_stmt;

namespace cdp::sqlite {

class Statement;

// Routes sqlite's log into spdlog, once per process. Must run before sqlite is
// initialised (Db::Open and EnvVfs call it).
void RouteLogOnce();

class Db {
 public:
  struct Options {
    int busy_timeout_ms = 5000;
    bool create = true;      // create the file if missing
    bool read_only = false;
    // A registered sqlite VFS to open the file with ("" = the default, the
    // local file system). EnvVfs (common/store/sqlite_vfs.h) puts a database in an
    // Env; temporary tables and indices are then kept in memory.
    std::string vfs;
  };

  // Opens (and creates) the database at `path` (":memory:" for a private in-memory db).
  // Failure: kIOError/kNotFound/kCorruption with the path and sqlite's message.
  static Result<std::unique_ptr<Db>> Open(const std::string& path, const Options& opts);
  static Result<std::unique_ptr<Db>> Open(const std::string& path) { return Open(path, Options()); }
  ~Db();
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  // Runs one or more ';'-separated statements, discarding rows.
  Status Exec(std::string_view sql);
  // Compiles one statement. Failure: kInvalidArgument with the SQL error.
  Result<Statement> Prepare(std::string_view sql);

  int64_t LastInsertRowId() const;
  int64_t Changes() const;  // rows changed by the last INSERT/UPDATE/DELETE
  bool InTransaction() const;  // a BEGIN not yet committed or rolled back
  const std::string& path() const { return path_; }
  sqlite3* handle() { return db_; }

 private:
  Db(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  sqlite3* db_;
  std::string path_;
};

// A prepared statement. Parameters are 1-based (?1, ?2 or positional ?),
// columns 0-based. Move-only.
class Statement {
 public:
  Statement(Statement&& o) noexcept;
  Statement& operator=(Statement&& o) noexcept;
  ~Statement();

  Status Bind(int index, int64_t v);
  Status Bind(int index, int v) { return Bind(index, int64_t(v)); }
  Status Bind(int index, uint64_t v);  // kOutOfRange above INT64_MAX (sqlite integers are signed)
  Status Bind(int index, double v);
  Status Bind(int index, std::string_view text);            // copied by sqlite
  Status Bind(int index, const char* text) { return Bind(index, std::string_view(text)); }
  Status Bind(int index, const std::string& text) { return Bind(index, std::string_view(text)); }
  Status Bind(int index, ByteSpan blob);                    // copied by sqlite
  Status BindNull(int index);
  // Binds args to ?1, ?2, ... in order.
  template <typename... Args>
  Status BindAll(const Args&... args) {
    int i = 0;
    Status s;
    ((s.ok() ? (void)(s = Bind(++i, args)) : (void)0), ...);
    return s;
  }

  // Advances. Success: true = a row is available, false = done.
  Result<bool> Step();
  // Steps until done, for statements that return no rows (INSERT, UPDATE).
  // kInvalidArgument if it yields a row.
  Status Run();
  // Resets to run again, and clears bindings.
  Status Reset();

  int ColumnCount() const;
  bool ColumnIsNull(int col) const;
  int64_t ColumnInt64(int col) const;
  double ColumnDouble(int col) const;
  std::string ColumnText(int col) const;
  Bytes ColumnBlob(int col) const;

 private:
  friend class Db;
  Statement(Db* db, sqlite3_stmt* stmt) : db_(db), stmt_(stmt) {}
  Db* db_ = nullptr;
  sqlite3_stmt* stmt_ = nullptr;
};

// BEGIN IMMEDIATE on creation; Commit() commits; the destructor rolls back a
// transaction that was not committed (a failed rollback is logged). Move-only.
// Nested transactions are not supported (kInvalidArgument from Begin).
class Transaction {
 public:
  // Failure: kBusy if another connection holds the write lock past the busy timeout.
  static Result<Transaction> Begin(Db& db);
  Transaction(Transaction&& o) noexcept : db_(o.db_) { o.db_ = nullptr; }
  Transaction& operator=(Transaction&&) = delete;
  ~Transaction();

  // Success: the transaction is durable (synchronous=FULL). On failure the
  // transaction is rolled back.
  Status Commit();
  // Rolls back now. Idempotent.
  Status Rollback();

 private:
  explicit Transaction(Db* db) : db_(db) {}
  Db* db_;  // null once committed or rolled back
};

}  // namespace cdp::sqlite

// SPDX-License-Identifier: Apache-2.0
#include "common/store/sqlite.h"

#include <sqlite3.h>

#include <limits>
#include <mutex>

#include "common/base/log.h"

namespace cdp::sqlite {

namespace {

void LogCallback(void*, int code, const char* msg) {
  auto log = cdp::log::Get("sqlite");
  switch (code & 0xff) {
    case SQLITE_NOTICE:
      log->info("({}) {}", sqlite3_errstr(code), msg);
      break;
    case SQLITE_ERROR:       // SQL errors,
    case SQLITE_CONSTRAINT:  // constraint failures,
    case SQLITE_BUSY:        // lock waits and
    case SQLITE_CANTOPEN:    // missing files reach the caller as a Status already
    case SQLITE_SCHEMA:
      log->debug("({}) {}", sqlite3_errstr(code), msg);
      break;
    default:  // I/O errors, corruption, WAL recovery warnings
      log->warn("({}) {}", sqlite3_errstr(code), msg);
      break;
  }
}

// sqlite3_config() is process-wide and only valid before sqlite3_initialize(),
// so it happens once, before the first Open().
}  // namespace

void RouteLogOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    int rc = sqlite3_config(SQLITE_CONFIG_LOG, &LogCallback, nullptr);
    if (rc != SQLITE_OK) {
      cdp::log::Get("sqlite")->warn("cannot route sqlite's log (sqlite3_config: {}); was sqlite initialized earlier?",
                                     sqlite3_errstr(rc));
    }
  });
}

namespace {

Status FromCode(int rc, std::string_view context, const char* detail) {
  std::string msg = std::string(context) + ": " + (detail != nullptr ? detail : sqlite3_errstr(rc)) + " (" +
                    sqlite3_errstr(rc) + ")";
  switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return Status::Busy(std::move(msg));
    case SQLITE_FULL:
      return Status::NoSpace(std::move(msg));
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return Status::Corruption(std::move(msg));
    case SQLITE_CONSTRAINT:
      if (rc == SQLITE_CONSTRAINT_UNIQUE || rc == SQLITE_CONSTRAINT_PRIMARYKEY) {
        return Status::AlreadyExists(std::move(msg));
      }
      return Status::InvalidArgument(std::move(msg));
    case SQLITE_READONLY:
    case SQLITE_PERM:
    case SQLITE_AUTH:
      return Status::PermissionDenied(std::move(msg));
    case SQLITE_CANTOPEN:
    case SQLITE_IOERR:
      return Status::IOError(std::move(msg));
    case SQLITE_NOMEM:
      return Status::NoSpace(std::move(msg));
    default:
      return Status::InvalidArgument(std::move(msg));
  }
}

Status DbError(sqlite3* db, int rc, std::string_view context) {
  return FromCode(sqlite3_extended_errcode(db) != 0 ? sqlite3_extended_errcode(db) : rc, context, sqlite3_errmsg(db));
}

}  // namespace

// ---------------------------------------------------------------- Db

Result<std::unique_ptr<Db>> Db::Open(const std::string& path, const Options& opts) {
  RouteLogOnce();
  int flags = SQLITE_OPEN_FULLMUTEX | SQLITE_OPEN_EXRESCODE;
  if (opts.read_only) {
    flags |= SQLITE_OPEN_READONLY;
  } else {
    flags |= SQLITE_OPEN_READWRITE;
    if (opts.create) flags |= SQLITE_OPEN_CREATE;
  }
  sqlite3* raw = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &raw, flags, opts.vfs.empty() ? nullptr : opts.vfs.c_str());
  if (rc != SQLITE_OK) {
    Status s = raw != nullptr ? DbError(raw, rc, "open " + path) : FromCode(rc, "open " + path, nullptr);
    sqlite3_close_v2(raw);
    return s;
  }
  std::unique_ptr<Db> db(new Db(raw, path));
  sqlite3_extended_result_codes(raw, 1);
  rc = sqlite3_busy_timeout(raw, opts.busy_timeout_ms);
  if (rc != SQLITE_OK) return DbError(raw, rc, "busy_timeout " + path);
  if (!opts.read_only) {
    // journal_mode answers with the mode in effect ("memory" for :memory:).
    auto st = db->Prepare("PRAGMA journal_mode=WAL");
    if (!st.ok()) return st.status().WithContext(path);
    auto row = st->Step();
    if (!row.ok()) return row.status().WithContext(path);
    if (!*row) return Status::IOError("open " + path + ": PRAGMA journal_mode returned nothing");
    std::string mode = st->ColumnText(0);
    if (mode != "wal" && mode != "memory") {
      return Status::IOError("open " + path + ": cannot enable WAL mode (journal_mode is " + mode + ")");
    }
  }
  if (!opts.vfs.empty()) CDP_RETURN_IF_ERROR(db->Exec("PRAGMA temp_store=MEMORY").WithContext(path));
  CDP_RETURN_IF_ERROR(db->Exec("PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;").WithContext(path));
  return db;
}

Db::~Db() {
  int rc = sqlite3_close_v2(db_);
  if (rc != SQLITE_OK) cdp::log::Get("sqlite")->warn("close {}: {}", path_, sqlite3_errstr(rc));
}

Status Db::Exec(std::string_view sql) {
  std::string text(sql);
  char* err = nullptr;
  int rc = sqlite3_exec(db_, text.c_str(), nullptr, nullptr, &err);
  if (rc != SQLITE_OK) {
    Status s = FromCode(sqlite3_extended_errcode(db_), "exec", err != nullptr ? err : sqlite3_errmsg(db_));
    sqlite3_free(err);
    return s;
  }
  return Status::OK();
}

Result<Statement> Db::Prepare(std::string_view sql) {
  if (sql.size() > size_t(std::numeric_limits<int>::max())) return Status::InvalidArgument("prepare: SQL too long");
  sqlite3_stmt* stmt = nullptr;
  int rc = sqlite3_prepare_v2(db_, sql.data(), int(sql.size()), &stmt, nullptr);
  if (rc != SQLITE_OK) return DbError(db_, rc, "prepare '" + std::string(sql) + "'");
  if (stmt == nullptr) return Status::InvalidArgument("prepare: empty statement");
  return Statement(this, stmt);
}

int64_t Db::LastInsertRowId() const { return sqlite3_last_insert_rowid(db_); }
int64_t Db::Changes() const { return sqlite3_changes64(db_); }

bool Db::InTransaction() const { return sqlite3_get_autocommit(db_) == 0; }

// ---------------------------------------------------------------- Statement

Statement::Statement(Statement&& o) noexcept : db_(o.db_), stmt_(o.stmt_) {
  o.db_ = nullptr;
  o.stmt_ = nullptr;
}

Statement& Statement::operator=(Statement&& o) noexcept {
  if (this != &o) {
    sqlite3_finalize(stmt_);
    db_ = o.db_;
    stmt_ = o.stmt_;
    o.db_ = nullptr;
    o.stmt_ = nullptr;
  }
  return *this;
}

Statement::~Statement() { sqlite3_finalize(stmt_); }

#define CDP_SQLITE_BIND(call, what)                                                          \
  do {                                                                                       \
    int rc_ = (call);                                                                        \
    if (rc_ != SQLITE_OK) return DbError(db_->handle(), rc_, "bind " what " ?" + std::to_string(index)); \
    return Status::OK();                                                                     \
  } while (0)

Status Statement::Bind(int index, int64_t v) { CDP_SQLITE_BIND(sqlite3_bind_int64(stmt_, index, v), "int"); }

Status Statement::Bind(int index, uint64_t v) {
  if (v > uint64_t(std::numeric_limits<int64_t>::max())) {
    return Status::OutOfRange("bind ?" + std::to_string(index) + ": " + std::to_string(v) + " exceeds INT64_MAX");
  }
  return Bind(index, int64_t(v));
}

Status Statement::Bind(int index, double v) { CDP_SQLITE_BIND(sqlite3_bind_double(stmt_, index, v), "double"); }

Status Statement::Bind(int index, std::string_view text) {
  CDP_SQLITE_BIND(sqlite3_bind_text64(stmt_, index, text.data(), text.size(), SQLITE_TRANSIENT, SQLITE_UTF8), "text");
}

Status Statement::Bind(int index, ByteSpan blob) {
  // A null pointer would bind NULL; an empty blob stays an empty blob.
  static const uint8_t kEmpty = 0;
  const void* p = blob.empty() ? &kEmpty : blob.data();
  CDP_SQLITE_BIND(sqlite3_bind_blob64(stmt_, index, p, blob.size(), SQLITE_TRANSIENT), "blob");
}

Status Statement::BindNull(int index) { CDP_SQLITE_BIND(sqlite3_bind_null(stmt_, index), "null"); }

#undef CDP_SQLITE_BIND

Result<bool> Statement::Step() {
  int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return DbError(db_->handle(), rc, std::string("step '") + sqlite3_sql(stmt_) + "'");
}

Status Statement::Run() {
  auto r = Step();
  if (!r.ok()) return r.status();
  if (*r) return Status::InvalidArgument(std::string("run '") + sqlite3_sql(stmt_) + "': statement returned a row");
  return Status::OK();
}

Status Statement::Reset() {
  // sqlite3_reset repeats the last step's error; that error was already reported by Step().
  sqlite3_reset(stmt_);
  int rc = sqlite3_clear_bindings(stmt_);
  if (rc != SQLITE_OK) return DbError(db_->handle(), rc, "reset");
  return Status::OK();
}

int Statement::ColumnCount() const { return sqlite3_column_count(stmt_); }
bool Statement::ColumnIsNull(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }
int64_t Statement::ColumnInt64(int col) const { return sqlite3_column_int64(stmt_, col); }
double Statement::ColumnDouble(int col) const { return sqlite3_column_double(stmt_, col); }

std::string Statement::ColumnText(int col) const {
  const unsigned char* p = sqlite3_column_text(stmt_, col);
  int n = sqlite3_column_bytes(stmt_, col);
  if (p == nullptr || n <= 0) return {};
  return std::string(reinterpret_cast<const char*>(p), size_t(n));
}

Bytes Statement::ColumnBlob(int col) const {
  const void* p = sqlite3_column_blob(stmt_, col);
  int n = sqlite3_column_bytes(stmt_, col);
  if (p == nullptr || n <= 0) return {};
  const uint8_t* b = static_cast<const uint8_t*>(p);
  return Bytes(b, b + n);
}

// ---------------------------------------------------------------- Transaction

Result<Transaction> Transaction::Begin(Db& db) {
  if (sqlite3_get_autocommit(db.handle()) == 0) {
    return Status::InvalidArgument("begin " + db.path() + ": a transaction is already open");
  }
  CDP_RETURN_IF_ERROR(db.Exec("BEGIN IMMEDIATE").WithContext("begin " + db.path()));
  return Transaction(&db);
}

Transaction::~Transaction() {
  if (db_ == nullptr) return;
  Status s = Rollback();
  if (!s.ok()) cdp::log::Get("sqlite")->error("rollback: {}", s.ToString());
}

Status Transaction::Commit() {
  if (db_ == nullptr) return Status::InvalidArgument("commit: transaction already finished");
  Status s = db_->Exec("COMMIT");
  if (!s.ok()) {
    std::string path = db_->path();
    Status r = Rollback();
    if (!r.ok()) cdp::log::Get("sqlite")->error("rollback after failed commit: {}", r.ToString());
    return s.WithContext("commit " + path);
  }
  db_ = nullptr;
  return Status::OK();
}

Status Transaction::Rollback() {
  if (db_ == nullptr) return Status::OK();
  Db* db = db_;
  db_ = nullptr;
  // sqlite may already have rolled back on its own (e.g. after SQLITE_FULL).
  if (sqlite3_get_autocommit(db->handle()) != 0) return Status::OK();
  return db->Exec("ROLLBACK").WithContext("rollback " + db->path());
}

}  // namespace cdp::sqlite

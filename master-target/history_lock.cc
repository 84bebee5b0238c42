// SPDX-License-Identifier: Apache-2.0
#include "master-target/history_lock.h"

#include <algorithm>

#include "common/base/log.h"

namespace cdp::mt {

namespace {
// "24h", "90s": as the config says it.
std::string Hours(uint64_t us) {
  if (us % 3'600'000'000ull == 0) return std::to_string(us / 3'600'000'000ull) + "h";
  return std::to_string(us / 1'000'000) + "s";
}
}  // namespace

Result<HistoryLock> HistoryLock::Load(sqlite::Db& db, uint64_t configured_us, uint64_t now_us, std::string volume) {
  HistoryLock l;
  l.volume_ = std::move(volume);
  CDP_RETURN_IF_ERROR(db.Exec(
      "CREATE TABLE IF NOT EXISTS history_lock(id INTEGER PRIMARY KEY CHECK (id = 1), lock_us INTEGER NOT NULL,"
      " prev_lock_us INTEGER NOT NULL, changed_us INTEGER NOT NULL)"));
  CDP_ASSIGN_OR_RETURN(auto st, db.Prepare("SELECT lock_us, prev_lock_us, changed_us FROM history_lock WHERE id = 1"));
  CDP_ASSIGN_OR_RETURN(bool row, st.Step());
  if (!row) {
    l.lock_us_ = configured_us;
    CDP_RETURN_IF_ERROR(l.Save(db));
    return l;
  }
  l.lock_us_ = uint64_t(st.ColumnInt64(0));
  l.prev_lock_us_ = uint64_t(st.ColumnInt64(1));
  l.changed_us_ = uint64_t(st.ColumnInt64(2));
  CDP_RETURN_IF_ERROR(l.Configure(db, configured_us, now_us));
  return l;
}

Status HistoryLock::Configure(sqlite::Db& db, uint64_t configured_us, uint64_t now_us) {
  if (configured_us == lock_us_) return Status::OK();
  const HistoryLock before = *this;
  auto log = log::Get("mt.volume");
  if (configured_us < lock_us_) {
    // The longer of the lock being replaced and one still waited out.
    const uint64_t old = std::max(lock_us_, pending_until_us(now_us) ? prev_lock_us_ : 0);
    const uint64_t pending_end = std::max(now_us + lock_us_, pending_until_us(now_us));
    prev_lock_us_ = old;
    changed_us_ = pending_end - old;
    log->warn("{} history lock shortened from {} to {}: the old lock holds until {} (wall micros)",
              log::Where{volume_, "", 0}, Hours(lock_us_), Hours(configured_us), pending_end);
  } else {
    log->info("{} history lock lengthened from {} to {}", log::Where{volume_, "", 0}, Hours(lock_us_),
              Hours(configured_us));
  }
  lock_us_ = configured_us;
  Status s = Save(db);
  if (!s.ok()) *this = before;
  return s;
}

uint64_t HistoryLock::pending_until_us(uint64_t now_us) const {
  if (prev_lock_us_ <= lock_us_) return 0;
  const uint64_t end = changed_us_ + prev_lock_us_;
  return now_us < end ? end : 0;
}

uint64_t HistoryLock::EffectiveUs(uint64_t now_us) const {
  return pending_until_us(now_us) ? std::max(lock_us_, prev_lock_us_) : lock_us_;
}

Status HistoryLock::Save(sqlite::Db& db) const {
  CDP_ASSIGN_OR_RETURN(auto st, db.Prepare("INSERT OR REPLACE INTO history_lock VALUES(1, ?1, ?2, ?3)"));
  CDP_RETURN_IF_ERROR(st.BindAll(lock_us_, prev_lock_us_, changed_us_));
  return st.Run();
}

}  // namespace cdp::mt

// SPDX-License-Identifier: Apache-2.0
// HistoryLock: the window of a volume's recent history that nothing may drop
// (DESIGN.md invariant 9; issue #37). A recovery point younger than the lock,
// and the undo journal it needs, is kept whatever the byte budget, the tenant's
// quota, a token or a peer asks: retention skips it, a rollback keeps it, and
// when the journal budget would need it, apply stops instead (ReplicaVolume,
// StallCause::kHistoryLock).
//
// The lock is configured by the master target's admin alone (the config file:
// retention.lock, tenant_retention_lock, volume_retention_lock). Lengthening it
// takes effect at once. Shortening it takes effect only after the old lock's
// duration has passed, as S3 Object Lock's compliance mode: until then the old
// lock still holds (for every point, which errs on the side of keeping), so
// an intruder holding the admin's config file must still wait out the window.
// The state is persisted in the volume's index (table `history_lock`,
// docs/formats/mt-index.md), so a restart, with or without a changed config,
// keeps it.
//
//   configured L ---- Configure(L' >= L) ----> L' at once
//        |
//        +----------- Configure(L' < L) at t --> L until t + L, then L'
//
// Thread safety: none; the owner (ReplicaVolume) calls it under its apply lock.
#pragma once

#include <cstdint>
#include <string>

#include "common/base/result.h"
#include "common/base/status.h"
#include "common/store/sqlite.h"

namespace cdp::mt {

class HistoryLock {
 public:
  HistoryLock() = default;

  // Reads the volume's lock from `db` (making its table when the index is
  // older than the lock), then configures it to `configured_us` at `now_us`.
  // An index with no lock row gets `configured_us` at once. sqlite's Status on
  // failure. `volume` names the volume in the log.
  static Result<HistoryLock> Load(sqlite::Db& db, uint64_t configured_us, uint64_t now_us, std::string volume);

  // The admin's configured lock is now `configured_us` (see above); persisted
  // in `db` before it returns OK. A no-op when unchanged.
  Status Configure(sqlite::Db& db, uint64_t configured_us, uint64_t now_us);

  // The lock in force at `now_us`: the configured one, or a longer one being
  // waited out. 0: no lock.
  uint64_t EffectiveUs(uint64_t now_us) const;
  // Whether a point taken at `time_us` is inside the lock at `now_us`.
  bool Holds(uint64_t time_us, uint64_t now_us) const {
    const uint64_t l = EffectiveUs(now_us);
    return l != 0 && time_us + l > now_us;
  }
  uint64_t configured_us() const { return lock_us_; }
  // While a shortening is waited out: when the longer lock ends; else 0.
  uint64_t pending_until_us(uint64_t now_us) const;

 private:
  Status Save(sqlite::Db& db) const;

  std::string volume_;
  uint64_t lock_us_ = 0;       // configured
  uint64_t prev_lock_us_ = 0;  // the longer lock a shortening waits out
  uint64_t changed_us_ = 0;    // when the shortening was configured
};

}  // namespace cdp::mt

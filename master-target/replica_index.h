// SPDX-License-Identifier: Apache-2.0
// Replica index: the sqlite half of a master-target ReplicaVolume's state — the
// volume row (identity, applied sequence, committed journal position, horizon,
// state), the journal segments and the recovery points. Its format is written
// down in docs/formats/mt-index.md.
//
// The ReplicaVolume owns the sqlite::Db; the index code lives in replica_index.cc:
// CreateIndexSchema here, and the ReplicaVolume members that create the row
// (CreateFiles), load it (LoadIndex) and commit an applied batch (CommitBatch,
// the commit point of the apply protocol in master-target/replica_volume.h).
//
// Thread safety: none of its own. The ReplicaVolume calls it at Open, or with its
// apply mutex held.
#pragma once

#include "common/base/status.h"
#include "common/store/sqlite.h"

namespace cdp::mt {

// Creates the index tables if they do not exist. Failure: sqlite's Status.
Status CreateIndexSchema(sqlite::Db& db);

}  // namespace cdp::mt

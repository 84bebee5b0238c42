// SPDX-License-Identifier: Apache-2.0
// Failback at the original site: one pass of `cdpctl failback` (runbook in
// docs/recovery.md; the messages in common/wire/protocol.h, "Failback"). A pass
// brings the source volume level with the provider's promoted image wherever
// the two may differ, moving only the blocks that do:
//
//   the plan, page by page: FailbackPlanRequest -> PS -> MT (on the volume's
//   link, FailbackOptions::call). The blocks the
//   provider side changed after the failover point (the MT's journal after
//   it and the provider's writes) plus the process server's records it
//   never delivered
//     U  the original site's own never-shipped blocks: every record in the
//        capture queue above the PS's acknowledgement, and every region
//        flagged for a resync (bitmap mode, or dirty at a restart)
//     |
//   the union, in pieces of <= kMaxPullBlocks blocks, max_requests in flight:
//   read the piece here, digest each block (common/wire/block_digest.h), send
//   PullRequest{blocks, digests}
//     |
//   PullResponse: exactly the blocks whose provider content differs. For
//   each run: its old content is saved to the branch first (BranchStore::Save:
//   data synced, then its index), then the new content is written to the
//   backing store (CaptureDevice::WriteFailback, not captured); the backing
//   store is synced once, at the end of the pass.
//
// Nothing is silently lost: a block of the source is overwritten only after
// its old content is durable in the branch, and a block saved once keeps its
// first content (a re-run after a crash never saves failback's own writes).
// A pass is idempotent: blocks already equal are compared and not pulled.
// The caller fences the tap's writes (CaptureDevice::SetWriteFence) for the
// whole failback, so what a pass reads is what it overwrites.
//
// Every answer is checked before anything is written: a record outside the
// blocks asked for, unaligned, of another kind, or an answer to an unknown
// request fails the pass (kCorruption) with nothing of that answer applied.
//
// Thread safety: RunFailbackPass runs on the caller's thread; one pass per
// volume at a time (the agent serialises them).
#pragma once

#include <cstdint>
#include <string>

#include "agent/branch_store.h"
#include "agent/capture_device.h"
#include <functional>
#include <memory>

#include "common/base/result.h"
#include "common/wire/replication_sender.h"

namespace cdp::agent {

struct FailbackOptions {
  // Sends a request to the process server and calls back with its answer:
  // the volume's link's ReplicationSender::CallAsync (Sender::CallAsync), the
  // one request path of the agent, like the process server's to the MT.
  std::function<void(proto::Message, repl::ReplicationSender::CallCallback, std::shared_ptr<repl::CallBytes>)> call;
  std::string peer;  // for log lines: the process server's address
  uint64_t answer_timeout_ms = 120'000;  // for each answer
  int max_requests = 8;                   // PullRequests in flight
};

struct FailbackPassStats {
  uint64_t plan_blocks = 0;      // blocks the provider side named (MT + PS)
  uint64_t local_blocks = 0;     // blocks the original site never shipped
  uint64_t compared_blocks = 0;  // the union: digested here, compared there
  uint64_t pulled_blocks = 0;    // blocks that differed, now written here
  uint64_t pulled_bytes = 0;     // bytes of those blocks
  uint64_t saved_blocks = 0;     // of those, newly saved to the branch
  uint64_t requests = 0;         // plan pages + pulls
  uint64_t wire_bytes_in = 0;    // frames received from the PS (compressed)
  uint64_t wire_bytes_out = 0;   // frames sent to it (digests)
  double seconds = 0;
};

// One pass (see above). kInvalidArgument when the master target says the
// volume is not failing back; kUnavailable when the PS or the MT cannot
// answer (nothing half-applied: every answer is applied whole or not at all,
// and a re-run continues); kCorruption for a malformed answer.
Result<FailbackPassStats> RunFailbackPass(CaptureDevice& dev, BranchStore& branch, const FailbackOptions& o);

}  // namespace cdp::agent

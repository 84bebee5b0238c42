// SPDX-License-Identifier: Apache-2.0
// SpooledVolume: one (tenant, volume) at the process server: its spool, the
// VolumeOpen it was created with (persisted as volume.meta beside the spool so
// the backlog can be shipped after a restart before the agent reconnects), its
// codec, and its counters. The bytes of volume.meta, copies.meta,
// beyond.meta and anchor.meta: process-server/spool_meta.h.
//
// Copies: the volume ships to one or more master targets (copy 0 is the
// primary: the MT of `mt`, or the first of several `mt` keys). Each copy has
// its own cursor, the highest sequence that copy's MT acknowledged durable
// (its own MtLink reads the spool from there). The spool releases (deletes)
// only what EVERY copy acknowledged: the lowest cursor, so the spool's backlog,
// quota and back-pressure are those of the slowest copy. A copy the spool can
// no longer serve (its MT stands below what was already released: an MT that
// lost its replica, or an MT added to an existing volume) is "lost": it stalls
// ("resync needed") and no longer holds the spool back.
//
// The cursors are persisted in copies.meta beside volume.meta
// (docs/formats/spool.md), written with WriteFileAtomic at most every
// `cursor_sync_ms` as they advance, by the process server's flusher once
// that long after the last move (PersistCursorsIfMoved), and on Close(). A
// persisted cursor is a lower bound (it never runs ahead of the MT's
// acknowledgement); at open a cursor is at least the spool's released
// sequence (nothing above it was released, so every copy had acknowledged
// it), and the spool is released at once up to the lowest persisted cursor,
// so that a restart shows the true backlog even while an MT does not answer
// (issue 38 F2: the active segment's shipped records counted as backlog). The
// truth is each MT's VolumeOpenReply after a (re)connection, which resets that
// copy's cursor (SetCopyOpened).
//
// Two files name copies, each written with WriteFileAtomic while it names
// one and removed (then the directory synced) when it names none, so that a
// restart of the process server keeps their refusals:
//   beyond.meta  the copies refused as "beyond" the spool (CopyState::beyond);
//   anchor.meta  the copies whose MT has not answered an open since the spool
//                was created (CopyState::unanchored); written before
//                volume.meta when the spool is created.
// A damaged file names every copy (a refusal is never dropped on a guess).
//
// Thread safety: the spool is thread-safe; counters are atomics; the copy
// cursors are guarded by a mutex; the rest is immutable after Open().
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/base/clock.h"
#include "common/env/env.h"
#include "common/wire/protocol.h"
#include "process-server/spool.h"
#include "process-server/spool_meta.h"

namespace cdp::ps {

// A spool retired by a generation switch (re-protect) keeps its files in a
// sibling directory "<volume>.gen<G>.retired-<unix seconds>" until an
// operator deletes it. The start-up scan skips such directories, and agents
// may not name a volume with the mark.
inline constexpr std::string_view kRetiredMark = ".retired-";
inline bool IsRetiredSpoolName(std::string_view name) { return name.find(kRetiredMark) != std::string_view::npos; }

// One copy of a volume as the control API shows it.
struct CopyState {
  std::string mt;        // the master target's host:port
  uint64_t acked = 0;    // highest sequence it acknowledged durable (its cursor)
  bool lost = false;     // the spool can no longer serve it (resync needed)
  std::string stalled;   // why its shipping stopped ("" while it ships)
  // Stalled at records this spool cannot give it: a record failed its check,
  // or its MT stands beyond the spool while records wait (the spool lost
  // some). Nothing more of this spool can be delivered to it. Kept while the
  // stall clears at a reconnect; cleared when the copy acknowledges more.
  bool undeliverable = false;
  // Its MT answered an open with a sequence beyond the spool while the spool
  // held records: records numbered since may carry numbers the MT applied to
  // other writes, so the copy is refused (across restarts) even once the
  // spool passes that sequence, until the floor is learned from every MT
  // (ClearBeyond) or a re-protect retires the spool. Persisted in beyond.meta.
  bool beyond = false;
  // Its MT has not answered an open since this spool was created (a new
  // volume, a spool lost, a volume moved here): the spool may number records
  // its MT already holds under the same numbers, so the first answer decides
  // whether the copy can be served (process-server/mt_link.cc). Persisted in
  // anchor.meta.
  bool unanchored = false;
  std::string fenced;    // its MT's "failed over" refusal, "" otherwise
};

struct VolumeCounters {
  std::atomic<uint64_t> bytes_in{0};      // record data bytes accepted from agents
  std::atomic<uint64_t> records_in{0};
  std::atomic<uint64_t> batches_in{0};
  std::atomic<uint64_t> busy_nacks{0};
  std::atomic<uint64_t> raw_out{0};       // record bytes (header+data as spooled) shipped
  std::atomic<uint64_t> wire_out{0};      // frame bytes put on the wire
  std::atomic<uint64_t> frames_out{0};
  std::atomic<uint64_t> resent_frames{0}; // after a gap / busy / reconnect
  std::atomic<uint64_t> mt_acked{0};      // highest sequence the primary MT (copy 0) made durable
  std::atomic<uint64_t> corruptions{0};
};

class SpooledVolume {
 public:
  // Opens or creates the volume in `dir`. `open` = the agent's VolumeOpen, or
  // nullptr to reopen from volume.meta at start-up. A different generation than
  // the stored one is kInvalidArgument ("wrong generation"). A sealed
  // volume ships with Codec::kNone whatever `codec` says (its blocks are
  // ciphertext). `copies` names the master targets the volume ships to, the
  // primary first (empty: one unnamed copy); with two or more, copies.meta is
  // read (a bad one is kCorruption) and kept up to date every
  // `cursor_sync_ms` of spool_options.clock.
  static Result<std::unique_ptr<SpooledVolume>> Open(const SpoolOptions& spool_options, const std::string& tenant,
                                              const proto::VolumeOpen* open, proto::Codec codec, int level,
                                              const std::vector<std::string>& copies = {},
                                              uint64_t cursor_sync_ms = 1000);

  const std::string& tenant() const { return tenant_; }
  const std::string& name() const { return open_.name; }
  std::string key() const { return tenant_ + "/" + open_.name; }
  const proto::VolumeOpen& open_message() const { return open_; }
  proto::Codec codec() const { return codec_; }
  int level() const { return level_; }
  // Frames of this volume in flight to each MT (volume_inflight; 0: the
  // link's inflight). Set before the volume is added to its links.
  int max_inflight() const { return max_inflight_; }
  void set_max_inflight(int n) { max_inflight_ = n; }
  Spool& spool() { return *spool_; }
  VolumeCounters& counters() { return counters_; }

  size_t copies() const { return copies_.size(); }
  // Copy `copy` (< copies()) acknowledged every record <= `seq` (cursors only
  // move up here): the spool releases what every copy has. From the copy's
  // MtLink (Acked, a gap's Resume).
  void SetCopyAcked(size_t copy, uint64_t seq);
  // The copy's MT answered its VolumeOpen with `durable`: its cursor becomes
  // that (lower too: the MT is the truth). Returns false, and marks the copy
  // lost, when the spool released records above `durable` (it cannot serve
  // the copy: resync needed); true otherwise (lost cleared).
  bool SetCopyOpened(size_t copy, uint64_t durable);
  // CopyState::beyond of copy `copy`: set, read; ClearBeyond clears every
  // copy's. Both rewrite beyond.meta when it changes; an error writing it is
  // returned (the state in memory has changed all the same).
  Status SetBeyond(size_t copy);
  bool beyond(size_t copy) const;
  Status ClearBeyond();
  // CopyState::unanchored of copy `copy`: read; SetAnchored clears it once
  // anchor.meta no longer names it (an error writing it is returned, and the
  // copy stays unanchored).
  bool unanchored(size_t copy) const;
  Status SetAnchored(size_t copy);
  // The lowest cursor of the copies the spool can serve (not lost, not below
  // the released sequence: what the spool may release); the released
  // sequence when there is none.
  uint64_t ReleasableSeq() const;
  std::vector<CopyState> CopyStates() const;
  // No copy can still be served anything of this spool: each one acknowledged
  // everything spooled, is lost (resync needed), or is stalled undeliverable.
  // A re-protect may then retire the spool without leaving a record
  // undelivered that could be.
  bool NothingToDeliver() const;
  // Writes copies.meta now (ok when closed); PersistCursorsIfMoved only when
  // a cursor moved since it was last written.
  Status PersistCursors();
  Status PersistCursorsIfMoved();
  // Persists the cursors and closes the spool (Spool::Close); nothing of the
  // volume writes to its directory afterwards. Idempotent.
  void Close();

  // Why shipping of copy `copy` stopped ("" while it ships); set by its link.
  // `undeliverable`: see CopyState.
  void SetStalled(size_t copy, std::string reason, bool undeliverable = false);
  void SetStalled(std::string reason) { SetStalled(0, std::move(reason)); }
  // Every stalled copy's reason ("" when none): the primary's alone with one
  // copy, else "mt HOST:PORT: reason; ...".
  std::string stalled() const;
  // The master target's "failed over" refusal (proto::IsFailedOverNack) while
  // the volume is fenced, "" otherwise; set by the copy's link. The volume is
  // fenced while any copy is (the primary's message first). While fenced the
  // agent's VolumeOpen and WriteBatch get the same refusal and nothing is
  // spooled (process-server/agent_session.h).
  void SetFenced(size_t copy, std::string message);
  void SetFenced(std::string message) { SetFenced(0, std::move(message)); }
  std::string fenced() const;

 private:
  SpooledVolume() = default;
  // Releases the spool up to ReleasableSeq() and persists the cursors when
  // cursor_sync_ms has passed; mu_ not held.
  void AfterCursorMove();
  // Writes `list` naming the copies whose `member` is set (removes it when
  // none is).
  Status PersistCopyList(const CopyList& list, bool CopyState::*member);
  // Writes `list` naming `names` (removes it when empty); persist_mu_ held.
  Status WriteCopyList(const CopyList& list, const std::vector<std::string>& names);

  std::string tenant_;
  proto::VolumeOpen open_;
  proto::Codec codec_ = proto::Codec::kNone;
  int level_ = 0;
  int max_inflight_ = 0;
  std::unique_ptr<Spool> spool_;
  VolumeCounters counters_;
  Clock* clock_ = nullptr;
  std::string dir_;
  Env* env_ = nullptr;
  uint64_t cursor_sync_us_ = 0;
  std::mutex release_mu_;          // a release's computation and Spool::Release, and SetCopyOpened's check
  mutable std::mutex mu_;
  std::vector<CopyState> copies_;  // mu_
  uint64_t persisted_us_ = 0;      // mu_: when copies.meta was last written
  bool dirty_ = false;             // mu_: cursors moved since
  std::mutex persist_mu_;          // one writer of copies.meta (and of beyond.meta) at a time; held by Close
  bool closed_ = false;            // persist_mu_
};

}  // namespace cdp::ps

// SPDX-License-Identifier: Apache-2.0
// FaultEnv: an Env wrapper that models durability exactly and injects errors
// (leveldb's db/fault_injection_test.cc idea, generalised to pwrite, truncate,
// punch-hole and renames).
//
// It forwards every call to a base Env (typically NewMemEnv()) and keeps, on the
// side, what a power cut would leave behind:
//
//   * Data. For every file it remembers the content as of its last successful
//     File::Sync(): the synced size plus the original bytes of every 4 KiB block
//     below that size that was modified since (an undo log, filled on the first
//     touch of a block after a sync). Write, Append, Truncate, Allocate,
//     PunchHole and opening with `truncate` are all "unsynced" until Sync().
//   * Names. A file's creation, a Rename() and a Remove() change the name space
//     at once (the base Env sees them), but they become durable only when
//     SyncDir() is called on the parent directory of the name concerned. For a
//     rename from dir A to dir B, SyncDir(B) makes the new name durable and
//     SyncDir(A) makes the disappearance of the old name durable (the strict
//     POSIX reading; ext4's journalled rename is more forgiving, tests should not
//     rely on that).
//   * Files that already exist in the base Env when first seen by the FaultEnv
//     are taken as fully durable (content and name).
//   * Directories: CreateDirs() and RemoveDir() are taken as durable at once
//     (a simplification: OpenCDP creates its directories at start-up).
//
// DropUnsyncedData() is the simulated power cut: afterwards the base Env holds
// exactly the durable state — every durable name points to a file whose content
// is the last synced content of the file it named; every name not durable is
// gone; a file removed (or overwritten by a rename) but whose removal was not
// made durable comes back with its synced content. Every File opened before the
// drop returns kAborted from then on (the process that held it is dead).
//
// Error injection. Every operation is counted per Op. InjectError() makes a
// chosen call of an operation fail with Status::FromErrno(err, path) — ENOSPC
// gives kNoSpace, EIO gives kIOError — and the failed call changes nothing.
// SetCrashAfterSyncs(n) models "the power went after the n-th sync point": the
// first n successful sync points (File::Sync and SyncDir) pass, and from then on
// every mutating call fails with EIO and changes nothing, until
// DropUnsyncedData() (the reboot). A test crashes at every sync point with:
//
//   for (uint64_t n = 0;; ++n) {
//     MemEnv + FaultEnv fresh;  fault.SetCrashAfterSyncs(n);
//     Status s = Workload(&fault);            // fails once the "power" is gone
//     bool finished = !fault.crashed();
//     fault.DropUnsyncedData();  CheckRecovery(&fault);
//     if (finished) break;
//   }
//
// SetCapacity(bytes) models a full disk: a Write/Append/Allocate/Truncate that
// would make the sum of the sizes of all named files exceed `bytes` fails with
// ENOSPC and changes nothing.
//
// Limits: Rename() of a directory returns kNotSupported. Files must be reached only through this FaultEnv while it is in use
// (changes made behind its back are not modelled). DropUnsyncedData() restores
// in place when a file still sits at its durable name, otherwise it copies the
// synced content through memory.
//
// Thread safety: all methods are thread-safe. One mutex serialises every
// operation (including the forwarded I/O), so a FaultEnv is for correctness
// tests, not for measuring speed.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/env/env.h"

namespace cdp {

class FaultEnv : public Env {
 public:
  // The operations that are counted and can be made to fail.
  enum class Op : int {
    kOpen = 0,     // Env::Open
    kRead,         // File::Read, File::ReadUpTo
    kWrite,        // File::Write
    kAppend,       // File::Append
    kSync,         // File::Sync
    kAllocate,     // File::Allocate
    kPunchHole,    // File::PunchHole
    kTruncate,     // File::Truncate
    kRename,       // Env::Rename
    kRemove,       // Env::Remove
    kSyncDir,      // Env::SyncDir
    kCreateDirs,   // Env::CreateDirs
    kCount,
  };
  static const char* OpName(Op op);

  // `base` must outlive this FaultEnv; this FaultEnv must outlive every File
  // opened through it.
  explicit FaultEnv(Env* base);
  ~FaultEnv() override;
  FaultEnv(const FaultEnv&) = delete;
  FaultEnv& operator=(const FaultEnv&) = delete;

  // --- Env ---
  Result<std::unique_ptr<File>> Open(const std::string& path, const OpenOptions& opts) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status Remove(const std::string& path) override;
  Status SyncDir(const std::string& dir) override;
  Status CreateDirs(const std::string& dir) override;
  Status RemoveDir(const std::string& dir) override;
  bool Exists(const std::string& path) override;
  Result<std::vector<std::string>> ListDir(const std::string& dir) override;
  Result<uint64_t> FileSize(const std::string& path) override;
  Result<std::unique_ptr<FileLock>> LockFile(const std::string& path) override;

  // --- Power cut ---
  // Resets the base Env to the durable state described above, invalidates every
  // File opened so far, and clears the crashed state (injected errors stay until
  // ClearErrors()). Returns a non-ok Status only if the base Env fails.
  Status DropUnsyncedData();

  // --- Error injection ---
  // Counting from now, calls 1..after_n_calls of `op` succeed (if nothing else
  // fails them) and call after_n_calls+1 fails with Status::FromErrno(err, ...)
  // without changing anything. With `sticky`, every later call of `op` fails too.
  // Several injections may be armed at once (one per Op; a new one replaces the
  // old one for that Op).
  void InjectError(Op op, int err, uint64_t after_n_calls = 0, bool sticky = false);
  // Disarms every injection and the crash trigger (does not revive a crashed env;
  // only DropUnsyncedData() does).
  void ClearErrors();
  // How many times `op` has been called (failed calls included) since
  // construction or ResetCounters().
  uint64_t CallCount(Op op) const;
  // How many injected errors (InjectError) have fired.
  uint64_t InjectedFailures() const;
  void ResetCounters();

  // After `n` more successful sync points (File::Sync or SyncDir), the env
  // "loses power": every mutating call (Open with create/truncate, Write, Append,
  // Sync, Allocate, PunchHole, Truncate, Rename, Remove, SyncDir, CreateDirs,
  // RemoveDir) fails with EIO and changes nothing. n = 0 crashes at the first
  // sync point. Reads keep working.
  void SetCrashAfterSyncs(uint64_t n);
  // Loses power now (as if the crash trigger fired).
  void CrashNow();
  bool crashed() const;
  // Successful sync points since construction or ResetCounters().
  uint64_t SyncPoints() const;

  // Total bytes of all named files allowed; nullopt = unlimited (default).
  void SetCapacity(std::optional<uint64_t> bytes);

 private:
  class FaultFile;
  struct Inode;
  struct State;
  std::unique_ptr<State> st_;
};

}  // namespace cdp

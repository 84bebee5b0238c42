// SPDX-License-Identifier: Apache-2.0
// DigestStore: the leaf digests (common/wire/block_digest.h) of a replica's current
// image, in a file beside the replica (docs/formats/digest-store.md), kept up
// to date as records are applied. A resync compares a volume's regions against
// it without reading the replica: hashing a 2 GiB replica to answer a full
// compare costs the master target about a CPU second, looking its digests up
// costs a few milliseconds. Leaves the store does not know are read from the
// replica, hashed, and remembered.
//
// It is a cache, never a source of truth:
//   - Every write to the replica goes through Wrote / Zeroed / Forget, under
//     the volume's apply mutex: Wrote / Zeroed after the replica write
//     succeeded, Forget when it failed (it may have landed in part).
//   - Digests written by a process that did not Close() the store (kill -9,
//     power loss) are discarded at the next Open: the header says "open" from
//     Open until Close, and an open store is emptied when opened again.
//   - A write to the store that fails disables it until the next Open: Get
//     then reports every leaf unknown, and the header stays "open".
// So a known digest always describes what the replica held when it was last
// written through the volume. What went bad on the disk behind our back is
// online verify's business: it reads the replica afresh.
//
// Each leaf takes 16 bytes (0.4% of the volume); the file is sparse, and the
// leaves of a range never written through the store take no space.
//
// Thread safety: none; the volume calls it under its apply mutex.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/base/result.h"
#include "common/env/env.h"
#include "common/wire/protocol.h"

namespace cdp::mt {

class DigestStore {
 public:
  static constexpr uint64_t kHeaderSize = 4096;
  static constexpr uint64_t kEntrySize = 16;

  // Opens or creates the store at `path` for the replica of the volume
  // `uuid` of `volume_size` bytes. A store of another volume or size, a
  // damaged header, or one left open by a crash starts empty. The header is
  // marked open (and synced) before Open returns.
  static Result<std::unique_ptr<DigestStore>> Open(Env* env, const std::string& path,
                                                   const std::array<uint8_t, 16>& uuid, uint64_t volume_size);
  // Without Close() the header stays open, and the next Open starts empty.
  ~DigestStore() = default;
  // Syncs the digests, then marks the header clean: the next Open keeps them.
  // Only for a store whose every change reached it (the volume is not broken).
  Status Close();

  // The digests of leaves [first, first + count) into `leaves` (resized to
  // count); known[i] false where the store does not know leaf first + i.
  // Never fails: a store that cannot be read knows nothing.
  void Get(uint64_t first, size_t count, std::vector<proto::Hash128>* leaves, std::vector<bool>* known);
  // Remembers digests read from the replica for leaves [first, first + n).
  void Put(uint64_t first, std::span<const proto::Hash128> leaves);

  // Ranges are clipped to the volume (a sealed volume's replica file holds
  // its MACs after it; they have no digests).
  // The replica now holds `data` at `offset`: the leaves it covers whole get
  // their digests, the ones it covers in part are forgotten.
  void Wrote(uint64_t offset, std::span<const uint8_t> data);
  // The replica now reads zeros in [offset, offset + len).
  void Zeroed(uint64_t offset, uint64_t len);
  // [offset, offset + len) of the replica changed in a way the store does not see.
  void Forget(uint64_t offset, uint64_t len);

  bool enabled() const { return file_ != nullptr; }
  // Leaves Get found known, since Open.
  uint64_t hits() const { return hits_; }

 private:
  explicit DigestStore(uint64_t volume_size) : size_(volume_size), leaves_((volume_size + 4095) / 4096) {}
  Status WriteHeader(uint32_t state);
  // Writes entries for leaves [first, first + n); a failure disables the store.
  void WriteEntries(uint64_t first, std::span<const proto::Hash128> leaves);
  // Leaves [first, last) become unknown.
  void Unknown(uint64_t first, uint64_t last);
  void Disable();

  const uint64_t size_;
  const uint64_t leaves_;
  std::array<uint8_t, 16> uuid_{};
  std::unique_ptr<File> file_;  // null: disabled
  bool open_ = false;           // the header says open
  uint64_t hits_ = 0;
};

}  // namespace cdp::mt

// SpooledVolume: one (tenant, volume) at the process server: its spool, the
// VolumeOpen it was created with (persisted as volume.meta beside the spool so
// the backlog can be shipped after a restart before the agent reconnects), its
// codec, and its counters.
//
// volume.meta (docs/formats/spool.md, version 1), written with WriteFileAtomic:
//   magic u32 "CDPM" | version u32 = 1 | name_len u32 | name | size u64 |
//   block_size u32 | uuid[16] | generation u64 | crc32c u32 (over all before)
//
// Thread safety: the spool is thread-safe; counters are atomics; the rest is
// immutable after Open().
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "common/clock.h"
#include "common/env.h"
#include "common/protocol.h"
#include "process-server/spool.h"

namespace cdp::ps {

inline constexpr uint32_t kMetaMagic = 0x4d504443;  // "CDPM"
inline constexpr uint32_t kMetaVersion = 1;
inline constexpr uint8_t kMetaSealed = 1;  // the optional flags byte of a sealed volume

// A spool retired by a generation switch (re-protect) keeps its files in a
// sibling directory "<volume>.gen<G>.retired-<unix seconds>" until an
// operator deletes it. The start-up scan skips such directories, and agents
// may not name a volume with the mark.
inline constexpr std::string_view kRetiredMark = ".retired-";
inline bool IsRetiredSpoolName(std::string_view name) { return name.find(kRetiredMark) != std::string_view::npos; }

Bytes EncodeVolumeMeta(const proto::VolumeOpen& open);
Result<proto::VolumeOpen> DecodeVolumeMeta(ByteSpan data);

struct VolumeCounters {
  std::atomic<uint64_t> bytes_in{0};      // record data bytes accepted from agents
  std::atomic<uint64_t> records_in{0};
  std::atomic<uint64_t> batches_in{0};
  std::atomic<uint64_t> busy_nacks{0};
  std::atomic<uint64_t> raw_out{0};       // record bytes (header+data as spooled) shipped
  std::atomic<uint64_t> wire_out{0};      // frame bytes put on the wire
  std::atomic<uint64_t> frames_out{0};
  std::atomic<uint64_t> resent_frames{0}; // after a gap / busy / reconnect
  std::atomic<uint64_t> mt_acked{0};      // highest sequence the MT made durable
  std::atomic<uint64_t> corruptions{0};
};

class SpooledVolume {
 public:
  // Opens or creates the volume in `dir`. `open` = the agent's VolumeOpen, or
  // nullptr to reopen from volume.meta at start-up. A different generation than
  // the stored one is kInvalidArgument ("wrong generation"). A sealed
  // volume ships with Codec::kNone whatever `codec` says (its blocks are
  // ciphertext).
  static Result<std::unique_ptr<SpooledVolume>> Open(const SpoolOptions& spool_options, const std::string& tenant,
                                              const proto::VolumeOpen* open, proto::Codec codec, int level);

  const std::string& tenant() const { return tenant_; }
  const std::string& name() const { return open_.name; }
  std::string key() const { return tenant_ + "/" + open_.name; }
  const proto::VolumeOpen& open_message() const { return open_; }
  proto::Codec codec() const { return codec_; }
  int level() const { return level_; }
  Spool& spool() { return *spool_; }
  VolumeCounters& counters() { return counters_; }

  // Why shipping of this volume stopped ("" while it ships); set by the link.
  void SetStalled(std::string reason);
  std::string stalled() const;
  // The master target's "failed over" refusal (proto::IsFailedOverNack) while
  // the volume is fenced, "" otherwise; set by the link. While fenced the
  // agent's VolumeOpen and WriteBatch get the same refusal and nothing is
  // spooled (process-server/agent_session.h).
  void SetFenced(std::string message);
  std::string fenced() const;

 private:
  SpooledVolume() = default;
  std::string tenant_;
  proto::VolumeOpen open_;
  proto::Codec codec_ = proto::Codec::kNone;
  int level_ = 0;
  std::unique_ptr<Spool> spool_;
  VolumeCounters counters_;
  mutable std::mutex mu_;
  std::string stalled_;
  std::string fenced_;
};

}  // namespace cdp::ps

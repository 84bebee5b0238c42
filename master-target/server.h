// MasterTarget: the provider-side daemon core — accepts process servers over
// TCP, applies their write batches to per-tenant replica volumes (Volume), and
// serves the control API and point-in-time NBD exports.
//
// ===================== Protocol contract with the process server =====================
// (common/protocol.h messages over common/channel.h FrameChannel; the process
// server codes against this; keep it.)
//
//   PS connects to `listen` (default port 7500), then ServerHandshake:
//     Hello.role must be kProcessServer (kAgent is accepted too, for direct
//     agent -> MT set-ups); the tenant and its secret come from the MT config.
//     Wrong secret / unknown tenant -> AuthResult refused, connection closed.
//
//   VolumeOpen{name, size, block_size, uuid, generation}
//     -> VolumeOpenReply{volume_id, durable_seq}
//        volume_id: handle valid on this connection only;
//        durable_seq: last applied and committed sequence (0: nothing yet) —
//        the sender resumes at durable_seq + 1.
//        First open creates the volume: a sparse replica file of `size` bytes
//        under the tenant's directory. Bad name/size/block size -> Nack kBadRecord.
//     -> Nack{kWrongGeneration} for another uuid, size or block size, a lower
//        generation, or a failed-over volume opened with the same generation.
//     -> Nack{kPermissionDenied} when creating it would exceed the tenant's quota.
//        A HIGHER generation re-protects: journal and points are dropped, the
//        replica is kept as it is, durable_seq = 0 (the sequence restarts at 1;
//        the source resyncs by region hashes).
//
//   WriteBatch{volume_id, records}
//     records are applied strictly in sequence order:
//       seq <= applied           duplicate: skipped (still acked)
//       first new seq != applied+1  -> Nack{kGap, expected_seq = applied+1}, nothing applied
//       a bad record (past the end of the volume, zero or absurd length, data
//       size != length, bad tag name, bad kind) -> Nack{kBadRecord}, nothing of
//       the batch applied; the connection and other volumes are unaffected
//       unknown volume_id       -> Nack{kUnknownVolume}
//       failed-over volume      -> Nack{kWrongGeneration}
//       tenant over its quota   -> Nack{kBusy} (retry later: retention frees journal space)
//       I/O failure at the MT   -> Nack{kInternal} (the partial batch is undone; resend)
//     once the whole batch is durable (journal synced, replica synced, sqlite
//     committed) -> Ack{volume_id, durable_seq = last seq of the batch}.
//     Acks come in the order of the batches (one reply per WriteBatch).
//     kFlush records make crash-consistent recovery points (at most one per
//     `point_interval`, default 5 s); kTag records always make a named point.
//
//   HashRequest{volume_id, request_id, region_size, first_region, count}
//     -> HashResponse{... hashes}: XXH3-128 of each region of the replica as of
//        the durable sequence (the last region of the volume may be short;
//        regions past the end are left out) or Nack{kBadRecord} for a bad
//        size/count or a first region past the end.
//   Heartbeat{sent_us} -> Heartbeat{sent_us = MT wall clock, echo_us = the peer's sent_us}
//   Stats -> ignored.  Anything else -> the connection is closed.
// ======================================================================================
//
// Files: <data_dir>/tenants/<tenant>/volumes/<volume>/{replica.img, index.db, journal/}
//        <data_dir>/tenants/<tenant>/exports/<n>.cow  (writable export overlays)
// Every path is built from validated names (proto::ValidName) under the
// tenant's directory; one tenant's volumes are never reachable by another.
//
// Control API (JSON over HTTP on `control`, common/http_server.h); a volume is
// named by `tenant` + `volume`, or `volume` alone when unique across tenants:
//   GET    /v1/volumes                       every volume and its state
//   GET    /v1/points?volume=V[&tenant=T]    recovery points
//   POST   /v1/rollback {"volume","tenant","point": id | "seq": n}
//   POST   /v1/export   {"volume","tenant","point": id | "seq": n, "writable": bool}
//                       -> {"export": name, "port": nbd port}
//   DELETE /v1/export?name=NAME              (or body {"export": NAME})
//   GET    /v1/exports                       open exports
//   GET    /v1/hashes?volume=V[&tenant=T]&region_size=&first=&count=
//   POST   /v1/retention                     run retention now on every volume
//
// Lifecycle: construct -> Start() (opens every volume: crash recovery first,
// then listeners) -> Stop() (idempotent; the destructor calls it).
//
// Thread safety: Start/Stop from the owning thread; everything else is
// internal (one thread per connection, the HTTP and NBD servers' threads, one
// retention thread).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/env.h"
#include "common/metrics.h"
#include "common/result.h"
#include "common/status.h"
#include "master-target/volume.h"

namespace cdp {
class FrameChannel;
class NbdServer;
namespace http {
class Server;
}
}  // namespace cdp

namespace cdp::mt {

struct MasterTargetOptions {
  Env* env = nullptr;               // POSIX env in the daemon; must outlive the MasterTarget
  const Clock* clock = nullptr;     // must outlive the MasterTarget
  std::string data_dir;             // real directory (sqlite lives there too)
  std::map<std::string, std::string> tenants;  // name -> secret
  // name -> bytes a tenant may use (sum of its volumes' sizes and journals);
  // absent or 0 = unlimited.
  std::map<std::string, uint64_t> tenant_quota_bytes;
  std::string listen_host = "0.0.0.0";
  int listen_port = 7500;           // 0 = ephemeral (tests)
  std::string control_host = "127.0.0.1";
  int control_port = 9102;          // 0 = ephemeral; < 0 = no control server
  std::string nbd_host = "127.0.0.1";
  int nbd_port = 10810;             // 0 = ephemeral; < 0 = no NBD exports
  uint64_t segment_bytes = 64ull << 20;
  uint64_t point_interval_us = 5'000'000;
  RetentionPolicy retention;
  uint64_t retention_check_us = 10'000'000;
  uint32_t handshake_timeout_ms = 10'000;
};

class MasterTarget {
 public:
  explicit MasterTarget(MasterTargetOptions opts);
  ~MasterTarget();
  MasterTarget(const MasterTarget&) = delete;
  MasterTarget& operator=(const MasterTarget&) = delete;

  // Opens every existing volume (crash recovery), then binds the listeners and
  // starts the threads. Failure: the first error; nothing is left running.
  Status Start();
  void Stop();

  uint16_t port() const { return port_.load(); }          // data listener
  uint16_t control_port() const;
  uint16_t nbd_port() const;
  metrics::Registry& registry() { return registry_; }

  // The volume `name` of `tenant`, if open. For tests and the control API.
  std::shared_ptr<Volume> FindVolume(const std::string& tenant, const std::string& name);

  // Starts an NBD export of the volume at `point_seq`; returns its name.
  // kOutOfRange for an unreachable point, kNotFound for an unknown volume.
  Result<std::string> StartExport(const std::string& tenant, const std::string& volume, uint64_t point_seq,
                                  bool writable);
  Status StopExport(const std::string& name);

  struct Impl;

 private:
  MasterTargetOptions o_;
  metrics::Registry registry_;
  std::atomic<uint16_t> port_{0};
  std::unique_ptr<Impl> impl_;
};

// The per-volume files directory: <data_dir>/tenants/<tenant>/volumes/<volume>.
// Both names must be valid (proto::ValidName); returns "" otherwise.
std::string VolumeDir(const std::string& data_dir, const std::string& tenant, const std::string& volume);

}  // namespace cdp::mt

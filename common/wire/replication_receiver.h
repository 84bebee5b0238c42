// SPDX-License-Identifier: Apache-2.0
// ReplicationReceiver: the one receiving half of replication, the mirror of
// the ReplicationSender (common/wire/replication_sender.h). The process
// server receives its agents with it (process-server/agent_session.h), the
// master target its process servers and direct agents
// (master-target/ps_session.h). It owns the session; the daemon supplies a
// ReceiverSink per connection that knows its volumes.
//
//   Listener thread (one per connection), Serve(ch):
//     ServerHandshake(secret) -> admit(tenant, peer)?  refused: Nack{kPermissionDenied}, close
//     sink = make_sink(session)
//     FrameInbox (reader thread: receive, decrypt, decode ahead, <= inbox_bytes)
//       |
//       v  Pop
//     VolumeOpen      -> sink.Open -> VolumeOpenReply{handle, durable} | Nack{0, ...}
//     WriteBatch      -> the handle's volume; the batches of that volume already
//                        received and continuing its sequence join it (group_work)
//                        -> volume.Append(records, n) -> n replies: Ack | Nack
//     HashRequest     -> volume.Digests(request, reply)   (capped in flight)
//     FailbackPlanRequest, PullRequest -> sink.Call(request, reply)   (capped)
//     Heartbeat       -> echoed;  Stats -> ignored
//     GroupHeld       -> sink.Answered at once, from the inbox's reader (the
//                        answer to a GroupHold the daemon pushed through
//                        sink.Attach's function; it does not wait for the
//                        batches queued before it)
//     anything else   -> close
//     every 500 ms, between messages (busy or idle):
//       the peer's certificate distrusted since (revoked: `distrusted`) -> close
//       a handle's volume that became fenced -> Nack{handle, kWrongGeneration, fence}
//       a volume this session refused as fenced that no longer is -> close,
//       so that the peer reopens it at once
//
// Handles: a VolumeOpen accepted gets the next handle (1, 2, ...), valid on
// this connection only; a WriteBatch or HashRequest for another handle ->
// Nack{kUnknownVolume}. Group commit: each batch of a group is answered, in
// order, with the group's outcome (acks are cumulative). A Nack the sink
// gives whose text is proto::IsFailedOverNack marks the volume fenced here.
//
// Replies: the session thread sends acks and nacks itself, in order. Hash and
// call answers are sent by whoever gives them: from the session thread (a
// sink answering at once) directly, from any other thread (a relay's
// callback) through the session's replier thread, so that a relay's thread
// never waits on a slow peer. A request over its cap is answered kFailed at
// once (proto::FailedAnswer), and a slot is freed when its answer is sent.
// Answers given after the connection ended go nowhere.
//
// Thread safety: Serve may run on many threads at once (one per connection).
// A sink is used by its session's thread only, except the Reply functions,
// which any thread may call, exactly once each, and Answered (the inbox's
// reader thread).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/base/clock.h"
#include "common/daemon/metrics.h"
#include "common/wire/channel.h"
#include "common/wire/frame_inbox.h"
#include "common/wire/protocol.h"

namespace cdp::repl {

// The answer to a VolumeOpen or to a group of WriteBatches: accepted up to
// durable_seq, or refused with `nack` (its volume_id is the receiver's).
struct Verdict {
  std::optional<proto::Nack> nack;
  uint64_t durable_seq = 0;

  static Verdict Accept(uint64_t durable_seq) { return Verdict{std::nullopt, durable_seq}; }
  static Verdict Refuse(proto::NackReason reason, std::string message, uint64_t expected_seq = 0) {
    return Verdict{proto::Nack{0, reason, expected_seq, std::move(message)}, 0};
  }
};

// Sends one answer (HashResponse, FailbackPlan, PullResponse) to the peer.
using Reply = std::function<void(proto::Message)>;

// A volume as one session opened it.
class ReceiverVolume {
 public:
  virtual ~ReceiverVolume() = default;
  // "tenant/volume", for logs; the identity of the volume within a session.
  virtual const std::string& key() const = 0;
  // Non-empty (the Nack's text, beginning "failed over") while the volume
  // refuses the peer's stream as failed over or failed back.
  virtual std::string Fence() = 0;
  // Stores one group of contiguous WriteBatches (`batches` of them) in
  // sequence order: duplicates skipped, a gap or a bad record refuses all.
  // `wire_bytes`: the group's frames as they crossed the network
  // (compressed, headers included), for the volume's share of the link.
  virtual Verdict Append(std::vector<proto::Record> records, int batches, uint64_t wire_bytes) = 0;
  // Answers `request` (its volume_id and request_id set by the sink) through
  // `reply`, now or later; never refuses with a Nack.
  virtual void Digests(const proto::HashRequest& request, Reply reply) = 0;
};

struct Opened {
  std::shared_ptr<ReceiverVolume> volume;  // may be set with a refusal (fenced)
  Verdict verdict;
};

// One session's view of the daemon's volumes.
class ReceiverSink {
 public:
  virtual ~ReceiverSink() = default;
  virtual Opened Open(const proto::VolumeOpen& open) = 0;
  // A FailbackPlanRequest or PullRequest (it names its volume): answered
  // through `reply` with the same request_id, now or later.
  virtual void Call(proto::Message request, Reply reply) = 0;
  // Requests of the daemon's own to the peer (GroupHold, GroupRelease: a
  // group point, docs/groups.md). `push` sends one from any thread, through
  // the session's replier; after the session ends it goes nowhere. Given
  // once, before any message is handled.
  virtual void Attach(Reply push) { (void)push; }
  // The peer's answer to such a request (a GroupHeld), on the session's
  // inbox reader thread (FrameInbox's urgent messages: not behind the
  // batches received before it), concurrently with the session's own calls:
  // must not block.
  virtual void Answered(proto::Message answer) { (void)answer; }
};

// Who is on the other end, once admitted.
struct Session {
  std::string tenant;
  PeerIdentity peer;
  std::string address;  // the channel's peer address, for logs
};

// Where a session's time goes (issue 42: the stages of the stream), summed
// over the sessions that share it. Microseconds.
struct ReceiveStages {
  FrameInbox::Costs inbox;               // receiving (TLS, decompression, parsing) and the queue
  std::atomic<uint64_t> groups{0};       // group commits (one Append of one or more batches)
  std::atomic<uint64_t> apply_us{0};     // ReceiverVolume::Append: the apply and its syncs
  std::atomic<uint64_t> answer_us{0};    // sending the groups' acks and nacks
};

struct ReceiverOptions {
  std::string log_name = "wire";  // the logger
  // The tenant's secret, or nothing for an unknown tenant.
  std::function<std::optional<std::string>(const std::string& tenant)> secret;
  std::chrono::milliseconds handshake_timeout{10'000};
  // "" admits the authenticated peer; anything else is the reason it is
  // refused (logged, sent as Nack{kPermissionDenied}).
  std::function<std::string(const std::string& tenant, const PeerIdentity& peer)> admit;
  std::function<std::unique_ptr<ReceiverSink>(const Session& session)> make_sink;
  // Over TLS: "" while the peer's certificate is still trusted, else why not
  // (TlsCredentials::Distrusted: revoked since the session began); the
  // session then ends, within 500 ms of the daemon loading the new list.
  std::function<std::string(const TlsPeer& peer)> distrusted;
  const Clock* clock = nullptr;  // heartbeat answers
  const std::atomic<bool>* stopping = nullptr;  // the daemon's; sessions end when set
  uint64_t inbox_bytes = 32u << 20;   // received ahead (FrameInbox)
  uint64_t group_work = 32u << 20;    // proto::BatchWork of a group commit
  int hashes_per_volume = 256;        // hash requests in flight, per handle open
  int calls = 8;                      // failback requests in flight per connection
  // Each may be null.
  metrics::Gauge* connections = nullptr;
  metrics::Counter* nacks = nullptr;            // every Nack sent
  metrics::Gauge* queued_bytes = nullptr;       // received, not yet handled
  metrics::Counter* batches_grouped = nullptr;  // joined a group after its first
  ReceiveStages* stages = nullptr;
};

// The answer to a HashRequest, FailbackPlanRequest or PullRequest that could
// not be served: the matching response with status kFailed (never a Nack,
// which would stop the peer's streams). Another message: a Heartbeat (no
// answer is expected of it).
proto::Message FailedAnswer(const proto::Message& request);

class ReplicationReceiver {
 public:
  explicit ReplicationReceiver(ReceiverOptions options);
  // One connection, from the handshake to its end, on the caller's thread.
  // `slot` (may be null): the connection's place under its Listener's caps,
  // marked authenticated once the handshake succeeded and the peer was
  // admitted (until then the listener may evict it at its cap).
  void Serve(FrameChannel& ch, Listener::Slot* slot = nullptr);

 private:
  const ReceiverOptions o_;
};

}  // namespace cdp::repl

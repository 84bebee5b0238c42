// SPDX-License-Identifier: Apache-2.0
// MtLink: the process server's connection to the master target for one
// tenant (kept alive, reconnected), shipping the spools of the volumes
// assigned to it. Shipping is the one replication sender
// (common/wire/replication_sender.h: its header draws the state machine); this
// file is the RecordSource over a volume's spool:
//
//   OpenMessage   the agent's VolumeOpen, as persisted beside the spool
//   Resume(D)     on open: the spool's floor moves up to D if the master target
//                 is ahead; this copy's cursor becomes D (SetCopyOpened) and
//                 what every copy has is released; if the spool no longer
//                 holds D+1 this copy stalls ("resync needed") and stops
//                 holding the spool. On a gap: cursor to D, resend from D+1.
//
// Copies: a volume shipped to several master targets has one MtLink set per
// MT (per tenant); `copy` says which copy of the volume this link ships, and
// every link reads the one spool from its own cursor.
//   Read(from)    durable records from the spool, up to frame_bytes; frames
//                 compressed with the volume's codec by FrameChannel::Send
//   Acked(d)      this copy's cursor moves to d; segments every copy acked
//                 are released (SpooledVolume::SetCopyAcked)
//   Stalled       shown in /v1/volumes ("" while it ships); the records stay
//                 in the spool
//   Fenced        the MT refused the volume as failed over: shown as `fenced`
//                 in /v1/volumes, and the agent's stream is refused with the
//                 same text until a later open at the MT succeeds
//
// The shared throttle is a ThrottleFilter under each link's channel, so every
// byte the links put on the wire is paced by it.
//
// Thread safety: all public methods are thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/base/clock.h"
#include "common/base/result.h"
#include "common/net/throttle.h"
#include "common/net/tls_stream.h"
#include "common/wire/protocol.h"
#include "common/wire/replication_sender.h"
#include "process-server/spooled_volume.h"

namespace cdp::ps {

struct MtLinkOptions {
  // The MT (peer), tenant, secret, client_id, frames, window and recovery:
  // ProcessServerOptions::mt_link with this link's peer, tenant and secret.
  // workers: compression/sending threads of this link (the compression pool):
  // volumes are spread over them round-robin; one volume is always shipped by
  // one thread, so its frames stay in order.
  repl::LinkOptions link;
  Clock* clock = nullptr;        // must outlive the link
  Throttle* throttle = nullptr;  // shared by all links; may be null (unlimited)
  const TlsCredentials* tls = nullptr;  // TLS to the MT (over the throttle); null = clear text; must outlive the link
  int index = 0;                 // which of the tenant's connections (for logs)
  size_t copy = 0;               // which copy of its volumes this link ships (0: the primary MT)
  // The MT's GroupHold and GroupRelease (a group coordinated there, relayed
  // to the agents): repl::SenderOptions::on_peer_request. Empty: refused.
  std::function<void(repl::ReplicationSender&, proto::Message)> on_peer_request;
};

class MtLink {
 public:
  explicit MtLink(MtLinkOptions options);
  ~MtLink();  // Stop()s
  MtLink(const MtLink&) = delete;
  MtLink& operator=(const MtLink&) = delete;

  void Start();
  // Closes the connection and joins the threads. Idempotent.
  void Stop();

  // Ships `v` from now on (opened at the MT on the current or next connection).
  // `v` must outlive the link.
  void AddVolume(SpooledVolume* v);
  // Stops shipping `v` for good (its spool is being retired,
  // process-server/agent_session.h "Re-protect"): its stream leaves the
  // sender (repl::ReplicationSender::RemoveStream) and nothing of the link
  // touches `v` again, except a call already under way; `v` must still
  // outlive the link. A later AddVolume of another SpooledVolume of the same
  // name opens a new stream. No-op for a volume not on the link.
  void RemoveVolume(SpooledVolume* v);

  // Waits at most `timeout` until the MT answered the VolumeOpen of `v` on the
  // current connection. Success: the MT's durable sequence. kUnavailable when
  // not connected in time; the MT's refusal as kPermissionDenied.
  Result<uint64_t> WaitOpened(SpooledVolume* v, std::chrono::milliseconds timeout);

  // Forwards a hash request for `v` and waits for the answer (request_id and
  // volume_id of the answer are the MT's; the caller substitutes its own).
  // Forwards an agent's hash request; `done` gets the answer
  // (repl::ReplicationSender::HashAsync).
  void HashAsync(SpooledVolume* v, const proto::HashRequest& req, repl::ReplicationSender::HashCallback done);

  // Forwards an agent's failback request (FailbackPlanRequest, PullRequest:
  // they name their volume, no stream of it need be open); `done` gets the
  // answer, whose request_id is the link's (repl::ReplicationSender::CallAsync).
  void CallAsync(proto::Message request, repl::ReplicationSender::CallCallback done) {
    sender_.CallAsync(std::move(request), std::move(done));
  }

  // New durable data may be waiting.
  void Notify() { sender_.Notify(); }

  bool connected() const { return sender_.connected(); }
  repl::ShipStages stages() const { return sender_.Stats().stages; }
  uint64_t connects() const { return sender_.Stats().connects; }
  std::string state() const { return sender_.state(); }

 private:
  class SpoolSource;

  Result<repl::ReplicationSender::StreamId> StreamOf(SpooledVolume* v) const;

  MtLinkOptions opt_;
  repl::ReplicationSender sender_;
  mutable std::mutex mu_;
  std::map<SpooledVolume*, std::pair<std::unique_ptr<SpoolSource>, repl::ReplicationSender::StreamId>> volumes_;
  std::vector<std::unique_ptr<SpoolSource>> removed_;  // the sender may still hold them
};

}  // namespace cdp::ps

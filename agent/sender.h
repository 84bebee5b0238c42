// SPDX-License-Identifier: Apache-2.0
// Sender: ships one volume's captured records to the process server, and runs
// the volume's resync (initial sync, crash recovery, bitmap-mode healing).
//
// Shipping is the one replication sender (common/wire/replication_sender.h: its
// header draws the connect / open / resume / window / gap / busy / heartbeat /
// backoff state machine); this class is its RecordSource for the capture
// queue, plus the resync thread. The link is the sender's own, or one shared
// with other volumes of the agent (Agent: `ps_connections` links for all its
// volumes, so connections and their threads do not grow per volume; the
// volume is then one stream of that link):
//
//   RecordSource over the CaptureQueue:
//     Resume(D)   CaptureQueue::Resume(D); outside our window on a later
//                 contact than the first of this process = history lost on the
//                 process server: every region is compared again (full resync)
//     Read(from)  CaptureQueue::Peek; metadata-mode records are re-read from
//                 the backing store
//     Acked(d)    CaptureQueue::Ack(d) (memory freed), DirtyBitmap::SetAcked
//     Fenced(m)   the volume failed over at the master target: `fenced` in
//                 Stats() and /status until an open succeeds again (Stalled(ok))
//
//   resync thread: agent/resync.h (block-level compare through the sender:
//     PS -> MT, many requests in flight, rate-controlled shipping); every
//     checkpoint_interval: DirtyBitmap::Checkpoint (clears acked regions,
//     saves the resync cursor). The sender's own thread, or a ResyncDriver
//     thread shared with other volumes (the Agent's: threads do not grow per
//     volume).
//
// ResyncDriver: `threads` threads, thread t driving the resync rounds and
// checkpoints of senders t, t + threads, ...: each pass gives every one of
// its senders one round; when none progressed it waits for a hash answer of
// any of them (Wake), at most 10 ms while one has work, 50 ms when all idle.
//
// Thread safety: Start/Stop from the owner; Stats() from any thread.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "agent/capture_device.h"
#include "agent/resync.h"
#include "common/base/clock.h"
#include "common/base/host_port.h"
#include "common/net/tls_stream.h"
#include "common/wire/record_source.h"
#include "common/wire/replication_sender.h"

namespace cdp::agent {

// The agent's link to the process server as it ships: port 7400, 4 MiB
// frames, 4 in flight, heartbeats every 5 s. agent.conf's keys (batch_bytes,
// max_inflight, ps, tenant, secret, client_id) override it.
repl::LinkOptions AgentLinkDefaults();

struct SenderOptions {
  repl::LinkOptions link = AgentLinkDefaults();  // the PS, who we are, frames, window, recovery
  uint64_t checkpoint_interval_ms = 1000;
  ResyncOptions resync;              // its clock is this one
  uint64_t generation = 1;
  const Clock* clock = nullptr;      // must outlive the sender
  const TlsCredentials* tls = nullptr;  // TLS to the PS; null = clear text; must outlive the sender
  // The process server's own requests (group holds): repl::SenderOptions::on_peer_request.
  std::function<void(repl::ReplicationSender&, proto::Message)> on_peer_request;
};

struct SenderStats {
  // The link's: connected, connects, busy and gap nacks, and last_error
  // (the link's, else the resync's).
  repl::LinkStats link;
  uint64_t batches_sent = 0;
  uint64_t records_sent = 0;
  uint64_t bytes_sent = 0;          // record data bytes
  uint64_t reread_bytes = 0;        // metadata-mode data read back from the store
  uint64_t acked_seq = 0;
  uint64_t history_lost = 0;        // resume points outside our window
  uint64_t resync_remaining = 0;    // regions flagged for a resync
  ResyncStats resync;
  uint64_t rpo_lag_us = 0;          // age of the oldest unacknowledged record
  // The "failed over" refusal while the volume is fenced (the master target
  // failed it over: cdpctl failover), "" otherwise. Nothing is shipped then;
  // captured writes stay queued and dirty.
  std::string fenced;
  // The process server answered this volume's open since the agent started
  // (this generation). Until then nothing says where the far side stands:
  // a PS that lost its spool while the agent was down is found only by that
  // answer, so the volume is "unconfirmed", never drained (issue 38 F8).
  bool confirmed = false;
};

// Seals a record of a sealed volume for the wire (common/crypto/seal.h): kData ->
// kSealed, kZero / kTrim -> kSealedZero, others unchanged. kInvalidArgument
// for a range that is not whole 4 KiB blocks.
Status SealRecord(const seal::BlockSealer& sealer, proto::Record* r);

// The volume's uuid as its VolumeOpen announces it: XXH3-128 of the name.
std::array<uint8_t, 16> VolumeUuid(const std::string& name);

// A link to the process server for one or more volumes (Sender's shared
// link), made with `opts`' address, credentials, batching and timeouts.
std::unique_ptr<repl::ReplicationSender> NewPsLink(SenderOptions opts);

class Sender;

// Thread safety: Add before Start; Start/Stop from the owner; Wake from any thread.
class ResyncDriver {
 public:
  explicit ResyncDriver(int threads) : threads_(size_t(std::max(1, threads))) {}
  ~ResyncDriver() { Stop(); }
  ResyncDriver(const ResyncDriver&) = delete;
  ResyncDriver& operator=(const ResyncDriver&) = delete;

  // `sender` (made with this driver) must outlive the driver's threads.
  void Add(Sender* sender) { senders_.push_back(sender); }
  void Start();
  // Joins the threads: no sender is driven once it returns. Idempotent.
  void Stop();
  // Something to do (a hash answer arrived): waiting threads go round at once.
  void Wake();

 private:
  void Loop(size_t t, size_t n);  // thread t of n

  const size_t threads_;
  std::vector<Sender*> senders_;
  std::vector<std::thread> running_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t wakes_ = 0;
  bool stop_ = false;
};

class Sender final : private repl::RecordSource {
 public:
  // `device` must outlive the sender. `shared` (may be null: the sender makes
  // and owns its link) is a link made by NewPsLink that this volume's stream
  // joins; it must outlive the sender, and its owner starts and stops it
  // (stopping it before Stop() here, so that pending hash calls fail).
  // `driver` (may be null: the sender runs its own resync thread) runs the
  // resync; the caller Add()s the sender to it, and stops it before Stop().
  Sender(CaptureDevice* device, SenderOptions opts, repl::ReplicationSender* shared = nullptr,
         ResyncDriver* driver = nullptr);
  ~Sender() override;  // Stop()s
  Sender(const Sender&) = delete;
  Sender& operator=(const Sender&) = delete;

  void Start();
  // Stops the threads (an own link; a shared one loses this volume's stream);
  // queued records stay in memory (and in the bitmap).
  void Stop();
  SenderStats Stats() const;
  // Re-protect after a failback (Agent::Reprotect): from the next connection
  // the volume is opened as generation `gen`, and the queue and the bitmap
  // start empty (CaptureQueue::Reset, DirtyBitmap::ForgetAll, persisted):
  // the source equals the replica, so nothing is compared or shipped again.
  // The connection is dropped, so that the next one opens the new generation
  // (a shared link's other volumes reopen too, resuming where they were).
  // equal = false (re-protect after a rollback at the master target): the
  // queue starts empty as well, but every region is compared again.
  Status StartGeneration(uint64_t gen, bool equal);
  uint64_t generation() const { return generation_.load(); }
  // A failback request (FailbackPlanRequest, PullRequest) on this volume's
  // link to the process server: repl::ReplicationSender::CallAsync. A fenced
  // volume's link stays up for them.
  void CallAsync(proto::Message request, repl::ReplicationSender::CallCallback done,
                 std::shared_ptr<repl::CallBytes> bytes);
  // ReplicationSender::WaitConnected of the link.
  bool WaitConnected(std::chrono::milliseconds timeout) { return link_->WaitConnected(timeout); }
  // The link this volume ships on (its own, or one shared with other volumes).
  const repl::ReplicationSender* link() const { return link_; }

 private:
  // repl::RecordSource over the capture queue.
  proto::VolumeOpen OpenMessage() override;
  Result<uint64_t> Resume(uint64_t durable, repl::ResumeCause cause) override;
  Status Read(uint64_t from, uint64_t max_bytes, size_t max_records, std::vector<proto::Record>* out) override;
  void Acked(uint64_t durable) override;
  void Shipped(const proto::WriteBatch& batch, uint64_t wire_bytes) override;
  void Stalled(const Status& why) override;
  void Fenced(const std::string& message) override;

  friend class ResyncDriver;
  void ResyncLoop();
  // One resync round and the periodic checkpoint: true if it progressed;
  // *idle: the resync has nothing flagged or in flight.
  bool ResyncTick(bool* idle);
  void Checkpoint(bool force);

  CaptureDevice* dev_;
  SenderOptions opts_;
  std::unique_ptr<repl::ReplicationSender> own_link_;  // null with a shared link
  repl::ReplicationSender* link_;                      // own_link_ or the shared one
  repl::ReplicationSender::StreamId stream_ = 0;
  ResyncDriver* const driver_;
  std::thread resync_;  // without a driver
  bool started_ = false;
  std::atomic<bool> stop_{false};
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;

  mutable std::mutex mu_;   // guards st_ and the fields below
  SenderStats st_;          // the counters the link does not keep
  bool contacted_ = false;  // a VolumeOpenReply was seen by this process (this generation)
  std::atomic<uint64_t> generation_{1};  // the generation OpenMessage() sends
  uint64_t last_checkpoint_us_ = 0;
  uint64_t floor_ = 0;      // resume point of the latest contact (Resync::SetFloor)

  std::unique_ptr<Resync> resync_engine_;  // driven by the resync thread
};

}  // namespace cdp::agent

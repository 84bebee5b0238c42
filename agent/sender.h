// Sender: ships one volume's captured records to the process server, and runs
// the volume's resync (initial sync, crash recovery, bitmap-mode healing).
//
// Shipping is the one replication sender (common/replication_sender.h: its
// header draws the connect / open / resume / window / gap / busy / heartbeat /
// backoff state machine); this class is its RecordSource for the capture
// queue, plus the resync thread:
//
//   RecordSource over the CaptureQueue:
//     Resume(D)   CaptureQueue::Resume(D); outside our window on a later
//                 contact than the first of this process = history lost on the
//                 process server: every region is compared again (full resync)
//     Read(from)  CaptureQueue::Peek; metadata-mode records are re-read from
//                 the backing store
//     Acked(d)    CaptureQueue::Ack(d) (memory freed), DirtyBitmap::SetAcked
//
//   resync thread (when regions need it and the queue is in data mode):
//     HashRequest for up to hash_batch regions from the cursor (through the
//     sender: PS -> MT) -> equal regions are done, differing ones are queued
//     as data records (CaptureDevice::ShipRegion) as the budget allows;
//     kShip regions (bitmap mode) are queued without comparing. A request the
//     process server cannot answer (master target unreachable) pauses the
//     resync for hash_retry_ms; shipping goes on.
//     every checkpoint_interval: DirtyBitmap::Checkpoint (clears acked
//     regions, saves the resync cursor).
//
// The resync compares the replica as the master target has applied it. A
// region whose records are still in the process server's spool may compare
// unequal (shipped again: harmless); see docs/agent.md for the one case where a
// stale equal hash could hide a difference.
//
// Thread safety: Start/Stop from the owner; Stats() from any thread.
#pragma once

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
#include "common/tls_stream.h"
#include "common/clock.h"
#include "common/host_port.h"
#include "common/record_source.h"
#include "common/replication_sender.h"

namespace cdp::agent {

struct SenderOptions {
  HostPort ps{"127.0.0.1", 7400};  // the process server
  std::string tenant;
  std::string secret;
  std::string client_id = "agent";
  uint64_t batch_bytes = 4u << 20;   // data bytes per WriteBatch (at least one record)
  size_t batch_records = 16384;
  uint32_t linger_ms = 2;            // wait this long for a small batch to grow
  int max_inflight = 4;              // batches sent, not yet acknowledged
  uint32_t hash_batch = 256;         // regions per HashRequest
  uint64_t backoff_min_ms = 100;
  uint64_t backoff_max_ms = 10'000;
  uint64_t busy_backoff_ms = 200;    // hold after a busy nack (process server over quota)
  uint64_t checkpoint_interval_ms = 1000;
  uint64_t connect_timeout_ms = 5000;
  uint64_t hash_timeout_ms = 60'000;
  uint64_t hash_retry_ms = 5'000;     // after the server could not answer a HashRequest
  uint64_t heartbeat_ms = 5'000;      // a Heartbeat when nothing was sent for this long
  uint64_t dead_peer_ms = 30'000;     // nothing received for this long: reconnect
  uint64_t generation = 1;
  const Clock* clock = nullptr;      // must outlive the sender
  const TlsCredentials* tls = nullptr;  // TLS to the PS; null = clear text; must outlive the sender
};

struct SenderStats {
  bool connected = false;
  uint64_t connects = 0;
  uint64_t disconnects = 0;
  uint64_t batches_sent = 0;
  uint64_t records_sent = 0;
  uint64_t bytes_sent = 0;          // record data bytes
  uint64_t reread_bytes = 0;        // metadata-mode data read back from the store
  uint64_t acked_seq = 0;
  uint64_t busy_nacks = 0;
  uint64_t gap_nacks = 0;
  uint64_t history_lost = 0;        // resume points outside our window
  // Resync
  uint64_t resync_total = 0;        // regions needing a resync when the pass started
  uint64_t resync_remaining = 0;
  uint64_t resync_compared = 0;     // regions hashed and compared (cumulative)
  uint64_t resync_equal = 0;
  uint64_t resync_shipped = 0;      // regions queued as data (cumulative)
  double resync_eta_seconds = 0;
  uint64_t rpo_lag_us = 0;          // age of the oldest unacknowledged record
  std::string last_error;
};

class Sender final : private repl::RecordSource {
 public:
  // `device` must outlive the sender.
  Sender(CaptureDevice* device, SenderOptions opts);
  ~Sender() override;  // Stop()s
  Sender(const Sender&) = delete;
  Sender& operator=(const Sender&) = delete;

  void Start();
  // Stops the threads; queued records stay in memory (and in the bitmap).
  void Stop();
  SenderStats Stats() const;

 private:
  // repl::RecordSource over the capture queue.
  proto::VolumeOpen OpenMessage() override;
  Result<uint64_t> Resume(uint64_t durable, repl::ResumeCause cause) override;
  Status Read(uint64_t from, uint64_t max_bytes, size_t max_records, std::vector<proto::Record>* out) override;
  void Acked(uint64_t durable) override;
  void Shipped(const proto::WriteBatch& batch, uint64_t wire_bytes) override;

  void ResyncLoop();
  // One step of the resync; true if it did something (else the loop idles).
  Result<bool> ResyncStep();
  void Checkpoint(bool force);

  CaptureDevice* dev_;
  SenderOptions opts_;
  repl::ReplicationSender link_;
  repl::ReplicationSender::StreamId stream_ = 0;
  std::thread resync_;
  std::atomic<bool> stop_{false};
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;

  mutable std::mutex mu_;   // guards st_ and the fields below
  SenderStats st_;          // the counters the link does not keep
  bool contacted_ = false;  // a VolumeOpenReply was seen by this process
  uint64_t last_checkpoint_us_ = 0;
  uint64_t resync_pass_start_us_ = 0;
  uint64_t resync_pass_done_ = 0;

  // Resync thread only.
  std::deque<uint64_t> to_ship_;       // regions found different, waiting for room
  uint64_t resync_pause_until_us_ = 0;
  uint64_t next_request_id_ = 1;
};

}  // namespace cdp::agent

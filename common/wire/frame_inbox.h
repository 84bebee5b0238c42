// SPDX-License-Identifier: Apache-2.0
// FrameInbox: receives a FrameChannel's messages on a thread of its own into a
// bounded queue, so that a server decodes the next frames (TLS, decompression,
// CRC, parsing) while it works on the last one, and can see which messages
// have already arrived.
//
//   channel --Receive()--> [reader thread] --> queue (<= max_bytes) --> Pop()
//                                                                 \->
//                                                                 PopBatchFor()
//
// The replication receiver (replication_receiver.h) uses it to group-commit: the WriteBatches of
// one volume that are already here when it applies one are applied with it,
// under one sync (one journal sync, one replica sync and one commit at the
// master target; one fdatasync of the spool at the process server).
//
// Bounds: the reader stops receiving while the queued messages hold
// `max_bytes` or more (record data of WriteBatches, plus a fixed charge per
// message), so memory is bounded by max_bytes plus one frame, and a slow
// consumer pushes back on the peer through TCP.
//
// End: the channel's first error (the peer closed, a bad frame, Close()) is
// queued after the messages before it and ends the reader; Pop() returns it
// once those are drained, and again on every later call.
//
// Thread safety: Pop/PopBatchFor from one consumer thread. The channel may be
// used to Send() from any thread meanwhile; nothing else may Receive() from it
// while the inbox lives. The destructor closes the channel (so the blocked
// reader returns) and joins the reader.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "common/base/result.h"
#include "common/daemon/metrics.h"
#include "common/wire/channel.h"
#include "common/wire/protocol.h"

namespace cdp {

class FrameInbox {
 public:
  // What the inbox's stages cost, summed (several inboxes may share one).
  // Microseconds.
  struct Costs {
    std::atomic<uint64_t> messages{0};        // received
    std::atomic<uint64_t> receive_cpu_us{0};  // the reader's CPU: TLS, decompression, CRC, parsing, system calls
    std::atomic<uint64_t> queue_us{0};        // from received to taken by the consumer, summed over messages
  };

  // A message the reader hands over at once instead of queueing it behind
  // the others (an answer someone waits for: a group hold's GroupHeld must
  // not wait behind a batch's fdatasync). Called on the reader thread; true:
  // taken, not queued. Must not block.
  using Urgent = std::function<bool(proto::Message&)>;

  // Starts the reader; `ch` must outlive the inbox. `queued_bytes` and
  // `costs` (each may be null; must outlive the inbox) follow the bytes
  // queued and the costs: several inboxes may share them. `urgent` may be empty.
  FrameInbox(FrameChannel& ch, uint64_t max_bytes, metrics::Gauge* queued_bytes = nullptr, Costs* costs = nullptr,
             Urgent urgent = nullptr);
  ~FrameInbox();
  FrameInbox(const FrameInbox&) = delete;
  FrameInbox& operator=(const FrameInbox&) = delete;

  // The next message; kBusy when none arrived within `timeout`; the channel's
  // error once every message before it was returned. `wire_bytes`, when
  // given, receives the message's frame size (FrameChannel::Receive's).
  Result<proto::Message> Pop(std::chrono::milliseconds timeout, uint64_t* wire_bytes = nullptr);

  // The next message if it is already here and is a WriteBatch for
  // `volume_id` whose first record is `first_seq`, whose work
  // (proto::BatchWork) fits in `max_work` and whose records are at most
  // `max_records`; otherwise nothing is taken. `wire_bytes` as for Pop.
  std::optional<proto::WriteBatch> PopBatchFor(uint32_t volume_id, uint64_t first_seq, uint64_t max_work,
                                               size_t max_records, uint64_t* wire_bytes = nullptr);

 private:
  struct Item {
    Result<proto::Message> message;
    uint64_t bytes = 0;
    uint64_t received_us = 0;  // SystemClock NowMicros, when costs_ is set
    uint64_t wire_bytes = 0;   // the frame's size
  };
  void Taken(const Item& item);  // counts its queue time
  void ReadLoop();
  void Account(int64_t bytes);  // queued_bytes_ and the gauge; under mu_

  FrameChannel& ch_;
  const uint64_t max_bytes_;
  metrics::Gauge* const gauge_;
  Costs* const costs_;
  const Urgent urgent_;
  std::mutex mu_;
  std::condition_variable cv_;  // an item queued, room made, or stopping
  std::deque<Item> queue_;
  uint64_t queued_bytes_ = 0;
  bool stop_ = false;
  std::optional<Status> end_;  // the error the reader ended with, once popped
  std::thread reader_;
};

}  // namespace cdp

// SPDX-License-Identifier: Apache-2.0
// PS session: one process-server connection at the master target, from the
// handshake to EOF — VolumeOpen, WriteBatch, HashRequest and Heartbeat on a
// FrameChannel. The session is the one replication receiver's
// (common/wire/replication_receiver.h: handshake, handles, grouping, fences,
// replies), on the connection's own Listener thread; this daemon supplies its
// sink (SessionSink and SessionVolume, ps_session.cc), the one place that
// turns the wire's per-generation sequences into the volume's. Sessions share
// the daemon's volumes (master-target/master_target_impl.h) with the control
// API and the retention thread.
//
// ===================== Protocol contract with the process server =====================
// (common/wire/protocol.h messages over common/wire/channel.h FrameChannel; the process
// server codes against this; keep it.)
//
//   PS connects to `listen` (default port 7500) over TLS (unless tls = off),
//   then ServerHandshake: tenant and role come from the PS's certificate and
//   must match the Hello (common/wire/channel.h). The role must be kProcessServer;
//   kAgent only for a tenant in `direct_agents` (else Nack kPermissionDenied,
//   connection closed). Wrong secret / unknown tenant -> AuthResult refused.
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
//     -> Nack{kPermissionDenied} when creating it would exceed the tenant's
//        quota, and for a HIGHER generation unless the operator armed a
//        re-protect (`cdpctl reprotect`): no peer message drops history. The
//        armed next generation is accepted with durable_seq = 0 and numbers
//        its records from 1; the MT adds the volume's seq_base (journal and
//        every point kept; see replica_volume.h).
//
//   WriteBatch{volume_id, records}
//     records are applied strictly in sequence order:
//       seq <= applied           duplicate: skipped (still acked)
//       first new seq != applied+1  -> Nack{kGap, expected_seq = applied+1}, nothing applied
//       a bad record (past the end of the volume, zero or absurd length, data
//       size != length, bad tag name, bad kind) -> Nack{kBadRecord}, nothing of
//       the batch applied; the connection and other volumes are unaffected
//       unknown volume_id       -> Nack{kUnknownVolume}
//       failed-over volume, or re-protected since this session opened it
//                               -> Nack{kWrongGeneration}; for a volume failed
//       over by `cdpctl failover` (whatever generation), at VolumeOpen too, its
//       message begins "failed over" (proto::IsFailedOverNack): the old
//       primary is fenced, nothing is applied. When an undo lifts the
//       fence, the MT closes (within a second) every session that refused the
//       volume, so that the PS reconnects and reopens it at once
//       a zero/trim longer than 32 MiB, or a batch asking more than
//       `max_batch_work` (default proto::kMaxBatchWork, 256 MiB) of ranged
//       work                    -> Nack{kBadRecord}
//       tenant over its quota, or its journals at max_journal_bytes_per_tenant
//                               -> Nack{kBusy} (retry later: retention frees journal space)
//       I/O failure at the MT   -> Nack{kInternal} (the partial batch is undone; resend)
//     once the whole batch is durable (journal synced, replica synced, sqlite
//     committed) -> Ack{volume_id, durable_seq = last seq of the batch}.
//     Acks come in the order of the batches (one reply per WriteBatch).
//     Group commit: a session receives ahead (common/wire/frame_inbox.h, at most
//     32 MiB queued), and the volume's batches that continue the sequence and
//     are already received are applied as one (at most 32 MiB of work): one
//     journal sync, one replica sync, one commit. Each batch of the group is
//     still answered, in order, with the group's outcome: every Ack carries
//     the group's last seq (acks are cumulative), and a Nack (gap, bad record,
//     busy, internal) refuses the whole group, nothing of it applied.
//     kFlush records make crash-consistent recovery points (at most one per
//     `point_interval`, default 5 s); kTag records always make a named point.
//
//   HashRequest{volume_id, request_id, region_size, first_region, count, min_seq, at_seq}
//     -> HashResponse{... seq, status, hashes}: block digests (common/wire/block_digest.h)
//        of each unit of the replica at the applied sequence (>= min_seq, else
//        kBehind) or at exactly at_seq (kBehind / kPointGone); units past the
//        end are left out. A bad unit size, count or a first unit past the end
//        -> kFailed (never a Nack, which would stop the stream at the PS).
//   Heartbeat{sent_us} -> Heartbeat{sent_us = MT wall clock, echo_us = the peer's sent_us}
//   Stats -> ignored.  Anything else -> the connection is closed.
// ======================================================================================
#pragma once

#include "master-target/master_target_impl.h"

// SPDX-License-Identifier: Apache-2.0
// Agent session: one agent connection at the process server, from the
// handshake to EOF — VolumeOpen, WriteBatch (spooled, acked once durable),
// HashRequest (forwarded to the master target), the failback requests
// (relayed to it) and Heartbeat. The session is the one replication
// receiver's (common/wire/replication_receiver.h: handshake, handles,
// grouping, fences, replies), on the connection's own Listener thread; this
// daemon supplies its sink (SessionSink and SessionVolume, agent_session.cc).
// Sessions share the daemon's volumes and MT links
// (process-server/process_server_impl.h).
//
// ===================== Agent-facing contract (protocol v1) =====================
// Transport: TCP to `listen` (default port 7400), frames of common/wire/protocol.h,
// one thread per agent connection (common/wire/channel.h).
//  1. ServerHandshake: the agent says Hello{role = kAgent, tenant, client_id};
//     secrets are the per-tenant secrets of the config. A failed proof closes the
//     connection; any other role gets Nack{kPermissionDenied} and is closed.
//  2. VolumeOpen{name, size, block_size, uuid, generation}: the PS opens (or
//     creates) the tenant's spool for that volume, forwards the open to the
//     master target (it waits at most `mt_open_wait` for the MT's answer) and
//     replies VolumeOpenReply{volume_id, durable_seq}, where durable_seq is the
//     highest sequence durable in the spool, or the MT's applied sequence if that
//     is higher. An `acked_seq` above the spool's durable sequence (the spool
//     lost records it acknowledged) makes the PS wait for every copy's MT and
//     answer with the highest of theirs, or Nack{kBusy} while one has not
//     answered (docs/formats/protocol.md, "Acknowledged sequence").
//     volume_id is valid on this connection only. An invalid name,
//     or one containing ".retired-" (kRetiredMark) -> Nack{kBadRecord}; a
//     generation different from the one the spool was made for ->
//     Nack{kWrongGeneration}, except a higher one while the MT fences the
//     spool (see Re-protect); I/O failure -> Nack{kInternal}.
//  3. WriteBatch{volume_id, records}: contiguous sequences. Records with
//     seq <= durable are duplicates and skipped; a first new record past
//     durable+1 -> Nack{kGap, expected_seq = durable+1}. Accepted records are
//     appended to the spool and group-committed (one fdatasync covers every
//     batch waiting); then Ack{volume_id, durable_seq} (cumulative: everything
//     <= durable_seq is durable). Spool over quota -> Nack{kBusy} (nothing of the
//     batch is kept; retry later / fall back to bitmap mode); the spool accepts
//     again once shipping has drained it below the resume mark. Unknown
//     volume_id -> Nack{kUnknownVolume}. Bad record shape -> Nack{kBadRecord}.
//     All-zero data records are stored and shipped as kZero. Batches the
//     agent pipelined (sent without waiting) that are already received and
//     contiguous are appended together (one fdatasync) and each still gets
//     its own reply, in order (the receiver's group commit, at most 32 MiB
//     of work).
//  Fencing: while the master target refuses the volume as failed over
//     (SpooledVolume::fenced(), set by the MT link), the VolumeOpen and every
//     WriteBatch get Nack{kWrongGeneration} with the MT's text, which begins
//     "failed over" (proto::IsFailedOverNack): nothing is spooled, the agent
//     keeps its records (and dirty regions) as the original site's branch.
//     When the fence lifts (the MT's failover undone), a session that met it
//     is closed within a second, so that the agent reopens the volume at once.
//  4. HashRequest{volume_id, request_id, ...}: forwarded to the MT without
//     waiting (batches keep flowing; at most 256 outstanding per volume open
//     on the connection: ReceiverOptions::hashes_per_volume); its HashResponse is relayed back with the agent's
//     volume_id and request_id (resync, verify). MT unreachable, the MT
//     connection lost, or too many outstanding -> HashResponse{kFailed}.
//  5. Heartbeat{sent_us}: answered with Heartbeat{now, echo_us = sent_us}.
//  6. FailbackPlanRequest{request_id, volume, from_block} and
//     PullRequest{request_id, volume, extents, digests} (failback; they name
//     a volume of the connection's tenant, no VolumeOpen needed: the agent's
//     stream of it is fenced): relayed to the tenant's MT link for that
//     volume without waiting (MtLink::CallAsync; at most 8 per connection
//     relayed and not yet answered to the agent: ReceiverOptions::calls), and the answer — FailbackPlan or
//     PullResponse — is sent back with the agent's request_id. A PullResponse
//     travels compressed with the volume's configured codec (CodecFor). A
//     FailbackPlan{kOk} gets the PS's own never-delivered blocks added: the
//     blocks (block_size units of the spool's VolumeOpen) of every data, zero
//     and trim record of the volume's spool above the MT's acknowledged
//     sequence, within the page [from_block, next_block) ([from_block, end)
//     when next_block is 0), merged with the MT's extents (sorted, disjoint)
//     and cut to kMaxExtents (next_block then set where the cut fell). Over
//     the cap, the MT unreachable or the MT connection lost, no link for the
//     volume, or the spool unreadable -> the same message with status
//     kFailed (logged at the PS); never a Nack, which would stop the agent's
//     streams. kNotFailingBack and the MT's kFailed pass through.
//  Re-protect (generation switch): after failback the MT keeps fencing the
//     old generation G until `cdpctl reprotect`, and the agent then opens
//     G+1 (also `cdpctl reprotect` of a protecting volume: a re-seed, or a
//     move to another upstream). A VolumeOpen with a generation higher than
//     the spool's is accepted while that spool is fenced
//     (SpooledVolume::fenced()), and the next generation an operator armed
//     at this PS (POST /v1/reprotect, which cdpctl reprotect calls) once the
//     spool has nothing left to deliver (every copy acknowledged everything,
//     or is lost: SpooledVolume::NothingToDeliver; before that ->
//     Nack{kWrongGeneration} "...; generation G still has records to deliver
//     to the master target, the new one is taken once they are", and the
//     agent retries); the PS then
//     retires the old spool without deleting anything: its stream leaves the
//     MT link, the spool is closed, its directory is renamed to
//     "<dir>.gen<G>.retired-<unix seconds>" (the parent directory synced), a
//     warning names it (the operator may delete it), and a fresh spool for
//     G+1 is created and opened at the MT like any new stream (the MT takes
//     it once re-protect is armed there). A kill -9 before the rename leaves
//     the old spool (the next open switches again), after it the new one is
//     created from nothing; the start-up scan skips retired directories.
//     Another higher generation on a spool that is not fenced -> Nack{
//     kWrongGeneration} "wrong generation: spool has G, agent sent H; a
//     re-protect is an operator command (cdpctl reprotect)"; a lower one ->
//     "wrong generation: spool has G, agent sent H".
//  A malformed frame (bad CRC, bad payload, wrong frame sequence) or an
//  unexpected message type closes that connection with a logged reason;
//  nothing of it is spooled.
// ==============================================================================
#pragma once

#include "process-server/process_server_impl.h"

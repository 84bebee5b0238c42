// SPDX-License-Identifier: Apache-2.0
// The OpenCDP wire protocol: length-prefixed, checksummed frames carrying
// typed messages between agent -> process server -> master target.
// The byte-level format is documented in docs/formats/protocol.md.
//
// Frame = 24-byte header + payload, little-endian, encoded field by field:
//   magic u32 ("CDPF" = 0x46504443) | version u8 | type u8 | flags u16 |
//   length u32 (payload bytes) | sequence u64 (per-connection frame number) |
//   crc u32 (CRC32C over the header with crc=0, then the payload)
//
// Decoding is pure and incremental: DecodeFrame() looks at the bytes received
// so far and answers kComplete (one frame and how many bytes it used), kNeedMore
// (nothing consumed), or kBad (the stream is unusable: close the connection).
// Every length is checked against a cap before anything is allocated.
//
// Thread safety: all functions are pure; message structs are values.
#pragma once

#include <array>
#include <memory>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "common/base/coding.h"
#include "common/base/names.h"  // ValidName, kMaxNameLength: the names the records carry
#include "common/base/result.h"
#include "common/base/status.h"

namespace cdp::proto {

inline constexpr uint32_t kMagic = 0x46504443;  // "CDPF" little-endian
inline constexpr uint8_t kVersion = 1;
inline constexpr size_t kHeaderSize = 24;
// Hard caps, applied before any allocation.
inline constexpr uint32_t kMaxPayload = 64u << 20;      // one frame's payload
inline constexpr uint32_t kHandshakeMaxPayload = 4096;  // one frame's payload before authentication
inline constexpr uint32_t kMaxBatchRaw = 64u << 20;     // a batch after decompression
inline constexpr uint32_t kMaxRecordLength = 32u << 20; // one write record's length
inline constexpr uint32_t kMaxRecords = 1u << 20;       // records in one batch
inline constexpr uint32_t kMaxHashes = 1u << 16;        // regions in one hash message
// The work one batch may ask of the master target: the sum of the lengths of
// its data, zero and trim records (each range is read into the undo journal).
// Sources cut batches at it (a record is at most kMaxRecordLength, so one
// always fits); the PS refuses a batch over it and the MT one over its
// `max_batch_work` (default this value) with Nack kBadRecord.
inline constexpr uint64_t kMaxBatchWork = 256ull << 20;
inline constexpr size_t kMaxTextLength = 4096;          // AuthResult.reason, Nack.message
inline constexpr uint32_t kMaxStats = 4096;             // values in one Stats message
inline constexpr uint32_t kMaxExtents = 1u << 16;       // extents in one failback plan
inline constexpr uint32_t kMaxPullBlocks = 4096;        // blocks in one pull request
inline constexpr uint32_t kMaxGroupVolumes = 64;        // volumes of one agent in one group hold
inline constexpr uint32_t kMaxGroupHoldMs = 10'000;     // GroupHold.timeout_ms

enum class MsgType : uint8_t {
  kHello = 1,          // client -> server: who I am, my nonce
  kChallenge = 2,      // server -> client: server nonce + proof it knows the secret
  kAuth = 3,           // client -> server: proof it knows the secret
  kAuthResult = 4,     // server -> client: accepted or refused (reason)
  kVolumeOpen = 5,     // client -> server: open (or create) a volume's stream
  kVolumeOpenReply = 6,// server -> client: handle + durable sequence (resume point)
  kWriteBatch = 7,     // client -> server: ordered records of one volume
  kAck = 8,            // server -> client: durable up to and including a sequence
  kNack = 9,           // server -> client: refused (reason, expected sequence)
  kHashRequest = 10,   // either way: region hashes of a volume range, please
  kHashResponse = 11,  // region hashes (XXH3-128), one per region
  kHeartbeat = 12,     // either way: liveness and round-trip measurement
  kStats = 13,         // either way: named numeric counters
  kFailbackPlanRequest = 14,  // agent -> PS -> MT: which blocks must failback compare?
  kFailbackPlan = 15,         // MT -> PS -> agent: extents of those blocks (paged)
  kPullRequest = 16,          // agent -> PS -> MT: these blocks, unless equal to my digests
  kPullResponse = 17,         // MT -> PS -> agent: the blocks that differ, as records
  kGroupHold = 18,            // PS -> agent: hold these volumes' writes for a group point
  kGroupHeld = 19,            // agent -> PS: held (or refused)
  kGroupRelease = 20,         // PS -> agent: release, with the marker if the point is made
};

enum class Role : uint8_t { kAgent = 1, kProcessServer = 2, kControl = 3 };

struct Hello {
  Role role = Role::kAgent;
  std::string tenant;                 // validated name, see ValidName()
  std::string client_id;              // host name or instance id, validated
  std::array<uint8_t, 32> client_nonce{};
};

// proof = HMAC-SHA256(secret, "server" | client_nonce | server_nonce | tenant)
struct Challenge {
  std::array<uint8_t, 32> server_nonce{};
  std::array<uint8_t, 32> server_proof{};
};

// proof = HMAC-SHA256(secret, "client" | server_nonce | client_nonce | tenant)
struct Auth {
  std::array<uint8_t, 32> client_proof{};
};

struct AuthResult {
  bool accepted = false;
  std::string reason;
};

struct VolumeOpen {
  std::string name;                // validated name
  uint64_t size = 0;               // bytes, a multiple of block_size
  uint32_t block_size = 4096;      // power of two, 512..1 MiB
  std::array<uint8_t, 16> uuid{};  // identity of the source volume
  uint64_t generation = 0;         // bumped when the source is re-seeded
  // Tenant-side encryption: the stream carries kSealed / kSealedZero records
  // (size a multiple of kSealUnit). On the wire a flags byte after the
  // generation (bit 0), sent only when set, so unsealed opens are unchanged.
  bool sealed = false;
  // Agent -> process server: the highest sequence the agent knows was
  // acknowledged for this generation (its dirty bitmap's, across restarts);
  // 0 = none or unknown. A server whose spool holds less lost records it had
  // acknowledged and must learn where the master target stands before it
  // answers (docs/formats/protocol.md, "Acknowledged sequence"). Flags bit 1,
  // then 8 bytes; sent only when non-zero. A hint, never trusted as a
  // position: it only makes the server wait.
  uint64_t acked_seq = 0;
};

struct VolumeOpenReply {
  uint32_t volume_id = 0;     // handle for this connection's later messages
  uint64_t durable_seq = 0;   // highest sequence durable at the server (0: none)
};

enum class RecordKind : uint8_t {
  kData = 1,     // `data` holds `length` bytes
  kZero = 2,     // the range reads as zeros; no data
  kTrim = 3,     // the range was discarded; replicas write zeros; no data
  kFlush = 4,    // a crash-consistent boundary; offset = length = 0
  kTag = 5,      // a named consistency point; `data` holds the tag name
  // Sealed volumes (VolumeOpen.sealed; common/crypto/seal.h): ranges are whole
  // 4 KiB blocks (offset and length multiples of kSealUnit) and carry one
  // kSealMacSize-byte MAC per block, which the master target keeps beside
  // the replica. Only these two write kinds are taken on a sealed volume, and
  // neither on another.
  kSealed = 6,      // `data` = the stored blocks (`length` bytes) | their MACs
  kSealedZero = 7,  // the range reads as zeros; `data` = the MACs of its zero blocks
  // The agent's ransomware detector fired (agent/anomaly_detector.h) at this
  // place in the write order; offset = length = 0; `data` = EncodeAnomaly().
  // The master target keeps the image `back` records before it as a
  // suspect-clean point, pinned.
  kAnomaly = 8,
};

// An anomaly record's data: `back` (>= 1: the suspect-clean image is the one
// after record seq - back), fixed64, then the detector's message (UTF-8, at
// most kMaxAnomalyText bytes).
inline constexpr size_t kMaxAnomalyText = 512;
Bytes EncodeAnomaly(uint64_t back, std::string_view message);
// False when `data` is not an anomaly record's (too short or long, back 0).
bool DecodeAnomaly(ByteSpan data, uint64_t* back, std::string* message);

inline constexpr uint32_t kSealUnit = 4096;   // bytes per sealed block (= seal::kUnit)
inline constexpr uint32_t kSealMacSize = 16;  // bytes per block MAC (= seal::kMacSize)
// The MAC bytes a sealed record of `length` carries.
inline constexpr uint64_t SealMacBytes(uint64_t length) { return length / kSealUnit * kSealMacSize; }

// Kinds that change a range of the volume: data, zero, trim, sealed, sealed zero.
bool IsWriteKind(RecordKind k);
// Of those, the ones whose range reads as zeros afterwards: zero, trim, sealed zero.
bool IsZeroKind(RecordKind k);

struct Record {
  uint64_t seq = 0;        // per-volume sequence, strictly increasing by 1
  uint64_t offset = 0;
  uint32_t length = 0;
  RecordKind kind = RecordKind::kData;
  uint64_t timestamp_us = 0;  // wall-clock micros when captured
  Bytes data;                 // kData: exactly `length` bytes; kTag: the name
  // Instead of `data` (then empty), on the sending side only: the same bytes
  // shared with whoever captured them (the agent's capture queue), never
  // changed, so a record is framed and sent without a copy of its data.
  // ParseMessage never sets it; everything that encodes or counts a record
  // reads bytes().
  std::shared_ptr<const Bytes> shared = nullptr;
  ByteSpan bytes() const { return shared ? ByteSpan(*shared) : ByteSpan(data); }
};

enum class Codec : uint8_t { kNone = 0, kLz4 = 1, kZstd = 2 };

// Records of one volume, in sequence order, contiguous sequences.
// On the wire the record block may be compressed (see protocol.md).
struct WriteBatch {
  uint32_t volume_id = 0;
  Codec codec = Codec::kNone;   // how the record block travels (EncodeMessage compresses)
  int level = 0;                // compression level used when encoding (not sent)
  std::vector<Record> records;
};

struct Ack {
  uint32_t volume_id = 0;
  uint64_t durable_seq = 0;
};

enum class NackReason : uint32_t {
  kGap = 1,              // sequence not the expected one; see expected_seq
  kBusy = 2,             // quota: retry later
  kUnknownVolume = 3,
  kBadRecord = 4,        // out of range, bad length, bad kind
  kWrongGeneration = 5,
  kPermissionDenied = 6,
  kInternal = 7,
  kCorruption = 8,
};
// "gap", "busy", "unknown volume", ... for messages; "unknown" for other values.
std::string_view NackReasonName(NackReason r);

struct Nack {
  uint32_t volume_id = 0;
  NackReason reason = NackReason::kInternal;
  uint64_t expected_seq = 0;
  std::string message;
};

// Fencing after a failover (master-target/replica_volume.h): the master target
// refuses the old primary's VolumeOpen and WriteBatch of a failed-over volume
// with Nack{kWrongGeneration} whose message begins with kFailedOverText, and
// applies nothing; the process server refuses the agent's the same way. No new
// reason value (a version-1 receiver rejects unknown reasons): the text is
// the contract (docs/formats/protocol.md, "Failover and fencing").
inline constexpr std::string_view kFailedOverText = "failed over";
// True for such a refusal.
bool IsFailedOverNack(const Nack& n);

// Digests of units [first_region, first_region + count) of `region_size`
// bytes each (common/wire/block_digest.h), as of a sequence the server chooses:
// the replica's newest applied one, which must be >= min_seq (else the answer
// is kBehind), or exactly at_seq when at_seq != 0 (online verify; kPointGone
// when that sequence is outside the retained history). Sequences are the
// stream's wire sequences.
struct HashRequest {
  uint32_t volume_id = 0;
  uint64_t request_id = 0;
  uint32_t region_size = 1u << 20;  // bytes per unit: power of two, 4 KiB .. 1 GiB
  uint64_t first_region = 0;
  uint32_t count = 0;               // <= kMaxHashes
  uint64_t min_seq = 0;
  uint64_t at_seq = 0;
};

struct Hash128 {
  uint64_t low = 0, high = 0;
  bool operator==(const Hash128&) const = default;
};

enum class HashStatus : uint8_t {
  kOk = 0,         // `hashes` holds one digest per unit (units past the end are left out)
  kBehind = 1,     // the replica has not applied min_seq yet; `seq` = what it has; no hashes
  kPointGone = 2,  // at_seq is outside the retained history; no hashes
  kFailed = 3,     // could not be answered (master target unreachable, bad range, I/O
                   // error: the answering side logs why); no hashes
};

struct HashResponse {
  uint32_t volume_id = 0;
  uint64_t request_id = 0;
  uint32_t region_size = 0;
  uint64_t first_region = 0;
  std::vector<Hash128> hashes;  // block digests; kZeroDigest {0,0} travels as a flag
  uint64_t seq = 0;             // the sequence the digests describe (kBehind: applied)
  HashStatus status = HashStatus::kOk;
};

struct Heartbeat {
  uint64_t sent_us = 0;
  uint64_t echo_us = 0;  // the peer's sent_us being answered, or 0
};

struct Stats {
  std::vector<std::pair<std::string, double>> values;  // names <= kMaxNameLength
};

// ---- Failback (docs/formats/protocol.md "Failback") ----
// Block numbers count the volume's block_size (the VolumeOpen's). The agent
// asks the master target for the blocks the provider side changed after the
// failover point (FailbackPlan), adds its own never-shipped blocks, and pulls
// the union in pieces: each PullRequest carries the agent's digest of every
// block it names (common/wire/block_digest.h), and the answer holds only the
// blocks whose digest at the provider differs — identical blocks never
// travel. Both answer kNotFailingBack unless an operator started failback of
// the volume at the master target (`cdpctl failback`).

struct BlockExtent {
  uint64_t first_block = 0;
  uint32_t count = 0;  // > 0
  bool operator==(const BlockExtent&) const = default;
};

enum class FailbackStatus : uint8_t {
  kOk = 0,
  kNotFailingBack = 1,  // the volume is not failing back at the master target
  kFailed = 2,          // could not be answered (unreachable, I/O error: logged where it happened)
};

// Failback requests name their volume (in the connection's tenant): the
// agent's own stream of it is fenced while the volume is failed over.
struct FailbackPlanRequest {
  uint64_t request_id = 0;
  std::string volume;
  uint64_t from_block = 0;  // the page starts here
};

// The blocks the master target's side changed after the failover point — in
// the journal after it, or written to the promoted export — plus, added by
// the process server, those of records it spooled and never delivered.
struct FailbackPlan {
  uint64_t request_id = 0;
  FailbackStatus status = FailbackStatus::kOk;
  std::vector<BlockExtent> extents;  // kOk: sorted, disjoint, >= from_block, <= kMaxExtents
  uint64_t next_block = 0;           // 0: the plan is complete; else ask again from it
};

struct PullRequest {
  uint64_t request_id = 0;
  std::string volume;
  std::vector<BlockExtent> extents;  // sorted, disjoint; kMaxPullBlocks blocks in all at most
  std::vector<Hash128> digests;      // the agent's, one per block of `extents` in order
};

// kOk: `records` (kData or kZero — kSealed or kSealedZero with their MACs on
// a sealed volume —, block aligned, inside the request's extents, in offset
// order) are exactly the requested blocks whose content differs from the
// agent's digest (of the stored blocks, on a sealed volume). They travel as a record block like a
// WriteBatch's (compressed with `codec`); their sequences are 1, 2, ... and
// mean nothing else.
struct PullResponse {
  uint64_t request_id = 0;
  FailbackStatus status = FailbackStatus::kOk;
  Codec codec = Codec::kNone;
  int level = 0;  // compression level used when encoding (not sent)
  std::vector<Record> records;
};

// ---- Group points (docs/groups.md) ----
// The process server coordinating a consistency group asks an agent to hold
// the writes of some of its volumes: the agent takes each volume's capture
// lock, checks that the volume can promise a consistent point, marks it held
// (no write is applied, numbered or completed while it is) and answers
// GroupHeld. It lets go on GroupRelease or by itself after timeout_ms,
// whichever comes first; a GroupRelease with a marker that arrives while the
// hold is still on queues a kTag record named `marker` at the held place in
// every held volume first.
//
// With `freeze` (an application-consistent group tag: the first of its two
// holds) nothing is held: the agent runs its freeze hook, answers GroupHeld
// once the application is frozen (or kRefused when the hook failed), and
// runs its thaw hook on the round's GroupRelease or by itself timeout_ms
// after the request came, whichever is first. The coordinator then asks the
// ordinary hold, with the same round, while every member is frozen.
struct GroupHold {
  uint64_t round = 0;               // the coordinator's, non-zero
  uint32_t timeout_ms = 200;        // 1..kMaxGroupHoldMs
  std::vector<std::string> volumes; // 1..kMaxGroupVolumes valid names, distinct
  bool freeze = false;
};

enum class GroupHoldStatus : uint8_t {
  kHeld = 0,
  kRefused = 1,  // a volume unknown, not able to promise a point, or already held: `message` says which
};

struct GroupHeld {
  uint64_t round = 0;
  GroupHoldStatus status = GroupHoldStatus::kHeld;
  std::string message;  // kRefused: why (<= kMaxTextLength)
};

struct GroupRelease {
  uint64_t round = 0;
  std::string marker;  // a valid tag name: the point is made; empty: abandoned
};

// Total blocks of `extents`, or nullopt when one is empty, they are unsorted
// or overlapping, or the sum overflows.
std::optional<uint64_t> ExtentBlocks(std::span<const BlockExtent> extents);
// Sorts block extents and merges overlapping or touching ones (an extent
// stays under 2^32 blocks). Empty extents are dropped.
std::vector<BlockExtent> MergeExtents(std::vector<BlockExtent> v);

using Message = std::variant<Hello, Challenge, Auth, AuthResult, VolumeOpen, VolumeOpenReply, WriteBatch, Ack,
                             Nack, HashRequest, HashResponse, Heartbeat, Stats, FailbackPlanRequest,
                             FailbackPlan, PullRequest, PullResponse, GroupHold, GroupHeld, GroupRelease>;

MsgType TypeOf(const Message& m);

// A decoded frame whose header and CRC were checked; payload not yet parsed.
// A decoded frame. Its payload views the bytes DecodeFrame was given (no copy:
// a receiver parses it where it arrived), so it is valid while they are.
struct Frame {
  MsgType type{};
  uint16_t flags = 0;
  uint64_t sequence = 0;
  ByteSpan payload;
};

enum class DecodeState { kComplete, kNeedMore, kBad };

struct DecodeOutcome {
  DecodeState state = DecodeState::kNeedMore;
  size_t consumed = 0;  // bytes of input used (kComplete only)
  Status error;         // why (kBad only)
};

// Looks at the bytes received so far. On kComplete fills *out and says how many
// bytes it used; on kNeedMore consumes nothing; on kBad the stream must be dropped.
// `max_payload` (<= kMaxPayload) is checked before the payload's CRC is.
DecodeOutcome DecodeFrame(ByteSpan input, Frame* out, uint32_t max_payload = kMaxPayload);

// Parses a frame's payload into its message. Validates every field (names,
// lengths, kinds, contiguous sequences, caps, decompressed sizes); never
// allocates more than the caps allow.
Result<Message> ParseMessage(const Frame& frame);

// Encodes `m` as one complete frame with the given per-connection sequence.
// A WriteBatch is compressed with its codec/level. Fails only if `m` breaks a
// cap or holds an invalid name.
Result<Bytes> EncodeMessage(const Message& m, uint64_t sequence);

// The payload alone (what EncodeMessage wraps in a header); same failures.
// With EncodeHeader it lets a sender compress outside its send lock and stamp
// the frame sequence inside it.
Result<Bytes> EncodePayload(const Message& m);

// The payload as pieces, for a gathered write that does not copy record data:
// in a WriteBatch that travels uncompressed (codec kNone, or a sample says
// compression would not pay: the same decision as EncodePayload's), the data
// of each record of kInPlaceData bytes or more is referenced where it is, in
// the message; everything else is encoded into `own`. The pieces concatenated
// are EncodePayload's bytes; they are valid while the message is alive and
// unchanged and `own` untouched.
inline constexpr size_t kInPlaceData = 64 * 1024;
struct PayloadPieces {
  Bytes own;
  std::vector<ByteSpan> pieces;  // spans of `own` and of the message's records
  size_t size = 0;               // of the payload
};
// Same failures as EncodePayload.
Status EncodePayloadPieces(const Message& m, PayloadPieces* out);

// Writes the kHeaderSize-byte header of a frame carrying `payload` (or the
// concatenation of its pieces) into header[0, kHeaderSize), CRC included. The
// payload's size must be <= kMaxPayload.
void EncodeHeader(MsgType type, uint16_t flags, uint64_t sequence, ByteSpan payload,
                  uint8_t* header);
void EncodeHeader(MsgType type, uint16_t flags, uint64_t sequence, std::span<const ByteSpan> payload,
                  uint8_t* header);

// The work of `records`: the sum of the lengths of their write records, with
// the MAC bytes of sealed ones (see kMaxBatchWork).
uint64_t BatchWork(std::span<const Record> records);
// Drops records from the end of *records until its work is within
// kMaxBatchWork, keeping at least the first record.
void CutToWorkCap(std::vector<Record>* records);

}  // namespace cdp::proto

// SPDX-License-Identifier: Apache-2.0
#include "agent/capture_device.h"

#include <algorithm>

#include "common/base/log.h"
#include "common/wire/hash.h"

namespace cdp::agent {
namespace {
constexpr uint64_t kZeroChunk = 1u << 20;
uint64_t BlockFloor(uint64_t x) { return x / seal::kUnit * seal::kUnit; }
uint64_t BlockCeil(uint64_t x) { return (x + seal::kUnit - 1) / seal::kUnit * seal::kUnit; }
}  // namespace

Result<std::shared_ptr<CaptureDevice>> CaptureDevice::Open(const Options& opts) {
  if (!ValidName(opts.volume)) return Status::InvalidArgument("bad volume name '" + opts.volume + "'");
  if (opts.env == nullptr || opts.clock == nullptr) return Status::InvalidArgument("capture device: env and clock required");
  if (opts.block_size < 512 || opts.block_size > (2u << 20) || (opts.block_size & (opts.block_size - 1)) != 0) {
    return Status::InvalidArgument("capture device: block size must be a power of two in 512..2 MiB");
  }
  CDP_ASSIGN_OR_RETURN(std::unique_ptr<File> file, opts.env->Open(opts.backing_path, OpenOptions{}));
  CDP_ASSIGN_OR_RETURN(uint64_t size, file->Size());
  if (size == 0) return Status::InvalidArgument("backing store " + opts.backing_path + " is empty");
  if (size % 512 != 0) {
    return Status::InvalidArgument("backing store " + opts.backing_path + " size is not a multiple of 512");
  }
  if (opts.sealer && size % seal::kUnit != 0) {
    return Status::InvalidArgument("backing store " + opts.backing_path +
                                   ": an encrypted volume's size must be a multiple of 4 KiB");
  }
  DirtyBitmap::Options bo;
  bo.env = opts.env;
  bo.path = opts.bitmap_path;
  bo.volume_size = size;
  bo.region_size = opts.region_size;
  CDP_ASSIGN_OR_RETURN(std::unique_ptr<DirtyBitmap> bitmap, DirtyBitmap::Open(bo));
  return std::shared_ptr<CaptureDevice>(new CaptureDevice(opts, std::move(file), size, std::move(bitmap)));
}

CaptureDevice::CaptureDevice(const Options& opts, std::unique_ptr<File> file, uint64_t size,
                             std::unique_ptr<DirtyBitmap> bitmap)
    : opts_(opts), file_(std::move(file)), size_(size), bitmap_(std::move(bitmap)) {
  queue_ = std::make_unique<CaptureQueue>(CaptureQueue::Options{opts.volume, opts.budget, opts.clock});
  if (opts.anomaly && opts.anomaly->enabled) detector_ = std::make_unique<AnomalyDetector>(*opts.anomaly);
}

BlockDeviceFeatures CaptureDevice::features() const {
  BlockDeviceFeatures f;
  f.flush = f.fua = f.trim = f.write_zeroes = f.multi_conn = true;
  f.fast_zero = true;  // a zero range is one record, and a hole punched in the backing store
  return f;
}

Status CaptureDevice::Read(uint64_t offset, uint32_t len, uint8_t* buf) {
  if (offset > size_ || len > size_ - offset) return Status::OutOfRange("read past the end of the volume");
  return file_->Read(offset, len, buf);
}

Status CaptureDevice::Extents(uint64_t offset, uint64_t len, std::vector<DeviceExtent>* out) {
  if (offset > size_ || len > size_ - offset) return Status::OutOfRange("extents past the end of the volume");
  return FileExtents(*file_, offset, len, out);
}

Status CaptureDevice::SyncBacking() {
  std::lock_guard lk(sync_mu_);
  return file_->Sync();
}

void CaptureDevice::SetWriteFence(std::string why) {
  std::lock_guard lk(fence_mu_);
  fence_ = std::move(why);
}

std::string CaptureDevice::write_fence() const {
  std::lock_guard lk(fence_mu_);
  return fence_;
}

Status CaptureDevice::WriteFailback(uint64_t offset, uint64_t len, ByteSpan data) {
  if (offset > size_ || len > size_ - offset) return Status::OutOfRange("failback write past the end of the volume");
  if (!data.empty()) {
    if (data.size() != len) return Status::InvalidArgument("failback write: data size differs from its length");
    return file_->Write(offset, data);
  }
  Status s = file_->PunchHole(offset, len);
  if (s.ok()) return s;
  static const Bytes kZeros(kZeroChunk, 0);
  for (uint64_t done = 0; done < len;) {
    uint64_t n = std::min(kZeroChunk, len - done);
    CDP_RETURN_IF_ERROR(file_->Write(offset + done, ByteSpan(kZeros.data(), n)));
    done += n;
  }
  return Status::OK();
}

Status CaptureDevice::Write(uint64_t offset, ByteSpan data, bool fua) {
  return WriteKeeping(offset, data, nullptr, fua);
}

Status CaptureDevice::WriteShared(uint64_t offset, std::shared_ptr<const Bytes> data, bool fua) {
  const ByteSpan view(data->data(), data->size());
  return WriteKeeping(offset, view, std::move(data), fua);
}

Status CaptureDevice::WriteKeeping(uint64_t offset, ByteSpan data, std::shared_ptr<const Bytes> keep, bool fua) {
  const uint64_t len = data.size();
  if (len == 0) return Status::OK();
  if (std::string f = write_fence(); !f.empty()) return Status::PermissionDenied(f);
  if (offset > size_ || len > size_ - offset) return Status::OutOfRange("write past the end of the volume");
  if (len > proto::kMaxRecordLength) return Status::InvalidArgument("write larger than a record");
  // A sealed volume captures whole blocks: a partial one is read back (the
  // widened range touches the same bitmap regions, which are whole blocks).
  const bool widen = opts_.sealer && (offset % seal::kUnit != 0 || len % seal::kUnit != 0);
  if (widen && BlockCeil(offset + len) - BlockFloor(offset) > proto::kMaxRecordLength)
    return Status::InvalidArgument("write larger than a record");
  CDP_RETURN_IF_ERROR(bitmap_->MarkAndPin(offset, len));
  // The data for the queue: the caller's buffer, or a copy made before
  // taking the capture lock (the mode may change meanwhile; the copy is then
  // simply dropped). `keep` stays ours until we return: `data` points into
  // it, and the detector reads `data` after the queue may have dropped its
  // reference (the write that reaches the memory budget).
  std::shared_ptr<const Bytes> copy;
  if (!widen && queue_->mode() == CaptureMode::kData)
    copy = keep ? keep : std::make_shared<const Bytes>(data.begin(), data.end());
  {
    auto lk = queue_->LockForWrite();
    Status s = file_->Write(offset, data);
    if (!s.ok()) {
      // Part of it may have landed: the client gets the error, and the
      // regions are compared with the replica (and what differs shipped),
      // so source and replica still converge.
      bitmap_->AssignResync(offset, len);
      return s;
    }
    if (widen) {
      CDP_RETURN_IF_ERROR(QueueBlocksLocked(BlockFloor(offset), BlockCeil(offset + len) - BlockFloor(offset)));
      DetectLocked(offset, data, queue_->LastSeqLocked());
    } else {
      uint64_t seq = queue_->AppendLocked(proto::RecordKind::kData, offset, uint32_t(len), data, std::move(copy));
      if (seq != 0) bitmap_->Assign(offset, len, seq);
      else bitmap_->AssignResync(offset, len);
      DetectLocked(offset, data, seq);
    }
  }
  if (fua) return SyncBacking();
  return Status::OK();
}

void CaptureDevice::TickDetector() {
  if (!detector_) return;
  auto lk = queue_->Lock();
  QueueAnomalyLocked(detector_->Tick(opts_.clock->NowMicros()));
}

AnomalyCounters CaptureDevice::anomaly_counters() {
  if (!detector_) return {};
  auto lk = queue_->Lock();
  return detector_->counters();
}

void CaptureDevice::DetectLocked(uint64_t offset, ByteSpan data, uint64_t seq) {
  if (detector_) QueueAnomalyLocked(detector_->OnWrite(offset, data, opts_.clock->NowMicros(), seq));
}

void CaptureDevice::QueueAnomalyLocked(const std::optional<Anomaly>& a) {
  if (!a) return;
  const uint64_t at = queue_->AppendAnomalyLocked(a->clean_seq, a->message);
  log::Get("agent")->warn("{} possible ransomware: {}; the image after sequence {} is kept as suspect-clean{}",
                          log::Where{opts_.volume, "", at}, a->message, a->clean_seq,
                          at == 0 ? " (NOT sent: bitmap mode)" : "");
}

Status CaptureDevice::ApplyRange(proto::RecordKind kind, uint64_t offset, uint64_t len, bool punch) {
  if (offset > size_ || len > size_ - offset) return Status::OutOfRange("range past the end of the volume");
  if (len == 0) return Status::OK();
  if (std::string f = write_fence(); !f.empty()) return Status::PermissionDenied(f);
  CDP_RETURN_IF_ERROR(bitmap_->MarkAndPin(offset, len));
  static const Bytes kZeros(kZeroChunk, 0);
  auto lk = queue_->LockForWrite();
  Status s;
  if (punch) s = file_->PunchHole(offset, len);
  if (!punch || !s.ok()) {
    // No hole punching (NO_HOLE, or a store that cannot): write zeros.
    s = Status::OK();
    for (uint64_t done = 0; done < len && s.ok();) {
      uint64_t n = std::min(kZeroChunk, len - done);
      s = file_->Write(offset + done, ByteSpan(kZeros.data(), n));
      done += n;
    }
  }
  if (!s.ok()) {
    bitmap_->AssignResync(offset, len);  // as in Write: part may have landed
    return s;
  }
  uint64_t end = offset + len;
  if (opts_.sealer) {
    // Partial blocks at either end are data records of the whole block; the
    // whole blocks between stay a zero/trim range.
    const uint64_t head = BlockCeil(offset), tail = BlockFloor(end);
    if (head > tail) {  // inside one block
      CDP_RETURN_IF_ERROR(QueueBlocksLocked(BlockFloor(offset), seal::kUnit));
      DetectLocked(offset, {}, queue_->LastSeqLocked());
      return Status::OK();
    }
    if (head != offset) CDP_RETURN_IF_ERROR(QueueBlocksLocked(BlockFloor(offset), seal::kUnit));
    if (tail != end) CDP_RETURN_IF_ERROR(QueueBlocksLocked(tail, seal::kUnit));
    offset = head;
    end = tail;
  }
  for (uint64_t done = offset; done < end;) {
    uint64_t n = std::min<uint64_t>(proto::kMaxRecordLength, end - done);
    uint64_t seq = queue_->AppendLocked(kind, done, uint32_t(n), {});
    if (seq != 0) bitmap_->Assign(done, n, seq);
    else bitmap_->AssignResync(done, n);
    done += n;
  }
  // Zeros are no sign of encryption: the detector only learns the range's
  // place in the write order (its last clean write).
  DetectLocked(offset, {}, queue_->LastSeqLocked());
  return Status::OK();
}

Status CaptureDevice::QueueBlocksLocked(uint64_t offset, uint64_t len) {
  auto blocks = std::make_shared<Bytes>(len);
  if (Status s = file_->Read(offset, len, blocks->data()); !s.ok()) {
    bitmap_->AssignResync(offset, len);  // compared and shipped by the resync instead
    return s;
  }
  const ByteSpan view(blocks->data(), blocks->size());
  uint64_t seq = queue_->AppendLocked(proto::RecordKind::kData, offset, uint32_t(len), view, std::move(blocks));
  if (seq != 0) bitmap_->Assign(offset, len, seq);
  else bitmap_->AssignResync(offset, len);
  return Status::OK();
}

Status CaptureDevice::WriteZeroes(uint64_t offset, uint64_t len, bool fua, bool may_trim) {
  CDP_RETURN_IF_ERROR(ApplyRange(proto::RecordKind::kZero, offset, len, may_trim));
  if (fua) return SyncBacking();
  return Status::OK();
}

Status CaptureDevice::Trim(uint64_t offset, uint64_t len, bool fua) {
  // Replicas write zeros for a trim, so the source must read zeros too.
  CDP_RETURN_IF_ERROR(ApplyRange(proto::RecordKind::kTrim, offset, len, true));
  if (fua) return SyncBacking();
  return Status::OK();
}

Status CaptureDevice::Flush() {
  CDP_RETURN_IF_ERROR(SyncBacking());
  auto lk = queue_->LockForWrite();
  (void)queue_->AppendFlushLocked(ConsistentLocked());
  return Status::OK();
}

bool CaptureDevice::ConsistentLocked() const {
  return queue_->ModeLocked() == CaptureMode::kData && bitmap_->ResyncCount() == 0;
}

Status CaptureDevice::ReadBacking(uint64_t offset, size_t len, uint8_t* buf) const {
  if (offset > size_ || len > size_ - offset) return Status::OutOfRange("read past the end of the volume");
  return file_->Read(offset, len, buf);
}

uint32_t CaptureDevice::RegionLength(uint64_t region) const {
  uint64_t start = region * bitmap_->region_size();
  if (start >= size_) return 0;
  return uint32_t(std::min<uint64_t>(bitmap_->region_size(), size_ - start));
}

Result<std::vector<proto::Hash128>> CaptureDevice::LeafDigests(uint64_t offset, uint64_t len,
                                                               DigestStats* stats) const {
  DigestSource src;
  src.size = size_;
  src.read = [this](uint64_t off, size_t n, uint8_t* buf) {
    CDP_RETURN_IF_ERROR(file_->Read(off, n, buf));
    // A sealed volume is compared as the replica holds it: sealed.
    if (opts_.sealer) return opts_.sealer->Seal(off, std::span<uint8_t>(buf, n), nullptr);
    return Status::OK();
  };
  src.next_data = [this](uint64_t off) { return file_->NextData(off); };
  DigestReader reader(std::move(src));
  auto leaves = reader.Leaves(offset, len);
  if (stats != nullptr) {
    stats->bytes_read += reader.stats().bytes_read;
    stats->bytes_skipped += reader.stats().bytes_skipped;
  }
  return leaves;
}

Result<QuietDigests> CaptureDevice::DigestAtQuietPoint(uint64_t offset, uint64_t len, uint32_t unit,
                                                       uint32_t max_tries, DigestStats* stats) {
  if (!ValidUnitSize(unit)) return Status::InvalidArgument("unit must be a power of two in 4 KiB .. 1 GiB");
  if (offset % unit != 0) return Status::InvalidArgument("range must start on a unit boundary");
  if (offset >= size_) return Status::OutOfRange("range starts past the end of the volume");
  len = std::min(len, size_ - offset);
  if (len == 0) return Status::InvalidArgument("empty range");
  const uint64_t first = offset / bitmap_->region_size();
  const uint64_t last = (offset + len - 1) / bitmap_->region_size();
  QuietDigests out;
  auto busy = [&out](std::string why) {
    out.busy = true;
    out.why = std::move(why);
    out.digests.clear();
    return out;
  };
  std::vector<uint32_t> epochs(size_t(last - first + 1));
  while (out.tries < std::max<uint32_t>(max_tries, 1)) {
    ++out.tries;
    {
      auto lk = queue_->Lock();
      out.numbering = queue_->NumberingLocked();
      if (out.numbering == 0) {
        return busy("sequence numbers are provisional until the process server tells the resume point");
      }
      if (queue_->ModeLocked() != CaptureMode::kData) {
        return busy("capture queue in " + std::string(ModeName(queue_->ModeLocked())) + " mode");
      }
      out.seq = queue_->LastSeqLocked();
      for (uint64_t r = first; r <= last; ++r) {
        if (bitmap_->ResyncState(r) != DirtyBitmap::Resync::kNone) {
          return busy("region " + std::to_string(r) + " waits for a resync");
        }
        epochs[r - first] = bitmap_->ResyncEpoch(r);
      }
    }
    CDP_ASSIGN_OR_RETURN(std::vector<proto::Hash128> leaves, LeafDigests(offset, len, stats));
    auto lk = queue_->Lock();
    bool quiet = queue_->NumberingLocked() == out.numbering;
    for (uint64_t r = first; quiet && r <= last; ++r) {
      quiet = bitmap_->LastSeq(r) <= out.seq && bitmap_->ResyncEpoch(r) == epochs[r - first];
    }
    if (quiet) {
      out.digests = unit == kLeafSize ? std::move(leaves) : UnitsFromLeaves(leaves, unit);
      return out;
    }
  }
  return busy("written during each of " + std::to_string(out.tries) + " tries");
}

Result<uint64_t> CaptureDevice::ShipRange(uint64_t offset, uint32_t len) {
  if (len == 0 || len > proto::kMaxRecordLength || offset > size_ || len > size_ - offset) {
    return Status::OutOfRange("resync range outside the volume");
  }
  Bytes buf(len);
  auto lk = queue_->Lock();
  if (!queue_->HasRoomLocked(len)) return uint64_t(0);
  CDP_RETURN_IF_ERROR(file_->Read(offset, len, buf.data()));
  const bool zero = IsAllZero(buf.data(), buf.size());
  uint64_t seq = queue_->AppendResyncLocked(offset, len, zero ? Bytes() : std::move(buf));
  if (seq != 0) bitmap_->NoteShipped(offset, len, seq);
  return seq;
}

Result<CaptureDevice::NonZeroShip> CaptureDevice::ShipNonZero(uint64_t offset, uint32_t len) {
  if (len == 0 || len > proto::kMaxRecordLength || offset > size_ || len > size_ - offset) {
    return Status::OutOfRange("resync range outside the volume");
  }
  if (opts_.sealer) return Status::InvalidArgument("a sealed volume is compared sealed, block by block");
  NonZeroShip out;
  const uint64_t end = offset + len;
  // A range wholly in a hole costs one seek: no buffer, no lock (a write
  // that fills the hole meanwhile is captured, and replicated, itself).
  CDP_ASSIGN_OR_RETURN(uint64_t first_data, file_->NextData(offset));
  if (first_data >= end) {
    out.skipped = len;
    return out;
  }
  const size_t leaves = (len + kLeafSize - 1) / kLeafSize;
  Bytes buf(len);  // zeros where holes are not read
  auto lk = queue_->Lock();
  constexpr uint64_t kChunk = 256 * 1024;  // between two looks for a hole
  for (uint64_t pos = offset; pos < end;) {
    CDP_ASSIGN_OR_RETURN(uint64_t data, file_->NextData(pos));
    const uint64_t zero_end = std::min(end, data / kLeafSize * kLeafSize);
    if (zero_end > pos) {
      out.skipped += zero_end - pos;
      pos = zero_end;
      continue;
    }
    const uint64_t n = std::min(end - pos, kChunk);
    CDP_RETURN_IF_ERROR(file_->Read(pos, n, buf.data() + (pos - offset)));
    out.read += n;
    pos += n;
  }
  auto nonzero = [&](size_t k) {
    const size_t b = k * kLeafSize;
    return !IsAllZero(buf.data() + b, std::min<size_t>(kLeafSize, len - b));
  };
  std::vector<std::pair<uint64_t, uint64_t>> runs;  // [begin, end) in the range
  uint64_t bytes = 0;
  for (size_t i = 0; i < leaves;) {
    if (!nonzero(i)) {
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < leaves && nonzero(j)) ++j;
    runs.emplace_back(uint64_t(i) * kLeafSize, std::min<uint64_t>(uint64_t(j) * kLeafSize, len));
    bytes += runs.back().second - runs.back().first;
    i = j;
  }
  // Every record of the range, or none (and the next try reads it again).
  if (!runs.empty() && !queue_->HasRoomLocked(bytes + (runs.size() - 1) * CaptureQueue::kEntryOverhead)) {
    return NonZeroShip{.room = false};
  }
  for (const auto& [b, e] : runs) {
    // The whole range in one record keeps the buffer (no copy).
    Bytes data = (b == 0 && e == len) ? std::move(buf) : Bytes(buf.begin() + long(b), buf.begin() + long(e));
    const uint64_t seq = queue_->AppendResyncLocked(offset + b, uint32_t(e - b), std::move(data));
    if (seq == 0) return Status::Aborted("resync record refused after its room was checked");
    bitmap_->NoteShipped(offset + b, e - b, seq);
    out.last_seq = seq;
    ++out.records;
    out.bytes += e - b;
  }
  return out;
}

}  // namespace cdp::agent

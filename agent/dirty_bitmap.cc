// SPDX-License-Identifier: Apache-2.0
#include "agent/dirty_bitmap.h"

#include <algorithm>

#include "common/base/coding.h"
#include "common/base/crc32c.h"

namespace cdp::agent {
namespace {

constexpr uint64_t kMagic = 0x3150'4d42'4450'4443ull;  // "CDPDBMP1"
constexpr uint32_t kVersion = 2;
constexpr size_t kHeaderSize = 64;    // version 2: version 1's header, then acked_seq
constexpr uint32_t kVersion1 = 1;
constexpr size_t kHeaderSizeV1 = 56;  // read, then rewritten as version 2 (Load)
constexpr size_t kSlotAlign = 4096;

size_t SlotSize(size_t header_size, size_t bits_len) {
  return ((header_size + bits_len + 4 + kSlotAlign - 1) / kSlotAlign) * kSlotAlign;
}

// In ondisk_: while a slot write is in progress, a bit is set only if it is set
// both in the newest image on disk and in the image being written (bits being
// cleared count as not marked from the moment the write starts).

}  // namespace

DirtyBitmap::DirtyBitmap(const Options& opts)
    : opts_(opts),
      region_size_(opts.region_size),
      region_count_((opts.volume_size + opts.region_size - 1) / opts.region_size) {
  size_t bits_len = (region_count_ + 7) / 8;
  slot_size_ = SlotSize(kHeaderSize, bits_len);
  ondisk_.assign(bits_len, 0);
  last_seq_.assign(region_count_, 0);
  pins_.assign(region_count_, 0);
  resync_.assign(region_count_, uint8_t(Resync::kNone));
  hot_.assign(region_count_, 0);
  epoch_.assign(region_count_, 0);
}

Result<std::unique_ptr<DirtyBitmap>> DirtyBitmap::Open(const Options& opts) {
  if (opts.env == nullptr || opts.path.empty()) return Status::InvalidArgument("dirty bitmap: env and path required");
  if (opts.volume_size == 0) return Status::InvalidArgument("dirty bitmap: zero volume size");
  if (opts.region_size < 4096 || opts.region_size > (1u << 30) ||
      (opts.region_size & (opts.region_size - 1)) != 0) {
    return Status::InvalidArgument("dirty bitmap: region size must be a power of two in 4 KiB..1 GiB");
  }
  // Cap: 2^32 regions (a 4 PiB volume at 1 MiB) keeps memory sane.
  if (opts.volume_size / opts.region_size >= (1ull << 32)) {
    return Status::InvalidArgument("dirty bitmap: too many regions");
  }
  std::unique_ptr<DirtyBitmap> bm(new DirtyBitmap(opts));
  if (opts.env->Exists(opts.path)) {
    CDP_RETURN_IF_ERROR(bm->Load());
  } else {
    CDP_RETURN_IF_ERROR(bm->CreateFresh());
  }
  return bm;
}

Status DirtyBitmap::CreateFresh() {
  OpenOptions oo;
  oo.create = true;
  oo.truncate = true;
  CDP_ASSIGN_OR_RETURN(file_, opts_.env->Open(opts_.path, oo));
  CDP_RETURN_IF_ERROR(file_->Truncate(2 * slot_size_));
  // Every region needs a comparison with the replica: the initial sync.
  std::vector<uint8_t> bits(ondisk_.size(), 0);
  for (uint64_t r = 0; r < region_count_; ++r) bits[r >> 3] |= uint8_t(1u << (r & 7));
  CDP_RETURN_IF_ERROR(WriteImage(bits, 1, 0, 0));
  CDP_RETURN_IF_ERROR(opts_.env->SyncDir(DirName(opts_.path)));
  ondisk_ = bits;
  counter_ = 1;
  for (uint64_t r = 0; r < region_count_; ++r) resync_[r] = uint8_t(Resync::kCompare);
  resync_count_ = region_count_;
  return Status::OK();
}

// The newest valid image of one format version in `file`, if any.
struct DirtyBitmap::Image {
  std::vector<uint8_t> bits;
  uint64_t counter = 0;
  uint64_t cursor = 0;
  uint64_t acked = 0;
};

Status DirtyBitmap::ReadImage(uint32_t version, std::optional<Image>* out, bool* geometry_mismatch) {
  const size_t header = version == kVersion ? kHeaderSize : kHeaderSizeV1;
  const size_t bits_len = ondisk_.size();
  const size_t slot_size = SlotSize(header, bits_len);
  CDP_ASSIGN_OR_RETURN(uint64_t size, file_->Size());
  if (size < 2 * slot_size) return Status::OK();
  for (int slot = 0; slot < 2; ++slot) {
    Bytes buf(header + bits_len + 4);
    if (!file_->Read(uint64_t(slot) * slot_size, buf.size(), buf.data()).ok()) continue;
    uint32_t stored = DecodeFixed32(buf.data() + header + bits_len);
    if (crc32c::Value(buf.data(), header + bits_len) != stored) continue;
    if (DecodeFixed64(buf.data()) != kMagic || DecodeFixed32(buf.data() + 8) != version) continue;
    if (DecodeFixed32(buf.data() + 12) != region_size_ || DecodeFixed64(buf.data() + 16) != opts_.volume_size ||
        DecodeFixed64(buf.data() + 24) != region_count_ || DecodeFixed32(buf.data() + 48) != bits_len) {
      *geometry_mismatch = true;
      continue;
    }
    uint64_t counter = DecodeFixed64(buf.data() + 32);
    if (!*out || counter > (*out)->counter) {
      Image im;
      im.counter = counter;
      im.cursor = DecodeFixed64(buf.data() + 40);
      im.acked = version == kVersion ? DecodeFixed64(buf.data() + 56) : 0;
      im.bits.assign(buf.begin() + header, buf.begin() + header + bits_len);
      *out = std::move(im);
    }
  }
  return Status::OK();
}

Status DirtyBitmap::Load() {
  CDP_ASSIGN_OR_RETURN(file_, opts_.env->Open(opts_.path, OpenOptions{}));
  std::optional<Image> best;
  bool geometry_mismatch = false;
  CDP_RETURN_IF_ERROR(ReadImage(kVersion, &best, &geometry_mismatch));
  bool v1 = false;
  if (!best) {
    CDP_RETURN_IF_ERROR(ReadImage(kVersion1, &best, &geometry_mismatch));
    v1 = best.has_value();
  }
  if (!best) {
    if (geometry_mismatch) {
      return Status::InvalidArgument("dirty bitmap " + opts_.path + " was written for another volume geometry");
    }
    // A file of another geometry cut short, or ours damaged: find out which for the message.
    Bytes hdr(kHeaderSizeV1);
    CDP_ASSIGN_OR_RETURN(uint64_t size, file_->Size());
    if (size < 2 * slot_size_ && size >= kHeaderSizeV1 && file_->Read(0, kHeaderSizeV1, hdr.data()).ok() &&
        DecodeFixed64(hdr.data()) == kMagic) {
      return Status::InvalidArgument("dirty bitmap " + opts_.path + " was written for another volume geometry");
    }
    return Status::Corruption("dirty bitmap " + opts_.path + (size < 2 * slot_size_ ? ": file too short" : ": no valid slot"));
  }
  ondisk_ = best->bits;
  counter_ = best->counter;
  cursor_ = persisted_cursor_ = best->cursor;
  loaded_acked_ = best->acked;
  for (uint64_t r = 0; r < region_count_; ++r) {
    if (OnDiskLocked(r)) {
      resync_[r] = uint8_t(Resync::kCompare);
      ++resync_count_;
    }
  }
  if (v1) {
    // Rewritten as version 2, whole (its slots may be larger): a crash leaves
    // the old file or the new one. Version 1 kept no acknowledged sequence: 0.
    Bytes file(2 * slot_size_, 0);
    Bytes image = EncodeImage(ondisk_, counter_ + 1, cursor_, 0);
    std::copy(image.begin(), image.end(), file.begin() + ptrdiff_t(((counter_ + 1) % 2) * slot_size_));
    file_.reset();
    CDP_RETURN_IF_ERROR(WriteFileAtomic(opts_.env, opts_.path, ByteSpan(file.data(), file.size()))
                            .WithContext("dirty bitmap " + opts_.path + ": rewriting version 1 as version 2"));
    ++counter_;
    CDP_ASSIGN_OR_RETURN(file_, opts_.env->Open(opts_.path, OpenOptions{}));
  }
  return Status::OK();
}

Bytes DirtyBitmap::EncodeImage(const std::vector<uint8_t>& bits, uint64_t counter, uint64_t cursor,
                               uint64_t acked) const {
  Bytes buf;
  buf.reserve(kHeaderSize + bits.size() + 4);
  PutFixed64(buf, kMagic);
  PutFixed32(buf, kVersion);
  PutFixed32(buf, region_size_);
  PutFixed64(buf, opts_.volume_size);
  PutFixed64(buf, region_count_);
  PutFixed64(buf, counter);
  PutFixed64(buf, cursor);
  PutFixed32(buf, uint32_t(bits.size()));
  PutFixed32(buf, 0);
  PutFixed64(buf, acked);
  PutBytes(buf, ByteSpan(bits.data(), bits.size()));
  PutFixed32(buf, crc32c::Value(buf.data(), buf.size()));
  return buf;
}

Status DirtyBitmap::WriteImage(const std::vector<uint8_t>& bits, uint64_t counter, uint64_t cursor, uint64_t acked) {
  Bytes buf = EncodeImage(bits, counter, cursor, acked);
  CDP_RETURN_IF_ERROR(file_->Write((counter % 2) * slot_size_, ByteSpan(buf.data(), buf.size())));
  return file_->Sync();
}

bool DirtyBitmap::WantedDirtyLocked(uint64_t r) const {
  return pins_[r] > 0 || last_seq_[r] > acked_ || resync_[r] != uint8_t(Resync::kNone);
}

Status DirtyBitmap::PersistWriting(std::unique_lock<std::mutex>& lk, std::vector<uint8_t> image) {
  // Before the server's first resume point in this process our sequences are
  // provisional: the images keep the acknowledged sequence they were loaded with.
  uint64_t counter = counter_ + 1, cursor = cursor_, acked = resumed_ ? acked_ : loaded_acked_;
  lk.unlock();
  Status s = WriteImage(image, counter, cursor, acked);
  lk.lock();
  writing_ = false;
  ++write_round_;
  last_write_error_ = s;
  if (s.ok()) {
    ondisk_ = std::move(image);
    counter_ = counter;
    persisted_cursor_ = cursor;
    ++persists_;
  }
  cv_.notify_all();
  return s;
}

Status DirtyBitmap::MarkAndPin(uint64_t offset, uint64_t len) {
  if (len == 0 || offset + len < offset || offset + len > opts_.volume_size) {
    return Status::OutOfRange("dirty bitmap: range outside the volume");
  }
  const uint64_t first = FirstRegion(offset), last = LastRegion(offset, len);
  std::unique_lock lk(mu_);
  for (uint64_t r = first; r <= last; ++r) {
    ++pins_[r];
    hot_[r] = 1;
  }
  auto all_marked = [&] {
    for (uint64_t r = first; r <= last; ++r) {
      if (!OnDiskLocked(r)) return false;
    }
    return true;
  };
  while (!all_marked()) {
    if (writing_) {
      uint64_t round = write_round_;
      cv_.wait(lk, [&] { return write_round_ != round; });
      if (!last_write_error_.ok() && !all_marked()) {
        Status s = last_write_error_;
        for (uint64_t r = first; r <= last; ++r) --pins_[r];
        return s;
      }
      continue;
    }
    // Leader of a group commit: the image is what is on disk plus every
    // pinned region not yet on disk (ours and those of writers waiting).
    writing_ = true;
    std::vector<uint8_t> image = ondisk_;
    for (uint64_t r = 0; r < region_count_; ++r) {
      if (pins_[r] > 0 || resync_[r] != uint8_t(Resync::kNone)) image[r >> 3] |= uint8_t(1u << (r & 7));
    }
    Status s = PersistWriting(lk, std::move(image));
    if (!s.ok()) {
      for (uint64_t r = first; r <= last; ++r) --pins_[r];
      return s.WithContext("mark dirty region");
    }
  }
  return Status::OK();
}

void DirtyBitmap::Assign(uint64_t offset, uint64_t len, uint64_t seq) {
  const uint64_t first = FirstRegion(offset), last = LastRegion(offset, len);
  std::lock_guard lk(mu_);
  for (uint64_t r = first; r <= last; ++r) {
    last_seq_[r] = std::max(last_seq_[r], seq);
    hot_[r] = 1;
    if (pins_[r] > 0) --pins_[r];
  }
}

void DirtyBitmap::AssignResync(uint64_t offset, uint64_t len) {
  const uint64_t first = FirstRegion(offset), last = LastRegion(offset, len);
  std::lock_guard lk(mu_);
  for (uint64_t r = first; r <= last; ++r) {
    if (resync_[r] == uint8_t(Resync::kNone)) ++resync_count_;
    resync_[r] = uint8_t(Resync::kShip);
    ++epoch_[r];
    if (pins_[r] > 0) --pins_[r];
  }
}

void DirtyBitmap::SetAcked(uint64_t seq) {
  std::lock_guard lk(mu_);
  acked_ = std::max(acked_, seq);
}

void DirtyBitmap::Renumber(uint64_t old_acked, uint64_t new_acked) {
  std::lock_guard lk(mu_);
  for (uint64_t r = 0; r < region_count_; ++r) {
    if (last_seq_[r] > old_acked) last_seq_[r] = last_seq_[r] - old_acked + new_acked;
    else last_seq_[r] = 0;
  }
  acked_ = new_acked;
}

void DirtyBitmap::MarkAllCompare() {
  std::lock_guard lk(mu_);
  for (uint64_t r = 0; r < region_count_; ++r) {
    if (resync_[r] == uint8_t(Resync::kNone)) {
      resync_[r] = uint8_t(Resync::kCompare);
      ++resync_count_;
    }
    ++epoch_[r];
  }
  cursor_ = 0;
}

void DirtyBitmap::ForgetAll() {
  std::lock_guard lk(mu_);
  for (uint64_t r = 0; r < region_count_; ++r) {
    resync_[r] = uint8_t(Resync::kNone);
    last_seq_[r] = 0;
    hot_[r] = 0;
    ++epoch_[r];
  }
  resync_count_ = 0;
  acked_ = 0;
  resumed_ = true;  // a new generation: its sequences start again
  cursor_ = 0;
}

bool DirtyBitmap::Resumed(uint64_t durable) {
  std::lock_guard lk(mu_);
  const bool lost = !resumed_ && durable < loaded_acked_;
  resumed_ = true;
  return lost;
}

uint64_t DirtyBitmap::KnownAcked() const {
  std::lock_guard lk(mu_);
  return resumed_ ? acked_ : std::max(acked_, loaded_acked_);
}

Result<size_t> DirtyBitmap::Checkpoint() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return !writing_; });
  std::vector<uint8_t> image = ondisk_;
  size_t cleared = 0;
  bool changed = false;
  for (uint64_t r = 0; r < region_count_; ++r) {
    bool on = OnDiskLocked(r);
    if (on) {
      if (pins_[r] == 0 && last_seq_[r] <= acked_ && resync_[r] == uint8_t(Resync::kNone) && !hot_[r]) {
        image[r >> 3] &= uint8_t(~(1u << (r & 7)));
        ++cleared;
        changed = true;
      }
    } else if (resync_[r] != uint8_t(Resync::kNone)) {
      image[r >> 3] |= uint8_t(1u << (r & 7));
      changed = true;
    }
    hot_[r] = 0;
  }
  if (!changed && cursor_ == persisted_cursor_) return size_t(0);
  writing_ = true;
  for (size_t i = 0; i < ondisk_.size(); ++i) ondisk_[i] &= image[i];
  Status s = PersistWriting(lk, std::move(image));
  if (!s.ok()) return s.WithContext("dirty bitmap checkpoint");
  return cleared;
}

std::optional<uint64_t> DirtyBitmap::NextResync(uint64_t from) const {
  std::lock_guard lk(mu_);
  for (uint64_t r = from; r < region_count_; ++r) {
    if (resync_[r] != uint8_t(Resync::kNone)) return r;
  }
  return std::nullopt;
}

DirtyBitmap::Resync DirtyBitmap::ResyncState(uint64_t region) const {
  std::lock_guard lk(mu_);
  if (region >= region_count_) return Resync::kNone;
  return Resync(resync_[region]);
}

void DirtyBitmap::ResyncDone(uint64_t region, uint64_t seq) {
  std::lock_guard lk(mu_);
  if (region >= region_count_) return;
  if (resync_[region] != uint8_t(Resync::kNone)) --resync_count_;
  resync_[region] = uint8_t(Resync::kNone);
  last_seq_[region] = std::max(last_seq_[region], seq);
}

uint32_t DirtyBitmap::ResyncEpoch(uint64_t region) const {
  std::lock_guard lk(mu_);
  return region < region_count_ ? epoch_[region] : 0;
}

bool DirtyBitmap::ResyncDoneAt(uint64_t region, uint32_t epoch) {
  std::lock_guard lk(mu_);
  if (region >= region_count_ || epoch_[region] != epoch) return false;
  if (resync_[region] != uint8_t(Resync::kNone)) --resync_count_;
  resync_[region] = uint8_t(Resync::kNone);
  return true;
}

void DirtyBitmap::NoteShipped(uint64_t offset, uint64_t len, uint64_t seq) {
  const uint64_t first = FirstRegion(offset), last = LastRegion(offset, len);
  std::lock_guard lk(mu_);
  for (uint64_t r = first; r <= last && r < region_count_; ++r) last_seq_[r] = std::max(last_seq_[r], seq);
}

uint64_t DirtyBitmap::LastSeq(uint64_t region) const {
  std::lock_guard lk(mu_);
  return region < region_count_ ? last_seq_[region] : 0;
}

void DirtyBitmap::SetCursor(uint64_t region) {
  std::lock_guard lk(mu_);
  cursor_ = region;
}

uint64_t DirtyBitmap::cursor() const {
  std::lock_guard lk(mu_);
  return cursor_;
}

uint64_t DirtyBitmap::DirtyCount() const {
  std::lock_guard lk(mu_);
  uint64_t n = 0;
  for (uint64_t r = 0; r < region_count_; ++r) n += (OnDiskLocked(r) || WantedDirtyLocked(r)) ? 1 : 0;
  return n;
}

uint64_t DirtyBitmap::ResyncCount() const {
  std::lock_guard lk(mu_);
  return resync_count_;
}

uint64_t DirtyBitmap::persist_count() const {
  std::lock_guard lk(mu_);
  return persists_;
}

}  // namespace cdp::agent

// SPDX-License-Identifier: Apache-2.0
#include "agent/branch_store.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "common/base/crc32c.h"
#include "common/nbd/block_device.h"

namespace cdp::agent {
namespace {

constexpr uint64_t kMagic = 0x3148'4352'4250'4443ull;  // "CDPBRCH1"
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderSize = 64;
constexpr size_t kHeaderCrcOffset = 60;
constexpr size_t kRecordSize = 16;
constexpr size_t kRecordCrcOffset = 12;
// Records read per Read() at Open.
constexpr size_t kReadChunkRecords = 4096;

std::string ImgPath(const std::string& prefix) { return prefix + ".img"; }
std::string IdxPath(const std::string& prefix) { return prefix + ".idx"; }

Bytes EncodeHeader(uint32_t block_size, uint64_t volume_size, const std::array<uint8_t, 16>& uuid,
                   uint64_t created_us) {
  Bytes b;
  b.reserve(kHeaderSize);
  PutFixed64(b, kMagic);
  PutFixed32(b, kVersion);
  PutFixed32(b, block_size);
  PutFixed64(b, volume_size);
  PutBytes(b, ByteSpan(uuid.data(), uuid.size()));
  PutFixed64(b, created_us);
  b.resize(kHeaderCrcOffset, 0);  // reserved
  PutFixed32(b, crc32c::Value(b.data(), kHeaderCrcOffset));
  return b;
}

void EncodeRecord(uint8_t* p, uint64_t first_block, uint32_t block_count) {
  EncodeFixed64(p, first_block);
  EncodeFixed32(p + 8, block_count);
  EncodeFixed32(p + kRecordCrcOffset, crc32c::Value(p, kRecordCrcOffset));
}

bool RecordCrcOk(const uint8_t* p) { return crc32c::Value(p, kRecordCrcOffset) == DecodeFixed32(p + kRecordCrcOffset); }

}  // namespace

BranchStore::BranchStore(const Options& opts)
    : env_(opts.env),
      img_path_(ImgPath(opts.prefix)),
      idx_path_(IdxPath(opts.prefix)),
      volume_size_(opts.volume_size),
      block_size_(opts.block_size),
      block_count_(opts.volume_size / opts.block_size),
      uuid_(opts.uuid),
      created_us_(opts.time_us),
      saved_(block_count_, false) {}

Result<std::unique_ptr<BranchStore>> BranchStore::Open(const Options& opts) {
  if (opts.env == nullptr || opts.prefix.empty())
    return Status::InvalidArgument("branch store: env and prefix required");
  if (!ValidBlockSize(opts.block_size)) {
    return Status::InvalidArgument("branch store: block size must be a power of two in 512 B..2 MiB");
  }
  if (opts.volume_size == 0 || opts.volume_size % opts.block_size != 0) {
    return Status::InvalidArgument("branch store: volume size must be a non-zero multiple of the block size");
  }
  std::unique_ptr<BranchStore> store(new BranchStore(opts));
  if (opts.env->Exists(store->idx_path_)) {
    CDP_RETURN_IF_ERROR(store->Load());
  } else {
    CDP_RETURN_IF_ERROR(store->Create());
  }
  return store;
}

Status BranchStore::Create() {
  // Without an index nothing was ever saved: a leftover .img is meaningless.
  OpenOptions oo;
  oo.create = true;
  oo.truncate = true;
  CDP_ASSIGN_OR_RETURN(img_, env_->Open(img_path_, oo));
  CDP_RETURN_IF_ERROR(img_->Truncate(volume_size_));
  CDP_RETURN_IF_ERROR(img_->Sync());
  // The index appears whole or not at all; its directory sync also makes the
  // .img's name durable (same directory).
  Bytes header = EncodeHeader(block_size_, volume_size_, uuid_, created_us_);
  CDP_RETURN_IF_ERROR(WriteFileAtomic(env_, idx_path_, ByteSpan(header.data(), header.size())));
  CDP_ASSIGN_OR_RETURN(idx_, env_->Open(idx_path_, OpenOptions{}));
  idx_size_ = kHeaderSize;
  return Status::OK();
}

Status BranchStore::Load() {
  CDP_ASSIGN_OR_RETURN(idx_, env_->Open(idx_path_, OpenOptions{}));
  CDP_ASSIGN_OR_RETURN(uint64_t size, idx_->Size());
  if (size < kHeaderSize) return Status::Corruption("branch index " + idx_path_ + ": header cut short");
  uint8_t h[kHeaderSize];
  CDP_RETURN_IF_ERROR(idx_->Read(0, kHeaderSize, h));
  if (DecodeFixed64(h) != kMagic || DecodeFixed32(h + 8) != kVersion ||
      crc32c::Value(h, kHeaderCrcOffset) != DecodeFixed32(h + kHeaderCrcOffset)) {
    return Status::Corruption("branch index " + idx_path_ + ": bad header");
  }
  if (DecodeFixed32(h + 12) != block_size_ || DecodeFixed64(h + 16) != volume_size_) {
    return Status::InvalidArgument("branch index " + idx_path_ + " was written for another volume size or block size");
  }
  if (std::memcmp(h + 24, uuid_.data(), uuid_.size()) != 0) {
    return Status::InvalidArgument("branch index " + idx_path_ + " was written for another volume (uuid)");
  }
  created_us_ = DecodeFixed64(h + 40);

  // Records: accept until the first bad one; a valid record after a bad one
  // means damage to synced bytes, anything else after it is a torn tail.
  const uint64_t whole = (size - kHeaderSize) / kRecordSize;
  uint64_t good = 0;  // records accepted
  bool bad_seen = false;
  Bytes chunk(kReadChunkRecords * kRecordSize);
  for (uint64_t i = 0; i < whole;) {
    const uint64_t n = std::min<uint64_t>(kReadChunkRecords, whole - i);
    CDP_RETURN_IF_ERROR(idx_->Read(kHeaderSize + i * kRecordSize, n * kRecordSize, chunk.data()));
    for (uint64_t j = 0; j < n; ++j) {
      const uint8_t* p = chunk.data() + j * kRecordSize;
      if (!RecordCrcOk(p)) {
        bad_seen = true;
        continue;
      }
      if (bad_seen) {
        return Status::Corruption("branch index " + idx_path_ + ": bad record " + std::to_string(good) +
                                  " followed by a valid one");
      }
      const uint64_t first = DecodeFixed64(p);
      const uint32_t count = DecodeFixed32(p + 8);
      if (count == 0 || first >= block_count_ || count > block_count_ - first) {
        return Status::Corruption("branch index " + idx_path_ + ": record " + std::to_string(good) +
                                  " outside the volume");
      }
      for (uint64_t b = first; b < first + count; ++b) {
        if (!saved_[b]) {
          saved_[b] = true;
          ++saved_count_;
        }
      }
      ++good;
    }
    i += n;
  }
  idx_size_ = kHeaderSize + good * kRecordSize;

  // The data file: created (and sized) before the index, so it must be there,
  // unless nothing was ever saved.
  if (!env_->Exists(img_path_)) {
    if (good > 0) return Status::Corruption("branch data " + img_path_ + " is missing");
    OpenOptions oo;
    oo.create = true;
    CDP_ASSIGN_OR_RETURN(img_, env_->Open(img_path_, oo));
    CDP_RETURN_IF_ERROR(img_->Truncate(volume_size_));
    CDP_RETURN_IF_ERROR(img_->Sync());
    CDP_RETURN_IF_ERROR(env_->SyncDir(DirName(img_path_)));
  } else {
    CDP_ASSIGN_OR_RETURN(img_, env_->Open(img_path_, OpenOptions{}));
    CDP_ASSIGN_OR_RETURN(uint64_t img_size, img_->Size());
    if (img_size != volume_size_) {
      return Status::Corruption("branch data " + img_path_ + " has size " + std::to_string(img_size) + ", expected " +
                                std::to_string(volume_size_));
    }
  }

  if (size != idx_size_) {  // torn tail: never acknowledged, cut it off
    CDP_RETURN_IF_ERROR(idx_->Truncate(idx_size_));
    CDP_RETURN_IF_ERROR(idx_->Sync());
  }
  return Status::OK();
}

Status BranchStore::Remove(Env* env, const std::string& prefix) {
  // The index first: an .img without an index is a leftover Open ignores.
  for (const std::string& path : {IdxPath(prefix), IdxPath(prefix) + ".tmp", ImgPath(prefix)}) {
    Status s = env->Remove(path);
    if (!s.ok() && s.code() != Code::kNotFound) return s;
  }
  return env->SyncDir(DirName(prefix));
}

Status BranchStore::Save(uint64_t offset, ByteSpan old_data) {
  const Piece p{offset, old_data};
  return SaveMany(std::span<const Piece>(&p, 1));
}

Status BranchStore::SaveMany(std::span<const Piece> pieces) {
  for (const Piece& p : pieces) {
    const uint64_t offset = p.offset, len = p.old_data.size();
    if (offset % block_size_ != 0 || len % block_size_ != 0) {
      return Status::InvalidArgument("branch store: save of [" + std::to_string(offset) + ", +" +
                                     std::to_string(len) + ") is not aligned to " + std::to_string(block_size_) +
                                     " bytes");
    }
    if (offset > volume_size_ || len > volume_size_ - offset) {
      return Status::OutOfRange("branch store: save of [" + std::to_string(offset) + ", +" + std::to_string(len) +
                                ") ends past the volume (" + std::to_string(volume_size_) + " bytes)");
    }
  }

  std::lock_guard lk(mu_);

  // Runs of blocks not saved yet, [begin, end) block indexes, each with its
  // bytes. A block named twice in one call is saved once (its first bytes).
  struct Run {
    uint64_t begin, end;
    const uint8_t* data;
  };
  std::vector<Run> runs;
  std::unordered_set<uint64_t> claimed;  // blocks taken by this call (saved_ is set after the index sync)
  for (const Piece& p : pieces) {
    const uint64_t first = p.offset / block_size_, last = (p.offset + p.old_data.size()) / block_size_;
    for (uint64_t b = first; b < last; ++b) {
      if (saved_[b] || (pieces.size() > 1 && !claimed.insert(b).second)) continue;
      const uint8_t* at = p.old_data.data() + (b - first) * block_size_;
      if (!runs.empty() && runs.back().end == b && runs.back().data + (b - runs.back().begin) * block_size_ == at) {
        ++runs.back().end;
      } else {
        runs.push_back(Run{b, b + 1, at});
      }
    }
  }
  if (runs.empty()) return Status::OK();
  if (!index_error_.ok()) return index_error_;

  // Sync point 1: the data.
  for (const Run& r : runs) {
    CDP_RETURN_IF_ERROR(img_->Write(r.begin * block_size_, ByteSpan(r.data, size_t((r.end - r.begin) * block_size_))));
  }
  CDP_RETURN_IF_ERROR(img_->Sync());

  // Sync point 2: the records naming it.
  Bytes recs;
  for (const Run& run : runs) {
    for (uint64_t r = run.begin; r < run.end;) {
      const uint32_t n = uint32_t(std::min<uint64_t>(run.end - r, std::numeric_limits<uint32_t>::max()));
      recs.resize(recs.size() + kRecordSize);
      EncodeRecord(recs.data() + recs.size() - kRecordSize, r, n);
      r += n;
    }
  }
  Status s = idx_->Append(ByteSpan(recs.data(), recs.size()));
  if (s.ok()) s = idx_->Sync();
  if (!s.ok()) {
    index_error_ = s.WithContext("branch index " + idx_path_ + " (reopen the store)");
    return index_error_;
  }
  idx_size_ += recs.size();
  for (const Run& r : runs) {
    for (uint64_t i = r.begin; i < r.end; ++i) saved_[i] = true;
    saved_count_ += r.end - r.begin;
  }
  return Status::OK();
}

bool BranchStore::Contains(uint64_t block) const {
  std::lock_guard lk(mu_);
  return block < block_count_ && saved_[block];
}

uint64_t BranchStore::saved_blocks() const {
  std::lock_guard lk(mu_);
  return saved_count_;
}

std::vector<std::pair<uint64_t, uint64_t>> BranchStore::Extents() const {
  std::lock_guard lk(mu_);
  std::vector<std::pair<uint64_t, uint64_t>> out;
  for (uint64_t b = 0; b < block_count_; ++b) {
    if (!saved_[b]) continue;
    const uint64_t off = b * block_size_;
    if (!out.empty() && out.back().first + out.back().second == off) {
      out.back().second += block_size_;
    } else {
      out.emplace_back(off, block_size_);
    }
  }
  return out;
}

Status BranchStore::ReadSaved(uint64_t offset, uint32_t len, uint8_t* buf) {
  if (offset > volume_size_ || len > volume_size_ - offset) {
    return Status::OutOfRange("branch store: read past the volume");
  }
  std::memset(buf, 0, len);
  std::lock_guard lk(mu_);
  return ReadSavedOverLocked(offset, len, buf);
}

Status BranchStore::ReadSavedOver(uint64_t offset, uint32_t len, uint8_t* buf) {
  if (offset > volume_size_ || len > volume_size_ - offset) {
    return Status::OutOfRange("branch store: read past the volume");
  }
  std::lock_guard lk(mu_);
  return ReadSavedOverLocked(offset, len, buf);
}

Status BranchStore::ReadSavedOverLocked(uint64_t offset, uint32_t len, uint8_t* buf) {
  const uint64_t end = offset + len;
  uint64_t pos = offset;
  while (pos < end) {
    // The longest stretch from `pos` whose blocks share one saved state.
    const bool saved = saved_[pos / block_size_];
    uint64_t stop = pos;
    while (stop < end && saved_[stop / block_size_] == saved) stop = (stop / block_size_ + 1) * block_size_;
    stop = std::min(stop, end);
    if (saved) CDP_RETURN_IF_ERROR(img_->Read(pos, size_t(stop - pos), buf + (pos - offset)));
    pos = stop;
  }
  return Status::OK();
}

}  // namespace cdp::agent

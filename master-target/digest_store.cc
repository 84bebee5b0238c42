// SPDX-License-Identifier: Apache-2.0
#include "master-target/digest_store.h"

#include <algorithm>
#include <cstring>

#include "common/base/coding.h"
#include "common/base/crc32c.h"
#include "common/wire/block_digest.h"

namespace cdp::mt {
namespace {

constexpr char kMagic[8] = {'C', 'D', 'P', 'D', 'G', 'S', 'T', '1'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kStateOpen = 1;
constexpr uint32_t kStateClean = 2;
constexpr size_t kHeaderBytes = 8 + 4 + 4 + 8 + 16 + 4;  // then the CRC32C of these
// Entries written or cleared per call, at most (64 KiB of file).
constexpr size_t kChunkEntries = 4096;
// An entry holds the complement of the digest, so that bytes never written
// (a hole, a fresh file) read as "unknown": all zeros.
constexpr proto::Hash128 kUnknown{~uint64_t{0}, ~uint64_t{0}};

void EncodeEntry(const proto::Hash128& h, uint8_t* p) {
  EncodeFixed64(p, ~h.low);
  EncodeFixed64(p + 8, ~h.high);
}

proto::Hash128 DecodeEntry(const uint8_t* p) { return proto::Hash128{~DecodeFixed64(p), ~DecodeFixed64(p + 8)}; }

uint64_t EntryOffset(uint64_t leaf) { return DigestStore::kHeaderSize + leaf * DigestStore::kEntrySize; }

}  // namespace

Result<std::unique_ptr<DigestStore>> DigestStore::Open(Env* env, const std::string& path,
                                                       const std::array<uint8_t, 16>& uuid, uint64_t volume_size) {
  std::unique_ptr<DigestStore> s(new DigestStore(volume_size));
  s->uuid_ = uuid;
  OpenOptions oo;
  oo.create = true;
  CDP_ASSIGN_OR_RETURN(s->file_, env->Open(path, oo));
  CDP_ASSIGN_OR_RETURN(uint64_t fsize, s->file_->Size());
  bool keep = false;
  if (fsize >= kHeaderSize) {
    uint8_t h[kHeaderBytes + 4];
    CDP_RETURN_IF_ERROR(s->file_->Read(0, sizeof(h), h));
    keep = std::memcmp(h, kMagic, 8) == 0 && DecodeFixed32(h + 8) == kVersion && DecodeFixed32(h + 12) == kLeafSize &&
           DecodeFixed64(h + 16) == volume_size && std::memcmp(h + 24, uuid.data(), 16) == 0 &&
           DecodeFixed32(h + 40) == kStateClean && DecodeFixed32(h + kHeaderBytes) == crc32c::Value(h, kHeaderBytes);
  }
  if (!keep) CDP_RETURN_IF_ERROR(s->file_->Truncate(0));
  // Open from here until Close: a crash meanwhile leaves it open, and the
  // next Open starts empty.
  CDP_RETURN_IF_ERROR(s->WriteHeader(kStateOpen));
  CDP_RETURN_IF_ERROR(s->file_->Sync());
  if (fsize == 0) CDP_RETURN_IF_ERROR(env->SyncDir(DirName(path)));  // a new file's name
  s->open_ = true;
  return s;
}

Status DigestStore::Close() {
  if (!file_) return Status::IOError("digest store disabled by an earlier error");
  if (!open_) return Status::OK();
  Status st = file_->Sync();
  if (st.ok()) st = WriteHeader(kStateClean);
  if (st.ok()) st = file_->Sync();
  if (!st.ok()) {
    Disable();
    return st;
  }
  open_ = false;
  return st;
}

Status DigestStore::WriteHeader(uint32_t state) {
  uint8_t h[kHeaderBytes + 4] = {};
  std::memcpy(h, kMagic, 8);
  EncodeFixed32(h + 8, kVersion);
  EncodeFixed32(h + 12, kLeafSize);
  EncodeFixed64(h + 16, size_);
  std::memcpy(h + 24, uuid_.data(), 16);
  EncodeFixed32(h + 40, state);
  EncodeFixed32(h + kHeaderBytes, crc32c::Value(h, kHeaderBytes));
  return file_->Write(0, ByteSpan(h, sizeof(h)));
}

void DigestStore::Disable() { file_.reset(); }

void DigestStore::Get(uint64_t first, size_t count, std::vector<proto::Hash128>* leaves, std::vector<bool>* known) {
  leaves->assign(count, kZeroDigest);
  known->assign(count, false);
  if (!file_ || first >= leaves_) return;
  count = size_t(std::min<uint64_t>(count, leaves_ - first));
  const uint64_t begin = EntryOffset(first), end = EntryOffset(first + count);
  // Leaves never written through the store are a hole in it: nothing to read.
  auto data = file_->NextData(begin);
  if (!data.ok()) return Disable();
  if (*data >= end) return;
  Bytes buf(kChunkEntries * kEntrySize);
  for (size_t i = 0; i < count;) {
    const size_t n = std::min(kChunkEntries, count - i);
    auto got = file_->ReadUpTo(EntryOffset(first + i), n * kEntrySize, buf.data());
    if (!got.ok()) return Disable();
    // Past the end of the file: never written.
    const size_t whole = *got / kEntrySize;
    for (size_t k = 0; k < whole; ++k) {
      proto::Hash128 h = DecodeEntry(buf.data() + k * kEntrySize);
      if (h == kUnknown) continue;
      (*leaves)[i + k] = h;
      (*known)[i + k] = true;
      ++hits_;
    }
    if (whole < n) break;
    i += n;
  }
}

void DigestStore::WriteEntries(uint64_t first, std::span<const proto::Hash128> leaves) {
  if (!file_ || first >= leaves_) return;
  const size_t count = size_t(std::min<uint64_t>(leaves.size(), leaves_ - first));
  Bytes buf(std::min(count, kChunkEntries) * kEntrySize);
  for (size_t i = 0; i < count;) {
    const size_t n = std::min(kChunkEntries, count - i);
    for (size_t k = 0; k < n; ++k) EncodeEntry(leaves[i + k], buf.data() + k * kEntrySize);
    if (!file_->Write(EntryOffset(first + i), ByteSpan(buf.data(), n * kEntrySize)).ok()) return Disable();
    i += n;
  }
}

void DigestStore::Put(uint64_t first, std::span<const proto::Hash128> leaves) { WriteEntries(first, leaves); }

void DigestStore::Unknown(uint64_t first, uint64_t last) {
  if (!file_) return;
  // Entries past the end of the file were never written: unknown already.
  auto fsize = file_->Size();
  if (!fsize.ok()) return Disable();
  last = std::min({last, leaves_, *fsize <= kHeaderSize ? 0 : (*fsize - kHeaderSize) / kEntrySize});
  if (first >= last) return;
  // Whole pages of entries go back to a hole; the rest are written unknown
  // (an all-zero entry). A file system that cannot punch holes gets zeros.
  uint64_t begin = EntryOffset(first), end = EntryOffset(last);
  const uint64_t page = 4096, pbegin = (begin + page - 1) / page * page, pend = end / page * page;
  if (pend > pbegin && file_->PunchHole(pbegin, pend - pbegin).ok()) {
    Unknown(first, (pbegin - kHeaderSize) / kEntrySize);
    first = (pend - kHeaderSize) / kEntrySize;
    begin = pend;
  }
  static const std::vector<proto::Hash128> unknown(kChunkEntries, kUnknown);
  for (uint64_t l = first; l < last;) {
    const size_t n = size_t(std::min<uint64_t>(kChunkEntries, last - l));
    WriteEntries(l, std::span(unknown.data(), n));
    if (!file_) return;
    l += n;
  }
}

void DigestStore::Forget(uint64_t offset, uint64_t len) {
  if (offset >= size_) return;  // past the volume: a sealed volume's MACs
  len = std::min(len, size_ - offset);
  if (len == 0) return;
  Unknown(offset / kLeafSize, (offset + len + kLeafSize - 1) / kLeafSize);
}

void DigestStore::Wrote(uint64_t offset, std::span<const uint8_t> data) {
  if (offset >= size_) return;
  data = data.first(size_t(std::min<uint64_t>(data.size(), size_ - offset)));
  if (!file_ || data.empty()) return;
  const uint64_t end = offset + data.size();
  // The leaves covered whole: from the first leaf boundary at or after offset
  // to the last one at or before end (the volume's short last leaf counts
  // as whole when the write reaches the end of the volume).
  const uint64_t first = (offset + kLeafSize - 1) / kLeafSize;
  uint64_t last = end / kLeafSize;
  if (end >= size_ && last < leaves_) last = leaves_;
  if (first >= last) return Forget(offset, data.size());
  if (offset < first * kLeafSize) Forget(offset, first * kLeafSize - offset);
  if (last * kLeafSize < end) Forget(last * kLeafSize, end - last * kLeafSize);
  std::vector<proto::Hash128> d;
  d.reserve(size_t(std::min<uint64_t>(last - first, kChunkEntries)));
  for (uint64_t l = first; l < last;) {
    const uint64_t n = std::min<uint64_t>(kChunkEntries, last - l);
    d.clear();
    for (uint64_t k = 0; k < n; ++k) {
      const uint64_t at = (l + k) * kLeafSize - offset;
      d.push_back(LeafDigest(data.data() + at, size_t(std::min<uint64_t>(kLeafSize, data.size() - at))));
    }
    WriteEntries(l, d);
    if (!file_) return;
    l += n;
  }
}

void DigestStore::Zeroed(uint64_t offset, uint64_t len) {
  if (offset >= size_) return;
  len = std::min(len, size_ - offset);
  if (!file_ || len == 0) return;
  // A long zeroed range is forgotten, not written: a hole in the replica is
  // found by one seek, and a trim of a whole volume must not write 0.4% of it.
  if (len > (1u << 20)) return Forget(offset, len);
  const uint64_t end = offset + len;
  const uint64_t first = (offset + kLeafSize - 1) / kLeafSize;
  uint64_t last = end / kLeafSize;
  if (end >= size_ && last < leaves_) last = leaves_;
  if (first >= last) return Forget(offset, len);
  if (offset < first * kLeafSize) Forget(offset, first * kLeafSize - offset);
  if (last * kLeafSize < end) Forget(last * kLeafSize, end - last * kLeafSize);
  WriteEntries(first, std::vector<proto::Hash128>(size_t(last - first), kZeroDigest));
}

}  // namespace cdp::mt

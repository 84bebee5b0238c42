// SPDX-License-Identifier: Apache-2.0
// Little-endian fixed-width encoding, field by field (leveldb util/coding.h).
// Never copy a struct onto the wire or the disk: encode each field with these.
//
// Put* append to a std::string or std::vector<uint8_t>; Encode*/Decode* work on
// raw pointers whose bounds the caller has checked. ByteReader is a bounds-checked
// cursor for decoders: every Get* returns false (and consumes nothing) when fewer
// bytes remain than it needs.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cdp {

using Bytes = std::vector<uint8_t>;
using ByteSpan = std::span<const uint8_t>;

inline void EncodeFixed16(uint8_t* p, uint16_t v) { p[0] = uint8_t(v); p[1] = uint8_t(v >> 8); }
inline void EncodeFixed32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i));
}
inline void EncodeFixed64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = uint8_t(v >> (8 * i));
}
inline uint16_t DecodeFixed16(const uint8_t* p) { return uint16_t(p[0] | (uint16_t(p[1]) << 8)); }
inline uint32_t DecodeFixed32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(p[i]) << (8 * i);
  return v;
}
inline uint64_t DecodeFixed64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

inline void PutU8(Bytes& b, uint8_t v) { b.push_back(v); }
inline void PutFixed16(Bytes& b, uint16_t v) { uint8_t t[2]; EncodeFixed16(t, v); b.insert(b.end(), t, t + 2); }
inline void PutFixed32(Bytes& b, uint32_t v) { uint8_t t[4]; EncodeFixed32(t, v); b.insert(b.end(), t, t + 4); }
inline void PutFixed64(Bytes& b, uint64_t v) { uint8_t t[8]; EncodeFixed64(t, v); b.insert(b.end(), t, t + 8); }
inline void PutBytes(Bytes& b, ByteSpan s) { b.insert(b.end(), s.begin(), s.end()); }
inline void PutBytes(Bytes& b, std::string_view s) {
  b.insert(b.end(), reinterpret_cast<const uint8_t*>(s.data()),
           reinterpret_cast<const uint8_t*>(s.data()) + s.size());
}

// True when every byte of `data` is zero (true for an empty span).
inline bool AllZero(ByteSpan data) {
  if (data.empty()) return true;
  if (data[0] != 0) return false;
  return std::memcmp(data.data(), data.data() + 1, data.size() - 1) == 0;
}

// Bounds-checked reader over a byte span. Never reads past the end.
class ByteReader {
 public:
  explicit ByteReader(ByteSpan s) : s_(s) {}
  size_t remaining() const { return s_.size() - pos_; }
  size_t position() const { return pos_; }
  bool empty() const { return remaining() == 0; }

  bool GetU8(uint8_t* v) {
    if (remaining() < 1) return false;
    *v = s_[pos_++];
    return true;
  }
  bool GetFixed16(uint16_t* v) { return Get(v, 2, DecodeFixed16); }
  bool GetFixed32(uint32_t* v) { return Get(v, 4, DecodeFixed32); }
  bool GetFixed64(uint64_t* v) { return Get(v, 8, DecodeFixed64); }
  // A view of the next n bytes (valid while the underlying buffer lives).
  bool GetSpan(size_t n, ByteSpan* out) {
    if (remaining() < n) return false;
    *out = s_.subspan(pos_, n);
    pos_ += n;
    return true;
  }
  bool Skip(size_t n) {
    if (remaining() < n) return false;
    pos_ += n;
    return true;
  }

 private:
  template <typename T, typename F>
  bool Get(T* v, size_t n, F decode) {
    if (remaining() < n) return false;
    *v = decode(s_.data() + pos_);
    pos_ += n;
    return true;
  }
  ByteSpan s_;
  size_t pos_ = 0;
};

// True when all `n` bytes at `p` are zero.
bool IsAllZero(const uint8_t* p, size_t n);

}  // namespace cdp

#include "process-server/spooled_volume.h"

#include "common/crc32c.h"

namespace cdp::ps {

Bytes EncodeVolumeMeta(const proto::VolumeOpen& open) {
  Bytes b;
  PutFixed32(b, kMetaMagic);
  PutFixed32(b, kMetaVersion);
  PutFixed32(b, uint32_t(open.name.size()));
  PutBytes(b, std::string_view(open.name));
  PutFixed64(b, open.size);
  PutFixed32(b, open.block_size);
  PutBytes(b, ByteSpan(open.uuid.data(), open.uuid.size()));
  PutFixed64(b, open.generation);
  if (open.sealed) PutU8(b, kMetaSealed);  // only when set: unsealed files are as before
  PutFixed32(b, crc32c::Value(b.data(), b.size()));
  return b;
}

Result<proto::VolumeOpen> DecodeVolumeMeta(ByteSpan data) {
  auto bad = [] { return Status::Corruption("volume.meta: bad record"); };
  if (data.size() < 4) return bad();
  if (crc32c::Value(data.data(), data.size() - 4) != DecodeFixed32(data.data() + data.size() - 4))
    return Status::Corruption("volume.meta: checksum mismatch");
  ByteReader r(data.first(data.size() - 4));
  uint32_t magic = 0, version = 0, name_len = 0;
  if (!r.GetFixed32(&magic) || magic != kMetaMagic || !r.GetFixed32(&version) || version != kMetaVersion ||
      !r.GetFixed32(&name_len) || name_len > proto::kMaxNameLength)
    return bad();
  proto::VolumeOpen o;
  ByteSpan name, uuid;
  if (!r.GetSpan(name_len, &name) || !r.GetFixed64(&o.size) || !r.GetFixed32(&o.block_size) ||
      !r.GetSpan(16, &uuid) || !r.GetFixed64(&o.generation))
    return bad();
  if (!r.empty()) {
    uint8_t flags = 0;
    if (!r.GetU8(&flags) || flags != kMetaSealed || !r.empty()) return bad();
    o.sealed = true;
  }
  o.name.assign(name.begin(), name.end());
  if (!proto::ValidName(o.name)) return bad();
  std::copy(uuid.begin(), uuid.end(), o.uuid.begin());
  return o;
}

Result<std::unique_ptr<SpooledVolume>> SpooledVolume::Open(const SpoolOptions& spool_options, const std::string& tenant,
                                             const proto::VolumeOpen* open, proto::Codec codec, int level) {
  Env* env = spool_options.env;
  std::string meta_path = JoinPath(spool_options.dir, "volume.meta");
  std::unique_ptr<SpooledVolume> v(new SpooledVolume());
  v->tenant_ = tenant;
  v->codec_ = codec;
  v->level_ = level;
  if (env->Exists(meta_path)) {
    CDP_ASSIGN_OR_RETURN(Bytes data, ReadWholeFile(env, meta_path));
    auto stored = DecodeVolumeMeta(data);
    if (!stored.ok()) return stored.status().WithContext(meta_path);
    if (open != nullptr && stored->generation != open->generation)
      return Status::InvalidArgument("wrong generation: spool has " + std::to_string(stored->generation) +
                                     ", agent sent " + std::to_string(open->generation));
    v->open_ = open != nullptr ? *open : *stored;
    if (open != nullptr && !(open->size == stored->size && open->block_size == stored->block_size &&
                             open->uuid == stored->uuid && open->sealed == stored->sealed)) {
      CDP_RETURN_IF_ERROR(env->CreateDirs(spool_options.dir));
      CDP_RETURN_IF_ERROR(WriteFileAtomic(env, meta_path, EncodeVolumeMeta(*open)));
    }
  } else {
    if (open == nullptr) return Status::NotFound("no volume.meta in " + spool_options.dir);
    v->open_ = *open;
    CDP_RETURN_IF_ERROR(env->CreateDirs(spool_options.dir));
    CDP_RETURN_IF_ERROR(WriteFileAtomic(env, meta_path, EncodeVolumeMeta(*open)));
  }
  // A sealed volume's blocks are ciphertext: compressing them costs CPU and saves nothing.
  if (v->open_.sealed) v->codec_ = proto::Codec::kNone;
  SpoolOptions so = spool_options;
  SpooledVolume* raw = v.get();
  auto user_cb = spool_options.on_corruption;
  so.on_corruption = [raw, user_cb](const Status& s) {
    raw->counters_.corruptions.fetch_add(1);
    if (user_cb) user_cb(s);
  };
  CDP_ASSIGN_OR_RETURN(v->spool_, Spool::Open(so));
  v->counters_.mt_acked.store(v->spool_->stats().released_seq);
  return v;
}

void SpooledVolume::SetStalled(std::string reason) {
  std::lock_guard<std::mutex> l(mu_);
  stalled_ = std::move(reason);
}

void SpooledVolume::SetFenced(std::string message) {
  std::lock_guard<std::mutex> l(mu_);
  fenced_ = std::move(message);
}

std::string SpooledVolume::fenced() const {
  std::lock_guard<std::mutex> l(mu_);
  return fenced_;
}

std::string SpooledVolume::stalled() const {
  std::lock_guard<std::mutex> l(mu_);
  return stalled_;
}

}  // namespace cdp::ps

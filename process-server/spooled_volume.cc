// SPDX-License-Identifier: Apache-2.0
#include "process-server/spooled_volume.h"

#include <algorithm>
#include <limits>
#include <map>
#include <utility>

#include "common/base/log.h"

namespace cdp::ps {

namespace {

// Whether copy `name` is listed in `list`'s file in `dir` (every copy when
// the file is damaged: logged).
class CopyListOnDisk {
 public:
  CopyListOnDisk(Env* env, const std::string& dir, const CopyList& list, const std::string& key) {
    const std::string path = JoinPath(dir, list.file);
    if (!env->Exists(path)) return;
    Result<Bytes> data = ReadWholeFile(env, path);
    Result<std::vector<std::string>> names = data.ok() ? DecodeCopyList(list, *data) : data.status();
    if (names.ok()) {
      names_ = std::move(*names);
      return;
    }
    all_ = true;
    log::Get("ps")->error("{} {}: taken as naming every copy", log::Where{key, "", 0},
                          names.status().WithContext(path).ToString());
  }
  bool Lists(const std::string& name) const {
    return all_ || std::find(names_.begin(), names_.end(), name) != names_.end();
  }

 private:
  std::vector<std::string> names_;
  bool all_ = false;
};

}  // namespace

Result<std::unique_ptr<SpooledVolume>> SpooledVolume::Open(const SpoolOptions& spool_options, const std::string& tenant,
                                             const proto::VolumeOpen* open, proto::Codec codec, int level,
                                             const std::vector<std::string>& copies, uint64_t cursor_sync_ms) {
  Env* env = spool_options.env;
  std::string meta_path = JoinPath(spool_options.dir, "volume.meta");
  const std::vector<std::string> names = copies.empty() ? std::vector<std::string>{""} : copies;
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
    // A new spool: no copy's MT has answered yet. Written first, so that no
    // volume.meta stands without it.
    CDP_RETURN_IF_ERROR(WriteFileAtomic(env, JoinPath(spool_options.dir, kAnchorList.file),
                                        EncodeCopyList(kAnchorList, names)));
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
  v->env_ = env;
  v->clock_ = spool_options.clock;
  v->dir_ = spool_options.dir;
  v->cursor_sync_us_ = cursor_sync_ms * 1000;
  // Nothing above the released sequence was released: every copy had
  // acknowledged it. A persisted cursor may only raise that.
  const uint64_t released = v->spool_->stats().released_seq;
  std::map<std::string, uint64_t> stored;
  const std::string copies_path = JoinPath(spool_options.dir, kCopiesFile);
  if (env->Exists(copies_path)) {
    CDP_ASSIGN_OR_RETURN(Bytes data, ReadWholeFile(env, copies_path));
    auto cur = DecodeCopiesMeta(data);
    if (!cur.ok()) return cur.status().WithContext(copies_path);
    for (const auto& [name, acked] : *cur) stored[name] = acked;
  }
  // Copies refused before a restart stay refused.
  const CopyListOnDisk beyond(env, spool_options.dir, kBeyondList, tenant + "/" + v->open_.name);
  const CopyListOnDisk unanchored(env, spool_options.dir, kAnchorList, tenant + "/" + v->open_.name);
  for (const std::string& name : names) {
    CopyState c;
    c.mt = name;
    c.acked = released;
    if (auto it = stored.find(name); it != stored.end()) c.acked = std::max(c.acked, it->second);
    c.beyond = beyond.Lists(name);
    c.unanchored = unanchored.Lists(name);
    v->copies_.push_back(std::move(c));
  }
  v->counters_.mt_acked.store(v->copies_[0].acked);
  v->persisted_us_ = v->clock_->NowMicros();
  // What every copy acknowledged before the restart is released now, not at
  // the MTs' next answer: a fenced or unreachable MT may not answer for a
  // long time, and its records would count as backlog (and widen a
  // failback's compare) meanwhile.
  if (const uint64_t low = v->ReleasableSeq(); low > released) {
    if (Status s = v->spool_->Release(low); !s.ok())
      log::Get("ps")->warn("{} spool release at open: {}", log::Where{v->key(), "", low}, s.ToString());
  }
  return v;
}

void SpooledVolume::SetCopyAcked(size_t copy, uint64_t seq) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (copy >= copies_.size() || seq <= copies_[copy].acked) return;
    copies_[copy].acked = seq;
    copies_[copy].undeliverable = false;  // it took records again
    if (copy == 0) counters_.mt_acked.store(seq);
    dirty_ = true;
  }
  AfterCursorMove();
}

bool SpooledVolume::SetCopyOpened(size_t copy, uint64_t durable) {
  bool servable = false;
  {
    // No release runs between the check and the cursor's move: one computed
    // with this copy's old (higher) cursor would pass `durable` otherwise.
    std::lock_guard<std::mutex> rl(release_mu_);
    servable = durable >= spool_->stats().released_seq;
    std::lock_guard<std::mutex> l(mu_);
    if (copy >= copies_.size()) return servable;
    copies_[copy].acked = durable;
    copies_[copy].lost = !servable;
    if (copy == 0) counters_.mt_acked.store(durable);
    dirty_ = true;
  }
  AfterCursorMove();
  return servable;
}

uint64_t SpooledVolume::ReleasableSeq() const {
  // A cursor below the released sequence cannot be served either: the spool's
  // floor jumped past it (the spool was lost and another copy's MT was ahead).
  const uint64_t released = spool_->stats().released_seq;
  uint64_t low = std::numeric_limits<uint64_t>::max();
  {
    std::lock_guard<std::mutex> l(mu_);
    for (const CopyState& c : copies_)
      if (!c.lost && c.acked >= released) low = std::min(low, c.acked);
  }
  return low == std::numeric_limits<uint64_t>::max() ? released : low;
}

bool SpooledVolume::NothingToDeliver() const {
  const uint64_t durable = spool_->durable_seq();
  std::lock_guard<std::mutex> l(mu_);
  for (const CopyState& c : copies_)
    if (!c.lost && !c.undeliverable && c.acked < durable) return false;
  return true;
}

std::vector<CopyState> SpooledVolume::CopyStates() const {
  std::lock_guard<std::mutex> l(mu_);
  return copies_;
}

void SpooledVolume::AfterCursorMove() {
  uint64_t release = 0;
  {
    std::lock_guard<std::mutex> rl(release_mu_);
    release = ReleasableSeq();
    if (Status s = spool_->Release(release); !s.ok())
      log::Get("ps.link")->warn("{} spool release: {}", log::Where{key(), "", release}, s.ToString());
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    const uint64_t now = clock_->NowMicros();
    if (!dirty_ || now - persisted_us_ < cursor_sync_us_) return;
    persisted_us_ = now;  // claimed: other threads do not write it too
  }
  if (Status s = PersistCursors(); !s.ok())
    log::Get("ps.link")->warn("{} copy cursors not persisted: {}", log::Where{key(), "", release}, s.ToString());
}

Status SpooledVolume::PersistCursorsIfMoved() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!dirty_) return Status::OK();
  }
  return PersistCursors();
}

Status SpooledVolume::PersistCursors() {
  std::lock_guard<std::mutex> pl(persist_mu_);
  if (closed_) return Status::OK();
  std::vector<std::pair<std::string, uint64_t>> cur;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (const CopyState& c : copies_) cur.emplace_back(c.mt, c.acked);
    dirty_ = false;
    persisted_us_ = clock_->NowMicros();
  }
  Status s = WriteFileAtomic(env_, JoinPath(dir_, kCopiesFile), EncodeCopiesMeta(cur));
  if (!s.ok()) {
    std::lock_guard<std::mutex> l(mu_);
    dirty_ = true;
  }
  return s;
}

void SpooledVolume::Close() {
  if (Status s = PersistCursors(); !s.ok())
    log::Get("ps")->warn("{} copy cursors not persisted at close: {}", log::Where{key(), "", 0}, s.ToString());
  {
    std::lock_guard<std::mutex> pl(persist_mu_);
    closed_ = true;
  }
  spool_->Close();
}

void SpooledVolume::SetStalled(size_t copy, std::string reason, bool undeliverable) {
  std::lock_guard<std::mutex> l(mu_);
  if (copy >= copies_.size()) return;
  // Undeliverable until the copy acknowledges more: a reconnect clears the
  // stall until the link reads the bad record again.
  if (!reason.empty() && undeliverable) copies_[copy].undeliverable = true;
  copies_[copy].stalled = std::move(reason);
}

Status SpooledVolume::SetBeyond(size_t copy) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (copy >= copies_.size() || copies_[copy].beyond) return Status::OK();
    copies_[copy].beyond = true;
  }
  return PersistCopyList(kBeyondList, &CopyState::beyond);
}

bool SpooledVolume::beyond(size_t copy) const {
  std::lock_guard<std::mutex> l(mu_);
  return copy < copies_.size() && copies_[copy].beyond;
}

Status SpooledVolume::ClearBeyond() {
  {
    std::lock_guard<std::mutex> l(mu_);
    bool any = false;
    for (CopyState& c : copies_) any = std::exchange(c.beyond, false) || any;
    if (!any) return Status::OK();
  }
  return PersistCopyList(kBeyondList, &CopyState::beyond);
}

bool SpooledVolume::unanchored(size_t copy) const {
  std::lock_guard<std::mutex> l(mu_);
  return copy < copies_.size() && copies_[copy].unanchored;
}

Status SpooledVolume::SetAnchored(size_t copy) {
  // Cleared in memory only once the file no longer names the copy: a restart
  // must not find it unanchored after its MT's answer was acted upon.
  std::lock_guard<std::mutex> pl(persist_mu_);
  std::vector<std::string> names;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (copy >= copies_.size() || !copies_[copy].unanchored) return Status::OK();
    for (size_t i = 0; i < copies_.size(); ++i)
      if (i != copy && copies_[i].unanchored) names.push_back(copies_[i].mt);
  }
  if (!closed_) CDP_RETURN_IF_ERROR(WriteCopyList(kAnchorList, names));
  std::lock_guard<std::mutex> l(mu_);
  copies_[copy].unanchored = false;
  return Status::OK();
}

Status SpooledVolume::PersistCopyList(const CopyList& list, bool CopyState::*member) {
  std::lock_guard<std::mutex> pl(persist_mu_);
  if (closed_) return Status::OK();
  std::vector<std::string> names;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (const CopyState& c : copies_)
      if (c.*member) names.push_back(c.mt);
  }
  return WriteCopyList(list, names);
}

Status SpooledVolume::WriteCopyList(const CopyList& list, const std::vector<std::string>& names) {
  const std::string path = JoinPath(dir_, list.file);
  if (!names.empty()) return WriteFileAtomic(env_, path, EncodeCopyList(list, names));
  if (!env_->Exists(path)) return Status::OK();
  CDP_RETURN_IF_ERROR(env_->Remove(path));
  return env_->SyncDir(dir_);
}

void SpooledVolume::SetFenced(size_t copy, std::string message) {
  std::lock_guard<std::mutex> l(mu_);
  if (copy < copies_.size()) copies_[copy].fenced = std::move(message);
}

std::string SpooledVolume::fenced() const {
  std::lock_guard<std::mutex> l(mu_);
  for (const CopyState& c : copies_)
    if (!c.fenced.empty()) return c.fenced;
  return "";
}

std::string SpooledVolume::stalled() const {
  std::lock_guard<std::mutex> l(mu_);
  if (copies_.size() == 1) return copies_[0].stalled;
  std::string out;
  for (const CopyState& c : copies_) {
    if (c.stalled.empty()) continue;
    if (!out.empty()) out += "; ";
    out += "mt " + c.mt + ": " + c.stalled;
  }
  return out;
}

}  // namespace cdp::ps

// The process server's shared state (ProcessServer::Impl), internal to
// process-server/: the open volumes (spool + counters) by tenant, the MT links
// per tenant, the agent listener, the HTTP server and the computed metric
// series. Its members are defined across server.cc (the core: volumes, links,
// spools, metrics, lifecycle) and agent_session.cc (one agent connection,
// agent_session.h); control_api.cc reads it for the routes.
//
// Thread safety: `volumes`, `links` and `series` are guarded by mu (links and
// series are filled in Start() before any connection runs); a SpooledVolume's
// counters are atomics and its spool is thread-safe.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/channel.h"
#include "common/http_server.h"
#include "common/listener.h"
#include "common/tls_stream.h"
#include "common/log.h"
#include "common/metrics.h"
#include "process-server/mt_link.h"
#include "process-server/process_server.h"
#include "process-server/spooled_volume.h"

namespace cdp::ps {

struct ProcessServer::Impl {
  ProcessServer* self = nullptr;
  ProcessServerOptions* opt = nullptr;
  std::shared_ptr<spdlog::logger> log = log::Get("ps");

  std::mutex mu;
  std::map<std::string, std::unique_ptr<SpooledVolume>> volumes;           // "tenant/volume"
  std::map<std::string, std::vector<std::unique_ptr<MtLink>>> links;  // tenant -> links
  std::vector<std::pair<std::string, metrics::Labels>> series;       // registered computed metrics

  std::unique_ptr<TlsCredentials> tls;  // null with tls = off; outlives links and listener
  std::unique_ptr<Listener> listener;  // agents, one thread each

  std::atomic<bool> stopping{false};

  std::shared_ptr<ControlTokens> control_tokens;  // null with control_auth off
  std::unique_ptr<http::Server> http;

  MtLink* LinkFor(const std::string& tenant, const std::string& volume);

  std::pair<proto::Codec, int> CodecFor(const std::string& key);

  SpoolOptions SpoolOpts(const std::string& tenant, const std::string& volume);

  void RegisterMetrics(SpooledVolume* v);

  // Opens or finds the volume; ok also for a reopen by the agent.
  Result<SpooledVolume*> GetVolume(const std::string& tenant, const proto::VolumeOpen* open, const std::string& name);

  template <typename M>
  static Status Reply(FrameChannel& ch, int replies, const M& msg) {
    for (int i = 0; i < replies; ++i) CDP_RETURN_IF_ERROR(ch.Send(msg));
    return Status::OK();
  }

  // Answers to hash requests forwarded without waiting (agent_session.cc):
  // sent on `ch` until the connection's Serve() ends and clears it.
  struct HashReplies {
    std::mutex mu;
    FrameChannel* ch = nullptr;
    int outstanding = 0;
  };
  static constexpr int kMaxHashesInFlight = 256;  // per agent connection

  // One agent connection, start to end.
  void Serve(FrameChannel& ch);

  // Handles one message; a WriteBatch that holds `replies` coalesced agent
  // batches is answered `replies` times (each reply is cumulative). A volume
  // whose open or batch is refused as fenced goes into *fenced_here.
  Status Handle(FrameChannel& ch, const std::string& tenant, std::map<uint32_t, SpooledVolume*>& handles,
                uint32_t& next_id, const std::shared_ptr<HashReplies>& hash_replies, proto::Message& m,
                int replies, std::set<SpooledVolume*>* fenced_here);
};

}  // namespace cdp::ps

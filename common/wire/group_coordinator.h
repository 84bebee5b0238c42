// SPDX-License-Identifier: Apache-2.0
// GroupCoordinator: consistency groups across agents (docs/groups.md). It
// runs where the group is configured: at the process server for members that
// all ship through it, or at the master target for members behind several
// process servers of one tenant. A group is a named set of members of one
// tenant, each an (agent, volume) pair. Every `interval_ms` the coordinator
// runs one round:
//
//   t0 -> GroupHold{round, hold_timeout_ms, the member volumes it reaches}
//         to each session it routes the members to (below)
//   wait for every GroupHeld, at most hold_max_ms after t0
//   made   = every session answered kHeld, the last by t_last < t0 + hold_max_ms
//   -> GroupRelease{round, made ? marker : ""} to every session asked
//
// Routing. At the process server (route_by_volume off) a session is an
// agent's, attached under its client_id (its Hello), and a member goes to
// the newest session of its agent. At the master target (route_by_volume on)
// a session is a process server's (or a direct agent's), attached under its
// client_id, and a member goes to the newest session of the peer that last
// opened the member's volume (Opened): the master target knows which peer
// ships each of the tenant's volumes, not which agent is behind it. The
// process server relays such a round (Relay): it forwards the hold of each
// volume to the agent whose session opened that volume last, answers the
// master target once for all of them (kHeld when every agent held, else the
// first refusal; nothing when one does not answer: the round lapses at the
// master target), and forwards the release. Rounds coordinated upstream
// carry kUpstreamRound, so that they never share a number with the process
// server's own rounds at an agent.
//
// The agents queue the marker, a kTag record named
//   group.<name>.<round>.<members>
// at the held place of each member volume; the master target lists a group
// point once it holds the marker in all <members> volumes (a lapsed hold
// leaves one out, and the point is never listed). hold_max_ms must stay
// below hold_timeout_ms (the agents' own release) by a margin for the clocks'
// rates: only durations on one clock are compared, never two clocks. At the
// master target the hold spans the round trip to the process servers: a
// WAN of more than hold_max_ms (50 ms) needs a larger hold_max_ms, and then
// a larger hold_timeout_ms.
// A round with a member not reachable, or one that refuses, is abandoned:
// nothing is marked, every session asked is released at once. No partial
// points.
//
// An application-consistent point (RunRound with a tag, `cdpctl tag
// --group`) first asks every member agent to freeze (its freeze hook), then
// holds and marks as above while all are frozen; see RunRound.
//
// Groups are kept in the file `path` (docs/formats/groups.md), written
// atomically on every change and read at start.
//
// Thread safety: every method is thread-safe. Owns the scheduling thread and
// the thread that sends the relay's answers upstream.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <boost/json/value.hpp>

#include "common/base/group_marker.h"
#include "common/base/result.h"
#include "common/daemon/metrics.h"
#include "common/http/http_server.h"
#include "common/env/env.h"
#include "common/wire/protocol.h"

namespace cdp {

struct GroupMember {
  std::string agent;   // the agent's client_id
  std::string volume;
  bool operator==(const GroupMember&) const = default;
};

struct GroupSpec {
  std::string tenant;
  std::string name;                  // ValidName
  std::vector<GroupMember> members;  // 1..kMaxGroupMembers, distinct
  uint64_t interval_ms = 10'000;     // a round every interval (>= 100)
  uint64_t hold_max_ms = 50;         // a round not held by all members within this is abandoned
  uint64_t hold_timeout_ms = 200;    // the agents release by themselves after this (> hold_max_ms + margin)
};

inline constexpr size_t kMaxGroupMembers = 64;
// The bit of a round coordinated upstream (the master target) and relayed by
// the process server: the process server's own rounds never carry it.
inline constexpr uint64_t kUpstreamRound = uint64_t(1) << 63;
// Upstream rounds a process server relays at once (each forgotten at its
// release, or 2 * proto::kMaxGroupHoldMs after its hold); a hold beyond is
// refused.
inline constexpr size_t kMaxRelayedRounds = 64;
// hold_timeout_ms - hold_max_ms, at least: the clocks' rates may differ.
inline constexpr uint64_t kGroupHoldMarginMs = 20;

// "host:volume" -> a member.
Result<GroupMember> ParseMember(const std::string& s);
// Every rule of GroupSpec; the message names the field.
Status ValidateGroup(const GroupSpec& g);

struct RoundOutcome {
  uint64_t round = 0;
  bool made = false;
  std::string marker;      // made: the marker queued at every member
  std::string why;         // abandoned: the reason
  uint64_t hold_us = 0;    // t_last - t0 (made), or how long the round waited
};

class GroupCoordinator {
 public:
  struct Options {
    Env* env = nullptr;
    std::string path;                        // groups.json
    metrics::Registry* registry = nullptr;   // may be null
    std::string metric_prefix = "cdp_ps";    // <prefix>_group_round_seconds
    std::string log_name = "ps";
    // The master target's: members routed by the peer that opened their
    // volume (Opened), rounds numbered with kUpstreamRound.
    bool route_by_volume = false;
  };
  using Push = std::function<void(proto::Message)>;

  explicit GroupCoordinator(Options o);
  ~GroupCoordinator();  // Stop()s
  GroupCoordinator(const GroupCoordinator&) = delete;
  GroupCoordinator& operator=(const GroupCoordinator&) = delete;

  // Reads the groups file (missing: none) and starts the schedule.
  Status Start();
  void Stop();

  // A session of `tenant` from `peer` (its client_id: an agent's at the
  // process server; a process server's or a direct agent's at the master
  // target): `push` sends it a message. Returns the handle for Detach. The
  // newest session of a peer carries its rounds.
  uint64_t Attach(const std::string& tenant, const std::string& peer, Push push);
  void Detach(uint64_t handle);
  // A GroupHeld from that session (its session thread: does not block).
  // The answer to a relayed hold (kUpstreamRound) goes to the relay.
  void Answered(uint64_t handle, const proto::GroupHeld& held);
  // `peer` (a session's client_id) opened `volume` of `tenant`: the newest
  // opener is where the volume's holds go (route_by_volume, and Relay).
  void Opened(const std::string& tenant, const std::string& volume, const std::string& peer);

  // A GroupHold or GroupRelease of an upstream round (kUpstreamRound; the
  // master target's, on the tenant's link), relayed to the agents (see the
  // top of this file). `answer` sends the one GroupHeld upstream; it is
  // called on this object's relay thread and may block. Anything else, or a
  // round without kUpstreamRound, is ignored. Does not block.
  void Relay(const std::string& tenant, const proto::Message& m, Push answer);

  // Creates or replaces a group (persisted before it returns).
  Status Put(GroupSpec g);
  // kNotFound when there is no such group.
  Status Remove(const std::string& tenant, const std::string& name);
  // Runs one round of the group now, outside its schedule. With a `tag`
  // (ValidGroupTag) the point is application-consistent: every member agent
  // is first asked to freeze (GroupHold{freeze}, its freeze hook) within
  // `freeze_ms`, then held as in any round, and the marker is
  //   group.<name>.<round>.<members>.tag.<tag>
  // A member that cannot freeze abandons the round; every agent asked is
  // released (and thaws) either way. kNotFound, kInvalidArgument (the tag,
  // or freeze_ms outside hold_max_ms + margin + 100 .. kMaxGroupHoldMs).
  Result<RoundOutcome> RunRound(const std::string& tenant, const std::string& name, const std::string& tag = "",
                                uint64_t freeze_ms = proto::kMaxGroupHoldMs);
  // Every group `caller` sees, with its counters and last round (the PS's
  // /v1/groups body; "coordinated" in the MT's).
  boost::json::value Json(const http::Caller& caller) const;

 private:
  struct Group {
    GroupSpec spec;
    std::chrono::steady_clock::time_point next;  // its next round
    uint64_t made = 0, abandoned = 0;
    std::optional<RoundOutcome> last, last_made;
    uint64_t last_made_wall_us = 0;
  };
  struct Agent {
    std::string tenant, agent;
    Push push;
  };
  struct Round {
    uint64_t id = 0;
    std::chrono::steady_clock::time_point t0;  // of the current question
    std::map<uint64_t, std::string> asked;  // session handle -> agent
    std::map<std::string, proto::GroupHeld> answers;  // by agent
    std::chrono::steady_clock::time_point t_last;
  };

  using Clock = std::chrono::steady_clock;
  using Sessions = std::map<std::string, std::pair<uint64_t, Push>>;  // agent -> its newest session
  using ByAgent = std::map<std::string, std::vector<std::string>>;    // agent -> its member volumes
  RoundOutcome Run(const GroupSpec& g, const std::string& tag, uint64_t freeze_ms);  // serialised by round_mu_
  // Sends every agent the hold (or freeze) of `round` and waits for all
  // answers until `deadline`; "" when all held, else why not.
  std::string Ask(const Sessions& sessions, const ByAgent& by_agent, uint64_t round,
                  uint32_t timeout_ms, bool freeze, Clock::time_point deadline, Clock::time_point* t_last);
  Status SaveLocked();                   // mu_ held
  void Schedule();
  // Where member `m` of a group of `tenant` is asked: its agent, or with
  // route_by_volume the peer that opened its volume last ("" if none). mu_ held.
  std::string RouteLocked(const std::string& tenant, const GroupMember& m) const;
  // A round relayed for upstream (kUpstreamRound): the agents asked and
  // their answers; answered once, when all held or one refused.
  struct Relayed {
    std::string tenant;
    Push answer;
    std::map<uint64_t, std::string> asked;  // session handle -> agent
    size_t held = 0;
    bool answered = false;
    Clock::time_point expires;  // forgotten after this without a release
  };
  void RelayLocked(const std::string& tenant, const proto::Message& m, Push answer,
                   std::vector<std::pair<Push, proto::Message>>* out);  // mu_ held
  void AnswerUpstreamLocked(Relayed& r, proto::GroupHeld held);  // mu_ held
  void SendAnswers();            // the relay thread

  const Options o_;
  mutable std::mutex mu_;
  std::condition_variable cv_;        // groups changed, stopping, or an answer came
  std::map<std::string, Group> groups_;  // by "tenant/name"
  std::map<uint64_t, Agent> agents_;     // by session handle
  uint64_t next_handle_ = 1;
  uint64_t last_round_ = 0;
  std::optional<Round> round_;           // the round under way
  std::map<std::string, std::string> openers_;  // "tenant/volume" -> the peer that opened it last
  std::map<uint64_t, Relayed> relayed_;  // by round
  std::deque<std::pair<Push, proto::Message>> upstream_;  // answers for the relay thread
  std::condition_variable upstream_cv_;
  std::thread relay_thread_;
  bool stop_ = false;
  std::mutex round_mu_;                  // one round at a time
  std::thread scheduler_;
  std::shared_ptr<metrics::Histogram> round_seconds_;
  std::shared_ptr<metrics::Counter> made_, abandoned_;  // <prefix>_group_points_made_total, _rounds_abandoned_total
};

}  // namespace cdp

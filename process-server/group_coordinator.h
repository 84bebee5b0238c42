// SPDX-License-Identifier: Apache-2.0
// GroupCoordinator: consistency groups across agents, coordinated at the
// process server their members ship through (docs/groups.md). A group is a
// named set of members of one tenant, each an (agent, volume) pair: the
// agent's client_id (its Hello) and one of its volumes. Every
// `interval_ms` the coordinator runs one round:
//
//   t0 -> GroupHold{round, hold_timeout_ms, the agent's member volumes} to
//         each member agent, on its newest session
//   wait for every GroupHeld, at most hold_max_ms after t0
//   made   = every agent answered kHeld, the last by t_last < t0 + hold_max_ms
//   -> GroupRelease{round, made ? marker : ""} to every agent asked
//
// The agents queue the marker, a kTag record named
//   group.<name>.<round>.<members>
// at the held place of each member volume; the master target lists a group
// point once it holds the marker in all <members> volumes (a lapsed hold
// leaves one out, and the point is never listed). hold_max_ms must stay
// below hold_timeout_ms (the agents' own release) by a margin for the clocks'
// rates: only durations on one clock are compared, never two clocks.
// A round with a member agent not connected, or one that refuses, is
// abandoned: nothing is marked, every agent asked is released at once. No
// partial points.
//
// An application-consistent point (RunRound with a tag, `cdpctl tag
// --group`) first asks every member agent to freeze (its freeze hook), then
// holds and marks as above while all are frozen; see RunRound.
//
// Groups are kept in <spool_dir>/groups.json (docs/formats/groups.md),
// written atomically on every change and read at start.
//
// Thread safety: every method is thread-safe. Owns the scheduling thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
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
#include "common/env/env.h"
#include "common/wire/protocol.h"

namespace cdp::ps {

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
  };
  using Push = std::function<void(proto::Message)>;

  explicit GroupCoordinator(Options o);
  ~GroupCoordinator();  // Stop()s
  GroupCoordinator(const GroupCoordinator&) = delete;
  GroupCoordinator& operator=(const GroupCoordinator&) = delete;

  // Reads the groups file (missing: none) and starts the schedule.
  Status Start();
  void Stop();

  // An agent session of `tenant` from `agent` (its client_id): `push` sends
  // it a message. Returns the handle for Detach. The newest session of an
  // agent carries its rounds.
  uint64_t Attach(const std::string& tenant, const std::string& agent, Push push);
  void Detach(uint64_t handle);
  // A GroupHeld from that session (its session thread: does not block).
  void Answered(uint64_t handle, const proto::GroupHeld& held);

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
  // Every group with its counters and last round (the /v1/groups body).
  boost::json::value Json() const;

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

  const Options o_;
  mutable std::mutex mu_;
  std::condition_variable cv_;        // groups changed, stopping, or an answer came
  std::map<std::string, Group> groups_;  // by "tenant/name"
  std::map<uint64_t, Agent> agents_;     // by session handle
  uint64_t next_handle_ = 1;
  uint64_t last_round_ = 0;
  std::optional<Round> round_;           // the round under way
  bool stop_ = false;
  std::mutex round_mu_;                  // one round at a time
  std::thread scheduler_;
  std::shared_ptr<metrics::Histogram> round_seconds_;
};

}  // namespace cdp::ps

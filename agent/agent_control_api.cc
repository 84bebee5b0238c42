// SPDX-License-Identifier: Apache-2.0
// The agent's control API (docs/operations.md, "Control API"): tag, the
// source's region digests for online verify, repair, the volume list, and
// failback's routes (agent_failback.cc). Registered by Agent::Start on the
// control server; each route answers from the agent's public operations.
#include <algorithm>
#include <boost/json.hpp>

#include "agent/agent.h"
#include "common/wire/block_digest.h"
#include "common/wire/hash.h"

namespace cdp::agent {

namespace json = boost::json;

void Agent::RegisterControlRoutes() {
  http_->Route("POST", "/v1/tag", [this](const http::Request& r) {
    auto p = http::Params::Of(r, {"name"});
    if (!p.ok()) return http::ErrorResponse(p.status());
    auto given = p->String("name");
    if (!given.ok()) return http::ErrorResponse(given.status());
    if (!*given) return http::Response::Error(400, "body must be {\"name\": \"TAG\"}");
    const std::string name = **given;
    auto t = Tag(name);
    if (!t.ok()) {
      int code = t.status().code() == Code::kInvalidArgument ? 400
                 : t.status().code() == Code::kBusy        ? 409
                                                           : 500;
      return http::Response::Error(code, t.status().ToString());
    }
    json::object out;
    out["tag"] = name;
    json::object seqs;
    for (auto& [vol, seq] : t->seqs) seqs[vol] = seq;
    out["seqs"] = std::move(seqs);
    return http::Response::Json(200, out);
  });
  http_->Route("GET", "/v1/hashes", [this](const http::Request& r) { return HashesRoute(r); });
  http_->Route("POST", "/v1/repair", [this](const http::Request& r) { return RepairRoute(r); });
  http_->Route("GET", "/v1/volumes", [this](const http::Request&) {
    return http::Response::Json(200, StatusJson().at("volumes"));
  });
  RegisterFailbackRoutes();
}

// Online verify: the source's region digests, each with the sequence it
// describes, so that `cdpctl verify` compares them with the replica's image at
// that sequence. Regions are hashed in windows of at least one dirty-bitmap
// region (the granularity at which writes are tracked), so 4 KiB leaves of one
// region share one window and one sequence.
http::Response Agent::HashesRoute(const http::Request& r) {
  auto p = http::Params::Of(r, {"volume", "region_size", "first", "count", "max_retries"});
  if (!p.ok()) return http::ErrorResponse(p.status());
  auto vol = p->String("volume");
  auto region_p = p->Uint("region_size");
  auto first_p = p->Uint("first");
  auto count_p = p->Uint("count");
  auto retries_p = p->Uint("max_retries");
  for (const Status& s : {vol.status(), region_p.status(), first_p.status(), count_p.status(), retries_p.status()}) {
    if (!s.ok()) return http::ErrorResponse(s);
  }
  CaptureDevice* dev = *vol ? FindDevice(**vol) : nullptr;
  if (!dev) return http::Response::Error(404, "no volume " + vol->value_or(""));
  const uint64_t region = region_p->value_or(1u << 20);
  if (!ValidUnitSize(region)) return http::Response::Error(400, "region_size must be a power of two in 4096..1GiB");
  const uint64_t regions = (dev->size() + region - 1) / region;
  const uint64_t first = first_p->value_or(0);
  if (first >= regions) return http::Response::Error(400, "first is past the end of the volume");
  uint64_t count = std::min<uint64_t>(count_p->value_or(regions - first), proto::kMaxHashes);
  count = std::min(count, regions - first);
  if (count == 0) return http::Response::Error(400, "count must be at least 1");
  const uint64_t retries = retries_p->value_or(20);
  if (retries > 1000) return http::Response::Error(400, "max_retries must be 0..1000");
  const uint64_t window = std::max<uint64_t>(region, dev->bitmap().region_size());
  const uint64_t per_window = window / region;
  json::array out;
  uint64_t busy = 0;
  for (uint64_t i = first; i < first + count;) {
    const uint64_t n = std::min(first + count - i, per_window - i % per_window);
    auto d = dev->DigestAtQuietPoint(i * region, n * region, uint32_t(region), uint32_t(retries + 1), nullptr);
    if (!d.ok()) return http::Response::Error(500, d.status().ToString());
    for (uint64_t k = 0; k < n; ++k) {
      if (d->busy) {
        out.push_back(json::object{{"busy", true}, {"why", d->why}});
        ++busy;
      } else {
        out.push_back(json::object{{"seq", d->seq}, {"numbering", d->numbering}, {"hash", HashToHex(d->digests.at(k))}});
      }
    }
    i += n;
  }
  return http::Response::Json(200, json::object{{"volume", dev->volume()},
                                                {"size", dev->size()},
                                                {"region_size", region},
                                                {"first", first},
                                                {"seq", dev->queue().next_seq() - 1},
                                                {"instance", instance_},
                                                {"numbering", dev->queue().numbering()},
                                                {"busy", busy},
                                                {"regions", std::move(out)}});
}

http::Response Agent::RepairRoute(const http::Request& r) {
  auto p = http::Params::Of(r, {"volume", "offset", "length"});
  if (!p.ok()) return http::ErrorResponse(p.status());
  auto vol = p->String("volume");
  auto off = p->Uint("offset");
  auto len = p->Uint("length");
  for (const Status& s : {vol.status(), off.status(), len.status()}) {
    if (!s.ok()) return http::ErrorResponse(s);
  }
  if (!*vol || !*off || !*len) {
    return http::Response::Error(400, "body must be {\"volume\": V, \"offset\": BYTES, \"length\": BYTES}");
  }
  auto res = Repair(**vol, **off, **len);
  if (!res.ok()) return http::ErrorResponse(res.status());
  json::array seqs;
  for (uint64_t s : res->seqs) seqs.push_back(s);
  return http::Response::Json(200, json::object{{"volume", **vol}, {"seqs", std::move(seqs)}, {"bytes", res->bytes}});
}

}  // namespace cdp::agent

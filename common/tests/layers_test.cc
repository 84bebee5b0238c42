// SPDX-License-Identifier: Apache-2.0
// The layers of common/ hold at link time and at include time, and
// docs/architecture.md shows the graph CMake builds.
//
//   cmake --graphviz (a scratch configure of this tree)  -> the link graph
//   kLayers (below)                                        -> what may link / include what
//   CheckLinks, CheckIncludes                              -> every violation, by name
//   RenderLayers(graph)                                    -> the block in docs/architecture.md
//
// kLayers is the one statement of the layering; common/CMakeLists.txt and
// each folder's README say the same in words.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/env/subprocess.h"
#include "common/tests/test_util.h"

namespace fs = std::filesystem;

namespace {

struct Layer {
  std::string folder;                // common/<folder>
  std::vector<std::string> targets;  // the CMake libraries built from it
  std::vector<std::string> below;    // folders it may link and include
  std::vector<std::string> system;   // imported libraries it may link
};

// Bottom to top. A folder may use the folders it names, and what they use.
const std::vector<Layer> kLayers = {
    {"base", {"cdp_base", "cdp_version"}, {}, {"Boost::headers", "spdlog::spdlog", "fmt::fmt", "Threads::Threads"}},
    {"env", {"cdp_env"}, {"base"}, {}},
    {"daemon", {"cdp_daemon"}, {"env"}, {"Boost::program_options", "Boost::json"}},
    {"crypto", {"cdp_crypto"}, {"env"}, {"OpenSSL::Crypto"}},
    {"store", {"cdp_segment_log", "cdp_sqlite"}, {"env"}, {"PkgConfig::SQLITE3"}},
    {"net", {"cdp_net"}, {"daemon", "crypto"}, {"OpenSSL::SSL"}},
    {"http", {"cdp_http"}, {"net", "crypto"}, {"Boost::json"}},
    {"wire", {"cdp_wire"}, {"net", "crypto", "http"}, {"PkgConfig::ZSTD", "PkgConfig::LZ4", "PkgConfig::XXHASH"}},
    {"nbd", {"cdp_nbd_proto", "cdp_nbd_client", "cdp_nbd"}, {"net", "env", "crypto"}, {}},
};

// What a binary's library must never reach, directly or through a layer.
struct Ban {
  std::string from;
  std::string what;
  std::string why;
};
const std::vector<Ban> kBans = {
    {"cdpctl", "PkgConfig::ZSTD", "cdpctl speaks HTTP, not the wire"},
    {"cdpctl", "PkgConfig::LZ4", "cdpctl speaks HTTP, not the wire"},
    {"cdpctl", "PkgConfig::XXHASH", "cdpctl speaks HTTP, not the wire"},
    {"cdpctl", "PkgConfig::SQLITE3", "cdpctl keeps no index"},
    {"cdpctl", "cdp_wire", "cdpctl speaks HTTP, not the wire"},
    {"cdp-loadgen", "cdp_nbd", "loadgen is an NBD client: it needs the protocol, not the server"},
};

struct Graph {
  std::map<std::string, std::vector<std::string>> edges;  // target -> what it links, in CMake's order
  std::set<std::string> nodes;
};

// Reads `cmake --graphviz` output: nodes `"nodeN" [ label = "name", ... ]` and
// edges `"nodeA" -> "nodeB" ...`. The legend's nodes (legendNodeN, unquoted)
// match neither.
Graph ParseDot(const std::string& dot) {
  Graph g;
  std::map<std::string, std::string> label;
  const std::regex node_re(R"re("(node\d+)" \[ label = "([^"]*)")re");
  const std::regex edge_re(R"re("(node\d+)" -> "(node\d+)")re");
  std::istringstream in(dot);
  std::string line;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, edge_re)) {
      g.edges[label[m[1]]].push_back(label[m[2]]);
    } else if (std::regex_search(line, m, node_re)) {
      label[m[1]] = m[2];
      g.nodes.insert(m[2]);
    }
  }
  return g;
}

const Layer* LayerOfTarget(const std::string& target) {
  for (const auto& l : kLayers)
    if (std::find(l.targets.begin(), l.targets.end(), target) != l.targets.end()) return &l;
  return nullptr;
}

const Layer* LayerOfFolder(const std::string& folder) {
  for (const auto& l : kLayers)
    if (l.folder == folder) return &l;
  return nullptr;
}

// The folders `folder` may use: itself and everything below it, transitively.
std::set<std::string> Reach(const std::string& folder) {
  std::set<std::string> out{folder};
  std::vector<std::string> todo{folder};
  while (!todo.empty()) {
    const Layer* l = LayerOfFolder(todo.back());
    todo.pop_back();
    if (l == nullptr) continue;
    for (const auto& b : l->below)
      if (out.insert(b).second) todo.push_back(b);
  }
  return out;
}

std::set<std::string> Closure(const Graph& g, const std::string& from) {
  std::set<std::string> out;
  std::vector<std::string> todo{from};
  while (!todo.empty()) {
    const std::string t = todo.back();
    todo.pop_back();
    auto it = g.edges.find(t);
    if (it == g.edges.end()) continue;
    for (const auto& n : it->second)
      if (out.insert(n).second) todo.push_back(n);
  }
  return out;
}

bool IsFile(const std::string& name) { return !name.empty() && name[0] == '/'; }  // a library by path

// Every link that breaks kLayers or kBans, one line each.
std::vector<std::string> CheckLinks(const Graph& g) {
  std::vector<std::string> bad;
  for (const auto& l : kLayers) {
    for (const auto& t : l.targets) {
      if (g.nodes.count(t) == 0) bad.push_back(t + ": no such CMake target (common/" + l.folder + ")");
      auto it = g.edges.find(t);
      if (it == g.edges.end()) continue;
      const std::set<std::string> reach = Reach(l.folder);
      for (const auto& dep : it->second) {
        if (IsFile(dep)) continue;  // an imported target's file, reached through it
        const Layer* dl = LayerOfTarget(dep);
        if (dl != nullptr) {
          if (reach.count(dl->folder) == 0) bad.push_back(t + " -> " + dep + ": common/" + l.folder + " may not use common/" + dl->folder);
        } else if (std::find(l.system.begin(), l.system.end(), dep) == l.system.end()) {
          bad.push_back(t + " -> " + dep + ": not a library common/" + l.folder + " may link");
        }
      }
    }
  }
  for (const auto& b : kBans) {
    if (g.nodes.count(b.from) == 0) {
      bad.push_back(b.from + ": no such CMake target");
      continue;
    }
    if (Closure(g, b.from).count(b.what) != 0) bad.push_back(b.from + " reaches " + b.what + ": " + b.why);
  }
  return bad;
}

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every `#include "common/<folder>/..."` in common/ that reaches past its
// layer, in cdpctl/ that names the wire, a store or NBD, and in loadgen/
// that names the NBD server.
std::vector<std::string> CheckIncludes(const fs::path& root) {
  std::vector<std::string> bad;
  const std::regex inc_re(R"re(#include "common/([a-z_]+)/([a-z_0-9]+\.h)")re");
  auto scan = [&](const fs::path& dir, bool recurse, const std::function<void(const std::string&, const std::string&, const std::string&)>& f) {
    auto visit = [&](const fs::path& p) {
      if (p.extension() != ".h" && p.extension() != ".cc") return;
      const std::string text = ReadFile(p);
      for (auto m = std::sregex_iterator(text.begin(), text.end(), inc_re); m != std::sregex_iterator(); ++m)
        f(fs::relative(p, root).string(), (*m)[1], (*m)[2]);
    };
    if (recurse) {
      for (const auto& e : fs::recursive_directory_iterator(dir))
        if (e.is_regular_file()) visit(e.path());
    } else {
      for (const auto& e : fs::directory_iterator(dir))
        if (e.is_regular_file()) visit(e.path());
    }
  };
  for (const auto& l : kLayers) {
    const std::set<std::string> reach = Reach(l.folder);
    scan(root / "common" / l.folder, false, [&](const std::string& file, const std::string& folder, const std::string& header) {
      if (!fs::exists(root / "common" / folder / header)) bad.push_back(file + ": includes common/" + folder + "/" + header + ", which does not exist");
      if (reach.count(folder) == 0) bad.push_back(file + ": includes common/" + folder + "/" + header + " (common/" + l.folder + " may not use common/" + folder + ")");
    });
  }
  scan(root / "cdpctl", false, [&](const std::string& file, const std::string& folder, const std::string& header) {
    // common/nbd: `cdpctl serve` decrypts a sealed volume at the tenant (client, sealed device, local server).
    if (folder == "wire" || folder == "store") bad.push_back(file + ": includes common/" + folder + "/" + header + " (cdpctl speaks HTTP)");
  });
  scan(root / "loadgen", false, [&](const std::string& file, const std::string& folder, const std::string& header) {
    if (folder == "nbd" && header != "nbd_proto.h" && header != "nbd_client.h")
      bad.push_back(file + ": includes common/nbd/" + header + " (loadgen links the NBD protocol and client only)");
  });
  return bad;
}

std::string Join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

// The Markdown block of docs/architecture.md: each layer's libraries with
// what they link, then what each binary's own library links.
std::string RenderLayers(const Graph& g) {
  std::ostringstream out;
  out << "| folder | library | links (ours) | links (system) |\n|---|---|---|---|\n";
  for (auto l = kLayers.rbegin(); l != kLayers.rend(); ++l) {
    for (const auto& t : l->targets) {
      std::vector<std::string> ours, sys;
      auto it = g.edges.find(t);
      if (it != g.edges.end())
        for (const auto& d : it->second) {
          if (IsFile(d)) continue;
          (LayerOfTarget(d) != nullptr ? ours : sys).push_back(d);
        }
      out << "| common/" << l->folder << " | " << t << " | " << Join(ours, ", ") << " | " << Join(sys, ", ") << " |\n";
    }
  }
  out << "\n| binary | its library | which links |\n|---|---|---|\n";
  for (const char* bin : {"cdp-agent", "cdp-process-server", "cdp-master-target", "cdp-loadgen", "cdpctl"}) {
    auto it = g.edges.find(bin);
    if (it == g.edges.end() || it->second.empty()) continue;
    const std::string lib = it->second.front();
    auto lit = g.edges.find(lib);
    std::vector<std::string> deps;
    if (lit != g.edges.end())
      for (const auto& d : lit->second)
        if (!IsFile(d)) deps.push_back(d);
    out << "| " << bin << " | " << lib << " | " << Join(deps, ", ") << " |\n";
  }
  return out.str();
}

const char* kBegin = "<!-- layers: generated by common/tests/layers_test.cc from CMake's graph -->\n";
const char* kEnd = "<!-- /layers -->";

Graph ConfigureGraph(const cdp::testing::ScratchDir& dir) {
  const std::string dot = dir.Join("layers.dot");
  auto r = cdp::RunCommand({CDP_CMAKE_COMMAND, "-S", CDP_SOURCE_DIR, "-B", dir.Join("build"), "--graphviz=" + dot},
                           std::chrono::minutes(5));
  REQUIRE(r.ok());
  INFO(r->output);
  REQUIRE(r->exit_code == 0);
  return ParseDot(ReadFile(dot));
}

}  // namespace

TEST_CASE("link layers: the checker names a layer that reaches up and a banned library", "[layers]") {
  // A graph as cmake --graphviz writes it, with cdp_http linking the wire and
  // cdpctl reaching zstd through it.
  const std::string dot = R"(digraph "OpenCDP" {
node [ fontsize = "12" ];
subgraph clusterLegend {
  label = "Legend";
  legendNode0 [ label = "Executable", shape = egg ];
  legendNode0 -> legendNode1 [ style = solid ];
}
    "node0" [ label = "cdp_http", shape = octagon ];
    "node1" [ label = "cdp_wire", shape = octagon ];
    "node2" [ label = "PkgConfig::ZSTD", shape = pentagon ];
    "node3" [ label = "cdpctl", shape = egg ];
    "node4" [ label = "cdp_ctl", shape = octagon ];
    "node5" [ label = "cdp-loadgen", shape = egg ];
    "node0" -> "node1"  // cdp_http -> cdp_wire
    "node1" -> "node2"  // cdp_wire -> PkgConfig::ZSTD
    "node3" -> "node4" [ style = dotted ] // cdpctl -> cdp_ctl
    "node4" -> "node0"  // cdp_ctl -> cdp_http
}
)";
  const auto bad = CheckLinks(ParseDot(dot));
  const std::string all = Join(bad, "\n");
  INFO(all);
  CHECK(std::count(bad.begin(), bad.end(), "cdp_http -> cdp_wire: common/http may not use common/wire") == 1);
  CHECK(std::count(bad.begin(), bad.end(), "cdpctl reaches PkgConfig::ZSTD: cdpctl speaks HTTP, not the wire") == 1);
  CHECK(std::count(bad.begin(), bad.end(), "cdpctl reaches cdp_wire: cdpctl speaks HTTP, not the wire") == 1);
  CHECK(std::count(bad.begin(), bad.end(), "cdp_base: no such CMake target (common/base)") == 1);
  CHECK(all.find("cdp-loadgen reaches") == std::string::npos);
}

TEST_CASE("link layers: common/ links and includes only downward, cdpctl reaches no wire or sqlite, loadgen no NBD server, and docs/architecture.md shows the graph", "[layers]") {
  cdp::testing::ScratchDir dir;
  REQUIRE(!dir.path().empty());
  const Graph g = ConfigureGraph(dir);
  REQUIRE(g.nodes.count("cdp-agent") == 1);

  const auto links = CheckLinks(g);
  INFO(Join(links, "\n"));
  CHECK(links.empty());

  const auto includes = CheckIncludes(CDP_SOURCE_DIR);
  INFO(Join(includes, "\n"));
  CHECK(includes.empty());

  // Every file of common/ lies in a layer's folder (or tests/).
  std::vector<std::string> loose;
  for (const auto& e : fs::directory_iterator(fs::path(CDP_SOURCE_DIR) / "common"))
    if (e.is_regular_file() && e.path().filename() != "CMakeLists.txt") loose.push_back(e.path().filename().string());
  INFO(Join(loose, " "));
  CHECK(loose.empty());

  const std::string doc = ReadFile(fs::path(CDP_SOURCE_DIR) / "docs/architecture.md");
  const size_t b = doc.find(kBegin);
  const size_t e = doc.find(kEnd);
  REQUIRE(b != std::string::npos);
  REQUIRE(e != std::string::npos);
  const std::string shown = doc.substr(b + std::string(kBegin).size(), e - b - std::string(kBegin).size());
  const std::string generated = RenderLayers(g);
  if (shown != generated && std::getenv("CDP_WRITE_LAYERS") != nullptr) {
    // CDP_WRITE_LAYERS=1 build/common/tests/common_tests '[layers]' rewrites the block.
    std::ofstream(fs::path(CDP_SOURCE_DIR) / "docs/architecture.md", std::ios::trunc)
        << doc.substr(0, b + std::string(kBegin).size()) << generated << doc.substr(e);
    return;
  }
  if (shown != generated) {
    FAIL("docs/architecture.md's layer table differs from CMake's graph; run CDP_WRITE_LAYERS=1 common_tests '[layers]' to rewrite it; it should read:\n" << generated);
  }
}

TEST_CASE("docs/architecture.md names only files that exist", "[layers]") {
  const fs::path root = CDP_SOURCE_DIR;
  const std::string doc = ReadFile(root / "docs/architecture.md");
  const std::regex path_re(R"re(`((?:agent|process-server|master-target|common|cdpctl|loadgen|storage|bench|e2e|fuzz|docs|packaging|scripts)/[A-Za-z0-9_./-]*[A-Za-z0-9_])`)re");
  std::vector<std::string> missing;
  size_t named = 0;
  for (auto m = std::sregex_iterator(doc.begin(), doc.end(), path_re); m != std::sregex_iterator(); ++m) {
    ++named;
    const std::string p = (*m)[1];
    if (!fs::exists(root / p)) missing.push_back(p);
  }
  INFO(Join(missing, "\n"));
  CHECK(named > 20);
  CHECK(missing.empty());
}

// SPDX-License-Identifier: Apache-2.0
// The Ceph test cluster of a storage test process (scripts/ceph-micro.sh).
//
// Under CTest the cluster is started once for the whole run by the
// storage:ceph-cluster-start fixture and named by CDP_CEPH_DIR. A binary run
// by hand (no CDP_CEPH_DIR) starts its own on first use, in a scratch
// directory, and stops it at exit; should the process die first, the
// script's watchdog (CEPH_MICRO_OWNER_PID) stops it.
//
// Thread safety: TestCluster() may be called from one thread at a time.
#pragma once

#include <string>

namespace cdp::storage::testing {

struct CephTestCluster {
  std::string dir;
  std::string conf;       // CEPH_CONF: monitor address, keyring path, cephx
  std::string keyring;    // every key of the cluster
  std::string pool;       // initialised for RBD
  std::string client_id;  // "opencdp": profile rbd on `pool` only
  std::string admin_id;   // "admin": every cap
};

// The running cluster, or nullptr with `*skip_reason` set when the Ceph
// packages are not installed (the one reason a [ceph] test may skip). Any
// other failure to find or start the cluster is a test failure (REQUIRE).
const CephTestCluster* TestCluster(std::string* skip_reason);

// A name no other test run uses at the same time: prefix + pid + counter.
std::string UniqueName(const std::string& prefix);

// A fresh image-name prefix for one test (UniqueName): at the end of the
// test every image "<prefix>~..." of the cluster's pool is removed, as
// admin, through the rbd CLI (so that tests without librbd use it too).
class ScopedImages {
 public:
  ScopedImages(const CephTestCluster& cluster, const std::string& what)
      : cluster_(cluster), prefix_(UniqueName(what)) {}
  ~ScopedImages();
  ScopedImages(const ScopedImages&) = delete;
  ScopedImages& operator=(const ScopedImages&) = delete;
  const std::string& prefix() const { return prefix_; }

 private:
  const CephTestCluster& cluster_;
  std::string prefix_;
};

}  // namespace cdp::storage::testing

// Declares `const CephTestCluster* var` for the running cluster, or prints why
// the test is skipped and returns (only when the Ceph packages are missing).
#define CDP_CEPH_CLUSTER_OR_SKIP(var)                                                                      \
  std::string var##_skip;                                                                                  \
  const ::cdp::storage::testing::CephTestCluster* var = ::cdp::storage::testing::TestCluster(&var##_skip); \
  if (var == nullptr) {                                                                                    \
    WARN("SKIPPED: " << var##_skip);                                                                       \
    return;                                                                                                \
  }

// SPDX-License-Identifier: Apache-2.0
// GatedEnv: an Env whose File::Sync calls can be held at a gate, so that a
// test can see what piles up behind a sync in progress (group commits).
//
//   GatedEnv env(base);
//   env.Close();                         // syncs from now on wait at the gate
//   ... start the work ...
//   REQUIRE(env.WaitUntilSyncBlocked(10s));  // a sync is waiting
//   ... queue more work behind it ...
//   env.Open();                          // every waiting sync goes on
//
// Thread safety: all methods are thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "common/env/env_wrapper.h"

namespace cdp::testing {

class GatedEnv : public EnvWrapper {
 public:
  // `base` must outlive this Env.
  explicit GatedEnv(Env* base) : EnvWrapper(base) {}

  Result<std::unique_ptr<File>> Open(const std::string& p, const OpenOptions& o) override {
    CDP_ASSIGN_OR_RETURN(auto f, EnvWrapper::Open(p, o));
    return std::unique_ptr<File>(new GatedFile(this, std::move(f)));
  }

  // Syncs from now on wait until Open().
  void Close() {
    std::lock_guard<std::mutex> l(mu_);
    closed_ = true;
    waiting_ = 0;
  }
  // Lets every waiting sync go on, and later ones pass.
  void Open() {
    std::lock_guard<std::mutex> l(mu_);
    closed_ = false;
    cv_.notify_all();
  }
  // True once a sync waits at the closed gate (false after `timeout`).
  bool WaitUntilSyncBlocked(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, timeout, [&] { return waiting_ > 0; });
  }

 private:
  class GatedFile : public FileWrapper {
   public:
    GatedFile(GatedEnv* env, std::unique_ptr<File> f) : FileWrapper(std::move(f)), env_(env) {}
    Status Sync() override {
      env_->WaitGate();
      return FileWrapper::Sync();
    }

   private:
    GatedEnv* env_;
  };

  void WaitGate() {
    std::unique_lock<std::mutex> l(mu_);
    if (!closed_) return;
    waiting_++;
    cv_.notify_all();
    cv_.wait(l, [&] { return !closed_; });
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;
  int waiting_ = 0;
};

}  // namespace cdp::testing

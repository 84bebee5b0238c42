// SPDX-License-Identifier: Apache-2.0
// WebDriver: a headless Chromium driven through chromedriver (the W3C
// WebDriver protocol: JSON over HTTP on loopback), for the dashboard's e2e
// test (e2e/dashboard_test.cc). Debian packages chromium and chromium-driver
// (scripts/install-deps.sh).
//
//   Browser b;  b.Start(scratch_dir)   chromedriver on a free port, one session
//     b.Go(url); b.Eval("return document.title"); b.Click("button.x");
//     b.WaitUntil("return document.body.dataset.state === 'ready'", 30s);
//     b.Screenshot(path)
//   ~Browser: deletes the session, kills chromedriver (and Chromium with it).
//
// Every call returns a Status (what chromedriver answered on failure); waits
// poll a condition in the page until a deadline, never sleep as synchronisation.
//
// Thread safety: none; one test thread drives a Browser.
#pragma once

#include <boost/json/value.hpp>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/base/result.h"
#include "common/base/status.h"
#include "e2e/harness.h"

namespace cdp::e2e {

class Browser {
 public:
  Browser() = default;
  ~Browser();
  Browser(const Browser&) = delete;
  Browser& operator=(const Browser&) = delete;

  // True when /usr/bin/chromium and chromedriver are installed.
  static bool Available();

  // Starts chromedriver (log in `dir`/chromedriver.log) and a headless
  // Chromium session with a fresh profile in `dir`, a window of
  // width x height CSS pixels, and `extra_args` for Chromium (e.g. the
  // server key it trusts: --ignore-certificate-errors-spki-list=).
  Status Start(const std::string& dir, int width = 1440, int height = 2000,
               const std::vector<std::string>& extra_args = {});

  // Navigates to `url` (returns when the page has loaded).
  Status Go(const std::string& url);
  // Runs `script` (a function body; `return` gives the value) in the page.
  Result<boost::json::value> Eval(const std::string& script);
  // Eval(script) until it returns true, or `timeout` passes (then kBusy with
  // the last value or error).
  Status WaitUntil(const std::string& script, std::chrono::milliseconds timeout);
  // Clicks the first element matching the CSS selector (as a user would:
  // scrolled into view, the real mouse event).
  Status Click(const std::string& css);
  // Saves a PNG of the window.
  Status Screenshot(const std::string& path);
  // The URL of the page now shown.
  Result<std::string> Url();
  // The cookies the browser holds for the current page (WebDriver's list:
  // name, value, secure, httpOnly, sameSite, expiry...), HttpOnly ones included.
  Result<boost::json::value> Cookies();

 private:
  Result<boost::json::value> Call(const std::string& method, const std::string& path, const boost::json::value& body);
  Daemon driver_;
  uint16_t port_ = 0;
  std::string session_;
};

}  // namespace cdp::e2e

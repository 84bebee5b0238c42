// SPDX-License-Identifier: Apache-2.0
#include "e2e/webdriver.h"

#include <openssl/evp.h>
#include <unistd.h>

#include <boost/json.hpp>
#include <fstream>

#include "common/http/http_client.h"

namespace cdp::e2e {

namespace json = boost::json;
using namespace std::chrono_literals;

namespace {

constexpr const char* kChromium = "/usr/bin/chromium";
constexpr const char* kDriver = "/usr/bin/chromedriver";
constexpr const char* kElementKey = "element-6066-11e4-a52e-4f735466cecf";

Result<std::string> Base64Decode(const std::string& in) {
  std::string out(in.size() / 4 * 3 + 3, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()), reinterpret_cast<const unsigned char*>(in.data()),
                          int(in.size()));
  if (n < 0) return Status::Corruption("screenshot: bad base64");
  size_t pad = 0;
  for (size_t i = in.size(); i > 0 && in[i - 1] == '='; --i) ++pad;
  out.resize(size_t(n) - pad);
  return out;
}

}  // namespace

bool Browser::Available() { return ::access(kChromium, X_OK) == 0 && ::access(kDriver, X_OK) == 0; }

Browser::~Browser() {
  if (!session_.empty()) (void)Call("DELETE", "/session/" + session_, nullptr);
  driver_.Stop(SIGKILL);
}

Result<json::value> Browser::Call(const std::string& method, const std::string& path, const json::value& body) {
  const std::string text = body.is_null() ? std::string() : json::serialize(body);
  CDP_ASSIGN_OR_RETURN(auto r, http::HttpRequest("127.0.0.1", port_, method, path, text, 60s));
  boost::system::error_code ec;
  json::value v = json::parse(r.body, ec);
  if (ec || !v.is_object() || !v.as_object().contains("value"))
    return Status::Corruption("chromedriver " + method + " " + path + ": HTTP " + std::to_string(r.status) + " " + r.body);
  json::value value = v.at("value");
  if (r.status != 200) {
    std::string msg = r.body;
    if (value.is_object() && value.as_object().contains("message")) msg = json::value_to<std::string>(value.at("message"));
    return Status::InvalidArgument("chromedriver " + method + " " + path + ": HTTP " + std::to_string(r.status) + ": " + msg);
  }
  return value;
}

Status Browser::Start(const std::string& dir, int width, int height, const std::vector<std::string>& extra_args) {
  port_ = FreePort();
  if (port_ == 0) return Status::IOError("no free port for chromedriver");
  if (!driver_.Start({kDriver, "--port=" + std::to_string(port_)}, dir + "/chromedriver.log"))
    return Status::IOError("cannot start " + std::string(kDriver));
  const bool ready = WaitFor(
      [&] {
        auto r = http::HttpRequest("127.0.0.1", port_, "GET", "/status", "", 2s);
        return r.ok() && r->status == 200 && r->body.find("\"ready\":true") != std::string::npos;
      },
      30s);
  if (!ready) return Status::Unavailable("chromedriver did not become ready (see " + dir + "/chromedriver.log)");
  json::array args{"--headless=new",
                   "--no-sandbox",
                   "--disable-gpu",
                   "--disable-dev-shm-usage",
                   "--no-first-run",
                   "--hide-scrollbars",
                   "--user-data-dir=" + dir + "/chromium-profile",
                   "--window-size=" + std::to_string(width) + "," + std::to_string(height)};
  for (const std::string& a : extra_args) args.push_back(json::value(a));
  json::object caps{{"browserName", "chrome"},
                    {"goog:chromeOptions", json::object{{"binary", kChromium}, {"args", args}}}};
  CDP_ASSIGN_OR_RETURN(auto v, Call("POST", "/session", json::object{{"capabilities", json::object{{"alwaysMatch", caps}}}}));
  if (!v.is_object() || !v.as_object().contains("sessionId")) return Status::Corruption("no session: " + json::serialize(v));
  session_ = json::value_to<std::string>(v.at("sessionId"));
  return Status::OK();
}

Status Browser::Go(const std::string& url) {
  return Call("POST", "/session/" + session_ + "/url", json::object{{"url", url}}).status();
}

Result<json::value> Browser::Eval(const std::string& script) {
  return Call("POST", "/session/" + session_ + "/execute/sync", json::object{{"script", script}, {"args", json::array{}}});
}

Status Browser::WaitUntil(const std::string& script, std::chrono::milliseconds timeout) {
  std::string last;
  const bool ok = WaitFor(
      [&] {
        auto v = Eval(script);
        if (!v.ok()) {
          last = v.status().ToString();
          return false;
        }
        last = json::serialize(*v);
        return v->is_bool() && v->as_bool();
      },
      timeout, 100ms);
  if (ok) return Status::OK();
  return Status::Busy("timed out waiting for `" + script + "` (last: " + last + ")");
}

Status Browser::Click(const std::string& css) {
  CDP_ASSIGN_OR_RETURN(auto e, Call("POST", "/session/" + session_ + "/element",
                                    json::object{{"using", "css selector"}, {"value", css}}));
  if (!e.is_object() || !e.as_object().contains(kElementKey)) return Status::NotFound("no element " + css);
  const std::string id = json::value_to<std::string>(e.at(kElementKey));
  return Call("POST", "/session/" + session_ + "/element/" + id + "/click", json::object{}).status();
}

Status Browser::Screenshot(const std::string& path) {
  CDP_ASSIGN_OR_RETURN(auto v, Call("GET", "/session/" + session_ + "/screenshot", nullptr));
  if (!v.is_string()) return Status::Corruption("screenshot: not a string");
  CDP_ASSIGN_OR_RETURN(std::string png, Base64Decode(std::string(v.as_string())));
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(png.data(), std::streamsize(png.size()));
  if (!f.good()) return Status::IOError("cannot write " + path);
  return Status::OK();
}

Result<json::value> Browser::Cookies() { return Call("GET", "/session/" + session_ + "/cookie", nullptr); }

Result<std::string> Browser::Url() {
  CDP_ASSIGN_OR_RETURN(auto v, Call("GET", "/session/" + session_ + "/url", nullptr));
  if (!v.is_string()) return Status::Corruption("url: not a string");
  return std::string(v.as_string());
}

}  // namespace cdp::e2e

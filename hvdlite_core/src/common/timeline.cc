#include "common/timeline.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "common/status.h"

namespace hvdlite {
namespace {

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out += c;
  }
  return out;
}

std::mutex g_members_mutex;
std::unordered_map<std::string, std::vector<std::string>> g_members;

}  // namespace

void Timeline::describe_members(const std::string& tensor, std::vector<std::string> members) {
  std::lock_guard<std::mutex> lock(g_members_mutex);
  if (members.empty())
    g_members.erase(tensor);
  else
    g_members[tensor] = std::move(members);
}

std::vector<std::string> Timeline::rows_of(const std::string& tensor) const {
  std::lock_guard<std::mutex> lock(g_members_mutex);
  auto it = g_members.find(tensor);
  return it == g_members.end() ? std::vector<std::string>{tensor} : it->second;
}

Timeline::~Timeline() { close(); }

void Timeline::open(const std::string& path, bool mark_cycles) {
  std::lock_guard<std::mutex> lock(mutex_);
  close_locked();
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw Error(StatusCode::kInvalidArgument, "cannot write the timeline file " + path + ": " + std::strerror(errno));
  }
  mark_cycles_ = mark_cycles;
  origin_ = std::chrono::steady_clock::now();
  rows_.clear();
  first_ = true;
  held_ = "[\n";
  flush_locked();
  enabled_ = true;
}

long long Timeline::micros(std::chrono::steady_clock::time_point t) const {
  // An entry enqueued before the file was opened starts at 0.
  return std::max<long long>(0, std::chrono::duration_cast<std::chrono::microseconds>(t - origin_).count());
}

Timeline::Row& Timeline::row(const std::string& tensor) {
  auto it = rows_.find(tensor);
  if (it != rows_.end()) return it->second;
  int id = static_cast<int>(rows_.size()) + 1;
  write("{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " + std::to_string(id) + ", \"args\": {\"name\": \"" +
        escape(tensor) + "\"}}");
  write("{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": " + std::to_string(id) +
        ", \"args\": {\"sort_index\": " + std::to_string(id) + "}}");
  return rows_.emplace(tensor, Row{id, 0}).first->second;
}

void Timeline::begin(const std::string& tensor, const std::string& activity,
                     std::chrono::steady_clock::time_point start) {
  const std::vector<std::string> rows = rows_of(tensor);
  std::lock_guard<std::mutex> lock(mutex_);
  if (fd_ < 0) return;
  for (const std::string& name : rows) {
    Row& r = row(name);
    ++r.open_spans;
    write("{\"name\": \"" + escape(activity) + "\", \"ph\": \"B\", \"ts\": " + std::to_string(micros(start)) +
          ", \"pid\": " + std::to_string(r.id) + ", \"tid\": 1}");
  }
}

void Timeline::end(const std::string& tensor) {
  const std::vector<std::string> rows = rows_of(tensor);
  std::lock_guard<std::mutex> lock(mutex_);
  if (fd_ < 0) return;
  const std::string now = std::to_string(micros(std::chrono::steady_clock::now()));
  for (const std::string& name : rows) {
    auto it = rows_.find(name);
    if (it == rows_.end() || it->second.open_spans == 0) continue;  // began before this file was opened
    --it->second.open_spans;
    write("{\"ph\": \"E\", \"ts\": " + now + ", \"pid\": " + std::to_string(it->second.id) + ", \"tid\": 1}");
  }
}

void Timeline::mark_cycle() {
  if (!enabled()) return;  // every cycle that does something calls this: no lock when there is no timeline
  std::lock_guard<std::mutex> lock(mutex_);
  if (fd_ < 0 || !mark_cycles_) return;
  write("{\"name\": \"CYCLE_START\", \"ph\": \"i\", \"s\": \"g\", \"ts\": " +
        std::to_string(micros(std::chrono::steady_clock::now())) + ", \"pid\": 0, \"tid\": 0}");
}

void Timeline::counter(const std::string& name, const std::vector<std::pair<std::string, double>>& values) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (fd_ < 0) return;
  Row& r = row(name);
  std::string args;
  for (const auto& kv : values) {
    if (!std::isfinite(kv.second)) continue;  // JSON has no NaN or infinity
    char number[64];
    std::snprintf(number, sizeof(number), "%.17g", kv.second);
    args += std::string(args.empty() ? "" : ", ") + "\"" + escape(kv.first) + "\": " + number;
  }
  write("{\"name\": \"" + escape(name) +
        "\", \"ph\": \"C\", \"ts\": " + std::to_string(micros(std::chrono::steady_clock::now())) +
        ", \"pid\": " + std::to_string(r.id) + ", \"tid\": 1, \"args\": {" + args + "}}");
}

void Timeline::write(const std::string& event) {
  if (!first_) held_ += ",\n";
  first_ = false;
  held_ += event;
  if (held_.size() >= (1u << 20)) flush_locked();  // a busy cycle: bound what a kill can lose
}

void Timeline::flush_if_due(bool quiet) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (fd_ < 0 || held_.empty()) return;
  if (quiet || std::chrono::steady_clock::now() - last_flush_ >= kFlushInterval) flush_locked();
}

void Timeline::flush_locked() {
  // One write of whole events: a kill leaves the file cut between two of them.
  size_t done = 0;
  while (done < held_.size()) {
    ssize_t n = ::write(fd_, held_.data() + done, held_.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // a full disk: the trace ends early rather than the job
    done += static_cast<size_t>(n);
  }
  held_.clear();
  last_flush_ = std::chrono::steady_clock::now();
}

void Timeline::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  close_locked();
}

void Timeline::close_locked() {
  if (fd_ < 0) return;
  enabled_ = false;
  const std::string now = std::to_string(micros(std::chrono::steady_clock::now()));
  for (auto& kv : rows_) {
    for (; kv.second.open_spans > 0; --kv.second.open_spans) {
      write("{\"ph\": \"E\", \"ts\": " + now + ", \"pid\": " + std::to_string(kv.second.id) + ", \"tid\": 1}");
    }
  }
  held_ += "\n]\n";
  flush_locked();
  ::close(fd_);
  fd_ = -1;
}

}  // namespace hvdlite

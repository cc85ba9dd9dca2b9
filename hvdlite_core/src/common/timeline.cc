#include "common/timeline.h"

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

}  // namespace

Timeline::~Timeline() { close(); }

void Timeline::open(const std::string& path) {
  file_ = std::fopen(path.c_str(), "w");
  if (!file_) throw Error(StatusCode::kInvalidArgument, "cannot write the timeline file " + path);
  origin_ = std::chrono::steady_clock::now();
  std::fputs("[\n", file_);
}

int Timeline::row(const std::string& tensor) {
  auto it = rows_.find(tensor);
  if (it != rows_.end()) return it->second;
  int id = static_cast<int>(rows_.size()) + 1;
  rows_[tensor] = id;
  write("{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " + std::to_string(id) +
        ", \"args\": {\"name\": \"" + escape(tensor) + "\"}}");
  write("{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": " + std::to_string(id) +
        ", \"args\": {\"sort_index\": " + std::to_string(id) + "}}");
  return id;
}

void Timeline::begin(const std::string& tensor, const std::string& activity,
                     std::chrono::steady_clock::time_point start) {
  if (!file_) return;
  int id = row(tensor);
  long long ts = std::chrono::duration_cast<std::chrono::microseconds>(start - origin_).count();
  write("{\"name\": \"" + escape(activity) + "\", \"ph\": \"B\", \"ts\": " + std::to_string(ts) +
        ", \"pid\": " + std::to_string(id) + ", \"tid\": 1}");
}

void Timeline::end(const std::string& tensor) {
  if (!file_) return;
  int id = row(tensor);
  long long ts =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - origin_).count();
  write("{\"ph\": \"E\", \"ts\": " + std::to_string(ts) + ", \"pid\": " + std::to_string(id) + ", \"tid\": 1}");
}

void Timeline::write(const std::string& event) {
  if (!first_) std::fputs(",\n", file_);
  first_ = false;
  std::fputs(event.c_str(), file_);
}

void Timeline::close() {
  if (!file_) return;
  std::fputs("\n]\n", file_);
  std::fclose(file_);
  file_ = nullptr;
}

}  // namespace hvdlite

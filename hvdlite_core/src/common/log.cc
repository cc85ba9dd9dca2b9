#include "common/log.h"

#include <sys/time.h>

#include <atomic>
#include <cctype>
#include <cstdio>
#include <ctime>

namespace hvdlite {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kWarning)};
std::atomic<int> g_rank{-1};
std::atomic<bool> g_hide_time{false};
const char kLetters[] = "TDIWEF";
}  // namespace

bool parse_log_level(const std::string& text, LogLevel* level) {
  std::string word;
  for (char ch : text) word += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  static const struct {
    const char* name;
    LogLevel level;
  } kNames[] = {{"trace", LogLevel::kTrace},     {"debug", LogLevel::kDebug},  {"info", LogLevel::kInfo},
                {"warning", LogLevel::kWarning}, {"warn", LogLevel::kWarning}, {"error", LogLevel::kError},
                {"fatal", LogLevel::kFatal}};
  for (const auto& entry : kNames) {
    if (word == entry.name) {
      *level = entry.level;
      return true;
    }
  }
  return false;
}

void log_configure(const std::string& level, int rank, bool hide_time) {
  LogLevel parsed = LogLevel::kWarning;
  const bool known = parse_log_level(level, &parsed);
  g_level = static_cast<int>(parsed);
  g_rank = rank;
  g_hide_time = hide_time;
  if (!known) {
    log_write(LogLevel::kWarning, "HVDLITE_LOG_LEVEL (or HOROVOD_LOG_LEVEL) is '" + level +
                                      "'; it takes TRACE, DEBUG, INFO, WARNING, ERROR or FATAL: logging at WARNING");
  }
}

bool log_enabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(std::memory_order_relaxed); }

void log_write(LogLevel level, const std::string& message) {
  const char letter = kLetters[static_cast<int>(level)];
  if (g_hide_time.load(std::memory_order_relaxed)) {
    std::fprintf(stderr, "[%c hvdlite rank %d] %s\n", letter, g_rank.load(), message.c_str());
  } else {
    timeval now{};
    gettimeofday(&now, nullptr);
    tm local{};
    localtime_r(&now.tv_sec, &local);
    char stamp[32];
    std::strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S", &local);
    std::fprintf(stderr, "[%s.%06ld: %c hvdlite rank %d] %s\n", stamp, static_cast<long>(now.tv_usec), letter,
                 g_rank.load(), message.c_str());
  }
  std::fflush(stderr);
}

}  // namespace hvdlite

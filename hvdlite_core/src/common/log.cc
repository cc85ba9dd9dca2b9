#include "common/log.h"

#include <atomic>
#include <cstdio>

namespace hvdlite {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kWarning)};
std::atomic<int> g_rank{-1};
const char* const kNames[] = {"TRACE", "DEBUG", "INFO", "WARNING", "ERROR"};
}  // namespace

void log_configure(const std::string& level, int rank) {
  LogLevel parsed = LogLevel::kWarning;
  if (level == "trace") parsed = LogLevel::kTrace;
  else if (level == "debug") parsed = LogLevel::kDebug;
  else if (level == "info") parsed = LogLevel::kInfo;
  else if (level == "error") parsed = LogLevel::kError;
  g_level = static_cast<int>(parsed);
  g_rank = rank;
}

bool log_enabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(std::memory_order_relaxed); }

void log_write(LogLevel level, const std::string& message) {
  std::fprintf(stderr, "[hvdlite %s rank %d] %s\n", kNames[static_cast<int>(level)], g_rank.load(), message.c_str());
  std::fflush(stderr);
}

}  // namespace hvdlite

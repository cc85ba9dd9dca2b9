// Leveled logging to stderr in Horovod's layout: "[2026-11-26 07:59:21.123456: W hvdlite rank 0] message", the
// time left out where LOG_HIDE_TIME is set. The level and the switch come from Config (HVDLITE_LOG_LEVEL,
// HVDLITE_LOG_HIDE_TIME, or Horovod's names).
#pragma once
#include <sstream>
#include <string>

namespace hvdlite {

enum class LogLevel { kTrace = 0, kDebug = 1, kInfo = 2, kWarning = 3, kError = 4, kFatal = 5 };

// Horovod's level names, in either case ("warn" too). False, and the level unchanged, for another word.
bool parse_log_level(const std::string& text, LogLevel* level);

// Sets the level, the rank shown and whether lines carry the time. An unknown level keeps WARNING and says so.
void log_configure(const std::string& level, int rank, bool hide_time);
bool log_enabled(LogLevel level);
void log_write(LogLevel level, const std::string& message);

}  // namespace hvdlite

#define HVD_LOG(level, stream_expr)                                            \
  do {                                                                         \
    if (::hvdlite::log_enabled(::hvdlite::LogLevel::level)) {                  \
      std::ostringstream hvd_log_stream_;                                      \
      hvd_log_stream_ << stream_expr;                                          \
      ::hvdlite::log_write(::hvdlite::LogLevel::level, hvd_log_stream_.str()); \
    }                                                                          \
  } while (0)

// Minimal leveled logging to stderr, prefixed with the rank. The level comes from Config (HVDLITE_LOG_LEVEL).
#pragma once
#include <sstream>
#include <string>

namespace hvdlite {

enum class LogLevel { kTrace = 0, kDebug = 1, kInfo = 2, kWarning = 3, kError = 4 };

void log_configure(const std::string& level, int rank);
bool log_enabled(LogLevel level);
void log_write(LogLevel level, const std::string& message);

}  // namespace hvdlite

#define HVD_LOG(level, stream_expr)                                        \
  do {                                                                     \
    if (::hvdlite::log_enabled(::hvdlite::LogLevel::level)) {              \
      std::ostringstream hvd_log_stream_;                                  \
      hvd_log_stream_ << stream_expr;                                      \
      ::hvdlite::log_write(::hvdlite::LogLevel::level, hvd_log_stream_.str()); \
    }                                                                      \
  } while (0)

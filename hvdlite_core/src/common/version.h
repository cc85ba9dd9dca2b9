// The library's version, one place (hvdlite_version() and the algorithm cache's key read it).
#pragma once

namespace hvdlite {
constexpr const char* kVersion = "0.1.0";
}

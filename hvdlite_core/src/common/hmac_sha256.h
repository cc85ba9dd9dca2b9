// HMAC-SHA256 (RFC 2104 over FIPS 180-4), used to authenticate every connection with the job secret.
// Hand-written because the core must build with only a C++ compiler (no OpenSSL headers are guaranteed);
// it is checked against Python's hashlib/hmac in tests/test_core_units.py.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace hvdlite {

using Digest = std::array<uint8_t, 32>;

Digest sha256(const uint8_t* data, size_t length);
Digest hmac_sha256(const uint8_t* key, size_t key_length, const uint8_t* data, size_t length);
// Constant-time comparison, so a forger learns nothing from how long a rejection takes.
bool digest_equal(const Digest& a, const Digest& b);

}  // namespace hvdlite

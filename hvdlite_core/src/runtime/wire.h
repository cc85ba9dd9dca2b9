// Little binary writer/reader for negotiation messages (request lists, response lists). Fixed-width
// little-endian fields, length-prefixed strings and vectors. A malformed message throws kInternal: it can
// only come from a peer running a different build.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/status.h"

namespace hvdlite {

class WireWriter {
 public:
  template <typename T>
  void put(T value) {
    const char* p = reinterpret_cast<const char*>(&value);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint32_t>(static_cast<uint32_t>(s.size()));
    bytes_.insert(bytes_.end(), s.begin(), s.end());
  }
  template <typename T>
  void put_vector(const std::vector<T>& v) {
    put<uint32_t>(static_cast<uint32_t>(v.size()));
    const char* p = reinterpret_cast<const char*>(v.data());
    bytes_.insert(bytes_.end(), p, p + v.size() * sizeof(T));
  }
  std::vector<char>& bytes() { return bytes_; }

 private:
  std::vector<char> bytes_;
};

class WireReader {
 public:
  WireReader(const char* data, size_t size) : data_(data), size_(size) {}
  template <typename T>
  T get() {
    need(sizeof(T));
    T value;
    std::memcpy(&value, data_ + offset_, sizeof(T));
    offset_ += sizeof(T);
    return value;
  }
  std::string get_string() {
    uint32_t n = get<uint32_t>();
    need(n);
    std::string s(data_ + offset_, n);
    offset_ += n;
    return s;
  }
  template <typename T>
  std::vector<T> get_vector() {
    uint32_t n = get<uint32_t>();
    need(static_cast<size_t>(n) * sizeof(T));
    std::vector<T> v(n);
    if (n) std::memcpy(v.data(), data_ + offset_, n * sizeof(T));  // (memcpy from/to null is undefined, even for 0)
    offset_ += n * sizeof(T);
    return v;
  }
  bool done() const { return offset_ == size_; }

 private:
  void need(size_t n) {
    if (offset_ + n > size_) throw Error(StatusCode::kInternal, "truncated negotiation message");
  }
  const char* data_;
  size_t size_;
  size_t offset_ = 0;
};

}  // namespace hvdlite

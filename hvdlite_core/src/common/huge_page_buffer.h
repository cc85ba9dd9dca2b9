// HugePageBuffer: a growable byte buffer on 2 MB transparent huge pages where the kernel allows them: single copy
// pins a peer's pages one at a time (process_vm_readv), far cheaper on huge pages. From huge_from_bytes on it asks
// for them (MADV_HUGEPAGE before the first touch, on a 2 MB-aligned mapping); smaller, it stays on 4 KB pages, as a
// huge page is resident in whole 2 MB and would grow a small job's memory. Where the kernel says no, it is
// ordinary memory and everything still works.
#pragma once
#include <cstddef>

namespace hvdlite {

class HugePageBuffer {
 public:
  // huge_from_bytes: from this capacity on, huge pages (0: never).
  explicit HugePageBuffer(size_t huge_from_bytes) : huge_from_bytes_(huge_from_bytes) {}
  ~HugePageBuffer();
  HugePageBuffer(const HugePageBuffer&) = delete;
  HugePageBuffer& operator=(const HugePageBuffer&) = delete;

  // At least `bytes` bytes, keeping what the buffer held; grows in whole pages (2 MB ones from huge_from_bytes).
  // Throws std::bad_alloc.
  char* reserve(size_t bytes);
  char* data() const { return data_; }
  size_t capacity() const { return capacity_; }
  // Whether the kernel accepted the huge-page advice for the current mapping (false before the first reserve).
  bool advised() const { return advised_; }

 private:
  char* data_ = nullptr;
  size_t capacity_ = 0;
  size_t huge_from_bytes_;
  bool advised_ = false;
};

}  // namespace hvdlite

// HugePageBuffer: a growable byte buffer on 2 MB transparent huge pages where the kernel allows them.
//
// Single copy reads a peer's buffer with process_vm_readv, which pins the peer's pages one 4 KB page at a time:
// on a Xeon with 2 vCPUs, reading 32 MB of another process took 2.5-3.4 ms from 4 KB pages and 1.4 ms from huge
// pages (docs/benchmarks.md). Most kernels ship transparent huge pages in "madvise" mode, so memory gets them only
// when asked: this buffer asks (MADV_HUGEPAGE before the first touch, on a 2 MB-aligned mapping) once it holds at
// least huge_from_bytes. Smaller, it is ordinary memory in whole 4 KB pages: a huge page is touched, and resident,
// in whole 2 MB, and a small job whose fusion buffer grew by one more 2 MB page late in a run failed the soak
// test's flat-memory check. Where the kernel says no, it is ordinary memory and everything still works.
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

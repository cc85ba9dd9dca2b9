#include "common/huge_page_buffer.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <new>

namespace hvdlite {
namespace {
constexpr size_t kHugePage = 2 << 20;
constexpr size_t kSmallPage = 4096;

size_t round_up(size_t bytes, size_t page) { return (bytes + page - 1) / page * page; }

// A mapping of `bytes` (a multiple of 4 KB) starting on a kHugePage boundary: map one huge page more than needed
// and give back the unaligned head and the tail.
char* map_aligned(size_t bytes) {
  void* raw = mmap(nullptr, bytes + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > start) munmap(raw, aligned - start);
  const size_t tail = (start + bytes + kHugePage) - (aligned + bytes);
  if (tail > 0) munmap(reinterpret_cast<void*>(aligned + bytes), tail);
  return reinterpret_cast<char*>(aligned);
}
}  // namespace

HugePageBuffer::~HugePageBuffer() {
  if (data_) munmap(data_, capacity_);
}

char* HugePageBuffer::reserve(size_t bytes) {
  if (bytes <= capacity_ && data_) return data_;
  const bool huge = huge_from_bytes_ > 0 && bytes >= huge_from_bytes_;
  const size_t capacity = round_up(bytes == 0 ? 1 : bytes, huge ? kHugePage : kSmallPage);
  char* fresh = map_aligned(capacity);
  // Before the first touch, so that its page faults map huge pages.
  advised_ = huge && madvise(fresh, capacity, MADV_HUGEPAGE) == 0;
  if (data_) {
    std::memcpy(fresh, data_, capacity_);
    munmap(data_, capacity_);
  }
  data_ = fresh;
  capacity_ = capacity;
  return data_;
}

}  // namespace hvdlite

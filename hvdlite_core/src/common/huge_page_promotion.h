// Moving a reused buffer that peers read or write by single copy onto 2 MB transparent huge pages: single copy
// (collectives/single_copy.h) pins the peer's memory page by page, and framework tensors sit on 4 KB pages. A
// collapse costs milliseconds, so it pays back only on a buffer reused at one address (a bucket, a parameter), not
// on a torch gradient, which zero_grad frees every step and malloc moves between a few addresses.
//
// Policy: the buffer's 2 MB-aligned interior is collapsed (MADV_COLLAPSE, Linux 6.1+; values and address unchanged)
// on its second use. A collapsed buffer left kAbandonedAfter uses of other large buffers having had fewer than
// kPaidBackUses of its own is waste; after kWasteTolerance of those nothing more is collapsed. Every
// kRecheckEvery-th use collapses again, and a slow answer (the buffer was remapped) leaves that buffer alone from
// then on. Errors leave a buffer as it is; nothing is done where transparent huge pages are "never".
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <utility>

namespace hvdlite {

class HugePagePromoter {
 public:
  // collapse(address, bytes) -> 0 or an errno; returns after doing it. seconds() is a monotonic clock.
  using CollapseFn = std::function<int(void*, size_t)>;
  using ClockFn = std::function<double()>;
  static constexpr int kRecheckEvery = 64;
  static constexpr int64_t kAbandonedAfter = 64;  // uses of other buffers (at least min_bytes) without one of its own
  static constexpr int64_t kPaidBackUses = 8;
  static constexpr int64_t kWasteTolerance = 3;
  // A re-check slower than this per huge page found small pages: a range already on huge pages answers far faster
  // than a collapse, which copies 2 MB a page.
  static constexpr double kSlowRecheckSecondsPerPage = 20e-6;
  static constexpr size_t kMaxTracked = 1024;  // buffers remembered; beyond, forgotten all at once

  HugePagePromoter(CollapseFn collapse, ClockFn seconds);

  // A buffer a peer is about to read. Buffers smaller than min_bytes, or without one whole 2 MB page inside, are
  // ignored.
  void note_use(const void* address, size_t bytes, size_t min_bytes);

  int64_t collapsed() const { return collapsed_; }             // buffers moved onto huge pages
  int64_t refused() const { return refused_; }                 // buffers the kernel would not move (left as they are)
  int64_t given_up() const { return given_up_; }               // buffers found on small pages again at a re-check
  int64_t wasted() const { return wasted_; }                   // collapsed buffers abandoned before they paid back
  bool stopped() const { return wasted_ >= kWasteTolerance; }  // no new collapses: the application moves buffers
  // Collapses attempted so far (first ones and re-checks): a caller timing an allreduce compares it before and
  // after, since a run that moved memory onto huge pages says nothing about the algorithm's speed.
  int64_t attempts() const { return attempts_.load(std::memory_order_relaxed); }

 private:
  enum class State { kCounting, kHuge, kLeftAlone };
  struct Entry {
    int64_t uses = 0;
    int64_t uses_at_collapse = 0;
    int64_t last_use = 0;  // the promoter's use counter at this buffer's latest use
    bool counted_as_waste = false;
    State state = State::kCounting;
  };
  void count_waste();  // marks collapsed buffers abandoned before paying back (caller holds mu_)
  CollapseFn collapse_;
  ClockFn seconds_;
  std::mutex mu_;
  std::map<std::pair<uintptr_t, size_t>, Entry> buffers_;
  int64_t collapsed_ = 0, refused_ = 0, given_up_ = 0, wasted_ = 0;
  int64_t uses_ = 0;  // uses of buffers at least min_bytes, all buffers together
  std::atomic<int64_t> attempts_{0};
};

// The process's promoter (the real madvise and clock), or nullptr where transparent huge pages are off.
HugePagePromoter* huge_page_promoter();

}  // namespace hvdlite

// Moving a reused buffer that peers read or write by single copy onto 2 MB transparent huge pages.
//
// Single copy (collectives/single_copy.h) reads and writes a peer's tensor with process_vm_readv/writev, which pin
// and map the peer's memory one page at a time. A tensor the framework allocated sits on 4 KB pages (most kernels
// hand out huge pages only on request), and on a 2-vCPU Xeon that cost a third of a large allreduce: the same
// tensors moved onto huge pages with MADV_COLLAPSE ran 16 MB allreduces 1.46-1.59x and 64 MB 1.26-1.35x faster
// (docs/benchmarks.md).
// A collapse is not cheap: 4-13 ms per 16 MB in a benchmark, up to 0.14 s for 64 MB, and 11-22 ms for one 4-9 MB
// gradient inside ResNet-50 training, where the kernel must compact memory first; the saving is about 22 us per MB
// each time a peer touches the buffer. A buffer used again and again at one address (a bucket, a parameter, the
// allreduce benchmark's tensor) pays it back. A torch gradient does not: zero_grad frees it every step and malloc
// hands it one of 2-9 addresses in turn, staying at one for 1 to 29 steps, so collapsing each address on its second
// use went on costing ResNet-50 training about 0.7 collapses a step after 30 steps, with no step-time gain measured.
//
// What is done: the buffer's 2 MB-aligned interior is collapsed (MADV_COLLAPSE, Linux 6.1+) on its second use; the
// kernel copies the contents into huge pages, so the tensor's values and address do not change. A collapsed buffer
// that then goes kAbandonedAfter uses of other large buffers without a use of its own, having been used fewer than
// kPaidBackUses times since its collapse, was wasted work; after kWasteTolerance of those the application is taken
// to move its buffers, and no further buffer is collapsed (those already collapsed keep their pages). Every
// kRecheckEvery-th use collapses again: memory still on huge pages answers in microseconds; a slow answer means the
// buffer was given back and mapped afresh between uses (a tensor freed and allocated again at the same address),
// and that buffer is left alone from then on, so no buffer costs a collapse per step. Any error (no MADV_COLLAPSE
// in this kernel, memory that cannot be collapsed, no huge page free) leaves that buffer as it is. Nothing is done
// where the administrator turned transparent huge pages off ("never").
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
  // A re-check slower than this per huge page found small pages: a range already on huge pages answered in about
  // 0.5 us a page, and collapsing small pages copies 2 MB a page (about 100 us).
  static constexpr double kSlowRecheckSecondsPerPage = 20e-6;
  static constexpr size_t kMaxTracked = 1024;             // buffers remembered; beyond, forgotten all at once

  HugePagePromoter(CollapseFn collapse, ClockFn seconds);

  // A buffer a peer is about to read. Buffers smaller than min_bytes, or without one whole 2 MB page inside, are
  // ignored.
  void note_use(const void* address, size_t bytes, size_t min_bytes);

  int64_t collapsed() const { return collapsed_; }  // buffers moved onto huge pages
  int64_t refused() const { return refused_; }      // buffers the kernel would not move (left as they are)
  int64_t given_up() const { return given_up_; }    // buffers found on small pages again at a re-check
  int64_t wasted() const { return wasted_; }        // collapsed buffers abandoned before they paid back
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

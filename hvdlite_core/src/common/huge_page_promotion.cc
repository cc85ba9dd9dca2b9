#include "common/huge_page_promotion.h"

#include <errno.h>
#include <sys/mman.h>

#include <chrono>
#include <fstream>
#include <string>

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1; older headers lack the name, older kernels answer EINVAL
#endif

namespace hvdlite {
namespace {
constexpr uintptr_t kHugePage = 2 << 20;

bool transparent_huge_pages_off() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  return !std::getline(in, mode) || mode.find("[never]") != std::string::npos;
}
}  // namespace

HugePagePromoter::HugePagePromoter(CollapseFn collapse, ClockFn seconds)
    : collapse_(std::move(collapse)), seconds_(std::move(seconds)) {}

void HugePagePromoter::note_use(const void* address, size_t bytes, size_t min_bytes) {
  if (bytes < min_bytes || bytes == 0) return;
  const uintptr_t start = reinterpret_cast<uintptr_t>(address);
  const uintptr_t first = (start + kHugePage - 1) / kHugePage * kHugePage;
  const uintptr_t last = (start + bytes) / kHugePage * kHugePage;
  if (last <= first) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (buffers_.size() >= kMaxTracked && !buffers_.count({start, bytes})) buffers_.clear();
  Entry& entry = buffers_[{start, bytes}];
  ++entry.uses;
  entry.last_use = ++uses_;
  const bool first_collapse = entry.state == State::kCounting && entry.uses == 2;
  if (first_collapse) {
    if (!stopped()) count_waste();
    if (stopped()) return;  // the application moves its buffers: stays counting, never collapsed
  }
  const bool recheck = entry.state == State::kHuge && entry.uses % kRecheckEvery == 0;
  if (!first_collapse && !recheck) return;
  attempts_.fetch_add(1, std::memory_order_relaxed);
  const double began = seconds_();
  const int error = collapse_(reinterpret_cast<void*>(first), last - first);
  if (first_collapse) {
    entry.state = error == 0 ? State::kHuge : State::kLeftAlone;
    entry.uses_at_collapse = entry.uses;
    ++(error == 0 ? collapsed_ : refused_);
  } else if (error != 0 ||
             seconds_() - began > kSlowRecheckSecondsPerPage * static_cast<double>((last - first) / kHugePage)) {
    entry.state = State::kLeftAlone;
    ++given_up_;
  }
}

void HugePagePromoter::count_waste() {
  for (auto& [key, entry] : buffers_) {
    if (entry.state != State::kHuge || entry.counted_as_waste) continue;
    if (uses_ - entry.last_use > kAbandonedAfter && entry.uses - entry.uses_at_collapse < kPaidBackUses) {
      entry.counted_as_waste = true;
      ++wasted_;
    }
  }
}

HugePagePromoter* huge_page_promoter() {
  static HugePagePromoter* promoter =
      transparent_huge_pages_off()
          ? nullptr
          : new HugePagePromoter(
                [](void* address, size_t bytes) { return madvise(address, bytes, MADV_COLLAPSE) == 0 ? 0 : errno; },
                [] {
                  const auto now = std::chrono::steady_clock::now().time_since_epoch();
                  return std::chrono::duration<double>(now).count();
                });
  return promoter;
}

}  // namespace hvdlite

#include "transport/channel.h"

#include <algorithm>
#include <cstring>

namespace hvdlite {
namespace {
constexpr size_t kBounceBytes = 256 << 10;  // a multiple of every granule (element sizes are 1-8 bytes)
}

size_t Channel::try_recv_with(size_t length, size_t granule, const RecvConsumer& consume) {
  if (bounce_.size() < kBounceBytes) bounce_.resize(kBounceBytes);
  // The bytes held back are part of this transfer, so length (what is left of it) covers them.
  const size_t want = std::min(length, kBounceBytes) - bounce_fill_;
  const size_t have = bounce_fill_ + try_recv(bounce_.data() + bounce_fill_, want);
  const size_t whole = have - have % granule;
  if (whole > 0) consume(bounce_.data(), whole);
  bounce_fill_ = have - whole;
  if (bounce_fill_ > 0 && whole > 0) std::memmove(bounce_.data(), bounce_.data() + whole, bounce_fill_);
  return whole;
}

}  // namespace hvdlite

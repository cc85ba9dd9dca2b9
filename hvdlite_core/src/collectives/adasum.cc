// Adasum: adaptive summation of gradients (Maleki et al., "Scaling Distributed Training with Adaptive
// Summation", MLSys 2021), with Horovod's semantics.
//
// Two gradients a and b combine as
//     adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b
// (a coefficient is 1 where its vector's squared norm is below 1e-8): orthogonal gradients add, parallel ones
// average. n = 2^k members combine pairwise in a binary tree: members (0,1), (2,3), ... first, then the pairs of
// results, and so on; the left operand is always the lower-numbered group. Each tensor of a fused buffer
// combines on its own (its own dot product and norms), as Horovod does layer by layer.
//
// Protocol (vector halving, distance doubling): at distance d = 1, 2, 4, ... a member and its partner (rank ^ d)
// share a window of the buffer; the left one keeps the first half, the right one the second, and each sends the
// other half to its partner. The 2d members of a group (equal rank / 2d) then hold disjoint slices of both
// operands, so per tensor each computes partial a.b, |a|^2 and |b|^2 over its slice, and a recursive-doubling sum
// of those 3 doubles per tensor over the group gives every member the same full values, hence the same
// coefficients. Each member combines its slice. After log2(n) levels each member holds 1/n of the result; the
// levels in reverse order exchange slices back (an allgather).
// Cost: 2(n-1)/n of the buffer sent per member, as a ring allreduce, plus log2(n)(log2(n)+1)/2 small exchanges.
#include <algorithm>
#include <cstring>
#include <string>

#include "collectives/algorithms.h"
#include "common/status.h"

namespace hvdlite {
namespace {

double load(DType dtype, const char* base, size_t i) {
  switch (dtype) {
    case DType::kFloat16: {
      uint16_t v;
      std::memcpy(&v, base + 2 * i, 2);
      return half_to_float(v);
    }
    case DType::kBFloat16: {
      uint16_t v;
      std::memcpy(&v, base + 2 * i, 2);
      return bf16_to_float(v);
    }
    case DType::kFloat32: {
      float v;
      std::memcpy(&v, base + 4 * i, 4);
      return v;
    }
    default: {
      double v;
      std::memcpy(&v, base + 8 * i, 8);
      return v;
    }
  }
}

void store(DType dtype, char* base, size_t i, double value) {
  switch (dtype) {
    case DType::kFloat16: {
      uint16_t v = float_to_half(static_cast<float>(value));
      std::memcpy(base + 2 * i, &v, 2);
      break;
    }
    case DType::kBFloat16: {
      uint16_t v = float_to_bf16(static_cast<float>(value));
      std::memcpy(base + 2 * i, &v, 2);
      break;
    }
    case DType::kFloat32: {
      float v = static_cast<float>(value);
      std::memcpy(base + 4 * i, &v, 4);
      break;
    }
    default:
      std::memcpy(base + 8 * i, &value, 8);
  }
}

template <typename T>
void dot_and_norms(const T* mine, const T* theirs, size_t n, double* dot, double* mine_sq, double* theirs_sq) {
  double d = 0, m = 0, t = 0;
  for (size_t i = 0; i < n; ++i) {
    const double x = mine[i], y = theirs[i];
    d += x * y;
    m += x * x;
    t += y * y;
  }
  *dot = d, *mine_sq = m, *theirs_sq = t;
}

template <typename T>
void combine(T* mine, const T* theirs, size_t n, double c_mine, double c_theirs) {
  for (size_t i = 0; i < n; ++i) mine[i] = static_cast<T>(c_mine * mine[i] + c_theirs * theirs[i]);
}

// Native float types take the vectorisable loops; the half types convert per element.
void partials(DType dtype, const char* mine, const char* theirs, size_t n, double* out) {
  if (dtype == DType::kFloat32) {
    dot_and_norms(reinterpret_cast<const float*>(mine), reinterpret_cast<const float*>(theirs), n, out, out + 1,
                  out + 2);
  } else if (dtype == DType::kFloat64) {
    dot_and_norms(reinterpret_cast<const double*>(mine), reinterpret_cast<const double*>(theirs), n, out, out + 1,
                  out + 2);
  } else {
    double d = 0, m = 0, t = 0;
    for (size_t i = 0; i < n; ++i) {
      const double x = load(dtype, mine, i), y = load(dtype, theirs, i);
      d += x * y, m += x * x, t += y * y;
    }
    out[0] = d, out[1] = m, out[2] = t;
  }
}

void combine_any(DType dtype, char* mine, const char* theirs, size_t n, double c_mine, double c_theirs) {
  if (dtype == DType::kFloat32) {
    combine(reinterpret_cast<float*>(mine), reinterpret_cast<const float*>(theirs), n, c_mine, c_theirs);
  } else if (dtype == DType::kFloat64) {
    combine(reinterpret_cast<double*>(mine), reinterpret_cast<const double*>(theirs), n, c_mine, c_theirs);
  } else {
    for (size_t i = 0; i < n; ++i)
      store(dtype, mine, i, c_mine * load(dtype, mine, i) + c_theirs * load(dtype, theirs, i));
  }
}

double coefficient(double dot, double norm_sq) { return norm_sq >= 1e-8 ? 1.0 - dot / (2.0 * norm_sq) : 1.0; }

size_t round_up(size_t bytes) { return (bytes + 63) & ~size_t(63); }

}  // namespace

bool adasum_supports(DType dtype) {
  return dtype == DType::kFloat16 || dtype == DType::kBFloat16 || dtype == DType::kFloat32 ||
         dtype == DType::kFloat64;
}

size_t adasum_scratch_bytes(const std::vector<size_t>& tensor_counts, DType dtype) {
  size_t total = 0;
  for (size_t c : tensor_counts) total += c;
  // the partner's half of the first window (the largest), then two vectors of 3 doubles per tensor
  return round_up((total - total / 2) * dtype_size(dtype)) + 2 * 3 * tensor_counts.size() * sizeof(double);
}

void allreduce_adasum(PointToPoint& pairs, void* buffer, const std::vector<size_t>& tensor_counts, DType dtype,
                      char* scratch) {
  const int n = pairs.size(), me = pairs.rank();
  if (n == 1) return;
  if ((n & (n - 1)) != 0) {
    throw Error(StatusCode::kInvalidArgument,
                "Adasum needs a power-of-two number of ranks, not " + std::to_string(n));
  }
  const size_t esize = dtype_size(dtype);
  const size_t tensors = tensor_counts.size();
  std::vector<size_t> start(tensors + 1, 0);
  for (size_t t = 0; t < tensors; ++t) start[t + 1] = start[t] + tensor_counts[t];
  const size_t total = start[tensors];
  char* data = static_cast<char*>(buffer);
  char* incoming = scratch;
  double* sums = reinterpret_cast<double*>(scratch + round_up((total - total / 2) * esize));
  double* received = sums + 3 * tensors;

  struct Window {
    size_t lo, hi;
  };
  std::vector<Window> windows;  // the shared window at each distance, for the way back
  size_t lo = 0, hi = total;
  for (int d = 1; d < n; d <<= 1) {
    const int partner = me ^ d;
    const bool left = (me & d) == 0;
    const size_t mid = lo + (hi - lo) / 2;
    const size_t keep_lo = left ? lo : mid, keep_hi = left ? mid : hi;
    const size_t give_lo = left ? mid : lo, give_hi = left ? hi : mid;
    windows.push_back({lo, hi});
    pairs.sendrecv(partner, data + give_lo * esize, (give_hi - give_lo) * esize, incoming,
                   (keep_hi - keep_lo) * esize);

    // Per tensor: [a.b, |left|^2, |right|^2] over my slice, then summed over the group of 2d members.
    for (size_t t = 0; t < tensors; ++t) {
      const size_t a = std::max(start[t], keep_lo), b = std::min(start[t + 1], keep_hi);
      double* s = sums + 3 * t;
      if (a >= b) {
        s[0] = s[1] = s[2] = 0;
        continue;
      }
      double mine_theirs[3];
      partials(dtype, data + a * esize, incoming + (a - keep_lo) * esize, b - a, mine_theirs);
      s[0] = mine_theirs[0];
      s[1] = left ? mine_theirs[1] : mine_theirs[2];
      s[2] = left ? mine_theirs[2] : mine_theirs[1];
    }
    for (int mask = 1; mask < 2 * d; mask <<= 1) {  // x + y == y + x: every member ends with identical sums
      pairs.sendrecv(me ^ mask, sums, 3 * tensors * sizeof(double), received, 3 * tensors * sizeof(double));
      for (size_t i = 0; i < 3 * tensors; ++i) sums[i] += received[i];
    }
    for (size_t t = 0; t < tensors; ++t) {
      const size_t a = std::max(start[t], keep_lo), b = std::min(start[t + 1], keep_hi);
      if (a >= b) continue;
      const double* s = sums + 3 * t;
      const double c_left = coefficient(s[0], s[1]), c_right = coefficient(s[0], s[2]);
      combine_any(dtype, data + a * esize, incoming + (a - keep_lo) * esize, b - a, left ? c_left : c_right,
                  left ? c_right : c_left);
    }
    lo = keep_lo, hi = keep_hi;
  }

  // The way back: at each distance, in reverse, swap my slice of the shared window for my partner's.
  for (int level = static_cast<int>(windows.size()) - 1; level >= 0; --level) {
    const int d = 1 << level;
    const Window w = windows[level];
    const size_t mid = w.lo + (w.hi - w.lo) / 2;
    const bool left = (me & d) == 0;
    const size_t other_lo = left ? mid : w.lo, other_hi = left ? w.hi : mid;
    pairs.sendrecv(me ^ d, data + lo * esize, (hi - lo) * esize, data + other_lo * esize,
                   (other_hi - other_lo) * esize);
    lo = w.lo, hi = w.hi;
  }
}

}  // namespace hvdlite

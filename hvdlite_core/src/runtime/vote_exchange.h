// The negotiation's exchange: every member's vote words and eager head reduced into every member's, as a recursive
// doubling allreduce, plus an eager tail (runtime/eager.h) that only some cycles need.
//
// A member's message is its fixed part (the vote words and the eager head, the same size on every member) and then
// a window of its tail: the words from its first to its last tail segment with data, often none. The window rides
// in the upper half of word 0, which the vote's flags leave free. A pair reduces the tails over the overlap of
// their windows and keeps that overlap: a member holds no hit outside its window, so the segments outside the
// overlap cannot be ready anywhere and nobody reads them. So a cycle with nothing in the tail costs what it cost
// without one, and a cycle that carries a tail tensor pays for its bytes, not for the whole tail.
//
// Each member sends its window before it knows whether the peer sends one (so it costs no extra round trip), and
// receives the peer's after the fixed part says where it lies. That needs the tail to fit what a channel holds
// unread, which the bound on EAGER_ALLREDUCE_BYTES keeps it within (common/config.cc).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>

#include "collectives/algorithms.h"

namespace hvdlite {

// The tail window a message announces: [begin, end) in 8-byte words from the start of the tail; empty when equal.
struct TailWindow {
  size_t begin = 0, end = 0;
  size_t words() const { return end > begin ? end - begin : 0; }
};
inline TailWindow tail_window(const uint64_t* message) {
  return {static_cast<size_t>((message[0] >> 32) & 0xffff), static_cast<size_t>(message[0] >> 48)};
}
inline void set_tail_window(uint64_t* message, TailWindow window) {
  if (window.words() == 0) window = {};
  message[0] = (message[0] & 0xffffffffull) | (static_cast<uint64_t>(window.begin) << 32) |
               (static_cast<uint64_t>(window.end) << 48);
}

// dst (op)= src over bytes [from, to) of two tails (dst and src point at the tails' starts).
using TailReducer = std::function<void(char* dst, const char* src, size_t from, size_t to)>;

// Collective over comm. words: fixed_words, then room for tail_capacity_words (the whole tail; at most 65,535).
// reduce_fixed: dst (op)= src over the fixed parts; word 0's upper half is then overwritten with the windows'
// overlap, and reduce_tail applied over it.
void exchange_votes(Communicator& comm, uint64_t* words, size_t fixed_words, size_t tail_capacity_words,
                    const BufferReducer& reduce_fixed, const TailReducer& reduce_tail);

}  // namespace hvdlite

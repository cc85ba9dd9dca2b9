// The negotiation's exchange: every member's votes reduced into every member's, as a recursive doubling
// allreduce in which a member sends, of most parts of its votes, only a window.
//
// The votes are a flags word and then sections. A whole section (the eager head) travels entire every time. Of a
// windowed section a member sends the words from the first to the last that differ from what every member holds
// there by default, often none: a vote block of thousands of cached positions costs what its few hits or
// conflicts cost, and a cycle's exchange stays small enough for a channel's one-slot message path. Two kinds:
//
// - Overlap: the default is zero and the reduction is zero wherever one side holds zero (the ready bits, ANDed;
//   the eager tail, whose segments count only where every member had a hit and so sent them). A pair keeps the
//   overlap of its two windows.
// - Span: the default is a word every member knows (all ones for the conflict bits, the named positions for the
//   unnamed vote) and the reduction is a bitwise AND. A pair keeps the span of its two windows.
//
// The windows ride in the flags word's upper half and in header words after it. A pair swaps the first parts of
// their messages, which say how long the rest is, then the rests both ways at once: windows cost no extra round
// trip where the first part holds them, and messages of any length cross.
#pragma once
#include <cstddef>
#include <cstdint>

namespace hvdlite {

class Communicator;

// A window [begin, end) of a section's words; empty when end <= begin.
struct VoteWindow {
  size_t begin, end;  // no initializers: the exchange's arrays of them are set where used, never cleared
  size_t words() const { return end > begin ? end - begin : 0; }
};

// Windows are announced in 16 bits of words.
constexpr size_t kMaxWindowedWords = 0xffff;

// dst (op)= src over words [from, to) of one section (dst and src point at the section's start). A plain function
// and its context: the lane sets up a section list for every exchange of a few hundred nanoseconds.
using SectionReducer = void (*)(const void* context, uint64_t* dst, const uint64_t* src, size_t from, size_t to);

struct VoteSection {
  enum class Kind {
    kWhole,          // sent entire; reduce
    kOverlap,        // window of the nonzero words; reduce; the words beyond the kept window are zeroed
    kOverlapUnread,  // the same with the window given, and nothing beyond it cleared: nobody reads there
    kSpan,           // window of the words that differ from baseline; bitwise AND
  };
  Kind kind = Kind::kWhole;
  size_t offset = 0;                   // in words from the start of the votes (the flags word is word 0)
  size_t count = 0;                    // words
  SectionReducer reduce = nullptr;     // kWhole, kOverlap, kOverlapUnread
  const void* context = nullptr;       // reduce's
  const uint64_t* baseline = nullptr;  // kSpan: each word's default (nullptr: all ones)
  VoteWindow given{};                  // kOverlapUnread: what this member sends
};

// The votes' layout: a prefix sent whole (the flags word, then prefix_words - 1 words that reduce_prefix reduces),
// then the sections, at increasing offsets.
struct VoteLayout {
  size_t prefix_words = 1;
  SectionReducer reduce_prefix = nullptr;  // over words [1, prefix_words) of the votes
  const void* prefix_context = nullptr;
  static constexpr size_t kMaxSections = 6;
  VoteSection sections[kMaxSections];
  size_t section_count = 0;
};

// Collective over comm. votes[0]: flags in its lower half, ANDed; the upper half must be zero. Afterwards the
// prefix and every section hold the reduction, except a kOverlapUnread section beyond its kept window.
void exchange_votes(Communicator& comm, uint64_t* votes, const VoteLayout& layout);

}  // namespace hvdlite

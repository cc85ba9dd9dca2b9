#include "runtime/vote_exchange.h"

#include <algorithm>
#include <array>
#include <string>

#include "collectives/communicator.h"
#include "collectives/power_of_two_fold.h"
#include "common/status.h"

namespace hvdlite {
namespace {

constexpr uint64_t kFlagsHalf = 0xffffffffull;

bool windowed(const VoteSection& s) { return s.kind != VoteSection::Kind::kWhole; }

uint64_t encode(VoteWindow w) {
  if (w.words() == 0) return 0;
  return static_cast<uint64_t>(w.begin) | (static_cast<uint64_t>(w.end) << 16);
}
VoteWindow decode(uint64_t half) {
  return {static_cast<size_t>(half & 0xffff), static_cast<size_t>((half >> 16) & 0xffff)};
}

// Where a message announces its nth windowed section's window: the flags word's upper half for the first, then
// the halves of the header words after it.
uint64_t& window_word(uint64_t* message, size_t nth) { return message[nth == 0 ? 0 : 1 + (nth - 1) / 2]; }
unsigned window_shift(size_t nth) { return nth == 0 ? 32 : 32 * ((nth - 1) % 2); }

VoteWindow overlap(VoteWindow a, VoteWindow b) {
  VoteWindow both{std::max(a.begin, b.begin), std::min(a.end, b.end)};
  return both.words() ? both : VoteWindow{};
}
VoteWindow span(VoteWindow a, VoteWindow b) {
  if (a.words() == 0) return b;
  if (b.words() == 0) return a;
  return {std::min(a.begin, b.begin), std::max(a.end, b.end)};
}

uint64_t baseline_at(const VoteSection& s, size_t w) { return s.baseline ? s.baseline[w] : ~0ull; }

// A word's difference from its default: nonzero where it differs.
uint64_t difference(const VoteSection& s, const uint64_t* words, size_t w) {
  return s.kind == VoteSection::Kind::kOverlap ? words[w] : words[w] ^ baseline_at(s, w);
}

// Whether any of the kChunk words from w differs from its default: one test for a run of defaults, in a loop the
// compiler vectorizes, where a block of thousands of positions holds a hit or two.
constexpr size_t kChunk = 8;
bool chunk_differs(const VoteSection& s, const uint64_t* words, size_t w) {
  uint64_t any = 0;
  if (s.kind == VoteSection::Kind::kOverlap) {
    for (size_t i = 0; i < kChunk; ++i) any |= words[w + i];
  } else if (s.baseline) {
    for (size_t i = 0; i < kChunk; ++i) any |= words[w + i] ^ s.baseline[w + i];
  } else {
    for (size_t i = 0; i < kChunk; ++i) any |= ~words[w + i];
  }
  return any != 0;
}

// The words of a section that differ from their defaults: the first to the last.
VoteWindow initial_window(const VoteSection& s, const uint64_t* words) {
  if (s.kind == VoteSection::Kind::kOverlapUnread) return s.given.words() ? s.given : VoteWindow{};
  size_t begin = 0;
  while (begin + kChunk <= s.count && !chunk_differs(s, words, begin)) begin += kChunk;
  while (begin < s.count && !difference(s, words, begin)) ++begin;
  if (begin == s.count) return {};
  size_t end = s.count;
  while (end >= begin + kChunk && !chunk_differs(s, words, end - kChunk)) end -= kChunk;
  while (!difference(s, words, end - 1)) --end;
  return {begin, end};
}

class VoteExchange {
 public:
  VoteExchange(Communicator& comm, uint64_t* votes, const VoteLayout& layout)
      : comm_(comm),
        progress_(comm.progress()),
        votes_(votes),
        layout_(layout),
        sections_(layout.sections),
        count_(layout.section_count) {
    size_t windowed_count = 0, whole_words = 0;
    capacity_ = layout.prefix_words;
    for (size_t i = 0; i < count_; ++i) {
      const VoteSection& s = sections_[i];
      capacity_ += s.count;
      if (!windowed(s)) {
        whole_words += s.count;
        continue;
      }
      if (s.count > kMaxWindowedWords) throw Error(StatusCode::kInternal, "a vote section outgrew its window");
      ++windowed_count;
      mine_[i] = initial_window(s, votes + s.offset);
    }
    header_words_ = windowed_count / 2;  // the first window rides in the flags word
    known_words_ = layout.prefix_words + header_words_ + whole_words;
    capacity_ += header_words_;
    char* scratch = comm.scratch(2 * capacity_ * 8);
    out_ = reinterpret_cast<uint64_t*>(scratch);
    in_ = out_ + capacity_;
  }

  // Recursive doubling, with the members beyond a power of two folded in first and answered last, as
  // collectives/power_of_two_fold.h pairs them.
  void run() {
    const FoldShape shape(comm_.size(), comm_.rank());
    if (shape.neighbour >= 0) {
      Channel* neighbour = comm_.channel(shape.neighbour);
      if (shape.virtual_rank < 0) {  // sits out
        send(neighbour);
        receive(neighbour);
        adopt();
        return;
      }
      receive(neighbour);
      combine();
    }
    for (int mask = 1; mask < shape.p; mask <<= 1) {
      swap(comm_.channel(shape.member(shape.virtual_rank ^ mask)));
      combine();
    }
    if (shape.neighbour >= 0) send(comm_.channel(shape.neighbour));
  }

 private:
  // A pair's exchange: the first parts both ways at once, then the rest both ways at once, so that messages of any
  // length cross. Where the words every message begins with fit a slot of the channel's message path, the first
  // part is as much of the message as fits one (all of it, mostly: the windows and a kilobyte collective riding in
  // the exchange fit too), and the peer learns its size from the slot; otherwise those words on the stream.
  void swap(Channel* peer) {
    const size_t mine = pack();
    const size_t slot_words = peer->message_capacity() / 8;
    const bool first_as_message = known_words_ <= slot_words;
    const size_t first = first_as_message ? std::min(slot_words, mine) : known_words_;
    Transfer rest[2];
    size_t count = 0;
    if (mine > first) rest[count++] = Transfer::Send(peer, out_ + first, (mine - first) * 8);
    size_t received = first;  // the peer's first part, in words
    if (first_as_message) {
      // Only the rest's length waits on the peer's first part, not its sending: with the first part on the message
      // path, the stream carries nothing before the rest, so it leaves right after the first part (as much as the
      // stream takes at once) and crosses with it instead of a one-way trip later.
      Transfer first_part[2] = {Transfer::Send(peer, out_, first * 8),
                                Transfer::Recv(peer, in_, std::min(slot_words, capacity_) * 8)};
      first_part[0].message = first_part[1].message = first_part[1].up_to = true;
      progress_.start(first_part, 1);
      if (count) progress_.start(rest, 1);
      progress_.run(first_part, 2);
      received = first_part[1].length / 8;
      if (received * 8 != first_part[1].length || received < known_words_) throw malformed(peer);
    } else {
      progress_.exchange(peer, out_, in_, first * 8);
    }
    const size_t theirs = read_windows(peer);
    // A first part on the message path is the whole message where that fits, else a full slot.
    if (first_as_message && received != std::min(theirs, slot_words)) throw malformed(peer);
    if (theirs > received) rest[count++] = Transfer::Recv(peer, in_ + received, (theirs - received) * 8);
    if (count) progress_.run(rest, count);
  }

  static Error malformed(const Channel* peer) {
    return Error(StatusCode::kInternal, "negotiation message from rank " + std::to_string(peer->peer()) +
                                            " is not as long as its windows announce");
  }

  // To or from a member folded in, on the stream: the words every message begins with, then the windows.
  void send(Channel* peer) {
    Transfer whole = Transfer::Send(peer, out_, pack() * 8);
    progress_.run(&whole, 1);
  }
  void receive(Channel* peer) {
    Transfer known = Transfer::Recv(peer, in_, known_words_ * 8);
    progress_.run(&known, 1);
    const size_t total = read_windows(peer);
    if (total <= known_words_) return;
    Transfer rest = Transfer::Recv(peer, in_ + known_words_, (total - known_words_) * 8);
    progress_.run(&rest, 1);
  }

  // This member's message into out_: the flags word, the header, the rest of the prefix, then each section (whole,
  // or its window). Returns its length in words.
  size_t pack() {
    uint64_t* header = out_ + 1;
    std::fill_n(header, header_words_, 0);
    out_[0] = votes_[0] & kFlagsHalf;
    uint64_t* payload = std::copy_n(votes_ + 1, layout_.prefix_words - 1, header + header_words_);
    size_t nth = 0;
    for (size_t i = 0; i < count_; ++i) {
      const VoteSection& s = sections_[i];
      const uint64_t* words = votes_ + s.offset;
      if (!windowed(s)) {
        payload = std::copy_n(words, s.count, payload);
        continue;
      }
      const VoteWindow w = mine_[i];
      window_word(out_, nth) |= encode(w) << window_shift(nth);
      ++nth;
      payload = std::copy_n(words + w.begin, w.words(), payload);
    }
    return static_cast<size_t>(payload - out_);
  }

  // The windows the received first part announces (into theirs_); returns the message's length in words.
  size_t read_windows(Channel* peer) {
    size_t total = known_words_, nth = 0;
    for (size_t i = 0; i < count_; ++i) {
      const VoteSection& s = sections_[i];
      if (!windowed(s)) continue;
      const VoteWindow w = decode(window_word(in_, nth) >> window_shift(nth));
      ++nth;
      // The layouts agree on every rank; a window past this one's section would write past the buffer.
      if (w.words() && w.end > s.count)
        throw Error(StatusCode::kInternal, "negotiation message from rank " + std::to_string(peer->peer()) +
                                               " announces a window past its section");
      theirs_[i] = w.words() ? w : VoteWindow{};
      total += theirs_[i].words();
    }
    return total;
  }

  void combine() {
    votes_[0] &= in_[0] & kFlagsHalf;
    const uint64_t* payload = in_ + 1 + header_words_;
    if (layout_.prefix_words > 1) {  // the reducer indexes from word 1 of both
      layout_.reduce_prefix(layout_.prefix_context, votes_, payload - 1, 1, layout_.prefix_words);
      payload += layout_.prefix_words - 1;
    }
    for (size_t i = 0; i < count_; ++i) {
      const VoteSection& s = sections_[i];
      uint64_t* dst = votes_ + s.offset;
      if (!windowed(s)) {
        s.reduce(s.context, dst, payload, 0, s.count);
        payload += s.count;
        continue;
      }
      const VoteWindow mine = mine_[i], theirs = theirs_[i];
      const uint64_t* src = payload;  // their window's words
      payload += theirs.words();
      if (s.kind == VoteSection::Kind::kSpan) {
        for (size_t w = theirs.begin; w < theirs.end; ++w) dst[w] &= src[w - theirs.begin];
        if (s.baseline) {  // where only this member's window reaches, theirs holds the default
          for (size_t w = mine.begin; w < mine.end; ++w) {
            if (w < theirs.begin || w >= theirs.end) dst[w] &= s.baseline[w];
          }
        }
        mine_[i] = span(mine, theirs);
        continue;
      }
      const VoteWindow both = overlap(mine, theirs);
      if (both.words()) {
        // Their words read where they arrived: the reducer reads word w at src_words[w]. Through an integer, as
        // the section's start may lie before the received words.
        const auto* src_words =
            reinterpret_cast<const uint64_t*>(reinterpret_cast<uintptr_t>(src) - theirs.begin * sizeof(uint64_t));
        s.reduce(s.context, dst, src_words, both.begin, both.end);
      }
      if (s.kind == VoteSection::Kind::kOverlap) clear_outside(dst, mine, both);
      mine_[i] = both;
    }
  }

  // The reduction, received whole by a member that sat out.
  void adopt() {
    votes_[0] = in_[0] & kFlagsHalf;
    const uint64_t* payload = in_ + 1 + header_words_;
    std::copy_n(payload, layout_.prefix_words - 1, votes_ + 1);
    payload += layout_.prefix_words - 1;
    for (size_t i = 0; i < count_; ++i) {
      const VoteSection& s = sections_[i];
      uint64_t* dst = votes_ + s.offset;
      if (!windowed(s)) {
        std::copy_n(payload, s.count, dst);
        payload += s.count;
        continue;
      }
      const VoteWindow mine = mine_[i], theirs = theirs_[i];
      if (s.kind == VoteSection::Kind::kSpan) {
        for (size_t w = mine.begin; w < mine.end; ++w) dst[w] = baseline_at(s, w);
      } else if (s.kind == VoteSection::Kind::kOverlap) {
        std::fill(dst + mine.begin, dst + mine.begin + mine.words(), 0);
      }
      std::copy_n(payload, theirs.words(), dst + theirs.begin);
      payload += theirs.words();
      mine_[i] = theirs;
    }
  }

  // Zeroes the words of was that kept does not cover.
  static void clear_outside(uint64_t* words, VoteWindow was, VoteWindow kept) {
    for (size_t w = was.begin; w < was.end; ++w) {
      if (w < kept.begin || w >= kept.end) words[w] = 0;
    }
  }

  Communicator& comm_;
  Progress& progress_;
  uint64_t* votes_;
  const VoteLayout& layout_;
  const VoteSection* sections_;
  size_t count_;
  // Set for the windowed sections only (before the first exchange, and as each message arrives).
  std::array<VoteWindow, VoteLayout::kMaxSections> mine_, theirs_;
  size_t header_words_ = 0;  // after the flags word
  size_t known_words_ = 0;   // flags, header and whole sections: what every message begins with
  size_t capacity_ = 0;      // the longest message, in words
  uint64_t* out_ = nullptr;
  uint64_t* in_ = nullptr;
};

}  // namespace

void exchange_votes(Communicator& comm, uint64_t* votes, const VoteLayout& layout) {
  if (comm.size() == 1) return;
  VoteExchange(comm, votes, layout).run();
}

}  // namespace hvdlite

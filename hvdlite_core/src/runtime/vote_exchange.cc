#include "runtime/vote_exchange.h"

#include <algorithm>
#include <string>

#include "collectives/communicator.h"
#include "collectives/power_of_two_fold.h"
#include "common/status.h"

namespace hvdlite {
namespace {

class VoteExchange {
 public:
  VoteExchange(Communicator& comm, uint64_t* words, size_t fixed_words, size_t tail_capacity_words,
               const BufferReducer& reduce_fixed, const TailReducer& reduce_tail)
      : comm_(comm),
        progress_(comm.progress()),
        mine_(words),
        fixed_(fixed_words * 8),
        tail_capacity_words_(tail_capacity_words),
        incoming_(reinterpret_cast<uint64_t*>(comm.scratch((fixed_words + tail_capacity_words) * 8))),
        reduce_fixed_(reduce_fixed),
        reduce_tail_(reduce_tail) {}

  // Recursive doubling, with the members beyond a power of two folded in first and answered last, as
  // collectives/power_of_two_fold.h pairs them.
  void run() {
    const FoldShape shape(comm_.size(), comm_.rank());
    if (shape.neighbour >= 0) {
      Channel* neighbour = comm_.channel(shape.neighbour);
      if (shape.virtual_rank < 0) {  // sits out
        send(neighbour, false);
        receive(neighbour, mine_, false);
        return;
      }
      receive(neighbour, incoming_, false);
      combine();
    }
    for (int mask = 1; mask < shape.p; mask <<= 1) {
      Channel* peer = comm_.channel(shape.member(shape.virtual_rank ^ mask));
      // A fixed part that fits the channel's message path goes there, beside the stream that carries the window.
      const bool message = fixed_ <= peer->message_capacity();
      send(peer, message);
      receive(peer, incoming_, message);
      combine();
    }
    if (shape.neighbour >= 0) send(comm_.channel(shape.neighbour), false);
  }

 private:
  char* tail(uint64_t* message) const { return reinterpret_cast<char*>(message) + fixed_; }

  // The fixed part, then the window. Each send completes once the channel holds it, whatever the peer does.
  void send(Channel* peer, bool message) {
    Transfer fixed = Transfer::Send(peer, mine_, fixed_);
    fixed.message = message;
    progress_.run(&fixed, 1);
    const TailWindow window = tail_window(mine_);
    if (window.words() == 0) return;
    Transfer part = Transfer::Send(peer, tail(mine_) + window.begin * 8, window.words() * 8);
    progress_.run(&part, 1);
  }

  // A fixed part, then the window it announces, where it lies in the tail.
  void receive(Channel* peer, uint64_t* into, bool message) {
    Transfer fixed = Transfer::Recv(peer, into, fixed_);
    fixed.message = message;
    progress_.run(&fixed, 1);
    const TailWindow window = tail_window(into);
    if (window.words() == 0) return;
    // The layouts agree on every rank; a window past this one's tail would write past the buffer.
    if (window.end > tail_capacity_words_)
      throw Error(StatusCode::kInternal, "negotiation message from rank " + std::to_string(peer->peer()) +
                                             " announces an eager window past the region");
    Transfer part = Transfer::Recv(peer, tail(into) + window.begin * 8, window.words() * 8);
    progress_.run(&part, 1);
  }

  void combine() {
    const TailWindow a = tail_window(mine_), b = tail_window(incoming_);
    const TailWindow both{std::max(a.begin, b.begin), std::min(a.end, b.end)};
    reduce_fixed_(mine_, incoming_);
    set_tail_window(mine_, both);
    if (both.words() > 0) reduce_tail_(tail(mine_), tail(incoming_), both.begin * 8, both.end * 8);
  }

  Communicator& comm_;
  Progress& progress_;
  uint64_t* mine_;
  const size_t fixed_;  // bytes
  const size_t tail_capacity_words_;
  uint64_t* incoming_;
  const BufferReducer& reduce_fixed_;
  const TailReducer& reduce_tail_;
};

}  // namespace

void exchange_votes(Communicator& comm, uint64_t* words, size_t fixed_words, size_t tail_capacity_words,
                    const BufferReducer& reduce_fixed, const TailReducer& reduce_tail) {
  if (comm.size() == 1) return;
  VoteExchange(comm, words, fixed_words, tail_capacity_words, reduce_fixed, reduce_tail).run();
}

}  // namespace hvdlite

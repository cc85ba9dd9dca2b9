// Timeline: a Chrome-trace (chrome://tracing, Perfetto) record, written by rank 0 like Horovod's, of when each
// tensor was enqueued and negotiated and when its collective ran. Enabled at init by HVDLITE_TIMELINE=<file> (or
// HOROVOD_TIMELINE), or at run time by hvdlite_start_timeline / hvdlite_stop_timeline. Events come from the cycle's
// thread, start/stop from any thread: a mutex orders them. Each file is well formed on its own: a span begun before
// the file was opened writes no end into it, and spans still open at close are ended there.
// Events are written whole and soon: the cycle hands them to the file at least every kFlushInterval (and on
// any idle cycle), so a reader sees a collective within milliseconds of its end, and a killed job leaves a
// file cut between two events, which trace viewers open (the closing bracket of the JSON array is optional).
#pragma once
#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace hvdlite {

class Timeline {
 public:
  ~Timeline();
  // Starts writing to path, closing the file written so far (if any). Throws kInvalidArgument if it cannot.
  // mark_cycles: an instant "CYCLE_START" event at each cycle that executed something.
  void open(const std::string& path, bool mark_cycles = false);
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  // Phase "B" at `start` (when the tensor was enqueued), for a tensor row named `tensor`.
  void begin(const std::string& tensor, const std::string& activity, std::chrono::steady_clock::time_point start);
  void begin(const std::string& tensor, const std::string& activity) {
    begin(tensor, activity, std::chrono::steady_clock::now());
  }
  void end(const std::string& tensor);
  void mark_cycle();
  // Writes the events held back, if the last write is kFlushInterval old or `quiet` (the cycle did nothing);
  // called once a cycle, from the cycle's thread.
  void flush_if_due(bool quiet);
  // A counter event ("ph": "C"): named figures the caller measured (bytes a compressor sent this step, ...),
  // drawn as a graph on a row of its own.
  void counter(const std::string& name, const std::vector<std::pair<std::string, double>>& values);
  void close();
  // Names the tensors that one collective carries packed together (an optimizer's gradient bucket): its spans are
  // then drawn on each member's row, so a trace shows every gradient as when each was a collective of its own.
  // Kept for the process, across timelines and re-initialisations; an empty list forgets the name.
  static void describe_members(const std::string& tensor, std::vector<std::string> members);

 private:
  struct Row {
    int id;
    int open_spans;
  };
  Row& row(const std::string& tensor);
  // The rows a tensor's spans go to: its members' where it has some, else its own.
  std::vector<std::string> rows_of(const std::string& tensor) const;
  long long micros(std::chrono::steady_clock::time_point t) const;
  void write(const std::string& event);
  void flush_locked();
  void close_locked();

  static constexpr std::chrono::milliseconds kFlushInterval{20};
  std::mutex mutex_;
  std::atomic<bool> enabled_{false};
  int fd_ = -1;
  std::string held_;  // whole events not yet written to fd_
  std::chrono::steady_clock::time_point last_flush_;
  bool mark_cycles_ = false;
  std::chrono::steady_clock::time_point origin_;
  std::unordered_map<std::string, Row> rows_;
  bool first_ = true;
};

}  // namespace hvdlite

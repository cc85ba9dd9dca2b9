// Which flat allreduce algorithm runs at which message size, on one host: chosen from measurements of this
// machine (measure_allreduce.cc, cached by choice/algorithm_cache.h), because the algorithms' crossover sizes
// differ from one processor to the next. A list of size bands, each from its min_bytes to the next one's.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "collectives/algorithms.h"

namespace hvdlite {

// One measured probe size: the seconds of each candidate there (max over members, median over repeats); a
// negative figure means "not a candidate at this size".
struct AllreduceProbe {
  size_t bytes;
  double seconds[3];  // indexed by AllreduceAlgorithm
};

// One measurement (a list of probes, ascending) as one line of text and back: "4096:1.2e-05,2.5e-05,-1;32768:..."
// (bytes, then the seconds of rd, ring and single copy). parse_probes() accepts exactly that form.
std::string serialize_probes(const std::vector<AllreduceProbe>& probes);
bool parse_probes(const std::string& text, std::vector<AllreduceProbe>* probes);

// Whether measurements can be weighed together: the same probe sizes, each with the same candidates.
bool probes_match(const std::vector<std::vector<AllreduceProbe>>& measurements);

class AllreduceTable {
 public:
  struct Band {
    size_t min_bytes;
    AllreduceAlgorithm algorithm;
  };
  // At each probe size, the fixed rules' algorithm (recursive doubling below small_message_bytes, else the ring)
  // unless another candidate is clearly faster (by kClearMargin): a measurement at init is not the training
  // path, and a near tie is noise, so the defaults hold where the figures do not clearly disagree. Each probe's
  // band reaches halfway (geometrically) to its neighbours'; adjacent bands with the same algorithm are merged.
  // Probes in ascending size.
  static constexpr double kClearMargin = 0.9;
  static AllreduceTable from_probes(const std::vector<AllreduceProbe>& probes, size_t small_message_bytes);
  // Several measurements (probes_match) vote: at each probe, the algorithm that more than half of them chose by the
  // rule above, else the fixed rules' one. A loaded moment or a far vCPU placement during one measurement then
  // cannot decide the table, and where the measurements disagree the defaults hold, which cost least when wrong.
  static AllreduceTable from_measurements(const std::vector<std::vector<AllreduceProbe>>& measurements,
                                          size_t small_message_bytes);
  // "rd@0,ring@11585,single_copy@724077": the cache's and build_info's form. parse() accepts exactly what
  // serialize() writes (bands ascending, the first at 0) and returns false on anything else.
  std::string serialize() const;
  static bool parse(const std::string& text, AllreduceTable* table);

  bool empty() const { return bands_.empty(); }
  AllreduceAlgorithm choose(size_t bytes) const;
  const std::vector<Band>& bands() const { return bands_; }

 private:
  std::vector<Band> bands_;
};

}  // namespace hvdlite

// The names the allreduce algorithms go by in build_info, the timeline, the cache file and the knobs.
#include "collectives/algorithms.h"

namespace hvdlite {

const char* algorithm_name(AllreduceAlgorithm algorithm) {
  switch (algorithm) {
    case AllreduceAlgorithm::kRecursiveDoubling:
      return "rd";
    case AllreduceAlgorithm::kRing:
      return "ring";
    case AllreduceAlgorithm::kSingleCopy:
      return "single_copy";
    case AllreduceAlgorithm::kRecursiveHalving:
      return "rhd";
  }
  return "?";
}

}  // namespace hvdlite

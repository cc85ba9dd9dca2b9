// Knobs every rank must share: each rank plans fusion (FUSION_THRESHOLD, FUSION_TENSOR_LIMIT), indexes the
// response cache (CACHE_CAPACITY), lays out its eager region (EAGER_ALLREDUCE_BYTES) and chooses algorithms
// (SMALL_MESSAGE_BYTES, SINGLE_COPY_ALLREDUCE, HIERARCHICAL_ALLREDUCE, the cost model's link figures) on its own, so
// differing values would mean different collectives: wrong results or a hang. At init the ranks compare them, and
// on a difference every rank fails with the same error naming the knob, the values and the ranks.
#pragma once

namespace hvdlite {

class Communicator;
struct Config;

// Collective over `world`; throws Error(kInvalidArgument) on every rank when a knob differs.
void check_config_agreement(Communicator& world, const Config& config);

}  // namespace hvdlite

#include "choice/select.h"

#include <algorithm>

#include "collectives/communicator.h"
#include "common/config.h"

namespace hvdlite {
namespace {

size_t power_of_two_at_most(int n) {
  size_t p = 1;
  while (p * 2 <= static_cast<size_t>(n)) p *= 2;
  return p;
}

int forced_algorithm(int setting) {
  switch (setting) {
    case Config::kForcedRd:
      return static_cast<int>(AllreduceAlgorithm::kRecursiveDoubling);
    case Config::kForcedRhd:
      return static_cast<int>(AllreduceAlgorithm::kRecursiveHalving);
    case Config::kForcedRing:
      return static_cast<int>(AllreduceAlgorithm::kRing);
    case Config::kForcedSingleCopy:
      return static_cast<int>(AllreduceAlgorithm::kSingleCopy);
    default:
      return -1;
  }
}

}  // namespace

Layout layout_of(const Communicator& comm, const Communicator* world) {
  Layout layout;
  layout.size = comm.size();
  layout.hosts = std::max(comm.host_count(), 1);
  layout.tiers = comm.local() != nullptr && comm.local()->size() > 1 && comm.cross() != nullptr;
  layout.per_host = layout.tiers ? comm.local()->size() : std::max(1, layout.size / layout.hosts);
  layout.single_copy = comm.single_copy_local();
  layout.world = &comm == world;
  return layout;
}

ChoiceSettings settings_from(const Config& config) {
  ChoiceSettings settings;
  settings.small_message_bytes = static_cast<size_t>(config.small_message_bytes);
  settings.single_copy_bytes = config.single_copy_allreduce ? settings.small_message_bytes
                                                            : static_cast<size_t>(config.single_copy_allreduce_bytes);
  settings.forced = forced_algorithm(config.allreduce_algorithms);
  settings.streaming_store_bytes = static_cast<size_t>(config.streaming_store_bytes);
  settings.two_tier_allreduce = config.hierarchical_allreduce != 0;
  settings.two_tier_allgather = config.hierarchical_allgather != 0;
  settings.pipeline_bytes = static_cast<size_t>(std::max<int64_t>(config.hierarchical_pipeline_bytes, 0));
  return settings;
}

size_t pipeline_chunks(size_t bytes, size_t pipeline_bytes) {
  if (pipeline_bytes == 0 || bytes <= pipeline_bytes) return 1;
  // Beyond 64 chunks the per-chunk latencies outweigh what more overlap could gain.
  return std::min<size_t>((bytes + pipeline_bytes - 1) / pipeline_bytes, 64);
}

AllreducePlan select_allreduce(const Layout& layout, size_t bytes, size_t count, const ChoiceSettings& settings) {
  AllreducePlan plan;
  if (layout.tiers && settings.two_tier_allreduce) {
    plan.two_tier = true;
    plan.chunks = std::min(pipeline_chunks(bytes, settings.pipeline_bytes),
                           std::max<size_t>(1, count / static_cast<size_t>(layout.per_host)));
    return plan;
  }
  plan.algorithm = select_flat_allreduce(layout, bytes, count, settings);
  plan.cold_output = settings.streaming_store_bytes > 0 && bytes >= settings.streaming_store_bytes;
  return plan;
}

AllreduceAlgorithm select_flat_allreduce(const Layout& layout, size_t bytes, size_t count,
                                         const ChoiceSettings& settings) {
  AllreduceAlgorithm algorithm;
  if (settings.forced >= 0) {
    algorithm = static_cast<AllreduceAlgorithm>(settings.forced);
  } else if (layout.world && layout.hosts == 1 && !settings.table.empty()) {
    algorithm = settings.table.choose(bytes);
  } else if (layout.single_copy && settings.single_copy_bytes > 0 && bytes >= settings.single_copy_bytes) {
    algorithm = AllreduceAlgorithm::kSingleCopy;
  } else {
    algorithm =
        bytes < settings.small_message_bytes ? AllreduceAlgorithm::kRecursiveDoubling : AllreduceAlgorithm::kRing;
  }
  if (algorithm == AllreduceAlgorithm::kSingleCopy && !layout.single_copy) algorithm = AllreduceAlgorithm::kRing;
  if (algorithm == AllreduceAlgorithm::kRing && count < static_cast<size_t>(layout.size)) {
    algorithm = AllreduceAlgorithm::kRecursiveDoubling;
  }
  if (algorithm == AllreduceAlgorithm::kRecursiveHalving && count < power_of_two_at_most(layout.size)) {
    algorithm = AllreduceAlgorithm::kRecursiveDoubling;
  }
  return algorithm;
}

AllgatherAlgorithm select_allgather(const Layout& layout, size_t total_bytes, const ChoiceSettings& settings) {
  if (layout.tiers && settings.two_tier_allgather) return AllgatherAlgorithm::kTwoTier;
  if (layout.single_copy && total_bytes >= settings.small_message_bytes) return AllgatherAlgorithm::kSingleCopy;
  return AllgatherAlgorithm::kRing;
}

BroadcastAlgorithm select_broadcast(const Layout& layout, size_t bytes, const ChoiceSettings& settings) {
  if (bytes < settings.small_message_bytes) return BroadcastAlgorithm::kTree;
  return layout.single_copy ? BroadcastAlgorithm::kSingleCopy : BroadcastAlgorithm::kChain;
}

}  // namespace hvdlite

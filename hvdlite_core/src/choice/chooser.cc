#include "choice/chooser.h"

#include <algorithm>

#include "choice/algorithm_cache.h"
#include "transport/mesh.h"

namespace hvdlite {
namespace {

AllreduceAlgorithm forced_algorithm(int setting) {
  switch (setting) {
    case Config::kForcedRhd:
      return AllreduceAlgorithm::kRecursiveHalving;
    case Config::kForcedRing:
      return AllreduceAlgorithm::kRing;
    case Config::kForcedSingleCopy:
      return AllreduceAlgorithm::kSingleCopy;
    default:
      return AllreduceAlgorithm::kRecursiveDoubling;
  }
}

size_t power_of_two_at_most(int n) {
  size_t p = 1;
  while (p * 2 <= static_cast<size_t>(n)) p *= 2;
  return p;
}

}  // namespace

Chooser::Chooser(const Config& config) : config_(config) {
  derived_.streaming_store_bytes = config.streaming_store_bytes;
  derived_.streaming_origin = config.streaming_store_bytes_set ? "knob" : "default";
  derived_.adaptive_allreduce_bytes = config.adaptive_allreduce_bytes;
}

void Chooser::establish(Communicator& world, Mesh& mesh) {
  world_ = &world;
  if (world.size() < 2 || config_.cpu_operations != 0) return;  // MPI runs its own algorithms
  // Ranks on several hosts, several on each: the two tiers of links, for the two-tier choice (cost_model.h).
  if (world.local() && world.local()->size() > 1 &&
      (config_.hierarchical_allreduce < 0 || config_.hierarchical_allgather < 0)) {
    mesh.set_link_costs(measure_link_costs(world, config_));
  }
  // One host: the flat algorithms by size from this machine's figures (cached per machine).
  if (world.host_count() != 1 || config_.allreduce_algorithms != 0) return;
  EstablishedTable established = establish_allreduce_table(world, config_);
  derived_.table = established.table;
  derived_.table_origin = established.origin;
  derived_.table_path = established.path;
  derived_.table_measurements = established.measurements;
  if (!config_.adaptive_allreduce_bytes_set && config_.adaptive_allreduce_bytes > 0) {
    derived_.adaptive_allreduce_bytes = static_cast<int64_t>(
        default_adaptive_bytes(established.table, static_cast<size_t>(config_.small_message_bytes),
                               static_cast<size_t>(config_.adaptive_allreduce_bytes)));
  }
  if (derived_.adaptive_allreduce_bytes > 0 && world.single_copy_local()) {
    adaptive_.reset(new AdaptiveAllreduce(static_cast<size_t>(derived_.adaptive_allreduce_bytes), derived_.table,
                                          2 * static_cast<size_t>(config_.shm_ring_bytes)));
  }
  if (!config_.streaming_store_bytes_set && established.streaming_store_bytes >= 0) {
    derived_.streaming_store_bytes = established.streaming_store_bytes;
    derived_.streaming_origin = established.origin;
  }
}

AllreducePlan Chooser::allreduce(const Communicator& comm, size_t bytes, size_t count, bool take) {
  AllreducePlan plan;
  if (two_tier_allreduce(comm, bytes)) {
    plan.two_tier = true;
    plan.chunks = std::min(choose_hierarchical_chunks(comm.host_count(), comm.local()->size(), bytes,
                                                      layout(comm.host_count(), 1, comm.link_costs()),
                                                      comm.link_costs(), config_.hierarchical_pipeline_bytes),
                           std::max<size_t>(1, count / comm.local()->size()));
    return plan;
  }
  plan.adaptive_band = &comm == world_ && adaptive_ ? adaptive_->band(bytes) : -1;
  plan.algorithm = flat_allreduce(comm, bytes, count, take);
  plan.cold_output = cold(bytes);
  return plan;
}

AllreduceAlgorithm Chooser::flat_allreduce(const Communicator& comm, size_t bytes, size_t count, bool take) {
  const size_t small = static_cast<size_t>(config_.small_message_bytes);
  const int band = &comm == world_ && adaptive_ ? adaptive_->band(bytes) : -1;
  AllreduceAlgorithm algorithm;
  if (band >= 0) {
    algorithm = take ? adaptive_->take(band) : adaptive_->peek(band);
  } else if (measured_for(comm)) {
    algorithm = derived_.table.choose(bytes);
  } else if (config_.allreduce_algorithms >= Config::kForcedRd) {
    algorithm = forced_algorithm(config_.allreduce_algorithms);
  } else if (config_.single_copy_allreduce && bytes >= small) {
    algorithm = AllreduceAlgorithm::kSingleCopy;
  } else {
    const FlatRule& choice = layout(comm);
    algorithm = bytes < choice.ring_from ? AllreduceAlgorithm::kRecursiveDoubling : AllreduceAlgorithm::kRing;
    if (choice.halving.contains(bytes)) algorithm = AllreduceAlgorithm::kRecursiveHalving;
  }
  if (algorithm == AllreduceAlgorithm::kSingleCopy && !comm.single_copy_local())
    algorithm = AllreduceAlgorithm::kRing;
  if (algorithm == AllreduceAlgorithm::kRing && count < static_cast<size_t>(comm.size())) {
    algorithm = AllreduceAlgorithm::kRecursiveDoubling;
  }
  if (algorithm == AllreduceAlgorithm::kRecursiveHalving && count < power_of_two_at_most(comm.size())) {
    algorithm = AllreduceAlgorithm::kRecursiveDoubling;
  }
  return algorithm;
}

void Chooser::observe(const AllreducePlan& plan, size_t bytes, double seconds) {
  if (plan.adaptive_band >= 0 && adaptive_) adaptive_->observe(plan.adaptive_band, bytes, plan.algorithm, seconds);
}

AllgatherAlgorithm Chooser::allgather(const Communicator& comm, size_t total_bytes) const {
  if (comm.size() > 1 && two_tier_allgather(comm, total_bytes)) return AllgatherAlgorithm::kTwoTier;
  if (comm.single_copy_local() && total_bytes >= static_cast<size_t>(config_.small_message_bytes)) {
    return AllgatherAlgorithm::kSingleCopy;
  }
  return AllgatherAlgorithm::kRing;
}

BroadcastAlgorithm Chooser::broadcast(const Communicator& comm, size_t bytes) const {
  const size_t small = static_cast<size_t>(config_.small_message_bytes);
  if (comm.single_copy_local() && bytes >= small) return BroadcastAlgorithm::kSingleCopy;
  return bytes < small ? BroadcastAlgorithm::kTree : BroadcastAlgorithm::kChain;
}

bool Chooser::cold(size_t bytes) const {
  return derived_.streaming_store_bytes > 0 && bytes >= static_cast<size_t>(derived_.streaming_store_bytes);
}

namespace {

// Every member takes the same decision: it depends on the set's layout, the job-wide setting (1/0 force it, -1
// lets the model choose) and the link costs rank 0 measured and broadcast at init (cost_model.h).
template <typename Predict>
bool two_tier_chosen(const Communicator& comm, int setting, Predict predict) {
  if (!comm.local() || comm.local()->size() < 2) return false;
  if (setting >= 0) return setting == 1;
  const LinkCosts& costs = comm.link_costs();
  if (!costs.known()) return false;
  const int hosts = comm.host_count(), per_host = comm.local()->size();
  return predict(true, hosts, per_host, costs) < predict(false, hosts, per_host, costs);
}

}  // namespace

bool Chooser::two_tier_allreduce(const Communicator& comm, size_t bytes) const {
  return two_tier_chosen(
      comm, config_.hierarchical_allreduce, [&](bool two_tier, int hosts, int per_host, const LinkCosts& c) {
        return two_tier ? predict_allreduce_hierarchical(hosts, per_host, bytes, layout(hosts, 1, c), c,
                                                         config_.hierarchical_pipeline_bytes)
                        : predict_allreduce_flat(hosts, per_host, bytes, layout(hosts, per_host, c), c);
      });
}

const FlatRule& Chooser::layout(const Communicator& comm) const {
  const int hosts = std::max(comm.host_count(), 1);
  const int per_host = comm.local() ? comm.local()->size() : (comm.size() + hosts - 1) / hosts;
  return layout(hosts, per_host, comm.link_costs());
}

const FlatRule& Chooser::layout(int hosts, int per_host, const LinkCosts& costs) const {
  std::lock_guard<std::mutex> lock(layouts_mutex_);
  auto found = layouts_.find({hosts, per_host});
  if (found != layouts_.end()) return found->second;
  const size_t small = static_cast<size_t>(config_.small_message_bytes);
  FlatRule choice(small);
  if (config_.allreduce_algorithms != 1) {  // unless the knobs fixed the rules
    choice.ring_from = ring_from_bytes(hosts, per_host, small, costs);
    choice.halving = halving_band(hosts, per_host, choice.ring_from, costs);
  }
  return layouts_.emplace(std::make_pair(hosts, per_host), choice).first->second;
}

bool Chooser::two_tier_allgather(const Communicator& comm, size_t total_bytes) const {
  return two_tier_chosen(comm, config_.hierarchical_allgather,
                         [&](bool two_tier, int hosts, int per_host, const LinkCosts& c) {
                           return two_tier ? predict_allgather_hierarchical(hosts, per_host, total_bytes, c)
                                           : predict_allgather_flat(hosts, per_host, total_bytes, c);
                         });
}

std::string Chooser::describe() const {
  // allreduce_table: where the one-host algorithm choice came from (measured, cached, or fixed: the knobs' rules).
  const AllreduceTable& table = derived_.table;
  std::string text = "allreduce_table=" + (table.empty() ? std::string("fixed") : derived_.table_origin);
  if (!table.empty()) {
    text += ";allreduce_algorithms=" + table.serialize() + ";allreduce_table_file=" + derived_.table_path +
            ";allreduce_table_measurements=" + std::to_string(derived_.table_measurements);
  }
  // The threshold in effect: the knob's value as read is in Config's part, and a measurement may have moved it.
  text += ";streaming_store_bytes=" + std::to_string(derived_.streaming_store_bytes) +
          ";streaming_store_bytes_from=" + derived_.streaming_origin;
  // Where the world's allreduces run recursive halving, when the size rules decide for it.
  if (world_ && world_->size() > 1 && config_.cpu_operations == 0 && !measured_for(*world_) &&
      config_.allreduce_algorithms == 0 && !config_.single_copy_allreduce) {
    const HalvingBand& band = layout(*world_).halving;
    text +=
        ";allreduce_halving_bytes=" +
        (band.to == 0 ? std::string("none")
                      : std::to_string(band.from) + "-" + (band.to == ~size_t{0} ? "any" : std::to_string(band.to)));
  }
  if (adaptive_) text += ";" + adaptive_->describe();
  return text;
}

}  // namespace hvdlite

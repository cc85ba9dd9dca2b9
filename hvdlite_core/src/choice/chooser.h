// What the choice (select.h) reads in this job: the knobs' settings and, for a job on one host, the machine's tuned
// table (read at init by tuning/table_file.h). Dispatch (dispatch.h) asks it and runs what it names.
#pragma once
#include <cstddef>
#include <string>

#include "choice/select.h"
#include "common/config.h"

namespace hvdlite {

class Communicator;

class Chooser {
 public:
  explicit Chooser(const Config& config);

  // At init: the job's world, and the machine's tuned table for it (tuning/table_file.h; empty where none).
  void establish(const Communicator& world, const TunedTable& tuned);

  AllreducePlan allreduce(const Communicator& comm, size_t bytes, size_t count) const {
    return select_allreduce(layout_of(comm, world_), bytes, count, settings_);
  }
  AllreduceAlgorithm flat_allreduce(const Communicator& comm, size_t bytes, size_t count) const {
    return select_flat_allreduce(layout_of(comm, world_), bytes, count, settings_);
  }
  AllgatherAlgorithm allgather(const Communicator& comm, size_t total_bytes) const {
    return select_allgather(layout_of(comm, world_), total_bytes, settings_);
  }
  BroadcastAlgorithm broadcast(const Communicator& comm, size_t bytes) const {
    return select_broadcast(layout_of(comm, world_), bytes, settings_);
  }
  // Whether a result of this many bytes is written with streaming stores (it will not stay in cache).
  bool cold(size_t bytes) const {
    return settings_.streaming_store_bytes > 0 && bytes >= settings_.streaming_store_bytes;
  }
  // "allreduce_table=...;streaming_store_bytes=...;streaming_store_bytes_from=..." for build_info.
  std::string describe() const;

 private:
  const Config& config_;
  ChoiceSettings settings_;
  const Communicator* world_ = nullptr;  // the communicator a tuned table is for
  std::string table_path_;               // where a tuned table for this job's machine and size is kept
  std::string table_key_;
  std::string streaming_origin_;  // "knob", "default" or "tuned"
};

}  // namespace hvdlite

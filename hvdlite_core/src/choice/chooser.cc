#include "choice/chooser.h"

#include "collectives/communicator.h"

namespace hvdlite {

Chooser::Chooser(const Config& config)
    : config_(config),
      settings_(settings_from(config)),
      streaming_origin_(config.streaming_store_bytes_set ? "knob" : "default") {}

void Chooser::establish(const Communicator& world, const TunedTable& tuned) {
  world_ = &world;
  table_path_ = tuned.path;
  table_key_ = tuned.key;
  // The fixed rules or a named algorithm, where the knobs ask for them, leave the table unused.
  if (config_.allreduce_algorithms == Config::kTuned) settings_.table = tuned.table;
  if (!config_.streaming_store_bytes_set && tuned.streaming_store_bytes >= 0) {
    settings_.streaming_store_bytes = static_cast<size_t>(tuned.streaming_store_bytes);
    streaming_origin_ = "tuned";
  }
}

std::string Chooser::describe() const {
  // allreduce_table: where the one-host algorithm choice comes from, the tuned table or the fixed rules; the file and
  // its key are where python -m hvdlite.tune writes one for jobs like this.
  std::string text = "allreduce_table=" + std::string(settings_.table.empty() ? "fixed" : "tuned");
  if (!settings_.table.empty()) text += ";allreduce_algorithms=" + settings_.table.serialize();
  if (!table_path_.empty()) text += ";allreduce_table_file=" + table_path_ + ";allreduce_table_key=" + table_key_;
  // The threshold in effect: the knob's value as read is in Config's part, and a tuned table may have moved it.
  return text + ";streaming_store_bytes=" + std::to_string(settings_.streaming_store_bytes) +
         ";streaming_store_bytes_from=" + streaming_origin_;
}

}  // namespace hvdlite

// Which flat allreduce algorithm runs at which message size on one host, where a tuned table exists for this
// machine (tuning/table_file.h; written by python -m hvdlite.tune): a list of size bands, each from its min_bytes
// to the next one's.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "collectives/algorithms.h"

namespace hvdlite {

class AllreduceTable {
 public:
  struct Band {
    size_t min_bytes;
    AllreduceAlgorithm algorithm;
  };
  AllreduceTable() = default;
  explicit AllreduceTable(std::vector<Band> bands) : bands_(std::move(bands)) {}

  // "rd@0,ring@11585,single_copy@724077": the table file's and build_info's form. parse() accepts exactly what
  // serialize() writes (bands ascending, the first at 0) and returns false on anything else.
  std::string serialize() const;
  static bool parse(const std::string& text, AllreduceTable* table);

  bool empty() const { return bands_.empty(); }
  AllreduceAlgorithm choose(size_t bytes) const;
  const std::vector<Band>& bands() const { return bands_; }

 private:
  std::vector<Band> bands_;
};

// A machine's tuned table as init found it (tuning/table_file.h reads it).
struct TunedTable {
  AllreduceTable table;                // empty: none
  int64_t streaming_store_bytes = -1;  // -1: the file does not say
  std::string path;                    // where it is kept ("" without a cache directory)
  std::string key;                     // what it is for: the machine, the job's size, the transport settings
};

}  // namespace hvdlite

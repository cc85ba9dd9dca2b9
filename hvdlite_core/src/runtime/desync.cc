#include "runtime/desync.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <sstream>

namespace hvdlite {
namespace {

std::string rank_list(const std::vector<int>& ranks) {
  std::ostringstream out;
  for (size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
  return out.str();
}

// Strongly connected components of the waits-on graph (Tarjan); ranks in a component of two or more are on a
// cycle. Returns the component of each such rank.
std::map<int, int> cycle_components(const std::map<int, std::set<int>>& waits_on) {
  std::map<int, int> index, low, component;
  std::vector<int> stack;
  std::set<int> on_stack;
  int next_index = 0, next_component = 0;
  std::function<void(int)> visit = [&](int v) {
    index[v] = low[v] = next_index++;
    stack.push_back(v);
    on_stack.insert(v);
    auto edges = waits_on.find(v);
    if (edges != waits_on.end()) {
      for (int w : edges->second) {
        if (!index.count(w)) {
          visit(w);
          low[v] = std::min(low[v], low[w]);
        } else if (on_stack.count(w)) {
          low[v] = std::min(low[v], index[w]);
        }
      }
    }
    if (low[v] != index[v]) return;
    std::vector<int> members;
    int w;
    do {
      w = stack.back();
      stack.pop_back();
      on_stack.erase(w);
      members.push_back(w);
    } while (w != v);
    if (members.size() > 1) {
      for (int m : members) component[m] = next_component;
      ++next_component;
    }
  };
  for (const auto& node : waits_on) {
    if (!index.count(node.first)) visit(node.first);
  }
  return component;
}

}  // namespace

std::vector<size_t> find_out_of_step(const std::vector<IncompleteCollective>& incomplete, double timeout_seconds) {
  std::vector<size_t> found;
  if (timeout_seconds <= 0) return found;
  std::map<int, std::set<int>> waits_on;
  for (const IncompleteCollective& c : incomplete) {
    if (c.age_seconds <= timeout_seconds) continue;
    for (int r : c.submitters) waits_on[r].insert(c.missing.begin(), c.missing.end());
  }
  if (waits_on.empty()) return found;
  std::map<int, int> component = cycle_components(waits_on);
  if (component.empty()) return found;
  for (size_t i = 0; i < incomplete.size(); ++i) {
    const IncompleteCollective& c = incomplete[i];
    if (c.age_seconds <= timeout_seconds) continue;
    bool on_cycle = false;
    for (int r : c.submitters) {
      auto mine = component.find(r);
      if (mine == component.end()) continue;
      for (int m : c.missing) {
        auto theirs = component.find(m);
        if (theirs != component.end() && theirs->second == mine->second) on_cycle = true;
      }
    }
    if (on_cycle) found.push_back(i);
  }
  return found;
}

std::string describe_out_of_step(const std::vector<IncompleteCollective>& incomplete,
                                 const std::vector<size_t>& found, double timeout_seconds) {
  std::ostringstream out;
  out << "ranks are out of step: they wait on different collectives, so none can complete (for over "
      << static_cast<int>(timeout_seconds) << " s). ";
  for (size_t i = 0; i < found.size(); ++i) {
    const IncompleteCollective& c = incomplete[found[i]];
    out << (i ? "; " : "") << c.description << " was submitted by rank(s) " << rank_list(c.submitters)
        << " but not by rank(s) " << rank_list(c.missing);
  }
  out << ". Every member of a process set must submit the same collectives (same names); a rank that raised "
         "may have skipped some. If a rank legitimately holds a submitted collective while it computes for "
         "longer, raise HVDLITE_DESYNC_TIMEOUT_SECONDS (0 turns this check off)";
  return out.str();
}

}  // namespace hvdlite

#include "runtime/coordinator.h"

#include <algorithm>
#include <sstream>

#include "common/log.h"
#include "runtime/desync.h"
#include "runtime/validation.h"

namespace hvdlite {

Coordinator::Coordinator(const Config& config, int size, ProcessSetRegistry& sets)
    : config_(config), size_(size), sets_(sets) {}

void Coordinator::ingest(const Request& request) {
  if (request.op == OpType::kAbort) {
    aborts_.push_back(request);
    return;
  }
  if (request.op == OpType::kJoin) {
    joined_ranks_.insert(request.rank);
    last_joined_ = request.rank;
    return;
  }
  std::string key = entry_key(request.process_set, request.name);
  // Stall ages count from the earliest submission, also when it waited on a cached hit first.
  auto submitted =
      std::chrono::steady_clock::now() - std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                             std::chrono::duration<double>(std::max(0.0, request.waited_seconds)));
  auto it = table_.find(key);
  if (it == table_.end()) {
    Submissions fresh;
    fresh.first_seen = submitted;
    it = table_.emplace(key, std::move(fresh)).first;
    arrival_order_.push_back(key);
  }
  it->second.first_seen = std::min(it->second.first_seen, submitted);
  it->second.requests.push_back(request);
}

std::vector<Response> Coordinator::decide() {
  decided_sets_version_ = sets_.version();
  std::vector<Response> out;
  std::vector<std::string> still_waiting;
  for (const std::string& key : arrival_order_) {
    Submissions& s = table_.at(key);
    const Request& first = s.requests.front();
    std::vector<int> members;
    if (!sets_.members(first.process_set, &members)) {
      out.push_back(Response::Failure(
          first, static_cast<int32_t>(StatusCode::kInvalidArgument),
          "process set " + std::to_string(first.process_set) + " of tensor '" + first.name + "' was removed"));
      table_.erase(key);
      continue;
    }
    std::set<int> submitted;
    for (const Request& q : s.requests) submitted.insert(q.rank);
    std::vector<int> joined;
    for (int m : members) {
      if (!submitted.count(m) && joined_ranks_.count(m)) joined.push_back(m);
    }
    if (submitted.size() + joined.size() == members.size()) {
      out.push_back(build_response(s.requests, joined, members));
      table_.erase(key);
    } else {
      still_waiting.push_back(key);
    }
  }
  arrival_order_.swap(still_waiting);
  if (!joined_ranks_.empty() && static_cast<int>(joined_ranks_.size()) == size_) {
    Response join;
    join.op = OpType::kJoin;
    join.name = "hvdlite.join";
    join.ranks = {last_joined_};
    join.cacheable = false;
    out.push_back(join);
    joined_ranks_.clear();
  }
  report_out_of_step(out);
  report_stalls(out);
  if (!aborts_.empty()) {  // requests arrive in rank order: the lowest rank's reason first
    Response failure;
    failure.op = OpType::kAbort;
    failure.cacheable = false;
    failure.error = aborts_.front().name;
    for (size_t i = 1; i < aborts_.size(); ++i) {
      failure.error += "; also rank " + std::to_string(aborts_[i].rank) + ": " + aborts_[i].name;
    }
    out.push_back(failure);
    aborts_.clear();
  }
  return out;
}

std::vector<int> Coordinator::missing_ranks(const Submissions& s) {
  std::vector<int> members, missing;
  sets_.members(s.requests.front().process_set, &members);
  for (int m : members) {
    bool has = std::any_of(s.requests.begin(), s.requests.end(), [m](const Request& q) { return q.rank == m; });
    if (!has && !joined_ranks_.count(m)) missing.push_back(m);
  }
  return missing;
}

std::string Coordinator::missing_ranks_text(const Submissions& s) {
  std::ostringstream text;
  std::vector<int> missing = missing_ranks(s);
  for (size_t i = 0; i < missing.size(); ++i) text << (i ? ", " : "") << missing[i];
  return text.str();
}

std::vector<std::string> Coordinator::out_of_step(std::string* message) {
  std::vector<IncompleteCollective> incomplete;
  auto now = std::chrono::steady_clock::now();
  for (const std::string& key : arrival_order_) {
    const Submissions& s = table_.at(key);
    const Request& first = s.requests.front();
    IncompleteCollective c;
    c.description = std::string(op_name(first.op)) + " of tensor '" + first.name + "'";
    if (first.process_set != 0) c.description += " in process set " + std::to_string(first.process_set);
    for (const Request& q : s.requests) c.submitters.push_back(q.rank);
    std::sort(c.submitters.begin(), c.submitters.end());
    c.missing = missing_ranks(s);
    c.age_seconds = std::chrono::duration<double>(now - s.first_seen).count();
    incomplete.push_back(std::move(c));
  }
  std::vector<size_t> found = find_out_of_step(incomplete, config_.desync_timeout_seconds);
  std::vector<std::string> keys;
  for (size_t i : found) keys.push_back(arrival_order_[i]);
  if (message && !found.empty()) *message = describe_out_of_step(incomplete, found, config_.desync_timeout_seconds);
  return keys;
}

void Coordinator::report_out_of_step(std::vector<Response>& out) {
  if (config_.desync_timeout_seconds <= 0 || arrival_order_.empty()) return;
  std::string message;
  std::vector<std::string> keys = out_of_step(&message);
  if (keys.empty()) return;
  HVD_LOG(kError, message);
  for (const std::string& key : keys) {
    out.push_back(
        Response::Failure(table_.at(key).requests.front(), static_cast<int32_t>(StatusCode::kMismatch), message));
    table_.erase(key);
  }
  std::vector<std::string> keep;
  for (const std::string& key : arrival_order_) {
    if (table_.count(key)) keep.push_back(key);
  }
  arrival_order_.swap(keep);
}

bool Coordinator::round_due(Clock::time_point now) {
  // A collective waiting on a process set removed since the last round fails in decide(), and nothing else may
  // ever bring a round: its other members never submit it.
  if (!arrival_order_.empty() && sets_.version() != decided_sets_version_) return true;
  if (now - last_stall_check_ < std::chrono::milliseconds(100)) return false;
  last_stall_check_ = now;
  bool due = false;
  for (const std::string& key : arrival_order_) {
    Submissions& s = table_.at(key);
    double age = std::chrono::duration<double>(now - s.first_seen).count();
    const Request& first = s.requests.front();
    if (!s.warned && config_.stall_warning_seconds > 0 && age > config_.stall_warning_seconds) {
      s.warned = true;
      HVD_LOG(kWarning, "stall: " << op_name(first.op) << " of tensor '" << first.name << "' has waited "
                                  << static_cast<int>(age) << " s; submitted by " << s.requests.size()
                                  << " rank(s), missing rank(s) " << missing_ranks_text(s));
    }
    if (config_.stall_shutdown_seconds > 0 && age > config_.stall_shutdown_seconds) due = true;
  }
  if (!due && config_.desync_timeout_seconds > 0 && !arrival_order_.empty()) due = !out_of_step(nullptr).empty();
  return due;
}

void Coordinator::report_stalls(std::vector<Response>& out) {
  if (config_.stall_shutdown_seconds <= 0) return;
  auto now = std::chrono::steady_clock::now();
  std::vector<std::string> keep;
  for (const std::string& key : arrival_order_) {
    Submissions& s = table_.at(key);
    double age = std::chrono::duration<double>(now - s.first_seen).count();
    if (age <= config_.stall_shutdown_seconds) {
      keep.push_back(key);
      continue;
    }
    const Request& first = s.requests.front();
    out.push_back(Response::Failure(first, static_cast<int32_t>(StatusCode::kTimeout),
                                    std::string(op_name(first.op)) + " of tensor '" + first.name + "' stalled for " +
                                        std::to_string(static_cast<int>(age)) + " s: rank(s) " +
                                        missing_ranks_text(s) +
                                        " never submitted it (HVDLITE_STALL_SHUTDOWN_TIME_SECONDS)"));
    table_.erase(key);
  }
  arrival_order_.swap(keep);
}

}  // namespace hvdlite

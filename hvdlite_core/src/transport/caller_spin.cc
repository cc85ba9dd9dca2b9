#include "transport/caller_spin.h"

#include <sched.h>
#include <signal.h>

#include <cmath>
#include <fstream>
#include <string>

namespace hvdlite {

int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  int cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  // "max 100000" (no quota) or "<quota> <period>" in microseconds; containers limited with --cpus show it here.
  std::ifstream quota_file("/sys/fs/cgroup/cpu.max");
  std::string quota;
  double period = 0;
  if (quota_file >> quota >> period && quota != "max" && period > 0) {
    try {
      const int limit = static_cast<int>(std::ceil(std::stod(quota) / period));
      if (limit >= 1 && limit < cpus) cpus = limit;
    } catch (const std::exception&) {
      // An unreadable quota leaves the affinity mask's count.
    }
  }
  return cpus < 1 ? 1 : cpus;
}

int ranks_on_this_machine(int local_ranks, const std::vector<pid_t>& other_hosts_pids) {
  int ranks = local_ranks;
  for (pid_t pid : other_hosts_pids) {
    if (pid > 0 && ::kill(pid, 0) == 0) ++ranks;
  }
  return ranks;
}

int64_t caller_spin_microseconds(const Config& config, int machine_ranks, int cpus) {
  if (config.spin_microseconds_set) return config.spin_microseconds;
  return machine_ranks <= cpus ? kDedicatedCpuSpinUs : config.spin_microseconds;
}

}  // namespace hvdlite

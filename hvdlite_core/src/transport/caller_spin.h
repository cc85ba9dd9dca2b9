// How long a framework thread waiting on its own operation busy-waits before it sleeps (Progress's spin budget).
// A sleeping waiter is woken by its peer's write, and on a virtual machine that wake-up is slow enough to leave the
// rank behind for the rest of its step. Where every rank on the host has a CPU of its own, a spinning waiter takes
// no core that another rank computes on, so it spins through the usual skew between ranks; where ranks outnumber
// the CPUs (Open MPI's test for yielding when idle) it would, so the spin stays short. Ranks count by the machine
// they run on, not by the host name they report: hosts emulated on one machine share its CPUs.
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <vector>

#include "common/config.h"

namespace hvdlite {

// The CPUs this process may use: its affinity mask, capped by a cgroup v2 CPU quota (rounded up).
int usable_cpus();

// The ranks running on this machine: this host's, and those of other hosts whose process exists here too (hosts
// emulated in network namespaces of one machine). A remote rank whose pid happens to exist here counts as well,
// which errs towards the short spin.
int ranks_on_this_machine(int local_ranks, const std::vector<pid_t>& other_hosts_pids);

// SPIN_MICROSECONDS when given; else kDedicatedCpuSpinUs where machine_ranks <= cpus, else the knob's default.
int64_t caller_spin_microseconds(const Config& config, int machine_ranks, int cpus);

constexpr int64_t kDedicatedCpuSpinUs = 5000;

}  // namespace hvdlite

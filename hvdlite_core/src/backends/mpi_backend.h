// The MPI data plane (HVDLITE_CPU_OPERATIONS=mpi): hvdlite's collectives as MPI calls, through the MPI plugin
// (plugins/mpi/), which the core loads with dlopen so that it never links MPI itself.
#pragma once
#include <memory>
#include <string>

#include "backends/backend.h"
#include "common/config.h"

namespace hvdlite {

// What this installation can say about MPI without starting it: whether a plugin was given (MPI_PLUGIN), whether
// it loads (its MPI library is found), and if not, why.
struct MpiAvailability {
  bool built = false;
  bool usable = false;
  std::string path;
  std::string why_not;          // "" when usable
  std::string library_version;  // the MPI library's version line, when usable
};
MpiAvailability mpi_availability(const Config& config);

// Starts the MPI backend for the job: collective over every rank. comm_address: address of the MPI_Comm whose
// ranks are hvdlite's (NULL: MPI_COMM_WORLD). Every rank learns whether every other rank could load the plugin
// (over world, the built-in mesh), so a rank without MPI fails everyone at once instead of leaving the others
// waiting inside MPI. Throws Error naming what is missing.
std::unique_ptr<Backend> make_mpi_backend(const Config& config, Communicator& world, const void* comm_address);

// Whether MPI provides MPI_THREAD_MULTIPLE to the running MPI backend (false when none runs).
bool mpi_thread_multiple();

}  // namespace hvdlite

/* The seam between the core and its MPI plugin (_hvdlite_mpi*.so).
 *
 * The core never links MPI: it is one library that works on machines with and without an MPI installation.
 * The Python package compiles plugins/mpi/mpi_plugin.cc against the machine's MPI the first time a job needs it
 * (hvdlite/common/mpi_plugin.py) and names it in HVDLITE_MPI_PLUGIN; the core dlopens it only when a job asks for
 * the MPI data plane (HVDLITE_CPU_OPERATIONS=mpi). MPI's handle types differ between implementations (Open MPI:
 * pointers, MPICH: integers), so only the plugin sees mpi.h; this table speaks in plain C types.
 *
 * Conventions: every function returns 0 on success, nonzero on failure with a message from last_error() on the
 * calling thread. Sets are hvdlite process set ids (0: every rank); ranks, roots and peers are indexes among
 * the set's members (members in ascending hvdlite rank, which is their order in the plugin's communicator).
 * dtype: hvdlite_dtype values; kind: 0 sum, 1 min, 2 max, 3 product. Collectives are called by every member
 * of the set in the same order (negotiation guarantees it), from one thread at a time.
 */
#ifndef HVDLITE_MPI_PLUGIN_ABI_H
#define HVDLITE_MPI_PLUGIN_ABI_H
#include <stddef.h>
#include <stdint.h>

#define HVDLITE_MPI_PLUGIN_ABI_VERSION 1

#ifdef __cplusplus
extern "C" {
#endif

/* The core's element-wise reduction (inout[i] = inout[i] op in[i]), for the types MPI has no operator for
 * (float16, bfloat16, bool): the plugin registers user-defined MPI operators that call it, so results are the
 * same as on the built-in backend. */
typedef void (*hvdlite_reduce_fn)(int dtype, int kind, void* inout, const void* in, size_t count);

typedef struct {
  int abi_version;
  const char* (*last_error)(void);
  /* The MPI library's own version line. */
  const char* (*library_version)(void);
  /* Collective over the job. comm_address: address of an MPI_Comm whose rank i is hvdlite rank i (mpi4py's
   * MPI._addressof(comm)), or NULL for MPI_COMM_WORLD. Initialises MPI (MPI_THREAD_MULTIPLE asked) only when
   * nothing has yet and an MPI launcher started this process. *thread_multiple: 1 when MPI provides
   * MPI_THREAD_MULTIPLE. Fails when the communicator's rank or size is not (rank, size). */
  int (*start)(const void* comm_address, int rank, int size, hvdlite_reduce_fn reduce, int* thread_multiple);
  /* Frees the plugin's communicators; never finalises MPI (whoever initialised it does, at exit). */
  int (*stop)(void);
  /* Collective over every rank of the job: a communicator for set id with these members (ascending ranks). */
  int (*add_set)(int id, const int32_t* ranks, int count);
  int (*remove_set)(int id);
  int (*allreduce)(int id, const void* input, void* output, size_t count, int dtype, int kind);
  /* block_bytes[i]: bytes of member i; input is this member's block; output gets every block in order. */
  int (*allgatherv)(int id, const void* input, void* output, const size_t* block_bytes);
  int (*bcast)(int id, void* buffer, size_t bytes, int root);
  int (*alltoallv)(int id, const void* input, const size_t* send_bytes, void* output, const size_t* recv_bytes);
  /* input: the full buffer (sum of counts elements); output: this member's counts[me] elements. */
  int (*reduce_scatter)(int id, const void* input, void* output, const size_t* counts, int dtype, int kind);
  int (*sendrecv)(int id, int peer, const void* send, size_t send_bytes, void* recv, size_t recv_bytes);
} hvdlite_mpi_plugin;

/* The one symbol a plugin exports. */
const hvdlite_mpi_plugin* hvdlite_mpi_plugin_v1(void);

#ifdef __cplusplus
}
#endif
#endif

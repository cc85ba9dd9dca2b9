/* hvdlite C ABI.
 *
 * The only interface between the C++ core and the language bindings (Python reaches it through cffi in ABI
 * mode, so this header must stay plain C that cffi's cdef parser accepts: no macros in declarations, no
 * includes the parser needs). Every function returns an hvdlite_status; on failure the message is available
 * from hvdlite_last_error() on the calling thread, or from hvdlite_handle_error() for a handle.
 */
#ifndef HVDLITE_H
#define HVDLITE_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  HVDLITE_OK = 0,
  HVDLITE_IN_PROGRESS = 1,
  HVDLITE_INVALID_ARGUMENT = 2, /* bad usage on this rank: wrong root, duplicate name, bad splits */
  HVDLITE_PRECONDITION = 3,     /* not initialised, already shut down */
  HVDLITE_MISMATCH = 4,         /* ranks submitted incompatible requests for one tensor name */
  HVDLITE_REMOTE_ERROR = 5,     /* a peer died or a connection broke */
  HVDLITE_TIMEOUT = 6,          /* a deadline passed */
  HVDLITE_INTERNAL = 7,
  HVDLITE_ABORTED = 8 /* the runtime shut down while the operation was pending */
} hvdlite_status;

typedef enum {
  HVDLITE_UINT8 = 0,
  HVDLITE_INT8 = 1,
  HVDLITE_INT32 = 2,
  HVDLITE_INT64 = 3,
  HVDLITE_FLOAT16 = 4,
  HVDLITE_BFLOAT16 = 5,
  HVDLITE_FLOAT32 = 6,
  HVDLITE_FLOAT64 = 7,
  HVDLITE_BOOL = 8,
  HVDLITE_UINT16 = 9,
  HVDLITE_INT16 = 10 /* appended: existing values never change */
} hvdlite_dtype;

typedef enum {
  HVDLITE_OP_ALLREDUCE = 0,
  HVDLITE_OP_ALLGATHER = 1,
  HVDLITE_OP_BROADCAST = 2,
  HVDLITE_OP_ALLTOALL = 3,
  HVDLITE_OP_REDUCESCATTER = 4,
  HVDLITE_OP_BARRIER = 5,
  HVDLITE_OP_JOIN = 6,
  HVDLITE_OP_ADD_PROCESS_SET = 7,
  HVDLITE_OP_REMOVE_PROCESS_SET = 8
} hvdlite_op;

typedef enum {
  HVDLITE_SUM = 0,
  HVDLITE_AVERAGE = 1,
  HVDLITE_MIN = 2,
  HVDLITE_MAX = 3,
  HVDLITE_PRODUCT = 4,
  HVDLITE_ADASUM = 5 /* float types, a power-of-two number of ranks (Horovod's Adasum) */
} hvdlite_reduce_op;

typedef enum { HVDLITE_HOST_MEMORY = 0, HVDLITE_CUDA_MEMORY = 1 } hvdlite_memory;

/* Where this process sits in the job; filled by the bootstrap (launcher variables, MPI, Slurm, ...). */
typedef struct {
  int32_t rank;
  int32_t size;
  const char* const* peer_addresses; /* size entries, "host:port" of each rank's listener */
  const int32_t* host_ids;           /* size entries; equal ids share a host (shared memory is used) */
  const int32_t* pids;               /* size entries; process ids, for cross-memory attach on one host */
  const uint8_t* secret;             /* per-job secret authenticating every connection */
  int32_t secret_len;
  const char* job_id;   /* names this job's shared-memory segments */
  const void* mpi_comm; /* HVDLITE_CPU_OPERATIONS=mpi: address of the MPI_Comm whose ranks are
                           these ranks (mpi4py: MPI._addressof(comm)); NULL: MPI_COMM_WORLD */
} hvdlite_init_config;

typedef struct {
  int32_t op;       /* hvdlite_op */
  const char* name; /* unique among this rank's in-flight operations of the process set */
  int32_t dtype;    /* hvdlite_dtype */
  int32_t ndim;
  const int64_t* shape;
  const void* input; /* not read after completion; may equal output for in-place allreduce */
  void* output;      /* allreduce, broadcast: same shape as input. NULL for allgather, alltoall,
                        reducescatter: the core owns their result (hvdlite_handle_output_*) */
  int32_t root_rank; /* broadcast: global rank of the root */
  int32_t reduce_op; /* hvdlite_reduce_op */
  double prescale_factor;
  double postscale_factor;
  int32_t process_set_id; /* 0: every rank */
  const int32_t* splits;  /* alltoall: rows sent to each member of the set; NULL for an even split.
                             add_process_set: the member ranks */
  int32_t nsplits;
  int32_t memory;     /* where input and output live: HVDLITE_HOST_MEMORY, or HVDLITE_CUDA_MEMORY (the NCCL
                         data plane; results the core owns then live on that device too) */
  int32_t device;     /* CUDA memory: the device ordinal; one device per process */
  const void* stream; /* CUDA memory: the cudaStream_t on which the input is produced (the core waits for
                         it on its own stream, never blocking this one); NULL: the legacy default stream */
  uint64_t layout;    /* allreduce of several tensors packed into one buffer: a digest of how they are laid
                         out in it. Ranks must agree, as on the shape (a mismatch fails on every rank); 0: none */
  uint64_t name_slot; /* named requests: where the core keeps the name's record. The core writes it (the one field
                         it writes) into the request it is given when it first queues the name, and a kept
                         request handed back finds the record without hashing the name; an asynchronous host
                         allreduce handed back again goes through the name's slot, with no queue entry of its
                         own. 0 in a new request; the caller never writes it, nor renames a request that has one */
} hvdlite_request;

const char* hvdlite_version(void);
const char* hvdlite_last_error(void);

/* Bootstrap: open this rank's listening socket first, publish its address, then init with everyone's. */
int hvdlite_listener_open(const char* bind_host, int32_t* port_out);
int hvdlite_init(const hvdlite_init_config* config);
int hvdlite_shutdown(void);
/* hvdlite_shutdown for a process leaving because of an error: the other ranks' pending and later operations
 * fail with reason (e.g. "rank 1 on host-a raised ValueError: ...") in their message. */
int hvdlite_abort(const char* reason);
/* 0: not initialised (or shut down); 1: running; 2: initialised, but a fatal error or another rank's shutdown
 * ended it: operations fail, rank and size still answer, and hvdlite_init starts a new runtime. */
int hvdlite_is_initialized(void);
int hvdlite_rank(void);
int hvdlite_size(void);

/* The longest hvdlite_run and hvdlite_finish wait before returning to the caller, so that a Python caller's signal
 * handlers (Ctrl-C, a timeout's alarm) run while ranks wait on each other. */
enum { HVDLITE_WAIT_SLICE_MS = 100 };

/* The calls every collective makes take one argument and return one value: in cffi's ABI mode each argument costs
 * about 50 ns a call, as much as the core's bookkeeping of a small operation. */

/* Queues one operation. Returns its handle (> 0), or the negated status when the request was refused (the error is in
 * hvdlite_last_error). */
int64_t hvdlite_submit(const hvdlite_request* request);
/* hvdlite_submit of a prepared request on other buffers: the request as given, with its input and output at these
 * addresses. A caller keeps one request per named tensor and passes where the data is on this call (an
 * out-of-place result, a tensor allocated anew each step), never writing into a request that another thread may be
 * submitting at the same moment. */
int64_t hvdlite_submit_at(const hvdlite_request* request, uintptr_t input, uintptr_t output);
/* Queues count operations atomically: all are validated first and either all are queued or none. */
int hvdlite_enqueue_many(const hvdlite_request* requests, int32_t count, int64_t* handles_out);
/* Queues count in-place operations made from prepared requests, atomically as hvdlite_enqueue_many: operation i is
 * templates[indices[i]] on the buffer at address buffers[i] (its input and output). A caller that submits the same
 * tensors step after step (an optimizer's gradients) builds the requests once and passes only where they are. */
int hvdlite_enqueue_batch(const hvdlite_request* templates, const int32_t* indices, const uintptr_t* buffers,
                          int32_t count, int64_t* handles_out);
/* Packs count buffers (sources[i], nbytes[i] bytes each) one after another into destination, or unpacks
 * source into them: how an adapter lays many small tensors into one flat buffer for a single operation and back,
 * at memcpy speed. */
int hvdlite_gather_bytes(void* destination, const uintptr_t* sources, const int64_t* nbytes, int32_t count);
int hvdlite_scatter_bytes(const void* source, const uintptr_t* destinations, const int64_t* nbytes, int32_t count);
/* 1 when the operation finished (successfully or not), 0 while pending, negative for an unknown handle. */
int hvdlite_poll(int64_t handle);
/* Blocks until done or timeout_seconds (<= 0: no limit) passes; returns the operation's status. */
int hvdlite_wait(int64_t handle, double timeout_seconds);
/* Waits up to HVDLITE_WAIT_SLICE_MS, and when the operation finished successfully releases its handle too, returning
 * 0: an asynchronous operation's usual end in one call. Otherwise the handle stays, as after hvdlite_wait, and the
 * status is returned (HVDLITE_TIMEOUT: the slice ran out). */
int hvdlite_finish(int64_t handle);
/* hvdlite_finish called holding a lock as hvdlite_run_holding is: given up only if the operation has not finished. */
int hvdlite_finish_holding(int64_t handle, void (*release)(void*), void* context);
/* Waits for count operations (a batch from hvdlite_enqueue_many) up to timeout_seconds in all. Every one
 * finished successfully: returns 0 with all the handles released. Otherwise releases none and returns
 * HVDLITE_TIMEOUT when time ran out first, else the status of the first failed one in the array. */
int hvdlite_wait_many(const int64_t* handles, int32_t count, double timeout_seconds);
/* hvdlite_submit, then a wait up to HVDLITE_WAIT_SLICE_MS, in one call: a synchronous collective's path. Returns 0
 * when the operation finished successfully (it needs no handle); its handle (> 0) when it is still running (wait on
 * it) or failed (read its error), to be released after; the negated status when the request was refused (the
 * error is in hvdlite_last_error). */
int64_t hvdlite_run(const hvdlite_request* request);
/* hvdlite_run with the buffers given as in hvdlite_submit_at. */
int64_t hvdlite_run_at(const hvdlite_request* request, uintptr_t input, uintptr_t output);
/* hvdlite_run (output 0) or hvdlite_run_at, called holding a lock that this process's other threads may need
 * (Python's GIL): the core calls release(context), once, before it may wait for long (a late peer, a sleep, a cycle
 * of other operations), and the caller takes the lock back after the call. A steady-state collective of a microsecond
 * then keeps it throughout. */
int64_t hvdlite_run_holding(const hvdlite_request* request, uintptr_t input, uintptr_t output, void (*release)(void*),
                            void* context);
/* What this thread's latest hvdlite_run returned: for a caller interrupted between that call's return and its use
 * of the value (Python raises a signal handler's exception there), so that a running operation is not lost. */
int64_t hvdlite_last_run(void);
int hvdlite_handle_error(int64_t handle, char* buffer, int32_t capacity);
/* Results the core owns (allgather, alltoall, reducescatter): shape first, then a copy into caller memory. */
int hvdlite_handle_output_shape(int64_t handle, int64_t* shape_out, int32_t capacity, int32_t* ndim_out);
int hvdlite_handle_output_copy(int64_t handle, void* destination, int64_t nbytes);
/* alltoall: rows received from each member; join: the last rank to join; add_process_set: the new id. */
int hvdlite_handle_int_results(int64_t handle, int32_t* values_out, int32_t capacity, int32_t* count_out);
int hvdlite_handle_release(int64_t handle);

/* Process sets: ids and members (global ranks, ascending). */
int hvdlite_process_set_ranks(int32_t process_set_id, int32_t* ranks_out, int32_t capacity, int32_t* count_out);
int hvdlite_process_set_ids(int32_t* ids_out, int32_t capacity, int32_t* count_out);

/* Timeline (Chrome trace) of every tensor's negotiation and execution, written by rank 0; the other ranks
 * accept both calls and record nothing. start replaces a running timeline (closing its file); mark_cycles != 0
 * adds an instant event at each cycle that ran collectives. stop closes the file (nothing running: no-op). */
int hvdlite_start_timeline(const char* file_path, int32_t mark_cycles);
int hvdlite_stop_timeline(void);
/* Names the tensors that the collective named tensor carries packed together, so that the timeline draws its spans
 * on each member's row (count 0 forgets the name). Kept for the process; callable before init. */
int hvdlite_timeline_members(const char* tensor, const char** members, int32_t count);
/* Adds a counter event (named figures, e.g. the bytes a gradient compressor sent this step) to this rank's
 * timeline, if it writes one; otherwise records nothing. */
int hvdlite_timeline_counter(const char* name, const char** keys, const double* values, int32_t count);

/* Which backends and transports this build and this job use, as "key=value;..." text. */
int hvdlite_build_info(char* buffer, int32_t capacity);

/* Every HVDLITE_* setting the core reads: "NAME\tdefault\tmeaning\n" lines (the source of docs/knobs.md). */
int hvdlite_knob_table(char* buffer, int32_t capacity);

#ifdef __cplusplus
}
#endif
#endif

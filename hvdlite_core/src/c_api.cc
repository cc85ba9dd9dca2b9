// The C ABI (include/hvdlite.h). Every entry point catches everything: a C++ exception never crosses into
// the caller. Failures return a status and leave their message for hvdlite_last_error() on this thread.
// Only these functions are exported (the library is built with -fvisibility=hidden).
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "backends/mpi_backend.h"
#include "common/copy_bytes.h"
#include "common/log.h"
#include "common/version.h"
#include "gpu/cuda_api.h"
#include "hvdlite.h"
#include "runtime/runtime.h"
#include "transport/socket_util.h"

#define HVDLITE_EXPORT extern "C" __attribute__((visibility("default")))

namespace hvdlite {
namespace {

std::mutex g_mutex;  // guards g_runtime (init/shutdown) and g_listen_fd
// Both outlive any Runtime (declared first, destroyed last): a handle's outcome stays readable after shutdown.
HandleTable g_handles;
FastSlots g_slots;  // the names' slots (runtime/fast_slots.h), whose handles the runtime moves to g_handles
// Shared, so a thread inside a call keeps the Runtime alive while another thread shuts it down.
std::shared_ptr<Runtime> g_runtime;
int g_listen_fd = -1;
thread_local std::string g_last_error;
thread_local int64_t g_last_run = 0;  // hvdlite_last_run

int fail(StatusCode code, const std::string& message) {
  g_last_error = message;
  return static_cast<int>(code);
}

int report(const Status& status) {
  if (status.ok()) return HVDLITE_OK;
  return fail(status.code(), status.message());
}

template <typename F>
int guarded(F&& body) {
  try {
    return body();
  } catch (const Error& e) {
    return fail(e.code(), e.what());
  } catch (const std::exception& e) {
    return fail(StatusCode::kInternal, e.what());
  } catch (...) {
    return fail(StatusCode::kInternal, "unknown error");
  }
}

std::shared_ptr<Runtime> runtime_or_null() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_runtime;
}

int not_initialized() {
  return fail(StatusCode::kPrecondition, "hvdlite has not been initialized; call hvd.init() first");
}

// A slot's outcome, not owned: the slots live as long as the process.
std::shared_ptr<HandleState> outcome_of(FastSlot& slot) {
  return std::shared_ptr<HandleState>(std::shared_ptr<void>(), &slot.outcome);
}

// A slot's operation while the slot holds it, else the handle table's row (null when neither knows the id).
std::shared_ptr<HandleState> find_handle(int64_t id) {
  if (FastSlot* slot = g_slots.owner(id)) return outcome_of(*slot);
  return g_handles.get(id);
}

void release_handle(int64_t id) {
  if (!g_slots.release(id)) g_handles.release(id);
}

int unknown_handle(int64_t id) { return fail(StatusCode::kInvalidArgument, "unknown handle " + std::to_string(id)); }

int copy_text(const std::string& text, char* buffer, int32_t capacity) {
  if (!buffer || capacity <= 0) return static_cast<int>(text.size());
  size_t n = std::min(text.size(), static_cast<size_t>(capacity - 1));
  std::memcpy(buffer, text.data(), n);
  buffer[n] = '\0';
  return static_cast<int>(text.size());
}

}  // namespace
}  // namespace hvdlite

using namespace hvdlite;

HVDLITE_EXPORT const char* hvdlite_version(void) { return hvdlite::kVersion; }

HVDLITE_EXPORT const char* hvdlite_last_error(void) { return g_last_error.c_str(); }

HVDLITE_EXPORT int hvdlite_listener_open(const char* bind_host, int32_t* port_out) {
  return guarded([&] {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_listen_fd >= 0) ::close(g_listen_fd);
    int port = 0;
    g_listen_fd = socket_listen(bind_host ? bind_host : "", &port);
    *port_out = port;
    return HVDLITE_OK;
  });
}

HVDLITE_EXPORT int hvdlite_init(const hvdlite_init_config* init) {
  return guarded([&] {
    std::unique_lock<std::mutex> lock(g_mutex);
    if (g_runtime && !g_runtime->stopped()) return static_cast<int>(HVDLITE_OK);
    if (g_runtime) {
      // Ended by a fatal error or another rank's shutdown: retire it (its pending operations were already
      // failed) and start afresh, as after shutdown(). Joining its thread happens outside the lock.
      std::shared_ptr<Runtime> old;
      old.swap(g_runtime);
      lock.unlock();
      old->shutdown();
      old.reset();
      lock.lock();
      if (g_runtime) return static_cast<int>(HVDLITE_OK);  // another thread initialised meanwhile
    }
    if (!init || init->size < 1 || init->rank < 0 || init->rank >= init->size) {
      return fail(StatusCode::kInvalidArgument, "invalid rank/size in init");
    }
    if (init->size > 1 && (g_listen_fd < 0 || !init->peer_addresses)) {
      return fail(StatusCode::kInvalidArgument, "multi-rank init needs hvdlite_listener_open and peer addresses");
    }
    Config config = Config::FromEnvironment();
    log_configure(config.log_level, init->rank, config.log_hide_time);
    int fd = g_listen_fd;
    g_listen_fd = -1;  // the mesh owns (and closes) it from here
    g_runtime = std::make_shared<Runtime>(config, *init, fd, g_handles, g_slots);
    return static_cast<int>(HVDLITE_OK);
  });
}

static int shutdown_runtime(const std::string& reason) {
  return guarded([&] {
    std::shared_ptr<Runtime> rt;
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      rt.swap(g_runtime);
    }
    // Collective shutdown; pending operations finish with kAborted. Outside the lock: waiters may call in.
    if (rt) rt->shutdown(reason);
    return static_cast<int>(HVDLITE_OK);
  });
}

HVDLITE_EXPORT int hvdlite_shutdown(void) { return shutdown_runtime(""); }

HVDLITE_EXPORT int hvdlite_abort(const char* reason) { return shutdown_runtime(reason ? reason : ""); }

HVDLITE_EXPORT int hvdlite_is_initialized(void) {
  auto rt = runtime_or_null();
  return !rt ? 0 : (rt->stopped() ? 2 : 1);
}

HVDLITE_EXPORT int hvdlite_rank(void) {
  auto rt = runtime_or_null();
  return rt ? rt->rank() : -1;
}

HVDLITE_EXPORT int hvdlite_size(void) {
  auto rt = runtime_or_null();
  return rt ? rt->size() : -1;
}

namespace {
// slot_home: the caller's own request, where request is a copy of it.
int64_t submit_one(const hvdlite_request* request, uint64_t* slot_home) {
  int64_t handle = 0;
  const int status = guarded([&] {
    if (!request) return fail(StatusCode::kInvalidArgument, "null request");
    {
      // Under the lock rather than through a copy of the runtime's pointer: the slot's submission is short, and the
      // copy's two reference-count updates cost as much as the lock again.
      std::lock_guard<std::mutex> lock(g_mutex);
      if (g_runtime && g_runtime->submit_fast(request, 1, &handle)) return static_cast<int>(HVDLITE_OK);
    }
    auto rt = runtime_or_null();
    if (!rt) return not_initialized();
    return report(rt->enqueue(request, 1, &handle, nullptr, slot_home ? &slot_home : nullptr));
  });
  return status == HVDLITE_OK ? handle : -static_cast<int64_t>(status);
}

uint64_t* slot_of(const hvdlite_request& request) { return const_cast<uint64_t*>(&request.name_slot); }
}  // namespace

HVDLITE_EXPORT int64_t hvdlite_submit(const hvdlite_request* request) { return submit_one(request, nullptr); }

namespace {
// The request with its buffers replaced, copied on the stack (the core copies it again when it queues it).
hvdlite_request at_buffers(const hvdlite_request& request, uintptr_t input, uintptr_t output) {
  hvdlite_request moved = request;
  moved.input = reinterpret_cast<const void*>(input);
  moved.output = reinterpret_cast<void*>(output);
  return moved;
}
}  // namespace

HVDLITE_EXPORT int64_t hvdlite_submit_at(const hvdlite_request* request, uintptr_t input, uintptr_t output) {
  if (!request) return hvdlite_submit(nullptr);
  const hvdlite_request moved = at_buffers(*request, input, output);
  return submit_one(&moved, slot_of(*request));
}

HVDLITE_EXPORT int hvdlite_enqueue_many(const hvdlite_request* requests, int32_t count, int64_t* handles_out) {
  return guarded([&] {
    auto rt = runtime_or_null();
    if (!rt) return not_initialized();
    if (count < 0 || (count > 0 && (!requests || !handles_out))) {
      return fail(StatusCode::kInvalidArgument, "invalid request array");
    }
    return report(rt->enqueue(requests, count, handles_out));
  });
}

HVDLITE_EXPORT int hvdlite_enqueue_batch(const hvdlite_request* templates, const int32_t* indices,
                                         const uintptr_t* buffers, int32_t count, int64_t* handles_out) {
  return guarded([&] {
    auto rt = runtime_or_null();
    if (!rt) return not_initialized();
    if (count < 0 || (count > 0 && (!templates || !indices || !buffers || !handles_out))) {
      return fail(StatusCode::kInvalidArgument, "invalid batch");
    }
    thread_local std::vector<hvdlite_request> requests;  // reused: an optimizer submits a batch every step
    thread_local std::vector<uint64_t*> slot_homes;
    requests.clear();
    slot_homes.clear();
    for (int32_t i = 0; i < count; ++i) {
      hvdlite_request r = templates[indices[i]];
      r.input = reinterpret_cast<const void*>(buffers[i]);
      r.output = reinterpret_cast<void*>(buffers[i]);
      requests.push_back(r);
      slot_homes.push_back(slot_of(templates[indices[i]]));
    }
    if (rt->submit_fast(requests.data(), count, handles_out)) return static_cast<int>(HVDLITE_OK);
    return report(rt->enqueue(requests.data(), count, handles_out, nullptr, slot_homes.data()));
  });
}

HVDLITE_EXPORT int hvdlite_gather_bytes(void* destination, const uintptr_t* sources, const int64_t* nbytes,
                                        int32_t count) {
  if (count < 0 || (count > 0 && (!destination || !sources || !nbytes))) {
    return fail(StatusCode::kInvalidArgument, "invalid gather");
  }
  char* out = static_cast<char*>(destination);
  for (int32_t i = 0; i < count; ++i) {
    copy_bytes(out, reinterpret_cast<const void*>(sources[i]), static_cast<size_t>(nbytes[i]));
    out += nbytes[i];
  }
  return HVDLITE_OK;
}

HVDLITE_EXPORT int hvdlite_scatter_bytes(const void* source, const uintptr_t* destinations, const int64_t* nbytes,
                                         int32_t count) {
  if (count < 0 || (count > 0 && (!source || !destinations || !nbytes))) {
    return fail(StatusCode::kInvalidArgument, "invalid scatter");
  }
  const char* in = static_cast<const char*>(source);
  for (int32_t i = 0; i < count; ++i) {
    copy_bytes(reinterpret_cast<void*>(destinations[i]), in, static_cast<size_t>(nbytes[i]));
    in += nbytes[i];
  }
  return HVDLITE_OK;
}

HVDLITE_EXPORT int hvdlite_poll(int64_t handle) {
  auto state = find_handle(handle);
  if (!state) return -1;
  return state->finished() ? 1 : 0;
}

namespace {
int wait_for(int64_t handle, double timeout_seconds, bool release_on_success) {
  return guarded([&] {
    std::shared_ptr<HandleState> state;
    FastSlot* const slot = g_slots.owner(handle);
    if (slot) {
      // Most of a step's gradients have finished by the time they are synchronized: no lock, no wait.
      if (release_on_success && slot->outcome.finished() && slot->outcome.status.ok()) {
        FastSlots::release(*slot);
        return static_cast<int>(HVDLITE_OK);
      }
      state = outcome_of(*slot);
    } else if (release_on_success) {
      // The same for the table's operations: one lock.
      const HandleTable::Outcome outcome = g_handles.release_if_done(handle, &state);
      if (outcome == HandleTable::Outcome::kReleased) return static_cast<int>(HVDLITE_OK);
      if (outcome == HandleTable::Outcome::kUnknown) return unknown_handle(handle);
    } else {
      state = g_handles.get(handle);
      if (!state) return unknown_handle(handle);
    }
    int64_t timeout_us = timeout_seconds > 0 ? static_cast<int64_t>(timeout_seconds * 1e6) : -1;
    auto rt = runtime_or_null();
    bool finished;
    if (rt) {
      finished = rt->wait(*state, timeout_us);
    } else {  // shut down: every operation it had was finished (aborted) before it went away
      auto start = Clock::now();
      while (!(finished = state->finished()) && (timeout_us < 0 || micros_since(start) < timeout_us)) {
        futex_wait(&state->done, 0, 1000);
      }
    }
    if (!finished) return fail(StatusCode::kTimeout, "timed out waiting for handle " + std::to_string(handle));
    if (release_on_success && state->status.ok()) {
      release_handle(handle);
      return static_cast<int>(HVDLITE_OK);
    }
    return report(state->status);
  });
}
}  // namespace

HVDLITE_EXPORT int hvdlite_wait(int64_t handle, double timeout_seconds) {
  return wait_for(handle, timeout_seconds, false);
}

HVDLITE_EXPORT int hvdlite_finish(int64_t handle) { return wait_for(handle, HVDLITE_WAIT_SLICE_MS * 1e-3, true); }

HVDLITE_EXPORT int hvdlite_finish_holding(int64_t handle, void (*release)(void*), void* context) {
  HeldLock& held = held_lock();
  held = {release, context};
  const int status = hvdlite_finish(handle);
  held.release = nullptr;  // not given up: the operation had finished
  return status;
}

HVDLITE_EXPORT int hvdlite_wait_many(const int64_t* handles, int32_t count, double timeout_seconds) {
  return guarded([&] {
    if (count < 0 || (count > 0 && !handles)) return fail(StatusCode::kInvalidArgument, "invalid handle array");
    std::vector<std::shared_ptr<HandleState>> states(static_cast<size_t>(count));
    for (int32_t i = 0; i < count; ++i) {
      states[i] = find_handle(handles[i]);
      if (!states[i]) return unknown_handle(handles[i]);
    }
    const int64_t timeout_us = timeout_seconds > 0 ? static_cast<int64_t>(timeout_seconds * 1e6) : -1;
    const auto start = Clock::now();
    auto rt = runtime_or_null();
    // Waiting on each in turn drives the cycles that finish the rest too; the later ones are mostly done.
    for (const auto& state : states) {
      if (state->finished()) continue;
      int64_t left = timeout_us < 0 ? -1 : std::max<int64_t>(0, timeout_us - micros_since(start));
      bool finished = rt ? rt->wait(*state, left) : state->finished();
      if (!finished) return fail(StatusCode::kTimeout, "timed out waiting for " + std::to_string(count) + " handles");
    }
    for (int32_t i = 0; i < count; ++i) {
      if (!states[i]->status.ok()) return report(states[i]->status);
    }
    for (int32_t i = 0; i < count; ++i) g_slots.release(handles[i]);  // ids the slots do not know are left alone
    g_handles.release_many(handles, count);
    return static_cast<int>(HVDLITE_OK);
  });
}

namespace {
int64_t run_one(const hvdlite_request* request, uint64_t* slot_home) {
  int64_t live = 0;
  const int status = guarded([&] {
    auto rt = runtime_or_null();
    if (!rt) return not_initialized();
    if (!request) return fail(StatusCode::kInvalidArgument, "null request");
    std::shared_ptr<HandleState> state;
    Runtime::Steady steady = Runtime::Steady::kTakeQueue;
    if (rt->steady_candidate(*request)) {
      Status failure;
      steady = rt->run_steady(*request, slot_home ? slot_home : slot_of(*request), &state, &failure);
      if (steady == Runtime::Steady::kDone) return static_cast<int>(HVDLITE_OK);
      if (steady == Runtime::Steady::kFailed) return report(failure);
    }
    if (steady == Runtime::Steady::kTakeQueue) {
      Status queued = rt->enqueue(request, 1, nullptr, &state, slot_home ? &slot_home : nullptr, nullptr, true);
      if (!queued.ok()) return report(queued);
    }
    const bool finished = rt->wait(*state, int64_t{HVDLITE_WAIT_SLICE_MS} * 1000);
    // Still running, or failed: only now does the operation need a handle, for the caller to wait on or to read
    // the error from (a hash-table insert and erase less for the common case).
    if (!finished || !state->status.ok()) live = g_handles.add(state);
    return static_cast<int>(HVDLITE_OK);
  });
  const int64_t result = status == HVDLITE_OK ? live : -static_cast<int64_t>(status);
  g_last_run = result;
  return result;
}
}  // namespace

HVDLITE_EXPORT int64_t hvdlite_run(const hvdlite_request* request) { return run_one(request, nullptr); }

HVDLITE_EXPORT int64_t hvdlite_run_at(const hvdlite_request* request, uintptr_t input, uintptr_t output) {
  if (!request) return hvdlite_run(nullptr);
  const hvdlite_request moved = at_buffers(*request, input, output);
  return run_one(&moved, slot_of(*request));
}

HVDLITE_EXPORT int64_t hvdlite_run_holding(const hvdlite_request* request, uintptr_t input, uintptr_t output,
                                           void (*release)(void*), void* context) {
  HeldLock& held = held_lock();
  held = {release, context};
  const int64_t result = output ? hvdlite_run_at(request, input, output) : hvdlite_run(request);
  held.release = nullptr;  // not given up: the call did not wait
  return result;
}

HVDLITE_EXPORT int64_t hvdlite_last_run(void) { return g_last_run; }

HVDLITE_EXPORT int hvdlite_handle_error(int64_t handle, char* buffer, int32_t capacity) {
  auto state = find_handle(handle);
  if (!state) return unknown_handle(handle);
  return copy_text(state->finished() ? state->status.message() : "", buffer, capacity);
}

HVDLITE_EXPORT int hvdlite_handle_output_shape(int64_t handle, int64_t* shape_out, int32_t capacity,
                                               int32_t* ndim_out) {
  auto state = find_handle(handle);
  if (!state) return unknown_handle(handle);
  if (!state->finished()) return fail(StatusCode::kInProgress, "operation still in progress");
  *ndim_out = static_cast<int32_t>(state->output_shape.size());
  for (int32_t i = 0; i < std::min(*ndim_out, capacity); ++i) shape_out[i] = state->output_shape[i];
  return HVDLITE_OK;
}

HVDLITE_EXPORT int hvdlite_handle_output_copy(int64_t handle, void* destination, int64_t nbytes) {
  auto state = find_handle(handle);
  if (!state) return unknown_handle(handle);
  if (!state->finished()) return fail(StatusCode::kInProgress, "operation still in progress");
  if (nbytes < 0 || static_cast<size_t>(nbytes) != state->output_bytes) {
    return fail(StatusCode::kInvalidArgument, "output is " + std::to_string(state->output_bytes) +
                                                  " bytes, the destination " + std::to_string(nbytes));
  }
  if (nbytes > 0 && state->device_output) {  // CUDA memory: cudaMemcpy finds each side's location itself
    return guarded([&]() {
      const GpuAvailability& gpu = gpu_availability(Config());
      check_cuda(*gpu.cuda,
                 gpu.cuda->Memcpy(destination, state->device_output.get(), static_cast<size_t>(nbytes),
                                  cuda::kMemcpyDefault),
                 "cudaMemcpy of a result");
      return HVDLITE_OK;
    });
  }
  if (nbytes > 0) std::memcpy(destination, state->output.get(), static_cast<size_t>(nbytes));
  return HVDLITE_OK;
}

HVDLITE_EXPORT int hvdlite_handle_int_results(int64_t handle, int32_t* values_out, int32_t capacity,
                                              int32_t* count_out) {
  auto state = find_handle(handle);
  if (!state) return unknown_handle(handle);
  *count_out = static_cast<int32_t>(state->int_results.size());
  for (int32_t i = 0; i < std::min(*count_out, capacity); ++i) values_out[i] = state->int_results[i];
  return HVDLITE_OK;
}

HVDLITE_EXPORT int hvdlite_handle_release(int64_t handle) {
  release_handle(handle);
  return HVDLITE_OK;
}

HVDLITE_EXPORT int hvdlite_process_set_ranks(int32_t id, int32_t* ranks_out, int32_t capacity, int32_t* count_out) {
  return guarded([&] {
    auto rt = runtime_or_null();
    if (!rt) return not_initialized();
    std::vector<int> members;
    if (!rt->process_sets().members(id, &members)) {
      return fail(StatusCode::kInvalidArgument, "process set " + std::to_string(id) + " does not exist");
    }
    *count_out = static_cast<int32_t>(members.size());
    for (int32_t i = 0; i < std::min(*count_out, capacity); ++i) ranks_out[i] = members[i];
    return static_cast<int>(HVDLITE_OK);
  });
}

HVDLITE_EXPORT int hvdlite_process_set_ids(int32_t* ids_out, int32_t capacity, int32_t* count_out) {
  return guarded([&] {
    auto rt = runtime_or_null();
    if (!rt) return not_initialized();
    std::vector<int> ids = rt->process_sets().ids();
    *count_out = static_cast<int32_t>(ids.size());
    for (int32_t i = 0; i < std::min(*count_out, capacity); ++i) ids_out[i] = ids[i];
    return static_cast<int>(HVDLITE_OK);
  });
}

HVDLITE_EXPORT int hvdlite_start_timeline(const char* file_path, int32_t mark_cycles) {
  return guarded([&] {
    auto rt = runtime_or_null();
    if (!rt) return not_initialized();
    if (!file_path || !*file_path) return fail(StatusCode::kInvalidArgument, "start_timeline needs a file path");
    rt->start_timeline(file_path, mark_cycles != 0);
    return static_cast<int>(HVDLITE_OK);
  });
}

HVDLITE_EXPORT int hvdlite_stop_timeline(void) {
  return guarded([&] {
    auto rt = runtime_or_null();
    if (!rt) return not_initialized();
    rt->stop_timeline();
    return static_cast<int>(HVDLITE_OK);
  });
}

HVDLITE_EXPORT int hvdlite_timeline_members(const char* tensor, const char** members, int32_t count) {
  return guarded([&] {
    if (!tensor || count < 0 || (count > 0 && !members)) {
      return fail(StatusCode::kInvalidArgument, "timeline_members needs a tensor name and count member names");
    }
    std::vector<std::string> names;
    for (int32_t i = 0; i < count; ++i) names.emplace_back(members[i] ? members[i] : "");
    Timeline::describe_members(tensor, std::move(names));
    return static_cast<int>(HVDLITE_OK);
  });
}

HVDLITE_EXPORT int hvdlite_timeline_counter(const char* name, const char** keys, const double* values,
                                            int32_t count) {
  return guarded([&] {
    auto rt = runtime_or_null();
    if (!rt) return not_initialized();
    if (!name || count < 0 || (count > 0 && (!keys || !values))) {
      return fail(StatusCode::kInvalidArgument, "timeline_counter needs a name and count keys and values");
    }
    if (!rt->timeline().enabled()) return static_cast<int>(HVDLITE_OK);
    std::vector<std::pair<std::string, double>> figures;
    for (int32_t i = 0; i < count; ++i) figures.emplace_back(keys[i] ? keys[i] : "", values[i]);
    rt->timeline().counter(name, figures);
    return static_cast<int>(HVDLITE_OK);
  });
}

HVDLITE_EXPORT int hvdlite_knob_table(char* buffer, int32_t capacity) {
  return copy_text(Config::KnobTable(), buffer, capacity);
}

HVDLITE_EXPORT int hvdlite_build_info(char* buffer, int32_t capacity) {
  std::string info = "version=0.1.0;backends=tcp,shm;";
  // MPI: built (the plugin exists), usable (it loads with its MPI library), and why not; values lose their
  // ';' so the text stays "key=value;...".
  Config config;
  try {
    config = Config::FromEnvironment();
  } catch (const Error&) {  // a malformed knob is init's to report; the build facts do not depend on it
  }
  const MpiAvailability& mpi = mpi_availability(config);
  auto clean = [](std::string text) {
    std::replace(text.begin(), text.end(), ';', ',');
    return text;
  };
  info += "mpi=" + std::string(mpi.usable ? "1" : "0") + ";mpi_built=" + (mpi.built ? "1" : "0") + ";";
  if (!mpi.usable) info += "mpi_missing=" + clean(mpi.why_not) + ";";
  if (mpi.usable) info += "mpi_library=" + clean(mpi.library_version) + ";";
  info += "mpi_thread_multiple=" + std::string(mpi_thread_multiple() ? "1" : "0") + ";";
  // NCCL: usable when the CUDA runtime and NCCL load and a device is visible (gpu/cuda_api.h).
  const GpuAvailability& gpu = gpu_availability(config);
  info += "nccl=" + std::string(gpu.usable ? "1" : "0") + ";";
  if (gpu.usable) {
    info += "nccl_version=" + std::to_string(gpu.nccl_version) + ";nccl_library=" + clean(gpu.nccl_path) +
            ";cuda_devices=" + std::to_string(gpu.device_count) + ";";
  } else {
    info += "nccl_missing=" + clean(gpu.why_not) + ";";
  }
  auto rt = runtime_or_null();
  if (rt) info += rt->describe();
  return copy_text(info, buffer, capacity);
}

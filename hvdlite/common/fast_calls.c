/* hvdlite._fast_calls: the steady state of the per-tensor calls a training step makes thousands of times (an
 * in-place allreduce of a named host tensor, synchronous or not, and the synchronize of its handle; a
 * DistributedOptimizer's gradient hook and the reads of its buckets' gradients), written in C against CPython's
 * stable ABI. The Python functions in hvdlite/torch/core_ops.py, hvdlite/common/ops.py,
 * hvdlite/torch/gradient_hooks.py and hvdlite/torch/gradient_buckets.py do the same and remain the reference: every
 * case this module does not take (a first call, anything that differs from what the request was prepared from, a
 * failure) returns None or the caller's sentinel and goes their way.
 *
 * Why C: the Python of such a call (a frame, a dictionary lookup, ten comparisons, the cffi call) cost about as much
 * as the collective itself. Nothing here is compiled against PyTorch: a tensor is read through its Python attributes,
 * as the Python code reads it.
 *
 * allreduce_, allreduce_async_ and synchronize here are hvdlite.torch's public functions themselves, bound as Python
 * binds the reference's parameters: the wrapper's frame was a tenth of a collective per tensor. Every call they do
 * not take goes to the reference with the same arguments, which raises its own errors. torch.compile cannot trace a
 * C function: it traces a Python stand-in in allreduce_'s place (hvdlite/torch/compiled_ops.py).
 *
 * The prepared entries' layout, and the records through which a named call finds its entry: prepared_entries.h. How a
 * tensor is read: tensor_reads.h. The optimizer's gradient hook and bucket reads: gradient_calls.h. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "gradient_calls.h"
#include "hvdlite.h"
#include "prepared_entries.h"
#include "tensor_reads.h"

static PyObject* prepared;   /* ops._prepared: name -> entry */
static PyObject* results;    /* HandleTable.results: core handle -> what synchronize returns */
static PyObject* inputs;     /* HandleTable.inputs: core handle -> a buffer kept alive besides */
static PyObject* host;       /* core_ops' host placement */
static PyObject* global_set; /* the global process set, whose id is 0 */
static PyObject* zero;
static PyObject* one;        /* the scale factors' default, 1.0 */
static PyObject* unfinished; /* finish()'s otherwise, for synchronize */
/* The public functions' references (core_ops' Python functions); ops.check, ops.run_unfinished and
 * ops.run_interrupted; and core_ops' namespace, whose cpu_placement the fake-CUDA tests set to a device. */
static PyObject *reference_allreduce_, *reference_allreduce_async_, *reference_synchronize, *check_status;
static PyObject *run_unfinished, *run_interrupted, *placement_namespace;
/* hvdlite.torch.allreduce's reference, the compression that compresses nothing, torch.empty_like and
 * torch.is_grad_enabled (setup_allreduce). */
static PyObject *reference_allreduce, *compression_none, *empty_like, *is_grad_enabled;
static PyObject* s_cpu_placement;
/* The parameters of the allreduces and of synchronize, in order, as the references name them. */
enum {
  kTensor,
  kAverage,
  kName,
  kOpArgument,
  kPrescaleArgument,
  kPostscaleArgument,
  kProcessSet,
  kAllreduceParameters
};
static PyObject* allreduce_parameters[kAllreduceParameters];
/* allreduce's, into a new tensor: the same with compression after name. */
enum {
  kNewTensor,
  kNewAverage,
  kNewName,
  kNewCompression,
  kNewOp,
  kNewPrescale,
  kNewPostscale,
  kNewProcessSet,
  kAllreduceNewParameters
};
static PyObject* allreduce_new_parameters[kAllreduceNewParameters];
static PyObject* synchronize_parameters[1];
/* Calls taken here, for the tests: run, submit, finish. */
static unsigned long long taken_run, taken_submit, taken_finish;
static PyObject *s_process_set_id, *s_requires_grad;

/* The value of an int the core gave (a handle, or minus a status): as PyLong_AsLongLong for every value in its range,
 * two's complement, without its general conversion, which the handles' high bits send byte by byte. */
static long long core_value(PyObject* number) { return (long long)PyLong_AsUnsignedLongLongMask(number); }

/* Whether the shape read from a tensor is the record's. */
static int steady_shape(const Steady* facts, PyObject* shape) {
  if (facts->ndim < 0 || !PyTuple_Check(shape)) return equal(facts->shape, shape) == 1;
  if (PyTuple_Size(shape) != facts->ndim) return 0;
  for (Py_ssize_t i = 0; i < facts->ndim; ++i) {
    const long long extent = PyLong_AsLongLong(PyTuple_GetItem(shape, i));
    if (extent != facts->dims[i]) return 0; /* (-1 with an error set: no extent is) */
  }
  return 1;
}

/* Whether a named call gives what the record's entry was prepared from (the tensor read through its attributes,
 * which may run Python code); its data's address in *pointer. 0 when it does not, or a read failed (an exception
 * set). */
static int steady_matches(const Steady* facts, PyObject* const* args, void** pointer) {
  PyObject *tensor = args[1], *op = args[2], *prescale = args[3], *postscale = args[4], *process_set = args[5];
  PyObject* dtype = read_attribute(tensor, kReadDtype);
  if (!dtype) return 0;
  const int same_dtype = dtype == facts->dtype;
  Py_DECREF(dtype);
  if (!same_dtype) return 0;
  PyObject* shape = read_attribute(tensor, kReadShape);
  if (!shape) return 0;
  int same = steady_shape(facts, shape);
  Py_DECREF(shape);
  if (!same) return 0;
  if (equal(facts->op, op) != 1 || equal(facts->prescale, prescale) != 1 || equal(facts->postscale, postscale) != 1)
    return 0;
  if (process_set == global_set) {
    same = equal(facts->set, zero);
  } else {
    PyObject* id = PyObject_GetAttr(process_set, s_process_set_id);
    if (!id) return 0;
    same = equal(facts->set, id);
    Py_DECREF(id);
  }
  return same == 1 && attribute_true(tensor, kReadIsCpu) == 1 && contiguous_address(tensor, pointer);
}

/* A new reference to the entry prepared under args[0] when the call matches it, its request in *request; else NULL,
 * an exception perhaps set. The entry is held through the call: its buffers hold the request the core reads. */
static PyObject* steady_entry(PyObject* const* args, void** pointer, const hvdlite_request** request) {
  const Steady* record = steady_record(args[0], prepared, host);
  if (!record) return NULL;
  const Steady facts = *record; /* the reads below may run Python code that forgets the record */
  /* The core reads the request's lines and its shape (ops puts it right behind) on submission; asked for now, they
   * arrive while the tensor's reads below wait for torch's objects, instead of after them. */
  __builtin_prefetch(facts.request);
  __builtin_prefetch((const char*)facts.request + 64);
  __builtin_prefetch((const char*)facts.request + 127 + facts.ndim * 8);
  Py_INCREF(facts.entry);
  if (steady_matches(&facts, args, pointer)) {
    *request = facts.request;
    return facts.entry;
  }
  Py_DECREF(facts.entry);
  return NULL;
}

/* The same for an unnamed tensor (args[0] None), whose entry is prepared under what it carries, as
 * core_ops._prepared_unnamed keys it: (dtype, shape, op, prescale, postscale, process set id, placement). */
static PyObject* unnamed_entry(PyObject* const* args, void** pointer, const hvdlite_request** request) {
  PyObject *tensor = args[1], *process_set = args[5];
  if (attribute_true(tensor, kReadIsCpu) != 1) return NULL; /* before the key: a CUDA tensor's is never there */
  PyObject* set_id = process_set == global_set ? zero : PyObject_GetAttr(process_set, s_process_set_id);
  if (!set_id) return NULL;
  if (set_id == zero) Py_INCREF(set_id);
  PyObject* dtype = read_attribute(tensor, kReadDtype);
  PyObject* shape = dtype ? read_attribute(tensor, kReadShape) : NULL;
  PyObject* key = shape ? PyTuple_Pack(7, dtype, shape, args[2], args[3], args[4], set_id, host) : NULL;
  Py_XDECREF(dtype);
  Py_XDECREF(shape);
  Py_DECREF(set_id);
  if (!key) return NULL;
  PyObject* entry = PyDict_GetItemWithError(prepared, key); /* borrowed */
  Py_DECREF(key);
  if (!entry || !PyTuple_Check(entry) || PyTuple_Size(entry) != kEntrySize) return NULL;
  Py_INCREF(entry);
  if (PyTuple_GetItem(entry, kPlacement) == host && contiguous_address(tensor, pointer) &&
      (*request = (const hvdlite_request*)PyLong_AsVoidPtr(PyTuple_GetItem(entry, kAddress))))
    return entry;
  Py_DECREF(entry);
  return NULL;
}

/* A call run() or submit() takes: its entry (held until the core is done with the request), the request, and the
 * tensor's address when the request was prepared on other buffers (0: on these). */
typedef struct {
  PyObject* entry;
  const hvdlite_request* request;
  uintptr_t moved_to;
} Taken;

static int take(PyObject* const* args, Py_ssize_t nargs, Taken* call) {
  void* pointer = NULL;
  call->entry = nargs != 6           ? NULL
                : args[0] == Py_None ? unnamed_entry(args, &pointer, &call->request)
                                     : steady_entry(args, &pointer, &call->request);
  if (!call->entry) return 0;
  /* The struct holds the entry's input and output addresses: read there, not converted from its integers. */
  const int moved = call->request->input != pointer || call->request->output != pointer;
  call->moved_to = moved ? (uintptr_t)pointer : 0;
  return 1;
}

/* Whether host tensors are placed on the host now (the fake-CUDA tests place them on a device: the Python way). */
static int host_placement(void) {
  return placement_namespace && PyDict_GetItemWithError(placement_namespace, s_cpu_placement) == host;
}

/* The GIL given up from inside the core, which stores the thread state where it is told. */
static void release_gil(void* saved) { *(PyThreadState**)saved = PyEval_SaveThread(); }

/* hvdlite_run of a taken call's request, into output (0: where it was prepared to write), its entry released. The
 * GIL stays held unless the call waits for long (a late peer, a slice of waiting): giving it up and taking it back
 * is a noticeable part of a steady-state call of a microsecond. */
static PyObject* run_taken(Taken* call, uintptr_t output) {
  const uintptr_t input = call->moved_to ? call->moved_to : (uintptr_t)call->request->input;
  PyThreadState* saved = NULL;
  const int64_t live = hvdlite_run_holding(call->request, input, output, release_gil, &saved);
  if (saved) PyEval_RestoreThread(saved);
  Py_DECREF(call->entry);
  ++taken_run;
  return PyLong_FromLongLong(live);
}

/* run(name or None, tensor, op, prescale, postscale, process_set), for allreduce_: hvdlite_run of the prepared
 * in-place allreduce. None when not taken; else what hvdlite_run returned (0: finished; a handle still running or
 * failed; minus a status). */
static PyObject* run(PyObject* module, PyObject* const* args, Py_ssize_t nargs) {
  Taken call;
  if (!take(args, nargs, &call)) return not_taken();
  return run_taken(&call, call.moved_to);
}

/* submit(name or None, tensor, op, prescale, postscale, process_set), for allreduce_async_: hvdlite_submit of the
 * prepared in-place allreduce, its handle recorded with the tensor as its result. None when not taken; else the
 * handle, or minus a status. */
static PyObject* submit(PyObject* module, PyObject* const* args, Py_ssize_t nargs) {
  Taken call;
  if (!take(args, nargs, &call)) return not_taken();
  /* Queuing never waits on other ranks: the GIL stays held, as for a dictionary store. */
  const int64_t handle =
      call.moved_to ? hvdlite_submit_at(call.request, call.moved_to, call.moved_to) : hvdlite_submit(call.request);
  Py_DECREF(call.entry);
  ++taken_submit;
  PyObject* number = PyLong_FromLongLong(handle);
  if (number && handle > 0 && PyDict_SetItem(results, number, args[1]) < 0) Py_CLEAR(number);
  return number;
}

/* finish(handle, otherwise), for synchronize: the result of a handle submit() recorded, once hvdlite_finish says it
 * finished well (within a slice); otherwise, with the handle and its result left as they were, for the Python path.
 * As there, the result leaves the table before the wait, so that another thread's synchronize of it finds nothing. */
static PyObject* finish(PyObject* module, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "finish(handle, otherwise)");
    return NULL;
  }
  PyObject *handle = args[0], *otherwise = args[1];
  const int64_t core_handle = PyLong_CheckExact(handle) ? core_value(handle) : 0;
  PyObject* result = core_handle > 0 ? PyDict_GetItemWithError(results, handle) : NULL; /* borrowed */
  if (!result) {
    PyErr_Clear();
    Py_INCREF(otherwise);
    return otherwise;
  }
  Py_INCREF(result);
  if (PyDict_DelItem(results, handle) < 0) {
    Py_DECREF(result);
    return NULL;
  }
  PyThreadState* saved = NULL; /* the GIL, given up only if the operation has not finished */
  const int status = hvdlite_finish_holding(core_handle, release_gil, &saved);
  if (saved) PyEval_RestoreThread(saved);
  if (status != 0) { /* still running, or failed: the Python path waits, or reports the error */
    const int restored = PyDict_SetItem(results, handle, result);
    Py_DECREF(result);
    if (restored < 0) return NULL;
    Py_INCREF(otherwise);
    return otherwise;
  }
  if (PyDict_Size(inputs) > 0 && PyDict_GetItemWithError(inputs, handle) && PyDict_DelItem(inputs, handle) < 0) {
    Py_DECREF(result);
    return NULL;
  }
  ++taken_finish;
  return result;
}

/* The call's arguments bound to the parameters names[0..count) as Python binds them, into bound (borrowed; NULL where
 * not given). 0 when they do not bind (too many, a keyword unknown or given twice): the reference raises then. */
static int bind(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, PyObject* const* names, int count,
                PyObject** bound) {
  if (nargs > count) return 0;
  for (int i = 0; i < count; ++i) bound[i] = i < nargs ? args[i] : NULL;
  const Py_ssize_t keywords = kwnames ? PyTuple_Size(kwnames) : 0;
  for (Py_ssize_t k = 0; k < keywords; ++k) {
    PyObject* keyword = PyTuple_GetItem(kwnames, k);
    int slot = -1;
    for (int i = 0; i < count && slot < 0; ++i) /* a call's keywords are interned constants: same objects */
      if (keyword == names[i]) slot = i;
    for (int i = 0; i < count && slot < 0; ++i)
      if (PyUnicode_Compare(keyword, names[i]) == 0) slot = i;
    if (slot < 0 || bound[slot]) return 0;
    bound[slot] = args[nargs + k];
  }
  return 1;
}

/* reference(*args, **kwargs): a call the public function did not take, with the arguments it was given. */
static PyObject* call_reference(PyObject* reference, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  PyErr_Clear(); /* a read that failed here fails again there, with the reference's own error */
  PyObject* positional = PyTuple_New(nargs);
  if (!positional) return NULL;
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    Py_INCREF(args[i]);
    PyTuple_SetItem(positional, i, args[i]);
  }
  PyObject* keywords = NULL;
  const Py_ssize_t count = kwnames ? PyTuple_Size(kwnames) : 0;
  if (count > 0 && !(keywords = PyDict_New())) {
    Py_DECREF(positional);
    return NULL;
  }
  for (Py_ssize_t k = 0; k < count; ++k) {
    if (PyDict_SetItem(keywords, PyTuple_GetItem(kwnames, k), args[nargs + k]) < 0) {
      Py_DECREF(positional);
      Py_DECREF(keywords);
      return NULL;
    }
  }
  PyObject* result = PyObject_Call(reference, positional, keywords);
  Py_DECREF(positional);
  Py_XDECREF(keywords);
  return result;
}

/* The arguments of an in-place allreduce (tensor, average=None, name=None, op=None, prescale_factor=1.0,
 * postscale_factor=1.0, process_set=global_process_set), bound as Python binds them, as run()'s and submit()'s six
 * (borrowed): 1 when the call is one they may take (a tensor given, without the deprecated average, with host
 * placement); 0 when it goes to the reference. */
static int allreduce_call(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, PyObject** call) {
  PyObject* bound[kAllreduceParameters];
  if (!bind(args, nargs, kwnames, allreduce_parameters, kAllreduceParameters, bound) || !bound[kTensor] ||
      (bound[kAverage] && bound[kAverage] != Py_None) || !host_placement())
    return 0;
  call[0] = bound[kName] ? bound[kName] : Py_None;
  call[1] = bound[kTensor];
  call[2] = bound[kOpArgument] ? bound[kOpArgument] : Py_None;
  call[3] = bound[kPrescaleArgument] ? bound[kPrescaleArgument] : one;
  call[4] = bound[kPostscaleArgument] ? bound[kPostscaleArgument] : one;
  call[5] = bound[kProcessSet] ? bound[kProcessSet] : global_set;
  return 1;
}

/* NULL with the error of a status the core returned (minus the status): ops.check raises it. */
static PyObject* raise_status(long long status) {
  PyObject* number = PyLong_FromLongLong(status);
  PyObject* none = number ? PyObject_CallFunctionObjArgs(check_status, number, NULL) : NULL;
  Py_XDECREF(number);
  Py_XDECREF(none);
  if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "hvdlite: a failed request raised nothing");
  return NULL;
}

static PyObject* not_set_up(void) {
  PyErr_SetString(PyExc_RuntimeError, "hvdlite._fast_calls: setup_public() was not called");
  return NULL;
}

/* What follows a run that allreduce_ or allreduce took (live: what run_taken returned), with the tensor and the new
 * output (NULL for allreduce_). A run that raised, or a signal handler's exception as it returned (Ctrl-C, an
 * alarm), leaves the run going on their memory, which ops.run_interrupted keeps alive until it ends: -1, the
 * exception set. A run the core did not finish within its wait slice goes to ops.run_unfinished with them, which
 * waits for it or raises its error (-1 then). 1 when the call was not taken (live None), else 0. */
static int after_run(PyObject* live, PyObject* tensor, PyObject* output) {
  const int interrupted = !live || PyErr_CheckSignals() < 0;
  if (!interrupted && live == Py_None) {
    Py_DECREF(live);
    return 1;
  }
  const long long value = interrupted ? 0 : core_value(live);
  Py_XDECREF(live);
  if (!interrupted && value == 0) return 0;
  PyObject* kept = output ? PyTuple_Pack(2, tensor, output) : Py_NewRef(tensor);
  if (interrupted) {
    PyObject *type, *value_object, *traceback;
    PyErr_Fetch(&type, &value_object, &traceback);
    PyObject* none = kept ? PyObject_CallFunctionObjArgs(run_interrupted, kept, NULL) : NULL;
    Py_XDECREF(none);
    Py_XDECREF(kept);
    PyErr_Restore(type, value_object, traceback);
    return -1;
  }
  PyObject* handle = kept ? PyLong_FromLongLong(value) : NULL;
  PyObject* none = handle ? PyObject_CallFunctionObjArgs(run_unfinished, handle, kept, NULL) : NULL;
  Py_XDECREF(handle);
  Py_XDECREF(kept);
  if (!none) return -1;
  Py_DECREF(none);
  return 0;
}

/* hvdlite.torch.allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
 * process_set=global_process_set): run() of a host tensor, named or not, without the deprecated average. Every other
 * call is the reference's. */
static PyObject* allreduce_(PyObject* module, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  PyObject* call[6];
  if (!reference_allreduce_) return not_set_up();
  if (allreduce_call(args, nargs, kwnames, call)) {
    const int after = after_run(run(module, call, 6), call[1], NULL);
    if (after < 0) return NULL;
    if (after == 0) return Py_NewRef(call[1]);
  }
  return call_reference(reference_allreduce_, args, nargs, kwnames);
}

/* Whether autograd records an allreduce of the tensor (it requires grad, with grad mode on), as
 * hvdlite.torch.allreduce's differentiable path does; -1 when a read failed. */
static int recorded_by_autograd(PyObject* tensor) {
  PyObject* requires = PyObject_GetAttr(tensor, s_requires_grad);
  const int needs = requires ? PyObject_IsTrue(requires) : -1;
  Py_XDECREF(requires);
  if (needs != 1) return needs;
  PyObject* enabled = PyObject_CallNoArgs(is_grad_enabled);
  const int on = enabled ? PyObject_IsTrue(enabled) : -1;
  Py_XDECREF(enabled);
  return on;
}

/* hvdlite.torch.allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
 * prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set): a host tensor that autograd does not
 * record, without the deprecated average or a compression, reduced into a new tensor like it (torch.empty_like) by
 * the request allreduce_ prepared for its name, the tensor left as it was. Every other call is the reference's. */
static PyObject* allreduce(PyObject* module, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  PyObject* bound[kAllreduceNewParameters];
  Taken call;
  if (!reference_allreduce) return not_set_up();
  if (bind(args, nargs, kwnames, allreduce_new_parameters, kAllreduceNewParameters, bound) && bound[kNewTensor] &&
      (!bound[kNewAverage] || bound[kNewAverage] == Py_None) &&
      (!bound[kNewCompression] || bound[kNewCompression] == compression_none) && host_placement() &&
      PyObject_TypeCheck(bound[kNewTensor], (PyTypeObject*)tensor_type) &&
      recorded_by_autograd(bound[kNewTensor]) == 0) {
    PyObject* tensor = bound[kNewTensor];
    PyObject* const taken_arguments[6] = {bound[kNewName] ? bound[kNewName] : Py_None,
                                          tensor,
                                          bound[kNewOp] ? bound[kNewOp] : Py_None,
                                          bound[kNewPrescale] ? bound[kNewPrescale] : one,
                                          bound[kNewPostscale] ? bound[kNewPostscale] : one,
                                          bound[kNewProcessSet] ? bound[kNewProcessSet] : global_set};
    if (take(taken_arguments, 6, &call)) {
      PyObject* output = PyObject_CallFunctionObjArgs(empty_like, tensor, NULL);
      PyObject* address = output ? read_attribute(output, kReadDataPtr) : NULL;
      void* pointer = address ? PyLong_AsVoidPtr(address) : NULL;
      Py_XDECREF(address);
      if (pointer) {
        if (after_run(run_taken(&call, (uintptr_t)pointer), tensor, output) < 0) Py_CLEAR(output);
        return output;
      }
      /* No address (an empty tensor has none), or a failed read: the reference's way. */
      Py_XDECREF(output);
      Py_DECREF(call.entry);
    }
  }
  return call_reference(reference_allreduce, args, nargs, kwnames);
}

/* hvdlite.torch.allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
 * process_set=global_process_set): submit() of a host tensor, named or not, without the deprecated average; every
 * other call is the reference's. */
static PyObject* allreduce_async_(PyObject* module, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  PyObject* call[6];
  if (!reference_allreduce_async_) return not_set_up();
  if (allreduce_call(args, nargs, kwnames, call)) {
    PyObject* handle = submit(module, call, 6);
    if (!handle || handle != Py_None) {
      const long long value = handle ? core_value(handle) : 0;
      if (value >= 0) return handle;
      Py_DECREF(handle);
      return raise_status(-value);
    }
    Py_DECREF(handle);
  }
  return call_reference(reference_allreduce_async_, args, nargs, kwnames);
}

/* hvdlite.torch.synchronize(handle): finish() of a handle submit() recorded; every other call is the reference's. */
static PyObject* synchronize(PyObject* module, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  PyObject* handle;
  if (!reference_synchronize) return not_set_up();
  if (bind(args, nargs, kwnames, synchronize_parameters, 1, &handle) && handle) {
    PyObject* call[2] = {handle, unfinished};
    PyObject* result = finish(module, call, 2);
    if (result != unfinished) return result;
    Py_DECREF(result);
  }
  return call_reference(reference_synchronize, args, nargs, kwnames);
}

/* setup(prepared, results, inputs, host, global_set, tensor_type): the Python objects the calls above read. */
static PyObject* setup(PyObject* module, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 6 || !PyDict_Check(args[0]) || !PyDict_Check(args[1]) || !PyDict_Check(args[2]) ||
      !PyType_Check(args[5])) {
    PyErr_SetString(PyExc_TypeError, "setup(prepared, results, inputs, host, global_set, tensor_type)");
    return NULL;
  }
  PyObject** targets[] = {&prepared, &results, &inputs, &host, &global_set, &tensor_type};
  for (int i = 0; i < 6; ++i) {
    PyObject* old = *targets[i];
    Py_INCREF(args[i]);
    *targets[i] = args[i];
    Py_XDECREF(old);
  }
  return tensor_reads_setup() < 0 ? NULL : Py_NewRef(Py_None);
}

/* setup_public(allreduce_, allreduce_async_, synchronize, check, run_unfinished, run_interrupted, namespace): the
 * references of the public functions, the ops functions they call, and core_ops' namespace. */
static PyObject* setup_public(PyObject* module, PyObject* const* args, Py_ssize_t nargs) {
  enum { kSetupArguments = 7 };
  int valid = nargs == kSetupArguments && PyDict_Check(args[kSetupArguments - 1]);
  for (int i = 0; valid && i < kSetupArguments - 1; ++i) valid = PyCallable_Check(args[i]);
  if (!valid) {
    PyErr_SetString(PyExc_TypeError,
                    "setup_public(allreduce_, allreduce_async_, synchronize, check, run_unfinished, run_interrupted, "
                    "namespace)");
    return NULL;
  }
  PyObject** targets[kSetupArguments] = {
      &reference_allreduce_, &reference_allreduce_async_, &reference_synchronize, &check_status, &run_unfinished,
      &run_interrupted,      &placement_namespace};
  for (int i = 0; i < kSetupArguments; ++i) {
    PyObject* old = *targets[i];
    Py_INCREF(args[i]);
    *targets[i] = args[i];
    Py_XDECREF(old);
  }
  Py_RETURN_NONE;
}

/* setup_allreduce(allreduce, compression_none, empty_like, is_grad_enabled): hvdlite.torch.allreduce's reference, and
 * what its C function compares with and calls. */
static PyObject* setup_allreduce(PyObject* module, PyObject* const* args, Py_ssize_t nargs) {
  enum { kSetupArguments = 4 };
  if (nargs != kSetupArguments || !PyCallable_Check(args[0]) || !PyCallable_Check(args[2]) ||
      !PyCallable_Check(args[3])) {
    PyErr_SetString(PyExc_TypeError, "setup_allreduce(allreduce, compression_none, empty_like, is_grad_enabled)");
    return NULL;
  }
  PyObject** targets[kSetupArguments] = {&reference_allreduce, &compression_none, &empty_like, &is_grad_enabled};
  for (int i = 0; i < kSetupArguments; ++i) {
    PyObject* old = *targets[i];
    *targets[i] = Py_NewRef(args[i]);
    Py_XDECREF(old);
  }
  Py_RETURN_NONE;
}

/* taken(): how many calls run, submit and finish took, as a (run, submit, finish) tuple. */
static PyObject* taken(PyObject* module, PyObject* unused) {
  return Py_BuildValue("(KKK)", taken_run, taken_submit, taken_finish);
}

/* The tensor methods read through their C functions, by name, for the tests. */
static PyObject* direct_methods(PyObject* module, PyObject* unused) { return tensor_reads_direct(); }

static PyMethodDef methods[] = {
    {"setup", (PyCFunction)(void (*)(void))setup, METH_FASTCALL, NULL},
    {"bucket_gradients", (PyCFunction)(void (*)(void))bucket_gradients, METH_FASTCALL, NULL},
    {"gradient_note", (PyCFunction)(void (*)(void))gradient_note, METH_FASTCALL, NULL},
    {"setup_public", (PyCFunction)(void (*)(void))setup_public, METH_FASTCALL, NULL},
    {"allreduce_", (PyCFunction)(void (*)(void))allreduce_, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"allreduce_async_", (PyCFunction)(void (*)(void))allreduce_async_, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"synchronize", (PyCFunction)(void (*)(void))synchronize, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"setup_allreduce", (PyCFunction)(void (*)(void))setup_allreduce, METH_FASTCALL, NULL},
    {"allreduce", (PyCFunction)(void (*)(void))allreduce, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"forget", steady_forget, METH_O, NULL},
    {"taken", taken, METH_NOARGS, NULL},
    {"direct_methods", direct_methods, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_fast_calls", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fast_calls(void) {
  zero = PyLong_FromLong(0);
  if (steady_setup() < 0) return NULL;
  if (tensor_reads_init() < 0 || gradient_calls_init() < 0) return NULL;
  s_process_set_id = PyUnicode_InternFromString("process_set_id");
  s_requires_grad = PyUnicode_InternFromString("requires_grad");
  if (!zero || !s_process_set_id || !s_requires_grad) return NULL;
  one = PyFloat_FromDouble(1.0);
  unfinished = PyObject_CallNoArgs((PyObject*)&PyBaseObject_Type);
  s_cpu_placement = PyUnicode_InternFromString("cpu_placement");
  if (!one || !unfinished || !s_cpu_placement) return NULL;
  static const char* const allreduce_names[kAllreduceParameters] = {
      "tensor", "average", "name", "op", "prescale_factor", "postscale_factor", "process_set"};
  for (int i = 0; i < kAllreduceParameters; ++i)
    if (!(allreduce_parameters[i] = PyUnicode_InternFromString(allreduce_names[i]))) return NULL;
  static const char* const allreduce_new_names[kAllreduceNewParameters] = {
      "tensor", "average", "name", "compression", "op", "prescale_factor", "postscale_factor", "process_set"};
  for (int i = 0; i < kAllreduceNewParameters; ++i)
    if (!(allreduce_new_parameters[i] = PyUnicode_InternFromString(allreduce_new_names[i]))) return NULL;
  if (!(synchronize_parameters[0] = PyUnicode_InternFromString("handle"))) return NULL;
  return PyModule_Create(&module_def);
}

/* hvdlite._fast_calls' calls of a DistributedOptimizer's backward pass: the gradient hook autograd calls once per
 * parameter, and the reads of a gradient bucket's gradients (gradient_calls.c). The Python functions in
 * hvdlite/torch/gradient_hooks.py and hvdlite/torch/gradient_buckets.py remain the reference: every case these do not
 * take goes their way. Against CPython's stable ABI, as fast_calls.c is. */
#pragma once
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "tensor_reads.h"

/* The attribute names these read, interned; -1 with an exception set. */
FAST_CALLS_INTERNAL int gradient_calls_init(void);
/* The module's functions bucket_gradients and gradient_note (gradient_calls.c says what each does). */
FAST_CALLS_INTERNAL PyObject* bucket_gradients(PyObject* module, PyObject* const* args, Py_ssize_t nargs);
FAST_CALLS_INTERNAL PyObject* gradient_note(PyObject* module, PyObject* const* args, Py_ssize_t nargs);

/* A DistributedOptimizer's per-parameter calls in C (gradient_calls.h says what for). */
#include "gradient_calls.h"

static PyObject* s_grad;

int gradient_calls_init(void) { return (s_grad = PyUnicode_InternFromString("grad")) ? 0 : -1; }

/* bucket_gradients(members, shapes, dtype, addresses): a gradient bucket's step (hvdlite/torch/gradient_buckets.py)
 * in one call: each member's .grad, when every one is a contiguous tensor of its shape (shapes[i]) and of dtype, with
 * their data addresses written at addresses (the integer address of a uintptr_t array of len(members)); else None
 * (a gradient missing, sparse, strided or laid out otherwise), for the Python path to decide. The reads are torch's
 * either way; in Python, the frames and lists around them cost a large part of them again, per parameter. */
PyObject* bucket_gradients(PyObject* module, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4 || !PyList_Check(args[0]) || !PyList_Check(args[1]) ||
      PyList_Size(args[0]) != PyList_Size(args[1])) {
    PyErr_SetString(PyExc_TypeError, "bucket_gradients(members, shapes, dtype, addresses)");
    return NULL;
  }
  PyObject *members = args[0], *shapes = args[1], *dtype = args[2];
  uintptr_t* addresses = (uintptr_t*)PyLong_AsVoidPtr(args[3]);
  if (!addresses) return PyErr_Occurred() ? NULL : not_taken();
  const Py_ssize_t count = PyList_Size(members);
  PyObject* grads = PyList_New(count);
  if (!grads) return NULL;
  for (Py_ssize_t i = 0; i < count; ++i) {
    PyObject* grad = PyObject_GetAttr(PyList_GetItem(members, i), s_grad); /* new reference */
    if (!grad) goto not_taken;
    PyList_SetItem(grads, i, grad); /* steals it: freed with the list */
    PyObject* grad_dtype = read_attribute(grad, kReadDtype);
    if (!grad_dtype) goto not_taken;
    const int same_dtype = grad_dtype == dtype;
    Py_DECREF(grad_dtype);
    if (!same_dtype) goto not_taken;
    PyObject* shape = read_attribute(grad, kReadShape);
    if (!shape) goto not_taken;
    const int same_shape = equal(PyList_GetItem(shapes, i), shape);
    Py_DECREF(shape);
    /* (is_contiguous raises for a sparse tensor: not taken either) */
    if (same_shape != 1 || attribute_true(grad, kReadIsContiguous) != 1) goto not_taken;
    PyObject* address = read_attribute(grad, kReadDataPtr);
    if (!address) goto not_taken;
    addresses[i] = (uintptr_t)PyLong_AsVoidPtr(address);
    Py_DECREF(address);
    if (PyErr_Occurred()) goto not_taken;
  }
  return grads;
not_taken:
  Py_DECREF(grads);
  return not_taken();
}

/* A DistributedOptimizer's gradient hook (hvdlite/torch/gradient_hooks.py) for the cases where it does no more than
 * note that a parameter's gradient is final, or count it towards its gradient bucket: autograd calls it once per
 * parameter per backward pass. Its state is the tuple (handles, deferred, batched, route, fallback); route is the
 * list [mode, slots, waiting, on_full] the optimizer sets at each pass's first gradient. Once this pass has noted a
 * gradient, a parameter not yet noted is
 * - mode 1 (every gradient waits for step()): noted as handles[id(p)] = deferred;
 * - mode 2 (reduced during backward through the buckets): if slots[id(p)] names its bucket i, noted as batched and
 *   counted off waiting[i]; the bucket's last one calls on_full(i, p), which packs and queues it.
 * Any other call goes to fallback(p), the Python hook: the pass's first gradient (which starts the pass's
 * bookkeeping there), a parameter noted twice (its error), a parameter outside the buckets, and the other modes. */
static PyObject* note_gradient(PyObject* state, PyObject* parameter) {
  PyObject *handles = PyTuple_GetItem(state, 0), *route = PyTuple_GetItem(state, 3);
  const long mode = PyLong_AsLong(PyList_GetItem(route, 0));
  if (mode == -1 && PyErr_Occurred()) return NULL;
  if ((mode == 1 || mode == 2) && PyDict_Size(handles) > 0) {
    PyObject* key = PyLong_FromVoidPtr(parameter); /* id(parameter) */
    if (!key) return NULL;
    int noted = PyDict_Contains(handles, key);
    PyObject* slot = NULL; /* borrowed */
    if (noted == 0 && mode == 2) {
      slot = PyDict_GetItemWithError(PyList_GetItem(route, 1), key);
      if (!slot && PyErr_Occurred()) noted = -1;
    }
    if (noted == 0 && (mode == 1 || slot)) {
      PyObject* marker = PyTuple_GetItem(state, mode == 1 ? 1 : 2);
      const int stored = PyDict_SetItem(handles, key, marker);
      Py_DECREF(key);
      if (stored < 0) return NULL;
      if (mode == 1) Py_RETURN_NONE;
      PyObject* waiting = PyList_GetItem(route, 2);
      const Py_ssize_t index = PyLong_AsSsize_t(slot);
      PyObject* count = index < 0 ? NULL : PyList_GetItem(waiting, index);
      const long left = count ? PyLong_AsLong(count) - 1 : -1;
      if (PyErr_Occurred()) return NULL;
      PyObject* left_object = PyLong_FromLong(left);
      if (!left_object || PyList_SetItem(waiting, index, left_object) < 0) return NULL;
      if (left > 0) Py_RETURN_NONE;
      return PyObject_CallFunctionObjArgs(PyList_GetItem(route, 3), slot, parameter, NULL);
    }
    Py_DECREF(key);
    if (noted < 0) return NULL;
  }
  return PyObject_CallFunctionObjArgs(PyTuple_GetItem(state, 4), parameter, NULL);
}

static PyMethodDef note_gradient_def = {"note_gradient", note_gradient, METH_O, NULL};

/* gradient_note(handles, deferred, batched, route, fallback): the hook above, bound to its state. */
PyObject* gradient_note(PyObject* module, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 5 || !PyDict_Check(args[0]) || !PyList_Check(args[3]) || PyList_Size(args[3]) != 4 ||
      !PyCallable_Check(args[4])) {
    PyErr_SetString(PyExc_TypeError, "gradient_note(handles, deferred, batched, route, fallback)");
    return NULL;
  }
  PyObject* state = PyTuple_Pack(5, args[0], args[1], args[2], args[3], args[4]);
  if (!state) return NULL;
  PyObject* hook = PyCFunction_New(&note_gradient_def, state);
  Py_DECREF(state);
  return hook;
}

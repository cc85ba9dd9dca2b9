/* The descriptors and C functions through which fast_calls reads a tensor (tensor_reads.h says why). */
#include "tensor_reads.h"

PyObject* tensor_type;
PyObject* read_names[kReads];
PyObject* read_descriptors[kReads];
descrgetfunc read_getters[kReads];
PyCFunction read_functions[kReads];
int read_flags[kReads];
PyObject* no_arguments;

int tensor_reads_init(void) {
  static const char* const reads[kReads] = {"dtype", "shape", "is_cpu", "is_contiguous", "data_ptr"};
  for (int i = 0; i < kReads; ++i)
    if (!(read_names[i] = PyUnicode_InternFromString(reads[i]))) return -1;
  return 0;
}

/* The methods' C functions, found by binding each descriptor to an instance of the type (a builtin method knows its
 * function and flags; its descriptor does not say, in the stable ABI). A method of another kind, or a type that
 * cannot be made without arguments, keeps its descriptor's call. -1 with an exception set. */
static int find_method_functions(void) {
  for (int i = 0; i < kReads; ++i) read_functions[i] = NULL;
  if (!no_arguments && !(no_arguments = PyTuple_New(0))) return -1;
  PyObject* instance = PyObject_CallNoArgs(tensor_type);
  if (!instance) {
    PyErr_Clear();
    return 0;
  }
  for (int i = kReadIsContiguous; i < kReads; ++i) {
    if (!read_descriptors[i]) continue;
    PyObject* bound = PyObject_GetAttr(instance, read_names[i]);
    if (!bound) {
      PyErr_Clear();
      continue;
    }
    if (PyCFunction_Check(bound) && PyCFunction_GetSelf(bound) == instance) {
      const int flags = PyCFunction_GetFlags(bound) & ~METH_COEXIST;
      if (flags == METH_NOARGS || flags == (METH_VARARGS | METH_KEYWORDS) ||
          flags == (METH_FASTCALL | METH_KEYWORDS)) {
        read_functions[i] = PyCFunction_GetFunction(bound);
        read_flags[i] = flags;
      }
    }
    Py_DECREF(bound);
  }
  Py_DECREF(instance);
  return 0;
}

int tensor_reads_setup(void) {
  for (int i = 0; i < kReads; ++i) {
    Py_CLEAR(read_descriptors[i]);
    read_getters[i] = NULL;
    PyObject* descriptor = PyObject_GetAttr(tensor_type, read_names[i]);
    if (!descriptor) return -1;
    PyTypeObject* kind = Py_TYPE(descriptor);
    if (i < kReadIsContiguous) {
      read_getters[i] = (descrgetfunc)PyType_GetSlot(kind, Py_tp_descr_get);
      if (!read_getters[i] || !PyType_GetSlot(kind, Py_tp_descr_set)) {
        read_getters[i] = NULL;
        Py_DECREF(descriptor);
        continue;
      }
    } else if (!PyCallable_Check(descriptor) || PyType_GetSlot(kind, Py_tp_descr_set)) {
      Py_DECREF(descriptor);
      continue;
    }
    read_descriptors[i] = descriptor;
  }
  return find_method_functions();
}

PyObject* tensor_reads_direct(void) {
  PyObject* names = PyList_New(0);
  for (int i = 0; names && i < kReads; ++i) {
    if (read_functions[i] && PyList_Append(names, read_names[i]) < 0) Py_CLEAR(names);
  }
  return names;
}

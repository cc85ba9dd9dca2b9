/* How hvdlite._fast_calls reads a tensor: through its Python attributes, as the Python code reads it. A tensor of
 * exactly torch.Tensor is read through that type's own descriptors, which tensor_reads_setup() looks up once: finding
 * each by name on every read cost about as much as some of the reads. A tensor of any other type (a Parameter, a
 * subclass that may override them) is read by name, as Python reads it. The reads are inline here: a steady call
 * makes five of them. Against CPython's stable ABI, as fast_calls.c is. */
#pragma once
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Shared between the module's files only. */
#ifndef FAST_CALLS_INTERNAL
#define FAST_CALLS_INTERNAL __attribute__((visibility("hidden")))
#endif

enum { kReadDtype, kReadShape, kReadIsCpu, kReadIsContiguous, kReadDataPtr, kReads };
FAST_CALLS_INTERNAL extern PyObject* tensor_type;
FAST_CALLS_INTERNAL extern PyObject* read_names[kReads];
FAST_CALLS_INTERNAL extern PyObject* read_descriptors[kReads];
FAST_CALLS_INTERNAL extern descrgetfunc read_getters[kReads]; /* a property's getter; NULL for a method */
/* A method's C function, as the type defines it (NULL: called through its descriptor), and its calling convention:
 * called directly, a read skips the descriptor's argument packing and dispatch, which cost as much as some of the
 * methods' own work. */
FAST_CALLS_INTERNAL extern PyCFunction read_functions[kReads];
FAST_CALLS_INTERNAL extern int read_flags[kReads];
FAST_CALLS_INTERNAL extern PyObject* no_arguments; /* the empty tuple, for a method that takes positional arguments */
typedef PyObject* (*FastWithKeywords)(PyObject*, PyObject* const*, Py_ssize_t, PyObject*);

/* The attributes' names interned; -1 with an exception set. */
FAST_CALLS_INTERNAL int tensor_reads_init(void);
/* tensor_type's descriptors (the properties' getters, and the methods), and the methods' C functions; -1 with an
 * exception set. One that is not of its kind (another torch) stays NULL, and that attribute is read by name. */
FAST_CALLS_INTERNAL int tensor_reads_setup(void);
/* The names of the methods read through their C functions, for the tests. */
FAST_CALLS_INTERNAL PyObject* tensor_reads_direct(void);

/* A method read of a tensor of exactly the type: its C function called as its descriptor would call it. */
static inline PyObject* call_method(PyObject* tensor, int which) {
  const PyCFunction function = read_functions[which];
  switch (read_flags[which]) {
    case METH_NOARGS:
      return function(tensor, NULL);
    case METH_VARARGS | METH_KEYWORDS:
      return ((PyCFunctionWithKeywords)(void (*)(void))function)(tensor, no_arguments, NULL);
    case METH_FASTCALL | METH_KEYWORDS:
      return ((FastWithKeywords)(void (*)(void))function)(tensor, NULL, 0, NULL);
    default:
      return PyObject_CallFunctionObjArgs(read_descriptors[which], tensor, NULL);
  }
}

/* A new reference to the tensor's attribute (a method's result); NULL with an exception set. */
static inline PyObject* read_attribute(PyObject* tensor, int which) {
  if ((PyObject*)Py_TYPE(tensor) == tensor_type && read_descriptors[which]) {
    if (read_getters[which]) return read_getters[which](read_descriptors[which], tensor, tensor_type);
    if (read_functions[which]) return call_method(tensor, which);
    return PyObject_CallFunctionObjArgs(read_descriptors[which], tensor, NULL);
  }
  return which >= kReadIsContiguous ? PyObject_CallMethodObjArgs(tensor, read_names[which], NULL)
                                    : PyObject_GetAttr(tensor, read_names[which]);
}

/* 1 when the attribute is True, 0 when it is anything else, -1 with an exception set. */
static inline int attribute_true(PyObject* tensor, int which) {
  PyObject* value = read_attribute(tensor, which);
  if (!value) return -1;
  const int yes = value == Py_True;
  Py_DECREF(value);
  return yes;
}

/* Whether the tensor is contiguous; its data's address in *pointer. */
static inline int contiguous_address(PyObject* tensor, void** pointer) {
  if (attribute_true(tensor, kReadIsContiguous) != 1) return 0;
  PyObject* address = read_attribute(tensor, kReadDataPtr);
  if (!address) return 0;
  *pointer = PyLong_AsVoidPtr(address);
  Py_DECREF(address);
  return !PyErr_Occurred();
}

/* Whether two values read or given are equal. Scale factors are floats, the default a different object from the one
 * an entry was prepared with: compared by value without the rich comparison's dispatch. */
static inline int equal(PyObject* a, PyObject* b) {
  if (a == b) return 1;
  if (PyFloat_CheckExact(a) && PyFloat_CheckExact(b)) return PyFloat_AsDouble(a) == PyFloat_AsDouble(b);
  return PyObject_RichCompareBool(a, b, Py_EQ);
}

/* What the caller does with a call this module did not take: None, any failed read forgotten (the Python path reads
 * again and raises its own error). */
static inline PyObject* not_taken(void) {
  PyErr_Clear();
  Py_RETURN_NONE;
}

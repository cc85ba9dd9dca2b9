/* The steady records of named prepared entries (prepared_entries.h says what they hold and why). */
#include "prepared_entries.h"

#include <stdint.h>
#include <string.h>

enum { kSteadyChunk = 256 }; /* records allocated at a time */

static PyObject* steady_by_name; /* name -> its record's address */
static Steady* steady_cursor;    /* the record of the last named call */
static Steady* steady_free;
static Steady** steady_chunks; /* every chunk of records, for forget(None) */
static Py_ssize_t steady_chunk_count;

/* A free record (a new chunk of them when none is left), its fields zero; NULL with an exception set. */
static Steady* steady_new(void) {
  if (!steady_free) {
    Steady** chunks = PyMem_Realloc(steady_chunks, (size_t)(steady_chunk_count + 1) * sizeof(Steady*));
    char* block = chunks ? PyMem_Malloc(kSteadyChunk * sizeof(Steady) + 64) : NULL;
    if (!block) {
      if (chunks) steady_chunks = chunks;
      PyErr_NoMemory();
      return NULL;
    }
    steady_chunks = chunks;
    /* Aligned to a line, each record on two lines of its own. */
    Steady* chunk = (Steady*)(((uintptr_t)block + 63) & ~(uintptr_t)63);
    memset(chunk, 0, kSteadyChunk * sizeof(Steady));
    for (int i = 0; i + 1 < kSteadyChunk; ++i) chunk[i].next = &chunk[i + 1];
    steady_chunks[steady_chunk_count++] = chunk;
    steady_free = chunk;
  }
  Steady* record = steady_free;
  steady_free = record->next;
  record->next = NULL;
  return record;
}

/* The record's facts and request read from its entry (prepared for the host: the caller checked); 0 when a read
 * failed (an exception set), the record left to be filled again. */
static int steady_fill(Steady* record, PyObject* entry) {
  Py_CLEAR(record->entry);
  PyObject* shape = PyTuple_GetItem(entry, kShape);
  Py_ssize_t ndim = PyTuple_Check(shape) ? PyTuple_Size(shape) : -1;
  if (ndim > kInlineDims) ndim = -1;
  for (Py_ssize_t i = 0; i < ndim; ++i) {
    record->dims[i] = PyLong_AsLongLong(PyTuple_GetItem(shape, i));
    if (record->dims[i] == -1 && PyErr_Occurred()) return 0;
  }
  record->request = (const hvdlite_request*)PyLong_AsVoidPtr(PyTuple_GetItem(entry, kAddress));
  if (!record->request) return 0;
  record->ndim = ndim;
  record->shape = shape;
  record->dtype = PyTuple_GetItem(entry, kDtype);
  record->op = PyTuple_GetItem(entry, kOp);
  record->prescale = PyTuple_GetItem(entry, kPrescale);
  record->postscale = PyTuple_GetItem(entry, kPostscale);
  record->set = PyTuple_GetItem(entry, kSet);
  record->entry = Py_NewRef(entry);
  return 1;
}

/* The record of the entry prepared for host under name, filled from it; NULL when there is none (an exception
 * perhaps set). */
static Steady* steady_find(PyObject* name, PyObject* prepared, PyObject* host) {
  PyObject* entry = PyDict_GetItemWithError(prepared, name); /* borrowed */
  if (!entry || !PyTuple_Check(entry) || PyTuple_Size(entry) != kEntrySize ||
      PyTuple_GetItem(entry, kPlacement) != host)
    return NULL;
  PyObject* address = PyDict_GetItemWithError(steady_by_name, name); /* borrowed */
  Steady* record = address ? (Steady*)PyLong_AsVoidPtr(address) : NULL;
  if (!record) {
    if (PyErr_Occurred() || !(record = steady_new())) return NULL;
    PyObject* number = PyLong_FromVoidPtr(record);
    if (!number || PyDict_SetItem(steady_by_name, name, number) < 0) {
      Py_XDECREF(number);
      record->next = steady_free;
      steady_free = record;
      return NULL;
    }
    Py_DECREF(number);
    record->name = Py_NewRef(name);
  }
  if (record->entry != entry && !steady_fill(record, entry)) return NULL;
  return record;
}

const Steady* steady_record(PyObject* name, PyObject* prepared, PyObject* host) {
  Steady* record = steady_cursor ? steady_cursor->next : NULL;
  const int predicted = record && record->entry &&
                        (record->name == name || (PyUnicode_CheckExact(name) && PyUnicode_CheckExact(record->name) &&
                                                  PyUnicode_Compare(record->name, name) == 0));
  if (!predicted) {
    if (!(record = steady_find(name, prepared, host))) return NULL;
    if (steady_cursor) steady_cursor->next = record;
  }
  steady_cursor = record;
  return record;
}

PyObject* steady_forget(PyObject* module, PyObject* key) {
  if (key != Py_None) {
    PyObject* address = PyDict_GetItemWithError(steady_by_name, key); /* borrowed */
    Steady* record = address ? (Steady*)PyLong_AsVoidPtr(address) : NULL;
    if (!record) return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    Py_CLEAR(record->entry);
    Py_RETURN_NONE;
  }
  steady_cursor = NULL;
  steady_free = NULL;
  for (Py_ssize_t c = 0; c < steady_chunk_count; ++c) {
    for (int i = 0; i < kSteadyChunk; ++i) {
      Steady* record = &steady_chunks[c][i];
      Py_CLEAR(record->entry);
      Py_CLEAR(record->name);
      record->next = steady_free;
      steady_free = record;
    }
  }
  PyDict_Clear(steady_by_name);
  Py_RETURN_NONE;
}

int steady_setup(void) { return (steady_by_name = PyDict_New()) ? 0 : -1; }

/* How hvdlite._fast_calls (fast_calls.c) finds ops.prepared()'s entries: the layout of an entry tuple, and the steady
 * records of named entries (prepared_entries.c). Against CPython's stable ABI, as fast_calls.c is. */
#pragma once
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "hvdlite.h"

/* ops.prepared()'s tuples: (struct, buffers, input address, output address, dtype, shape, op, prescale, postscale,
 * process set id, placement, struct address). */
enum {
  kStruct = 0,
  kInput = 2,
  kOutput = 3,
  kDtype = 4,
  kShape,
  kOp,
  kPrescale,
  kPostscale,
  kSet,
  kPlacement,
  kAddress,
  kEntrySize
};

/* A named entry's steady record: what a call is compared with (the entry's facts) and its request, on two adjacent
 * cache lines read in place of the name's slot in the dict of every prepared entry, the entry tuple, its shape and
 * its address's int; and the record of the call that followed it last time. A step submits its names in the order of
 * the step before, so the next call's record is that one: found without hashing into a table whose misses grew with
 * every name the job had ever cached. Records are reused, never freed: a call whose reads run Python code that
 * forgets them (steady_forget) still reads memory of its own, and compares with its copy. */
enum { kInlineDims = 5 };
typedef struct Steady {
  PyObject* name;  /* NULL: free */
  PyObject* entry; /* NULL: to be filled from the dict again (its entry was replaced, or a read of it failed) */
  const hvdlite_request* request;
  PyObject* dtype; /* these four, set and shape: the entry's */
  PyObject* op;
  PyObject* prescale;
  PyObject* postscale;
  PyObject* set;
  struct Steady* next; /* a free record's: the next free one */
  PyObject* shape;
  Py_ssize_t ndim; /* -1: more dimensions than kInlineDims, compared with shape */
  long long dims[kInlineDims];
} Steady;
_Static_assert(sizeof(Steady) == 128, "a steady record is two cache lines");

/* Shared between the module's files only. */
#ifndef FAST_CALLS_INTERNAL
#define FAST_CALLS_INTERNAL __attribute__((visibility("hidden")))
#endif

/* The table of records by name; -1 with an exception set. */
FAST_CALLS_INTERNAL int steady_setup(void);

/* The record for a named call, whose entry is prepared[name] when that is prepared for host: the one that followed
 * the last named call's record last time, when it is this name's; else the one found through the dicts, which
 * becomes that successor. NULL when there is none (an exception perhaps set). */
FAST_CALLS_INTERNAL const Steady* steady_record(PyObject* name, PyObject* prepared, PyObject* host);

/* forget(key): the steady records are read from ops' dict again: key's, whose entry was replaced; every one when key
 * is None (the dict was cleared), their names and entries released. */
FAST_CALLS_INTERNAL PyObject* steady_forget(PyObject* module, PyObject* key);

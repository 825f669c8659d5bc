/* The frame walk of core/stacks.py StackCollector.capture, in C.

Why C: every captured call walks its whole Python stack (15 to 30 frames under a training loop, most of
them inside torch or the optimizer) to find the user's frames. In Python each frame costs about 0.1 µs of
attribute reads and dict probes; here about 0.02 µs.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <stdint.h>

#if PY_VERSION_HEX < 0x030B0000 /* before 3.11 the frame's fields are public */
static PyCodeObject *frame_code(PyFrameObject *f) {
    Py_INCREF(f->f_code);
    return f->f_code;
}
/* what Python's frame.f_lasti says (StackCollector._walk reads that): the field is in bytes in 3.9, in
   instructions in 3.10 */
#if PY_VERSION_HEX < 0x030A0000
static int frame_lasti(PyFrameObject *f) { return f->f_lasti; }
#else
static int frame_lasti(PyFrameObject *f) { return f->f_lasti < 0 ? -1 : f->f_lasti * (int)sizeof(_Py_CODEUNIT); }
#endif
static PyFrameObject *frame_back(PyFrameObject *f) {
    Py_XINCREF(f->f_back);
    return f->f_back;
}
#else
#define frame_code PyFrame_GetCode
#define frame_lasti PyFrame_GetLasti
#define frame_back PyFrame_GetBack
#endif

/* The skip decisions of `skip` (id(code) -> bool) again, kept in a caller's buffer (a bytearray that lives as
long as the dict): every frame of every walk asks, and the dict's keys are ints that a walk would otherwise
make and free for each frame. Entries are the code's address with the decision in the low bit (code objects
are aligned), found within a few slots of the address's hash; a code that finds no free slot is asked of
the dict each time. Valid because the dict only grows, never changes a decision, and its owner keeps every
code object it decided about alive (core/stacks.py), so an address seen here still names the same code. */
#define SKIP_PROBES 8

typedef struct {
    uintptr_t *slots;
    Py_ssize_t mask; /* slots - 1; the count is a power of two, or 0: no cache */
} skip_cache_t;

static skip_cache_t skip_cache_of(PyObject *buffer) {
    skip_cache_t c = {NULL, -1};
    if (buffer == NULL || !PyByteArray_CheckExact(buffer))
        return c;
    Py_ssize_t n = PyByteArray_GET_SIZE(buffer) / (Py_ssize_t)sizeof(uintptr_t);
    if (n >= SKIP_PROBES && (n & (n - 1)) == 0) {
        c.slots = (uintptr_t *)PyByteArray_AS_STRING(buffer);
        c.mask = n - 1;
    }
    return c;
}

/* 1: a user frame, 0: skipped, -1: not decided yet (or an error, set). */
static int is_user_code(PyObject *skip, skip_cache_t *c, PyCodeObject *code) {
    uintptr_t address = (uintptr_t)code;
    Py_ssize_t at = c->slots ? (Py_ssize_t)((address >> 4) & (uintptr_t)c->mask) : 0, free_at = -1;
    for (int i = 0; c->slots && i < SKIP_PROBES; i++) {
        uintptr_t entry = c->slots[(at + i) & c->mask];
        if ((entry & ~(uintptr_t)1) == address)
            return (int)(entry & 1);
        if (entry == 0 && free_at < 0)
            free_at = (at + i) & c->mask;
    }
    PyObject *id = PyLong_FromVoidPtr(code);
    PyObject *skipped = id ? PyDict_GetItemWithError(skip, id) : NULL;
    Py_XDECREF(id);
    if (skipped == NULL)
        return -1;
    int user = skipped == Py_False ? 1 : skipped == Py_True ? 0 : !PyObject_IsTrue(skipped);
    if (user >= 0 && free_at >= 0 && (address & 1) == 0)
        c->slots[free_at] = address | (uintptr_t)user;
    return user;
}

/* walk(frame, skip) -> (id(code), f_lasti, id(code), f_lasti, ...) of the frames from `frame` outwards whose
   code `skip` (id(code) -> bool) maps to False; None as soon as a code is not in `skip` (the caller decides
   about it, then walks again). `cache`: skip_cache_of(). */
static PyObject *walk_from(PyObject *start, PyObject *skip, skip_cache_t *cache) {
    PyObject *key = PyList_New(0);
    if (key == NULL)
        return NULL;
    PyFrameObject *frame = (PyFrameObject *)start;
    Py_INCREF(frame);
    while (frame != NULL) {
        PyCodeObject *code = frame_code(frame);
        int user = is_user_code(skip, cache, code);
        Py_DECREF(code); /* the frame keeps it alive */
        if (user < 0) {
            Py_DECREF(frame);
            Py_DECREF(key);
            if (PyErr_Occurred())
                return NULL;
            Py_RETURN_NONE; /* a code seen for the first time */
        }
        if (user) {
            PyObject *id = PyLong_FromVoidPtr(code);
            PyObject *lasti = id ? PyLong_FromLong(frame_lasti(frame)) : NULL;
            int added = lasti != NULL && PyList_Append(key, id) == 0 && PyList_Append(key, lasti) == 0;
            Py_XDECREF(id);
            Py_XDECREF(lasti);
            if (!added) {
                Py_DECREF(frame);
                Py_DECREF(key);
                return NULL;
            }
        }
        PyFrameObject *back = frame_back(frame);
        Py_DECREF(frame);
        frame = back;
    }
    PyObject *out = PyList_AsTuple(key);
    Py_DECREF(key);
    return out;
}

static PyObject *walk(PyObject *self, PyObject *args) {
    PyObject *start, *skip, *buffer = NULL;
    if (!PyArg_ParseTuple(args, "O!O!|O!:walk", &PyFrame_Type, &start, &PyDict_Type, &skip, &PyByteArray_Type,
                          &buffer))
        return NULL;
    skip_cache_t cache = skip_cache_of(buffer);
    return walk_from(start, skip, &cache);
}

/* file(skip, cache, by_offsets, walk_ids, entries, name, frame): StackCollector.file when everything it
   needs is known already (the frames' codes, the walk, its stack this step): `name` joins its stack's names
   and the result is True. Otherwise what was found for StackCollector.file_new to go on from: the walk's key
   when only the walk or its stack is new, None when a code is (or `frame` is not a frame). `cache`: a
   bytearray kept with `skip` (see skip_cache_of), or None. */
static PyObject *file(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7 || !PyDict_Check(args[0]) || !PyDict_Check(args[2]) || !PyDict_Check(args[3]) ||
        !PyList_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "file(skip, cache, by_offsets, walk_ids, entries, name, frame): "
                                         "expected a dict, a bytearray or None, two dicts, a list, a name and "
                                         "a frame");
        return NULL;
    }
    if (!PyFrame_Check(args[6]))
        Py_RETURN_NONE;
    skip_cache_t cache = skip_cache_of(args[1]);
    PyObject *key = walk_from(args[6], args[0], &cache);
    if (key == NULL || key == Py_None)
        return key;
    PyObject *walk_id = PyDict_GetItemWithError(args[2], key);
    PyObject *index = walk_id ? PyDict_GetItemWithError(args[3], walk_id) : NULL;
    if (index == NULL) {
        if (PyErr_Occurred()) {
            Py_DECREF(key);
            return NULL;
        }
        return key;
    }
    Py_DECREF(key);
    Py_ssize_t i = PyLong_AsSsize_t(index);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    PyObject *entry = i >= 0 && i < PyList_GET_SIZE(args[4]) ? PyList_GET_ITEM(args[4], i) : NULL;
    if (entry == NULL || !PyList_Check(entry) || PyList_GET_SIZE(entry) < 1 ||
        !PyList_Check(PyList_GET_ITEM(entry, 0))) {
        PyErr_SetString(PyExc_ValueError, "file(): entries[walk_ids[walk]] is not a [names, frames] list");
        return NULL;
    }
    if (PyList_Append(PyList_GET_ITEM(entry, 0), args[5]) < 0)
        return NULL;
    Py_RETURN_TRUE;
}

static PyMethodDef METHODS[] = {
    {"walk", walk, METH_VARARGS,
     "walk(frame, skip, cache=None) -> tuple of (id(code), f_lasti) pairs, flat, for the frames whose id(code) "
     "maps to False in skip, from frame outwards; None when a code is not in skip. cache: a bytearray of a "
     "power-of-two number of pointer-sized slots, zeroed, kept with skip: its decisions, copied."},
    {"file", (PyCFunction)(void (*)(void))file, METH_FASTCALL,
     "file(skip, cache, by_offsets, walk_ids, entries, name, frame) -> True when name joined the names of its "
     "known stack; else the walk's key, or None when a code is new: what StackCollector.file_new goes on "
     "from."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_fast_stack",
                                    "The stack walk of core/stacks.py in C.", -1, METHODS};

PyMODINIT_FUNC PyInit__fast_stack(void) { return PyModule_Create(&MODULE); }

/* The frame walk of core/stacks.py StackCollector.capture, in C.

Why C: every captured call walks its whole Python stack (15 to 30 frames under a training loop, most of
them inside torch or the optimizer) to find the user's frames; in Python each frame is attribute reads and
dict probes.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <stdint.h>
#include <stddef.h>
#include <string.h>

#include "_module.h"

#if PY_VERSION_HEX < 0x030B0000 /* PyFrame_GetLasti came in 3.11: before it, Python's own frame.f_lasti */
static int frame_lasti(PyFrameObject *f) {
    PyObject *lasti = PyObject_GetAttrString((PyObject *)f, "f_lasti");
    long v = lasti ? PyLong_AsLong(lasti) : -1;
    Py_XDECREF(lasti);
    if (v == -1 && PyErr_Occurred())
        PyErr_Clear();
    return (int)v;
}
#else
#define frame_lasti PyFrame_GetLasti
#endif
#define frame_code PyFrame_GetCode
#define frame_back PyFrame_GetBack

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

/* Moves `*frame` (a new reference; NULL at the end) outwards past the next frame whose code `skip` maps to
   False (a user frame), whose code address and offset go to *code and *lasti: 1 when one was found, 0 at the
   end of the stack, -1 when a code is not in `skip` yet (or with an exception set). `cache`: skip_cache_of(). */
static int next_user_frame(PyFrameObject **frame, PyObject *skip, skip_cache_t *cache, uintptr_t *code, int *lasti) {
    while (*frame != NULL) {
        PyFrameObject *here = *frame;
        PyCodeObject *here_code = frame_code(here);
        int user = is_user_code(skip, cache, here_code);
        Py_DECREF(here_code); /* the frame keeps it alive */
        if (user < 0) {
            Py_CLEAR(*frame);
            return -1;
        }
        if (user) {
            *code = (uintptr_t)here_code;
            *lasti = frame_lasti(here);
        }
        *frame = frame_back(here);
        Py_DECREF(here);
        if (user)
            return 1;
    }
    return 0;
}

/* walk(frame, skip) -> (id(code), f_lasti, id(code), f_lasti, ...) of the user frames from `frame` outwards
   (see next_user_frame); None as soon as a code is not in `skip` (the caller decides about it, then walks
   again). */
static PyObject *walk_from(PyObject *start, PyObject *skip, skip_cache_t *cache) {
    PyObject *key = PyList_New(0);
    if (key == NULL)
        return NULL;
    PyFrameObject *frame = (PyFrameObject *)start;
    Py_INCREF(frame);
    uintptr_t code;
    int lasti, found;
    while ((found = next_user_frame(&frame, skip, cache, &code, &lasti)) == 1) {
        PyObject *id = PyLong_FromVoidPtr((void *)code);
        PyObject *offset = id ? PyLong_FromLong(lasti) : NULL;
        int added = offset != NULL && PyList_Append(key, id) == 0 && PyList_Append(key, offset) == 0;
        Py_XDECREF(id);
        Py_XDECREF(offset);
        if (!added) {
            Py_XDECREF(frame);
            Py_DECREF(key);
            return NULL;
        }
    }
    if (found < 0) {
        Py_DECREF(key);
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE; /* a code seen for the first time */
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

/* Filer(skip, cache, by_offsets, walk_ids, entries, touched)(name, frame): StackCollector.file when everything
   it needs is known already (the frames' codes, the walk and its stack): `name` joins its stack's names, the
   stack's entry joins `touched` (the step's stacks, in order) when it is its first name this step, and the
   result is True. Otherwise what was found for StackCollector.file_new to go on from: the walk's key when
   only the walk is new, None when a code is (or `frame` is not a frame). `cache`: a bytearray kept with `skip`
   (see skip_cache_of), or None.

   Why a type and a memo: every captured call files its name, nearly always from a call site seen before.
   Making the walk's key (a tuple of ints, two per user frame) to look it up in `by_offsets` costs a list, the
   ints, the tuple and its hash each time. Here the walk is read into a buffer and looked up in a memo of
   walks seen before (their frames' code addresses and offsets -> walk id): no object is made. The memo stays
   valid because `by_offsets` only grows and never gives a key another id, and the collector keeps every code
   object it decided about alive (a code address names one code). */
#define LOCAL_FRAMES 128    /* user frames read on the C stack; deeper walks go to the heap */
#define MEMO_SLOTS 4096     /* a power of two; filled to half at most */

typedef struct {
    Py_uhash_t hash;
    Py_ssize_t n;       /* values in pairs: 2 per user frame */
    uintptr_t *pairs;   /* code address, offset, code address, offset, ... */
    PyObject *walk;     /* the walk id by_offsets gave the key */
} memo_t;

#define FILER_FIELDS(X) X(skip) X(cache) X(by_offsets) X(walk_ids) X(entries) X(touched)

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *skip, *cache, *by_offsets, *walk_ids, *entries, *touched; /* FILER_FIELDS */
    memo_t *memo;
    Py_ssize_t used;
} Filer;

/* A walk read into memory: `pairs` is `local` until the walk outgrows it, then a heap buffer of `size` values. */
typedef struct {
    uintptr_t local[2 * LOCAL_FRAMES];
    uintptr_t *pairs;
    Py_ssize_t n, size;
} walk_buf_t;

static void walk_buf_free(walk_buf_t *w) {
    if (w->pairs != w->local)
        PyMem_Free(w->pairs);
}

/* The user's frames from `start` outwards into w (code address, offset, ...): 1, 0 when a code is new, -1
   with an exception set. w->pairs is to be freed with walk_buf_free() whatever the result. */
static int read_walk(PyObject *start, PyObject *skip, skip_cache_t *cache, walk_buf_t *w) {
    w->pairs = w->local;
    w->n = 0;
    w->size = 2 * LOCAL_FRAMES;
    PyFrameObject *frame = (PyFrameObject *)start;
    Py_INCREF(frame);
    uintptr_t code;
    int lasti, found;
    while ((found = next_user_frame(&frame, skip, cache, &code, &lasti)) == 1) {
        if (w->n + 2 > w->size) { /* a deep stack: a heap buffer, doubled as it grows */
            uintptr_t *more = PyMem_Malloc((size_t)w->size * 2 * sizeof(uintptr_t));
            if (more == NULL) {
                Py_XDECREF(frame);
                PyErr_NoMemory();
                return -1;
            }
            memcpy(more, w->pairs, (size_t)w->n * sizeof(uintptr_t));
            walk_buf_free(w);
            w->pairs = more;
            w->size *= 2;
        }
        w->pairs[w->n++] = code;
        w->pairs[w->n++] = (uintptr_t)(intptr_t)lasti;
    }
    return found == 0 ? 1 : PyErr_Occurred() ? -1 : 0;
}

static Py_uhash_t walk_hash(const uintptr_t *pairs, Py_ssize_t n) {
    Py_uhash_t h = 1469598103934665603ULL;
    for (Py_ssize_t i = 0; i < n; i++)
        h = (h ^ (Py_uhash_t)pairs[i]) * 1099511628211ULL;
    return h;
}

/* The walk's key as StackCollector._walk makes it: (id(code), f_lasti, ...). */
static PyObject *key_of(const uintptr_t *pairs, Py_ssize_t n) {
    PyObject *key = PyTuple_New(n);
    for (Py_ssize_t i = 0; key != NULL && i < n; i++) {
        PyObject *v = i % 2 == 0 ? PyLong_FromVoidPtr((void *)pairs[i]) : PyLong_FromLong((long)(intptr_t)pairs[i]);
        if (v == NULL)
            Py_CLEAR(key);
        else
            PyTuple_SET_ITEM(key, i, v);
    }
    return key;
}

/* The memo's slot for the walk: the one holding it, or the empty one where it would go. */
static memo_t *memo_slot(Filer *f, Py_uhash_t hash, const uintptr_t *pairs, Py_ssize_t n) {
    for (Py_ssize_t i = (Py_ssize_t)(hash & (MEMO_SLOTS - 1));; i = (i + 1) & (MEMO_SLOTS - 1)) {
        memo_t *m = &f->memo[i];
        if (m->walk == NULL ||
            (m->hash == hash && m->n == n && memcmp(m->pairs, pairs, (size_t)n * sizeof(uintptr_t)) == 0))
            return m;
    }
}

/* Filer(name, frame) once the walk is read: True when `name` joined its known stack, else the walk's key. */
static PyObject *file_walk(Filer *f, PyObject *name, const uintptr_t *pairs, Py_ssize_t n) {
    PyObject *key = NULL;
    Py_uhash_t hash = walk_hash(pairs, n);
    memo_t *m = memo_slot(f, hash, pairs, n);
    PyObject *walk = m->walk;
    if (walk == NULL) { /* new to the memo: by_offsets may know the key already */
        if ((key = key_of(pairs, n)) == NULL)
            return NULL;
        walk = PyDict_GetItemWithError(f->by_offsets, key);
        if (walk != NULL && f->used < MEMO_SLOTS / 2 &&
            (m->pairs = PyMem_Malloc((size_t)(n > 0 ? n : 1) * sizeof(uintptr_t))) != NULL) {
            memcpy(m->pairs, pairs, (size_t)n * sizeof(uintptr_t));
            m->hash = hash;
            m->n = n;
            Py_INCREF(walk);
            m->walk = walk;
            f->used++;
        }
    }
    PyObject *index = walk ? PyDict_GetItemWithError(f->walk_ids, walk) : NULL;
    if (index == NULL) {
        if (PyErr_Occurred()) {
            Py_XDECREF(key);
            return NULL;
        }
        return key != NULL ? key : key_of(pairs, n); /* the walk is new: file_new goes on */
    }
    Py_XDECREF(key);
    Py_ssize_t i = PyLong_AsSsize_t(index);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    PyObject *entry = i >= 0 && i < PyList_GET_SIZE(f->entries) ? PyList_GET_ITEM(f->entries, i) : NULL;
    if (entry == NULL || !PyList_Check(entry) || PyList_GET_SIZE(entry) < 1 ||
        !PyList_Check(PyList_GET_ITEM(entry, 0))) {
        PyErr_SetString(PyExc_ValueError, "Filer: entries[walk_ids[walk]] is not a [names, frames] list");
        return NULL;
    }
    PyObject *names = PyList_GET_ITEM(entry, 0);
    if ((PyList_GET_SIZE(names) == 0 && PyList_Append(f->touched, entry) < 0) || PyList_Append(names, name) < 0)
        return NULL;
    Py_RETURN_TRUE;
}

static PyObject *Filer_call(Filer *f, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (PyVectorcall_NARGS(nargsf) != 2 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "Filer(name, frame): expected two positional arguments");
        return NULL;
    }
    PyObject *name = args[0], *frame = args[1];
    if (f->skip == NULL || !PyFrame_Check(frame)) /* cleared by the collector (tp_clear): Python's walk files it */
        Py_RETURN_NONE;
    skip_cache_t cache = skip_cache_of(f->cache);
    walk_buf_t w;
    int read = read_walk(frame, f->skip, &cache, &w);
    PyObject *result = read < 0 ? NULL : read == 0 ? (Py_INCREF(Py_None), Py_None) : file_walk(f, name, w.pairs, w.n);
    walk_buf_free(&w);
    return result;
}

static PyObject *Filer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *skip, *cache, *by_offsets, *walk_ids, *entries, *touched;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs) > 0) {
        PyErr_SetString(PyExc_TypeError, "Filer() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O!OO!O!O!O!:Filer", &PyDict_Type, &skip, &cache, &PyDict_Type, &by_offsets,
                          &PyDict_Type, &walk_ids, &PyList_Type, &entries, &PyList_Type, &touched))
        return NULL;
    if (cache != Py_None && !PyByteArray_CheckExact(cache)) {
        PyErr_SetString(PyExc_TypeError, "Filer(): cache must be a bytearray or None");
        return NULL;
    }
    Filer *f = (Filer *)type->tp_alloc(type, 0);
    if (f == NULL)
        return NULL;
    f->vectorcall = (vectorcallfunc)Filer_call;
    if ((f->memo = PyMem_Calloc(MEMO_SLOTS, sizeof(memo_t))) == NULL) {
        Py_DECREF(f);
        return PyErr_NoMemory();
    }
#define KEEP(field) Py_INCREF(field); f->field = field;
    FILER_FIELDS(KEEP)
    return (PyObject *)f;
}

GC_FIELD_FUNCTIONS(Filer, Filer_traverse, Filer_clear, FILER_FIELDS)

static void Filer_dealloc(Filer *f) {
    PyObject_GC_UnTrack(f);
    Filer_clear(f);
    if (f->memo != NULL) {
        for (Py_ssize_t i = 0; i < MEMO_SLOTS; i++) {
            PyMem_Free(f->memo[i].pairs);
            Py_XDECREF(f->memo[i].walk);
        }
        PyMem_Free(f->memo);
    }
    Py_TYPE(f)->tp_free((PyObject *)f);
}

static PyTypeObject FilerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "msprobe_lite.core._fast_stack.Filer",
    .tp_basicsize = sizeof(Filer),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Filer(skip, cache, by_offsets, walk_ids, entries, touched)(name, frame) -> True when name joined "
              "the names of its known stack (and the stack's entry joined touched, if its first this step); else "
              "the walk's key, or None when a code is new: what StackCollector.file_new goes on from.",
    .tp_new = Filer_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Filer, vectorcall),
    .tp_traverse = (traverseproc)Filer_traverse,
    .tp_clear = (inquiry)Filer_clear,
    .tp_dealloc = (destructor)Filer_dealloc,
};

static PyMethodDef METHODS[] = {
    {"walk", walk, METH_VARARGS,
     "walk(frame, skip, cache=None) -> tuple of (id(code), f_lasti) pairs, flat, for the frames whose id(code) "
     "maps to False in skip, from frame outwards; None when a code is not in skip. cache: a bytearray of a "
     "power-of-two number of pointer-sized slots, zeroed, kept with skip: its decisions, copied."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_fast_stack",
                                    "The stack walk of core/stacks.py in C.", -1, METHODS};

PyMODINIT_FUNC PyInit__fast_stack(void) {
    return module_with_type(&MODULE, "Filer", &FilerType);
}

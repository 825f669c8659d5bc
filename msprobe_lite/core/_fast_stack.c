/* The frame walk of core/stacks.py StackCollector.capture, in C.

Why C: every captured call walks its whole Python stack (15 to 30 frames under a training loop, most of
them inside torch or the optimizer) to find the user's frames. In Python each frame costs about 0.1 µs of
attribute reads and dict probes; here about 0.02 µs.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>

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

/* walk(frame, skip) -> (id(code), f_lasti, id(code), f_lasti, ...) of the frames from `frame` outwards whose
   code `skip` (id(code) -> bool) maps to False; None as soon as a code is not in `skip` (the caller decides
   about it, then walks again). */
static PyObject *walk_from(PyObject *start, PyObject *skip) {
    PyObject *key = PyList_New(0);
    if (key == NULL)
        return NULL;
    PyFrameObject *frame = (PyFrameObject *)start;
    Py_INCREF(frame);
    while (frame != NULL) {
        PyCodeObject *code = frame_code(frame);
        PyObject *id = PyLong_FromVoidPtr(code);
        Py_DECREF(code); /* the frame keeps it alive */
        PyObject *skipped = id ? PyDict_GetItemWithError(skip, id) : NULL;
        if (skipped == NULL) {
            Py_XDECREF(id);
            Py_DECREF(frame);
            Py_DECREF(key);
            if (PyErr_Occurred())
                return NULL;
            Py_RETURN_NONE; /* a code seen for the first time */
        }
        int user = skipped == Py_False ? 1 : skipped == Py_True ? 0 : !PyObject_IsTrue(skipped);
        if (user) {
            PyObject *lasti = PyLong_FromLong(frame_lasti(frame));
            if (lasti == NULL || PyList_Append(key, id) < 0 || PyList_Append(key, lasti) < 0) {
                Py_XDECREF(lasti);
                Py_DECREF(id);
                Py_DECREF(frame);
                Py_DECREF(key);
                return NULL;
            }
            Py_DECREF(lasti);
        }
        Py_DECREF(id);
        PyFrameObject *back = frame_back(frame);
        Py_DECREF(frame);
        frame = back;
    }
    PyObject *out = PyList_AsTuple(key);
    Py_DECREF(key);
    return out;
}

static PyObject *walk(PyObject *self, PyObject *args) {
    PyObject *start, *skip;
    if (!PyArg_ParseTuple(args, "O!O!:walk", &PyFrame_Type, &start, &PyDict_Type, &skip))
        return NULL;
    return walk_from(start, skip);
}

/* file(skip, by_offsets, walk_ids, entries, name, frame): StackCollector.file when everything it needs is
   known already (the frames' codes, the walk, its stack this step): `name` joins its stack's names and the
   result is True. Otherwise what was found for StackCollector.file_new to go on from: the walk's key when
   only the walk or its stack is new, None when a code is (or `frame` is not a frame). */
static PyObject *file(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyDict_Check(args[0]) || !PyDict_Check(args[1]) || !PyDict_Check(args[2]) ||
        !PyList_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "file(skip, by_offsets, walk_ids, entries, name, frame): expected "
                                         "three dicts, a list, a name and a frame");
        return NULL;
    }
    if (!PyFrame_Check(args[5]))
        Py_RETURN_NONE;
    PyObject *key = walk_from(args[5], args[0]);
    if (key == NULL || key == Py_None)
        return key;
    PyObject *walk_id = PyDict_GetItemWithError(args[1], key);
    PyObject *index = walk_id ? PyDict_GetItemWithError(args[2], walk_id) : NULL;
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
    PyObject *entry = i >= 0 && i < PyList_GET_SIZE(args[3]) ? PyList_GET_ITEM(args[3], i) : NULL;
    if (entry == NULL || !PyList_Check(entry) || PyList_GET_SIZE(entry) < 1 ||
        !PyList_Check(PyList_GET_ITEM(entry, 0))) {
        PyErr_SetString(PyExc_ValueError, "file(): entries[walk_ids[walk]] is not a [names, frames] list");
        return NULL;
    }
    if (PyList_Append(PyList_GET_ITEM(entry, 0), args[4]) < 0)
        return NULL;
    Py_RETURN_TRUE;
}

static PyMethodDef METHODS[] = {
    {"walk", walk, METH_VARARGS,
     "walk(frame, skip) -> tuple of (id(code), f_lasti) pairs, flat, for the frames whose id(code) maps to "
     "False in skip, from frame outwards; None when a code is not in skip."},
    {"file", (PyCFunction)(void (*)(void))file, METH_FASTCALL,
     "file(skip, by_offsets, walk_ids, entries, name, frame) -> True when name joined the names of its known "
     "stack; else the walk's key, or None when a code is new: what StackCollector.file_new goes on from."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_fast_stack",
                                    "The stack walk of core/stacks.py in C.", -1, METHODS};

PyMODINIT_FUNC PyInit__fast_stack(void) { return PyModule_Create(&MODULE); }

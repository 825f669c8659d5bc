/* What the extensions' modules share: the module with its one public type, interned names, GC functions. */
#ifndef MSPROBE_LITE_MODULE_H
#define MSPROBE_LITE_MODULE_H

#include <Python.h>

/* PyModule_Create(def) with `type` (readied here) added as `name`: the module, or NULL with an exception set. */
static inline PyObject *module_with_type(PyModuleDef *def, const char *name, PyTypeObject *type) {
    if (PyType_Ready(type) < 0)
        return NULL;
    PyObject *module = PyModule_Create(def);
    if (module == NULL)
        return NULL;
    Py_INCREF(type);
    if (PyModule_AddObject(module, name, (PyObject *)type) < 0) {
        Py_DECREF(type);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}

/* In a module's init: `var` = the interned str `text`, or return NULL. */
#define INTERN(var, text)                                                                                  \
    if ((var = PyUnicode_InternFromString(text)) == NULL)                                                   \
        return NULL;

/* tp_traverse and tp_clear of a type whose object references are the fields listed by the X-macro FIELDS
   (FIELDS(X) expands to X(a) X(b) ...): `static int traverse(Type *o, visitproc, void *)`, `clear(Type *o)`. */
#define GC_FIELD_VISIT_(field) Py_VISIT(o->field);
#define GC_FIELD_CLEAR_(field) Py_CLEAR(o->field);
#define GC_FIELD_FUNCTIONS(Type, traverse, clear, FIELDS)                \
    static int traverse(Type *o, visitproc visit, void *arg) {           \
        FIELDS(GC_FIELD_VISIT_)                                          \
        return 0;                                                        \
    }                                                                    \
    static int clear(Type *o) {                                          \
        FIELDS(GC_FIELD_CLEAR_)                                          \
        return 0;                                                        \
    }

#endif

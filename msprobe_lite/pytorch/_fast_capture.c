/* The API capture's `__torch_function__` (pytorch/api_capture.py) in C.

Why C: while collecting, PyTorch calls the mode for every torch call, attribute reads of tensors included.
Most are not APIs of the list and only pass through. For each one that is, the Python method crossed a dozen
frames of bookkeeping (naming, the record, the step's dicts, the stack), more than encoding its tensors,
and the small training step makes hundreds (AdamW alone 9 per parameter). Here:

- a call that is not an API of the list, or comes while forward collection is off, goes straight to the
  function;
- a captured call is recorded here, exactly as `ApiCapture.__torch_function__` -> `CallRecorder.begin_api` /
  `end_api` record it, when the run allows (`bind`: no tensors saved to files, the C value encoder built).
  With `scope`, `list` or a direction filtered (`bind_filter`), the RecordFilter is asked by name, as the
  Python route asks it: a call filtered out is counted and costs little more than the mode itself. At mix level its parent is the innermost module call (`ModuleHooks.current`), or
  "optimizer";
- its gradient half too (`bind_gradients`): `CallRecorder.gradients_before` / `gradients_after`, `_hook`
  and `TorchFramework.on_grad` for tensors in plain containers, with the same Call, BackwardCall and
  handle objects; the hooks are GradHooks (`_GradSlot` and `BackwardCall.fill` in C). Other containers go
  to those Python methods;
- the debugger's reads of tensors are never seen by a torch-function mode or tensor subclass of the
  user's: inside quiet (DisableTorchFunction) when a mode is active, else with the encoder's `bare()`
  (`bind_quiet`), which quiets only its Python routes, and quiet for a tensor that is not a plain one;
- otherwise the call goes to the Python method, the twin (`twin`), which covers every case.

The order of every dict insertion is the Python route's, so the dumps are byte for byte the same
(tests/test_pytorch_l1.py compares whole dumps of both routes). The debugger's own failures are reported
through `report_failure` and the user's call goes on; an exception of the user's call is the user's, and
so is one that `report_failure` raises again (the user's queued work failing at a read: core/safety.py).
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <structmember.h>

#include "_slots.h"
#include "_module.h"
#include "_quiet.h"
#include "_weakref.h"

typedef struct {
    PyObject_HEAD
    PyObject *table;       /* {function: (prefix, api)} */
    PyObject *session;     /* core.session.Session: forward_on, counters, construct, records, dirty */
    PyObject *encode;      /* the C value encoder (pytorch/_fast_encode.c Encoder) */
    PyObject *seal;        /* its seal(record) */
    PyObject *record_type; /* core.records.Record */
    PyObject *grad_enabled;/* torch.is_grad_enabled */
    PyObject *file_known;  /* StackCollector.file_known(name, frame): True, or what it found for file_new */
    PyObject *file_new;    /* StackCollector.file_new(name, frame, found), or None when stacks are not kept */
    PyObject *quiet;       /* torch._C.DisableTorchFunction: the encoder's reads are not torch calls */
    PyObject *report;      /* core.safety.report_failure */
    PyObject *twin;        /* ApiCapture.__torch_function__, the Python function */
    PyObject *call_type;   /* core.calls.Call */
    PyObject *before;      /* CallRecorder.gradients_before(call, bwd_name, bwd_parent, args, kwargs) */
    PyObject *after;       /* CallRecorder.gradients_after(call, output) */
    PyObject *abandon;     /* CallRecorder.abandon(name, call or None): the call raised */
    PyObject *current;     /* ModuleHooks.current() (mix level), or None */
    /* the record filter (bind_filter), all NULL when nothing is filtered: RecordFilter.on_start, wants and
       on_end, CallRecorder._end_places(args, kwargs) and CallRecorder._slots (the step's hooked tensors) */
    PyObject *on_start, *wants, *on_end, *end_places, *slots;
    slots_t record_slots;  /* Record made without its __init__ (see _slots.h), when it can be */
    /* the gradient half in C (bind_gradients): CallRecorder.gradients_before/after, _hook, _backward and
       TorchFramework.on_grad, for plain tensors in plain containers */
    PyObject *grad_slots;  /* CallRecorder._slots: id(tensor) -> its _GradSlot this step */
    PyObject *handles;     /* CallRecorder.grad_handles: the step's hook handles */
    PyObject *recorder;    /* the CallRecorder (BackwardCall.recorder) */
    PyObject *tensor_type; /* torch.Tensor: what counts as a tensor (isinstance) */
    PyObject *plain;       /* framework.PLAIN_TENSORS: types whose hooks go into the hook dict here */
    PyObject *hook_dict;   /* collections.OrderedDict, a tensor's _backward_hooks */
    PyObject *keys;        /* framework._KEYS: the hooks' keys, shared with TorchFramework.on_grad */
    PyObject *on_grad;     /* TorchFramework.on_grad, for other tensor types */
    slots_t call_slots, backward_slots, grad_slot_slots, handle_slots;
    int max_depth;         /* values.MAX_DEPTH */
    PyObject *bare;        /* the encoder's bare(value) (bind_quiet), or NULL: always inside quiet */
    PyObject *mode_count;  /* torch._C._len_torch_function_stack */
    char grads_in_c;       /* bind_gradients succeeded */
    char fast;             /* bound, and this run's captured calls may be recorded here */
    char in_optimizer;     /* set by the optimizer's step hooks (mix level) */
    char has_modules;      /* mix level: a call's parent is the innermost module, or "optimizer" */
    char inputs, outputs, numbers;
    PyObject *torch_function; /* this mode's bound __torch_function__, for Handler_getattro */
} Handler;

static PyObject *S_forward_on, *S_counters, *S_construct, *S_records, *S_dirty, *S_fields, *S_setitem,
    *S_optimizer, *S_input_args, *S_input_kwargs, *S_output, *S_site, *S_what,
    *S_site_begin, *S_site_end, *S_name, *S_bwd_name, *S_backward_name, *S_requires_grad, *S_version,
    *S_backward_hooks, *S_grad_fn, *S_register_hook_dict, *S_n_out, *S_input, *S_step_open, *S_data,
    *S_site_hook, *EMPTY, *ZERO;

/* The Python method with the same arguments, `self` in front. */
static PyObject *call_twin(Handler *h, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (h->twin == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Handler was not bound");
        return NULL;
    }
    Py_ssize_t total = nargs + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0);
    PyObject *small[8], **stack = total < 8 ? small : PyMem_Malloc((total + 1) * sizeof(PyObject *));
    if (stack == NULL)
        return PyErr_NoMemory();
    stack[0] = (PyObject *)h;
    for (Py_ssize_t i = 0; i < total; i++)
        stack[i + 1] = args[i];
    PyObject *out = PyObject_Vectorcall(h->twin, stack, nargs + 1, kwnames);
    if (stack != small)
        PyMem_Free(stack);
    return out;
}

/* With an exception set: an Exception is the debugger's failure, reported (1: the user's call goes on);
   anything else (KeyboardInterrupt, SystemExit) stays set (0), as the Python route lets it through. */
static int reported(Handler *h, PyObject *site) {
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return 0;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL)
        PyException_SetTraceback(value, tb);
    PyObject *args[] = {S_what, value ? value : Py_None, site};
    PyObject *names = PyTuple_Pack(1, S_site);
    PyObject *done = names ? PyObject_Vectorcall(h->report, args, 2, names) : NULL;
    Py_XDECREF(names);
    Py_XDECREF(done);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    if (done == NULL)
        return 0; /* report_failure raised: the user's own error (core/safety.py), or a KeyboardInterrupt */
    return 1;
}


/* Whether the debugger's own reads of tensors must be made inside quiet: 1 when a torch-function mode is
   active (one of the user's, below the debugger's: PyTorch takes the debugger's own off its stack while its
   __torch_function__ runs, so the stack is empty in the usual case), 0 when none is and bare() may encode
   (plain tensors then dispatch to nothing; bare() quiets the Python routes itself), -1 on error. Entering
   and leaving quiet is a sizeable part of a captured call's bookkeeping. */
static int modes_on(Handler *h) {
    if (h->bare == NULL || h->mode_count == NULL)
        return 1;
    PyObject *n = PyObject_CallNoArgs(h->mode_count);
    if (n == NULL)
        return -1;
    long count = PyLong_AsLong(n);
    Py_DECREF(n);
    if (count == -1 && PyErr_Occurred())
        return -1;
    return count != 0;
}

/* Whether `kind` is one of the plain tensor types (`plain`: no __torch_function__ of their own). */
static int is_plain(Handler *h, PyTypeObject *kind) {
    for (Py_ssize_t i = 0; h->plain != NULL && i < PyTuple_GET_SIZE(h->plain); i++)
        if ((PyObject *)kind == PyTuple_GET_ITEM(h->plain, i))
            return 1;
    return 0;
}

/* 1 when every tensor of `tensors` is of a plain tensor type, 0 if not. */
static int all_plain(Handler *h, PyObject *tensors) {
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(tensors); i++)
        if (!is_plain(h, Py_TYPE(PyList_GET_ITEM(tensors, i))))
            return 0;
    return 1;
}

/* isinstance(v, torch.Tensor), answered without the metaclass's __instancecheck__ for the values calls pass
   most: a plain tensor, None, and the exact builtin scalars and containers. */
static int is_tensor(Handler *h, PyObject *v) {
    PyTypeObject *kind = Py_TYPE(v);
    if (is_plain(h, kind))
        return 1;
    if (v == Py_None || kind == &PyLong_Type || kind == &PyFloat_Type || kind == &PyBool_Type ||
        kind == &PyUnicode_Type || kind == &PyTuple_Type || kind == &PyList_Type || kind == &PyDict_Type)
        return 0;
    return PyObject_IsInstance(v, h->tensor_type);
}


/* hasattr(v, name): 1 or 0, -1 with an exception other than AttributeError set (hasattr lets it through). */
static int has_attr(PyObject *v, PyObject *name) {
    PyObject *found = PyObject_GetAttr(v, name);
    if (found != NULL) {
        Py_DECREF(found);
        return 1;
    }
    if (!PyErr_ExceptionMatches(PyExc_AttributeError))
        return -1;
    PyErr_Clear();
    return 0;
}

static int set_item_new(PyObject *dict, PyObject *key, PyObject *value) { /* steals value */
    if (value == NULL)
        return -1;
    int done = PyDict_SetItem(dict, key, value);
    Py_DECREF(value);
    return done;
}

/* The session's per-step dict `name` (replaced at every step: read per call). */
static PyObject *step_dict(Handler *h, PyObject *name) {
    PyObject *d = PyObject_GetAttr(h->session, name);
    if (d != NULL && !PyDict_CheckExact(d)) {
        PyErr_Format(PyExc_TypeError, "session.%U: expected a dict, got %.100s", name, Py_TYPE(d)->tp_name);
        Py_CLEAR(d);
    }
    return d;
}

/* Record(name, data): made through _slots.h when it can be (no __init__ frame). */
static PyObject *new_record(Handler *h, PyObject *name, PyObject *data) {
    PyObject *parts[] = {name, data};
    return h->record_slots.type != NULL ? slots_new(&h->record_slots, parts)
                                        : PyObject_Vectorcall(h->record_type, parts, 2, NULL);
}

/* Session.add(record), inline: the step's records[name] = record, and the step is dirty. 0, or -1. */
static int session_add(Handler *h, PyObject *name, PyObject *record) {
    PyObject *records = step_dict(h, S_records);
    int added = records != NULL && PyDict_SetItem(records, name, record) == 0 &&
                PyObject_SetAttr(h->session, S_dirty, Py_True) == 0;
    Py_XDECREF(records);
    return added ? 0 : -1;
}

/* One captured call in flight: new references, NULL until made. */
typedef struct {
    PyObject *name, *data, *record;
    PyObject *call; /* core.calls.Call, when gradients are recorded */
} Flight;

static void flight_clear(Flight *f) {
    Py_CLEAR(f->name);
    Py_CLEAR(f->data);
    Py_CLEAR(f->record);
    Py_CLEAR(f->call);
}

/* The innermost module call's name and backward name (mix level; the name even when its backward is not
   recorded), as new references in owner[0] and owner[1], or None when no module is running:
   CallRecorder.begin_api. */
static int module_parents(Handler *h, PyObject **owner) {
    PyObject *outer = PyObject_CallNoArgs(h->current);
    if (outer == NULL)
        return -1;
    if (outer != Py_None) {
        owner[0] = PyObject_GetAttr(outer, S_name);
        owner[1] = owner[0] ? PyObject_GetAttr(outer, S_backward_name) : NULL;
    }
    Py_DECREF(outer);
    return outer != Py_None && owner[1] == NULL ? -1 : 0;
}

static const char *const RECORD_SLOTS[] = {"name", "data"};

/* `{prefix}.{api}.{n}{suffix}` (naming.api_record): written into the new string directly when prefix and api
   are ASCII, as API names are (PyUnicode_FromFormat parses its format on every call). */
static PyObject *call_name(PyObject *prefix, PyObject *api, Py_ssize_t n, const char *suffix) {
    if (!PyUnicode_Check(prefix) || !PyUnicode_Check(api) || !PyUnicode_IS_ASCII(prefix) || !PyUnicode_IS_ASCII(api))
        return PyUnicode_FromFormat("%S.%S.%zd%s", prefix, api, n, suffix);
    char digits[24];
    int nd = 0;
    size_t v = (size_t)n;
    do {
        digits[nd++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    Py_ssize_t lp = PyUnicode_GET_LENGTH(prefix), la = PyUnicode_GET_LENGTH(api), ls = (Py_ssize_t)strlen(suffix);
    PyObject *name = PyUnicode_New(lp + la + nd + ls + 2, 127);
    if (name == NULL)
        return NULL;
    char *out = (char *)PyUnicode_1BYTE_DATA(name);
    memcpy(out, PyUnicode_1BYTE_DATA(prefix), lp);
    out += lp;
    *out++ = '.';
    memcpy(out, PyUnicode_1BYTE_DATA(api), la);
    out += la;
    *out++ = '.';
    while (nd)
        *out++ = digits[--nd];
    memcpy(out, suffix, ls);
    return name;
}

/* -- the gradient half (CallRecorder.gradients_before / gradients_after) ----------------------------------- */

/* values.tensor_leaves(v, is_tensor, depth) appended to `found`: 1, or 0 when `v` holds a container this walk
   leaves to Python (a subclass of list, tuple or dict may iterate its own way), -1 on error. */
static int leaves(Handler *h, PyObject *v, int depth, PyObject *found) {
    int is = is_tensor(h, v);
    if (is != 0)
        return is < 0 ? -1 : PyList_Append(found, v) < 0 ? -1 : 1;
    if (depth >= h->max_depth)
        return 1;
    /* the items to walk, held unchanged (Python code, an odd __class__, may run below): a tuple itself (torch.Size
       included), a copy of a list, a dict's values */
    PyObject *items = NULL;
    if (PyTuple_Check(v) && Py_TYPE(v)->tp_iter == PyTuple_Type.tp_iter)
        items = (Py_INCREF(v), v);
    else if (PyList_Check(v) && Py_TYPE(v)->tp_iter == PyList_Type.tp_iter)
        items = PySequence_List(v);
    else if (PyDict_CheckExact(v))
        items = PyDict_Values(v);
    else
        return PyList_Check(v) || PyTuple_Check(v) || PyDict_Check(v) ? 0 : 1;
    if (items == NULL)
        return -1;
    int rc = 1;
    for (Py_ssize_t i = 0; rc == 1 && i < PySequence_Fast_GET_SIZE(items); i++)
        rc = leaves(h, PySequence_Fast_GET_ITEM(items, i), depth + 1, found);
    Py_DECREF(items);
    return rc;
}

/* `tensor.requires_grad` (framework.may_get_grad): 1, 0, or -1 on error. */
static int may_get_grad(PyObject *t) {
    PyObject *flag = PyObject_GetAttr(t, S_requires_grad);
    int yes = flag ? PyObject_IsTrue(flag) : -1;
    Py_XDECREF(flag);
    return yes;
}

static int any_may_get_grad(PyObject *tensors) {
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(tensors); i++) {
        int yes = may_get_grad(PyList_GET_ITEM(tensors, i));
        if (yes != 0)
            return yes;
    }
    return 0;
}

/* TorchFramework.on_grad(t, fn) for a plain tensor: the hook goes into its hook dict (made, and registered with
   its autograd node, the first time) under a fresh negative key; the handle joins the step's. */
static int on_grad(Handler *h, PyObject *t, PyObject *fn) {
    int plain = is_plain(h, Py_TYPE(t));
    PyObject *handle = NULL;
    if (!plain) {
        PyObject *args[] = {t, fn};
        handle = PyObject_Vectorcall(h->on_grad, args, 2, NULL);
    } else {
        PyObject *hooks = PyObject_GetAttr(t, S_backward_hooks);
        if (hooks == Py_None) {
            Py_DECREF(hooks);
            hooks = PyObject_CallNoArgs(h->hook_dict);
            if (hooks == NULL || PyObject_SetAttr(t, S_backward_hooks, hooks) < 0) {
                Py_XDECREF(hooks);
                return -1;
            }
            PyObject *node = PyObject_GetAttr(t, S_grad_fn);
            PyObject *done = node == NULL ? NULL : node == Py_None ? (Py_INCREF(Py_None), Py_None)
                                                                   : PyObject_CallMethodOneArg(node, S_register_hook_dict, t);
            Py_XDECREF(node);
            if (done == NULL) {
                Py_DECREF(hooks);
                return -1;
            }
            Py_DECREF(done);
        }
        PyObject *key = hooks ? PyIter_Next(h->keys) : NULL;
        if (key != NULL && PyObject_SetItem(hooks, key, fn) == 0) {
            PyObject *parts[] = {hooks, key};
            handle = slots_new(&h->handle_slots, parts);
        }
        Py_XDECREF(key);
        Py_XDECREF(hooks);
        if (handle == NULL && !PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "the debugger's hook key counter ended");
    }
    int rc = handle == NULL ? -1 : PyList_Append(h->handles, handle);
    Py_XDECREF(handle);
    return rc;
}

/* -- the gradient hook: _GradSlot and BackwardCall.fill in C -------------------------------------------------- */

/* One tensor's gradient hook (core/calls.py _GradSlot, made by this route): when the gradient arrives, it fills
   each place the tensor holds, as (BackwardCall, key, index). `places`, `tensor` (a weak reference), `version`
   and `fired` are read, and the places extended or restarted, by CallRecorder._hook as a _GradSlot's are. */
typedef struct {
    PyObject_HEAD
    PyObject *places, *tensor, *version;
    Handler *handler;
    char fired; /* its gradient came since its places were last started */
} GradHook;

static PyTypeObject GradHookType;

static PyObject *grad_hook_new(Handler *h, PyObject *places) {
    GradHook *g = PyObject_GC_New(GradHook, &GradHookType);
    if (g == NULL)
        return NULL;
    Py_INCREF(places);
    g->places = places;
    Py_INCREF(Py_None);
    g->tensor = Py_None;
    Py_INCREF(Py_None);
    g->version = Py_None;
    Py_INCREF(h);
    g->handler = h;
    g->fired = 0;
    PyObject_GC_Track(g);
    return (PyObject *)g;
}

/* The places, weak reference and version of a hook this step (a GradHook, or a _GradSlot of the Python
   route), as new references: 1; 0 (none kept) for another kind of object or one with a field unset; -1 on
   an error. */
static int slot_view(Handler *h, PyObject *slot, PyObject **places, PyObject **weak, PyObject **version) {
    *places = *weak = *version = NULL;
    if (Py_TYPE(slot) == &GradHookType) {
        GradHook *g = (GradHook *)slot;
        *places = g->places;
        *weak = g->tensor;
        *version = g->version;
        Py_XINCREF(*places);
        Py_XINCREF(*weak);
        Py_XINCREF(*version);
    } else if (Py_TYPE(slot) == h->grad_slot_slots.type) {
        const slots_t *s = &h->grad_slot_slots;
        *places = slots_get(s, slot, 0);
        *weak = *places ? slots_get(s, slot, 1) : NULL;
        *version = *weak ? slots_get(s, slot, 2) : NULL;
    }
    if (*places != NULL && *weak != NULL && *version != NULL)
        return 1;
    Py_CLEAR(*places); /* cleared by the collector, or unset: not usable */
    Py_CLEAR(*weak);
    Py_CLEAR(*version);
    return PyErr_Occurred() ? -1 : 0;
}

/* _GradSlot.fired of a hook this step: its gradient came since its places were started. */
static int slot_fired(Handler *h, PyObject *slot) {
    if (Py_TYPE(slot) == &GradHookType)
        return ((GradHook *)slot)->fired;
    PyObject *fired = slots_get(&h->grad_slot_slots, slot, 3);
    Py_XDECREF(fired);
    return fired == Py_True;
}

/* _GradSlot.end(key) and _GradSlot.restart(place): the places of `key` (the key of `place`) are done with
   (they keep the gradient that came); `place`, when given, joins the others, and the gradient has not come for
   them. */
static int slot_restart(Handler *h, PyObject *slot, PyObject *key, PyObject *place) {
    int ours = Py_TYPE(slot) == &GradHookType;
    PyObject *held = ours ? ((GradHook *)slot)->places : slots_get(&h->grad_slot_slots, slot, 0);
    if (ours)
        Py_XINCREF(held);
    else if (held == NULL && PyErr_Occurred())
        return -1;
    PyObject *old = held ? PySequence_Fast(held, "a gradient hook's places: expected a list") : PyList_New(0);
    Py_XDECREF(held);
    PyObject *list = old ? PyList_New(0) : NULL;
    if (list == NULL || (place != NULL && (!PyTuple_Check(place) || PyTuple_GET_SIZE(place) != 3))) {
        if (list != NULL)
            PyErr_SetString(PyExc_TypeError, "a gradient hook's place: expected (backward, key, index)");
        Py_XDECREF(old);
        Py_XDECREF(list);
        return -1;
    }
    if (place != NULL)
        key = PyTuple_GET_ITEM(place, 1);
    int rc = 0;
    for (Py_ssize_t i = 0; rc == 0 && i < PySequence_Fast_GET_SIZE(old); i++) {
        PyObject *kept = PySequence_Fast_GET_ITEM(old, i);
        int same = PyTuple_Check(kept) && PyTuple_GET_SIZE(kept) == 3
                       ? PyObject_RichCompareBool(PyTuple_GET_ITEM(kept, 1), key, Py_EQ) : 0;
        rc = same < 0 ? -1 : same ? 0 : PyList_Append(list, kept);
    }
    Py_DECREF(old);
    if (rc < 0 || (place != NULL && PyList_Append(list, place) < 0)) {
        Py_DECREF(list);
        return -1;
    }
    if (ours) {
        Py_XSETREF(((GradHook *)slot)->places, list);
        ((GradHook *)slot)->fired = 0;
        return 0;
    }
    rc = slots_set(&h->grad_slot_slots, slot, 0, list) < 0 || slots_set(&h->grad_slot_slots, slot, 3, Py_False) < 0
             ? -1 : 0;
    Py_DECREF(list);
    return rc;
}

/* CallRecorder._hook(backward, tensors, key): how many of `tensors` may get a gradient (are hooked), or -1. */
static int hook(Handler *h, PyObject *backward, PyObject *tensors, PyObject *key) {
    int hooked = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(tensors); i++) {
        PyObject *t = PyList_GET_ITEM(tensors, i);
        int yes = may_get_grad(t);
        if (yes <= 0) {
            if (yes < 0)
                return -1;
            continue;
        }
        PyObject *version = PyObject_GetAttr(t, S_version); /* Summarizer.version */
        if (version == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_RuntimeError)) /* an inference tensor keeps no version */
                return -1;
            PyErr_Clear();
        }
        PyObject *index = PyLong_FromSsize_t(i);
        PyObject *place = index ? PyTuple_Pack(3, backward, key, index) : NULL;
        Py_XDECREF(index);
        PyObject *id = place ? PyLong_FromVoidPtr(t) : NULL;
        PyObject *slot = id ? PyDict_GetItemWithError(h->grad_slots, id) : NULL; /* borrowed */
        int rc = id == NULL || (slot == NULL && PyErr_Occurred()) ? -1 : 0, placed = 0;
        PyObject *places = NULL, *weak = NULL, *seen = NULL;
        int viewed = rc == 0 && slot != NULL && version != NULL ? slot_view(h, slot, &places, &weak, &seen) : 0;
        if (viewed < 0)
            rc = -1;
        if (viewed > 0) {
            /* hooked already this step: the same tensor, unchanged since (the same autograd node)? */
            Py_INCREF(slot);
            int same = PyWeakref_CheckRef(weak) ? PyObject_RichCompareBool(seen, version, Py_EQ) : 0;
            Py_CLEAR(places); /* the comparison may have run Python code: look again */
            Py_CLEAR(weak);
            Py_CLEAR(seen);
            viewed = same > 0 ? slot_view(h, slot, &places, &weak, &seen) : 0;
            if (viewed < 0)
                same = -1;
            if (viewed > 0 && referent_is(weak, t)) {
                /* yes: one more place for its hook; when a backward pass has brought its gradient since, the
                   places of the same key before are done with (see _GradSlot) */
                rc = slot_fired(h, slot) ? slot_restart(h, slot, NULL, place)
                     : PyList_Check(places) ? PyList_Append(places, place) : -1;
                if (rc < 0 && !PyErr_Occurred())
                    PyErr_SetString(PyExc_TypeError, "a gradient hook's places: expected a list");
                placed = 1;
            } else if (same < 0) {
                rc = -1;
            }
            Py_XDECREF(places);
            Py_XDECREF(weak);
            Py_XDECREF(seen);
            Py_DECREF(slot);
        }
        PyObject *fresh = NULL;
        if (rc == 0 && !placed) {
            PyObject *list = PyList_New(1);
            if (list != NULL) {
                Py_INCREF(place);
                PyList_SET_ITEM(list, 0, place);
                fresh = grad_hook_new(h, list);
                Py_DECREF(list);
            }
            rc = fresh == NULL || on_grad(h, t, fresh) < 0 ? -1 : 0;
        }
        if (rc == 0 && !placed && version != NULL) {
            PyObject *weakref = PyWeakref_NewRef(t, NULL);
            if (weakref == NULL) {
                if (PyErr_ExceptionMatches(PyExc_TypeError)) /* no weak references: one hook per place */
                    PyErr_Clear();
                else
                    rc = -1;
            } else {
                GradHook *g = (GradHook *)fresh;
                Py_SETREF(g->tensor, weakref);
                Py_INCREF(version);
                Py_SETREF(g->version, version);
                rc = PyDict_SetItem(h->grad_slots, id, fresh);
            }
        }
        Py_XDECREF(fresh);
        Py_XDECREF(id);
        Py_XDECREF(place);
        Py_XDECREF(version);
        if (rc < 0)
            return -1;
        hooked++;
    }
    return hooked;
}

/* BackwardCall.fill(key, index, grad) for a BackwardCall of this route's kind (no tensor saved): the record
   appears with the first gradient; each gradient's summary goes into its place. Anything else: its own fill. */
static int fill(Handler *h, PyObject *backward, PyObject *key, PyObject *index, PyObject *grad) {
    const slots_t *b = &h->backward_slots; /* name, recorder, record, n_in, n_out, parent, save_as, abandoned */
    if (Py_TYPE(backward) != b->type || !PyLong_CheckExact(index)) {
        PyObject *done = PyObject_CallMethod(backward, "fill", "OOO", key, index, grad);
        Py_XDECREF(done);
        return done == NULL ? -1 : 0;
    }
    PyObject *open = PyObject_GetAttr(h->session, S_step_open);
    int on = open ? PyObject_IsTrue(open) : -1;
    Py_XDECREF(open);
    if (on <= 0 || grad == Py_None)
        return on < 0 ? -1 : 0;
    PyObject *field[8] = {NULL}; /* held from here on: Python code runs below */
    int ours = 1;
    for (int i = 0; ours && i < 8; i++)
        ours = (field[i] = slots_get(b, backward, i)) != NULL;
    if (!ours || field[6] != Py_None) { /* a slot deleted, or tensors saved: its own fill */
        for (int i = 0; i < 8; i++)
            Py_XDECREF(field[i]);
        if (PyErr_Occurred())
            return -1;
        PyObject *done = PyObject_CallMethod(backward, "fill", "OOO", key, index, grad);
        Py_XDECREF(done);
        return done == NULL ? -1 : 0;
    }
    PyObject *record = NULL, *slots = NULL;
    int rc = PyObject_IsTrue(field[7]); /* abandoned */
    if (rc == 0 && field[2] == Py_None) { /* the record appears with the first gradient */
        PyObject *name = field[0], *parent = field[5], *data = PyDict_New(), *construct = NULL;
        rc = data == NULL ? -1 : 0;
        for (int part = 0; rc == 0 && part < 2; part++) {
            if (!(part == 0 ? h->inputs : h->outputs))
                continue;
            Py_ssize_t n = PyLong_AsSsize_t(field[part == 0 ? 4 : 3]); /* n_out for "input", n_in for "output" */
            if (n == -1 && PyErr_Occurred()) {
                rc = -1;
                break;
            }
            PyObject *nones = PyList_New(n < 0 ? 0 : n); /* [None] * n */
            for (Py_ssize_t j = 0; nones != NULL && j < n; j++) {
                Py_INCREF(Py_None);
                PyList_SET_ITEM(nones, j, Py_None);
            }
            rc = set_item_new(data, part == 0 ? S_input : S_output, nones);
        }
        record = rc < 0 ? NULL : new_record(h, name, data);
        Py_XDECREF(data);
        if (record == NULL || session_add(h, name, record) < 0)
            rc = -1;
        if (rc == 0 && slots_set(b, backward, 2, record) < 0)
            rc = -1;
        if (rc == 0 && h->file_new != Py_None && h->has_modules && /* recorder.parents: extra_info, mix */
            ((construct = step_dict(h, S_construct)) == NULL || PyDict_SetItem(construct, name, parent) < 0))
            rc = -1;
        Py_XDECREF(construct);
    } else if (rc == 0) {
        record = field[2];
        Py_INCREF(record);
    }
    if (rc == 0) { /* record.data.get(key) */
        PyObject *data = PyObject_GetAttr(record, S_data);
        slots = data == NULL ? NULL : PyDict_CheckExact(data) ? PyDict_GetItemWithError(data, key)
                                                             : PyObject_CallMethod(data, "get", "O", key);
        if (slots != NULL && PyDict_CheckExact(data))
            Py_INCREF(slots);
        Py_XDECREF(data);
        if (slots == NULL && PyErr_Occurred())
            rc = -1;
    }
    if (rc == 0 && slots != NULL && slots != Py_None) {
        Py_ssize_t at = PyLong_AsSsize_t(index), size = PyObject_Size(slots);
        if ((at == -1 || size < 0) && PyErr_Occurred())
            rc = -1;
        else if (at < size) {
            PyObject *quiet = quiet_enter(h->quiet);
            PyObject *summary = quiet ? PyObject_CallOneArg(h->encode, grad) : NULL; /* Summarizer.summarize */
            if (quiet != NULL && quiet_exit(quiet) < 0)
                Py_CLEAR(summary);
            rc = summary == NULL || PyObject_SetItem(slots, index, summary) < 0 ||
                         PyObject_SetAttr(h->session, S_dirty, Py_True) < 0 ? -1 : 0;
            Py_XDECREF(summary);
        }
    }
    Py_XDECREF(slots);
    Py_XDECREF(record);
    for (int i = 0; i < 8; i++)
        Py_DECREF(field[i]);
    return rc < 0 ? -1 : 0;
}

/* _GradSlot.__call__(grad): each place filled; a failure is reported and the next place goes on. */
static PyObject *GradHook_call(GradHook *g, PyObject *args, PyObject *kwargs) {
    PyObject *grad;
    if (!PyArg_ParseTuple(args, "O:gradient hook", &grad))
        return NULL;
    Handler *h = g->handler;
    if (h == NULL || g->places == NULL) /* cleared by the collector */
        Py_RETURN_NONE;
    Py_INCREF(h);
    g->fired = 1;
    PyObject *places = PySequence_Fast(g->places, "a gradient hook's places: expected a list");
    if (places == NULL) {
        Py_DECREF(h);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(places); i++) {
        PyObject *place = PySequence_Fast_GET_ITEM(places, i);
        Py_INCREF(place); /* the list is the hook's own: Python code run by fill() may change it */
        int rc = PyTuple_CheckExact(place) && PyTuple_GET_SIZE(place) == 3
                     ? fill(h, PyTuple_GET_ITEM(place, 0), PyTuple_GET_ITEM(place, 1), PyTuple_GET_ITEM(place, 2), grad)
                     : (PyErr_SetString(PyExc_TypeError, "a gradient hook's place: expected (backward, key, index)"), -1);
        if (rc == 0) {
            Py_DECREF(place);
            continue;
        }
        if (!PyErr_ExceptionMatches(PyExc_Exception)) {
            Py_DECREF(place);
            Py_DECREF(places);
            Py_DECREF(h);
            return NULL; /* KeyboardInterrupt, SystemExit: the user's */
        }
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb != NULL && value != NULL)
            PyException_SetTraceback(value, tb);
        PyObject *name = PyTuple_Check(place) && PyTuple_GET_SIZE(place) > 0
                             ? PyObject_GetAttr(PyTuple_GET_ITEM(place, 0), S_name) : NULL;
        if (name == NULL)
            PyErr_Clear();
        PyObject *what = PyUnicode_FromFormat("backward hook of %S", name ? name : Py_None);
        Py_XDECREF(name);
        Py_DECREF(place);
        PyObject *names = PyTuple_Pack(1, S_site);
        PyObject *report[] = {what, value ? value : Py_None, S_site_hook};
        PyObject *done = what && names && h->report ? PyObject_Vectorcall(h->report, report, 2, names) : NULL;
        Py_XDECREF(names);
        Py_XDECREF(what);
        Py_XDECREF(done);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        if (done == NULL && PyErr_Occurred()) { /* the user's own error, as on the Python route */
            Py_DECREF(places);
            Py_DECREF(h);
            return NULL;
        }
        PyErr_Clear();
    }
    Py_DECREF(places);
    Py_DECREF(h);
    Py_RETURN_NONE;
}

#define GRAD_HOOK_FIELDS(X) X(places) X(tensor) X(version) X(handler)

GC_FIELD_FUNCTIONS(GradHook, GradHook_traverse, GradHook_clear, GRAD_HOOK_FIELDS)

static void GradHook_dealloc(GradHook *g) {
    PyObject_GC_UnTrack(g);
    GradHook_clear(g);
    PyObject_GC_Del(g);
}

static PyMemberDef GRAD_HOOK_MEMBERS[] = { /* read-only: CallRecorder._hook reads them, and appends to places */
    {"places", T_OBJECT, offsetof(GradHook, places), READONLY,
     "(BackwardCall, key, index) for each place the tensor holds."},
    {"tensor", T_OBJECT, offsetof(GradHook, tensor), READONLY, "A weak reference to the hooked tensor, or None."},
    {"version", T_OBJECT, offsetof(GradHook, version), READONLY, "The tensor's version when it was hooked, or None."},
    {"fired", T_BOOL, offsetof(GradHook, fired), READONLY, "Its gradient came since its places were started."},
    {NULL, 0, 0, 0, NULL}};

static PyObject *grad_hook_restart(GradHook *g, PyObject *key, PyObject *place) {
    if (g->handler == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the gradient hook was released");
        return NULL;
    }
    if (slot_restart(g->handler, (PyObject *)g, key, place) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *GradHook_restart(GradHook *g, PyObject *place) { return grad_hook_restart(g, NULL, place); }

static PyObject *GradHook_end(GradHook *g, PyObject *key) { return grad_hook_restart(g, key, NULL); }

static PyMethodDef GRAD_HOOK_METHODS[] = {
    {"restart", (PyCFunction)GradHook_restart, METH_O,
     "_GradSlot.restart(place): the places of place's key are done with; place joins the rest."},
    {"end", (PyCFunction)GradHook_end, METH_O, "_GradSlot.end(key): the places of key are done with."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject GradHookType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "msprobe_lite.pytorch._fast_capture.GradHook",
    .tp_basicsize = sizeof(GradHook),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A tensor's gradient hook made by the C handler: core.calls._GradSlot in C (see the module).",
    .tp_call = (ternaryfunc)GradHook_call,
    .tp_members = GRAD_HOOK_MEMBERS,
    .tp_methods = GRAD_HOOK_METHODS,
    .tp_traverse = (traverseproc)GradHook_traverse,
    .tp_clear = (inquiry)GradHook_clear,
    .tp_dealloc = (destructor)GradHook_dealloc,
};

/* CallRecorder._backward(call): its BackwardCall (save_as None: this route runs only when no tensor is saved). */
static PyObject *backward_of(Handler *h, PyObject *call) {
    const slots_t *c = &h->call_slots; /* name, record, backward, save_as, bwd_name, bwd_parent, n_in */
    PyObject *name = slots_get(c, call, 4), *parent = name ? slots_get(c, call, 5) : NULL,
             *n_in = parent ? slots_get(c, call, 6) : NULL, *backward = NULL;
    if (n_in == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_AttributeError, "Call: its backward name, parent or input count is unset");
    if (n_in != NULL) {
        PyObject *parts[] = {name, h->recorder, Py_None, n_in, ZERO, parent, Py_None, Py_False};
        backward = slots_new(&h->backward_slots, parts);
    }
    if (backward != NULL && slots_set(c, call, 2, backward) < 0)
        Py_CLEAR(backward);
    Py_XDECREF(name);
    Py_XDECREF(parent);
    Py_XDECREF(n_in);
    return backward;
}

/* Quiet entered when `tensors` are read outside quiet and one is not a plain tensor (its own
   __torch_function__ must not see the debugger's reads): *quiet is then set; 0, or -1 on error. */
static int quiet_for(Handler *h, PyObject *tensors, int quieted, PyObject **quiet) {
    *quiet = NULL;
    if (quieted)
        return 0;
    return all_plain(h, tensors) || (*quiet = quiet_enter(h->quiet)) != NULL ? 0 : -1;
}

/* CallRecorder.gradients_before: makes the Call (f->call) and hooks the call's inputs. 0 (nothing done) when
   the arguments hold a container left to Python: the caller then goes the Python way. `quieted`: inside
   quiet already. */
static int grads_before(Handler *h, Flight *f, PyObject *bwd_name, PyObject *bwd_parent, PyObject *args,
                        PyObject *kwargs, int quieted) {
    PyObject *inputs = PyList_New(0), *quiet = NULL;
    if (inputs == NULL)
        return -1;
    int rc = leaves(h, args, 1, inputs);
    if (rc == 1 && kwargs != NULL && PyDict_GET_SIZE(kwargs) > 0)
        rc = leaves(h, kwargs, 1, inputs);
    if (rc == 1 && quiet_for(h, inputs, quieted, &quiet) < 0)
        rc = -1;
    if (rc == 1) {
        PyObject *n_in = PyLong_FromSsize_t(PyList_GET_SIZE(inputs));
        PyObject *parts[] = {f->name, Py_None, Py_None, Py_None, bwd_name, bwd_parent, n_in, bwd_name};
        f->call = n_in ? slots_new(&h->call_slots, parts) : NULL;
        Py_XDECREF(n_in);
        int wanted = f->call ? any_may_get_grad(inputs) : -1;
        PyObject *backward = wanted > 0 ? backward_of(h, f->call) : NULL;
        rc = wanted < 0 || (wanted > 0 && (backward == NULL || hook(h, backward, inputs, S_output) < 0)) ? -1 : 1;
        Py_XDECREF(backward);
    }
    if (quiet != NULL && quiet_exit(quiet) < 0)
        rc = -1;
    Py_DECREF(inputs);
    return rc;
}

/* CallRecorder.gradients_after: hooks the outputs; 0 (nothing done) for an output left to Python. */
static int grads_after(Handler *h, PyObject *call, PyObject *out, int quieted) {
    if (Py_TYPE(call) != h->call_slots.type)
        return 0;
    PyObject *outputs = PyList_New(0), *quiet = NULL;
    if (outputs == NULL)
        return -1;
    int rc = leaves(h, out, 0, outputs);
    if (rc == 1 && quiet_for(h, outputs, quieted, &quiet) < 0)
        rc = -1;
    if (rc == 1) {
        PyObject *backward = slots_get(&h->call_slots, call, 2);
        int made = backward == Py_None || backward == NULL;
        if (backward == NULL && PyErr_Occurred())
            rc = -1, made = 0;
        else if (made) {
            Py_XDECREF(backward);
            int wanted = any_may_get_grad(outputs);
            backward = wanted > 0 ? backward_of(h, call) : wanted < 0 ? NULL : (Py_INCREF(Py_None), Py_None);
        }
        if (backward == NULL)
            rc = -1;
        else if (backward != Py_None) {
            PyObject *n_out = PyLong_FromSsize_t(PyList_GET_SIZE(outputs));
            int hooked = n_out == NULL || PyObject_SetAttr(backward, S_n_out, n_out) < 0
                             ? -1 : hook(h, backward, outputs, S_input);
            Py_XDECREF(n_out);
            rc = hooked < 0 ? -1 : 1;
            if (hooked == 0 && !made && PyList_GET_SIZE(outputs) > 0) {
                /* nothing flows into its backward (x > 0, x.detach()): no record; see gradients_after */
                if (Py_TYPE(backward) == h->backward_slots.type) {
                    if (slots_set(&h->backward_slots, backward, 7, Py_True) < 0)
                        rc = -1;
                } else if (PyObject_SetAttrString(backward, "abandoned", Py_True) < 0) {
                    rc = -1;
                }
            }
        }
        Py_XDECREF(backward);
    }
    if (quiet != NULL && quiet_exit(quiet) < 0)
        rc = -1;
    Py_DECREF(outputs);
    return rc;
}

/* `fn(*args)` inside quiet unless `quieted` (the Python methods' reads are the debugger's too). */
static PyObject *call_quietly(Handler *h, PyObject *fn, PyObject *const *args, Py_ssize_t n, int quieted) {
    PyObject *quiet = quieted ? NULL : quiet_enter(h->quiet);
    if (!quieted && quiet == NULL)
        return NULL;
    PyObject *out = PyObject_Vectorcall(fn, args, n, NULL);
    if (quiet != NULL && quiet_exit(quiet) < 0)
        Py_CLEAR(out);
    return out;
}

/* `fn(name)` of the record filter -> 1/0 for wants, 0 for on_start/on_end, -1 on error. */
static int ask_filter(PyObject *fn, PyObject *name) {
    PyObject *answer = PyObject_CallOneArg(fn, name);
    if (answer == NULL)
        return -1;
    int yes = PyObject_IsTrue(answer);
    Py_DECREF(answer);
    return yes;
}

/* CallRecorder._end_places(args, kwargs), for a call whose backward is filtered out, when a tensor was hooked
   this step: 1, or -1 on error. */
static int end_places(Handler *h, PyObject *args, PyObject *kwargs, int quieted) {
    if (PyDict_GET_SIZE(h->slots) == 0)
        return 1;
    PyObject *both[] = {args, kwargs ? kwargs : Py_None};
    PyObject *done = call_quietly(h, h->end_places, both, 2, quieted);
    Py_XDECREF(done);
    return done == NULL ? -1 : 1;
}

static int record_inputs(Handler *h, PyObject *args, PyObject *kwargs, Flight *f, PyObject *parent,
                         PyObject **construct, int quieted);

/* CallRecorder.begin_api + begin, in their order (a failure midway leaves what the Python route would leave):
   counts the call, names it, asks the filter, makes its record with the inputs, sets its parent, files its
   stack, and with gradients recorded hooks its inputs (gradients_before) or, its backward filtered out, ends
   the places of earlier hooks on them (_end_places). */
static int begin_body(Handler *h, PyObject *entry, PyObject *args, PyObject *kwargs, Flight *f, int quieted) {
    if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 2) {
        PyErr_SetString(PyExc_TypeError, "API table: expected (prefix, api) tuples");
        return -1;
    }
    PyObject *construct = NULL, *counters = NULL, *owner[2] = {NULL, NULL};
    PyObject *parent = Py_None, *bwd_parent = Py_None;
    int optimizer = h->has_modules && h->in_optimizer;
    if (optimizer) { /* ApiCapture._open: the optimizer's calls, before the call is counted */
        parent = S_optimizer;
        if ((construct = step_dict(h, S_construct)) == NULL || PyDict_SetItem(construct, S_optimizer, Py_None) < 0)
            goto fail;
    }
    if ((counters = step_dict(h, S_counters)) == NULL)
        goto fail;
    PyObject *count = PyDict_GetItemWithError(counters, entry);
    if (count == NULL && PyErr_Occurred())
        goto fail;
    Py_ssize_t n = count == NULL ? 0 : PyLong_AsSsize_t(count);
    if (n == -1 && PyErr_Occurred())
        goto fail;
    if (set_item_new(counters, entry, PyLong_FromSsize_t(n + 1)) < 0)
        goto fail;
    if (h->has_modules && !optimizer) {
        if (module_parents(h, owner) < 0)
            goto fail;
        if (owner[0] != NULL) {
            parent = owner[0];
            bwd_parent = owner[1];
        }
    }
    PyObject *prefix = PyTuple_GET_ITEM(entry, 0), *api = PyTuple_GET_ITEM(entry, 1);
    f->name = call_name(prefix, api, n, ".forward");
    if (f->name == NULL)
        goto fail;
    int wanted = 1;
    if (h->wants != NULL && (ask_filter(h->on_start, f->name) < 0 || (wanted = ask_filter(h->wants, f->name)) < 0))
        goto fail;
    if (wanted && record_inputs(h, args, kwargs, f, parent, &construct, quieted) < 0)
        goto fail;
    PyObject *grad = PyObject_CallNoArgs(h->grad_enabled);
    int recording = grad ? PyObject_IsTrue(grad) : -1;
    Py_XDECREF(grad);
    if (recording < 0)
        goto fail;
    if (recording) {
        PyObject *bwd_name = call_name(prefix, api, n, ".backward");
        int wanted_back = bwd_name == NULL ? -1 : h->wants == NULL ? 1 : ask_filter(h->wants, bwd_name);
        int done = wanted_back < 0 ? -1 : !wanted_back ? end_places(h, args, kwargs, quieted)
                   : h->grads_in_c ? grads_before(h, f, bwd_name, bwd_parent, args, kwargs, quieted) : 0;
        if (done == 0) { /* the Python way */
            f->call = PyObject_CallOneArg(h->call_type, f->name);
            PyObject *before[] = {f->call, bwd_name, bwd_parent, args, kwargs ? kwargs : Py_None};
            PyObject *hooked = f->call ? call_quietly(h, h->before, before, 5, quieted) : NULL;
            done = hooked == NULL ? -1 : 1;
            Py_XDECREF(hooked);
        }
        Py_XDECREF(bwd_name);
        if (done < 0)
            goto fail;
    }
    Py_XDECREF(owner[0]);
    Py_XDECREF(owner[1]);
    Py_XDECREF(construct);
    Py_DECREF(counters);
    return 0;
fail:
    Py_XDECREF(owner[0]);
    Py_XDECREF(owner[1]);
    Py_XDECREF(construct);
    Py_XDECREF(counters);
    flight_clear(f);
    return -1;
}

/* The part of begin_body for a call whose forward record is kept: the record with its inputs, its parent
   (mix level) and its stack. `*construct`: the step's construct dict once looked up (a new reference). */
static int record_inputs(Handler *h, PyObject *args, PyObject *kwargs, Flight *f, PyObject *parent,
                         PyObject **construct, int quieted) {
    if ((f->data = PyDict_New()) == NULL)
        return -1;
    if (h->inputs) {
        PyObject *kw = kwargs != NULL ? (Py_INCREF(kwargs), kwargs) : PyDict_New();
        PyObject *encode = quieted ? h->encode : h->bare;
        int done = kw != NULL && set_item_new(f->data, S_input_args, PyObject_CallOneArg(encode, args)) == 0 &&
                   set_item_new(f->data, S_input_kwargs, PyObject_CallOneArg(encode, kw)) == 0;
        Py_XDECREF(kw);
        if (!done)
            return -1;
    }
    if (h->file_new != Py_None) { /* stacks kept (recorder.extra); parents at mix only (recorder.parents) */
        if (h->has_modules && ((*construct == NULL && (*construct = step_dict(h, S_construct)) == NULL) ||
                               PyDict_SetItem(*construct, f->name, parent) < 0))
            return -1;
        PyObject *frame = (PyObject *)PyEval_GetFrame(); /* borrowed: the caller of the torch function */
        PyObject *where[] = {f->name, frame ? frame : Py_None, NULL};
        PyObject *filed = PyObject_Vectorcall(h->file_known, where, 2, NULL); /* True, or what it found */
        if (filed != NULL && filed != Py_True) {
            where[2] = filed;
            PyObject *known = filed;
            filed = PyObject_Vectorcall(h->file_new, where, 3, NULL);
            Py_DECREF(known);
        }
        if (filed == NULL)
            return -1;
        Py_DECREF(filed);
    }
    f->record = new_record(h, f->name, f->data);
    return f->record == NULL ? -1 : 0;
}

/* CallRecorder.end_api + end: the output, the record joins the step, then with gradients recorded the outputs
   are hooked (gradients_after); the filter hears of the call's end. */
static int record_output(Handler *h, PyObject *out, Flight *f, int quieted);

static int end_body(Handler *h, PyObject *entry, PyObject *args, PyObject *out, Flight *f, int quieted) {
    /* x[i] = y: the output is x, changed (recorded, and hooked for its gradient); borrowed from args */
    if (PyTuple_GET_SIZE(args) > 0 && PyUnicode_Compare(PyTuple_GET_ITEM(entry, 1), S_setitem) == 0)
        out = PyTuple_GET_ITEM(args, 0);
    else if (PyErr_Occurred())
        return -1;
    if (f->record != NULL && record_output(h, out, f, quieted) < 0)
        return -1;
    if (f->call != NULL) {
        int done = h->grads_in_c ? grads_after(h, f->call, out, quieted) : 0;
        if (done == 0) { /* the Python way */
            PyObject *after[] = {f->call, out};
            PyObject *hooked = call_quietly(h, h->after, after, 2, quieted);
            done = hooked == NULL ? -1 : 1;
            Py_XDECREF(hooked);
        }
        if (done < 0)
            return -1;
    }
    return h->on_end != NULL ? ask_filter(h->on_end, f->name) < 0 ? -1 : 0 : 0;
}

/* The part of end_body for a kept forward record: its output, and the record joins the step. */
static int record_output(Handler *h, PyObject *out, Flight *f, int quieted) {
    if (h->outputs) {
        PyObject *shown = out;
        int whole = PyList_Check(shown) || PyTuple_Check(shown);
        if (whole) { /* a named tuple is one value */
            int named = has_attr(shown, S_fields);
            if (named < 0)
                return -1;
            whole = !named;
        }
        PyObject *encoded = PyObject_CallOneArg(quieted ? h->encode : h->bare, shown);
        if (encoded != NULL && !whole) { /* a single value: [value] */
            PyObject *one = encoded;
            if ((encoded = PyList_New(1)) != NULL)
                PyList_SET_ITEM(encoded, 0, one);
            else
                Py_DECREF(one);
        }
        if (set_item_new(f->data, S_output, encoded) < 0)
            return -1;
    }
    if (!h->numbers || PyDict_GET_SIZE(f->data) > 0) {
        if (session_add(h, f->name, f->record) < 0)
            return -1;
        PyObject *sealed = PyObject_CallOneArg(h->seal, f->record); /* see CallRecorder.end */
        if (sealed == NULL)
            return -1;
        Py_DECREF(sealed);
    }
    return 0;
}

/* begin_body / end_body with the debugger's reads of tensors inside quiet when a torch-function mode is
   active (`modes`, from modes_on once per call: the user's call leaves the mode stack as it found it);
   otherwise the encoder's bare() and the gradient half quiet only what needs it. */
static int begin(Handler *h, PyObject *entry, PyObject *args, PyObject *kwargs, Flight *f, int modes) {
    PyObject *quiet = modes ? quiet_enter(h->quiet) : NULL;
    if (modes && quiet == NULL)
        return -1;
    int rc = begin_body(h, entry, args, kwargs, f, modes);
    if (quiet != NULL && quiet_exit(quiet) < 0 && rc == 0) {
        flight_clear(f);
        rc = -1;
    }
    return rc;
}

static int end(Handler *h, PyObject *entry, PyObject *args, PyObject *out, Flight *f, int modes) {
    PyObject *quiet = modes ? quiet_enter(h->quiet) : NULL;
    if (modes && quiet == NULL)
        return -1;
    int rc = end_body(h, entry, args, out, f, modes);
    return quiet != NULL && quiet_exit(quiet) < 0 ? -1 : rc;
}

/* The user's call raised (its exception is set, and stays): CallRecorder.abandon takes back what begin() did. */
static void abandon(Handler *h, Flight *f) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *args[] = {f->name, f->call ? f->call : Py_None};
    PyObject *done = PyObject_Vectorcall(h->abandon, args, 2, NULL);
    if (done == NULL && !reported(h, S_site_end))
        PyErr_Clear(); /* not an Exception: the user's own exception goes on regardless */
    Py_XDECREF(done);
    PyErr_Restore(type, value, tb);
}

/* __torch_function__(func, types, args=(), kwargs=None) */
static PyObject *Handler_torch_function(Handler *h, PyObject *const *argv, Py_ssize_t nargs, PyObject *kwnames) {
    if (kwnames != NULL || nargs < 2 || nargs > 4 || h->table == NULL)
        return call_twin(h, argv, nargs, kwnames);
    PyObject *func = argv[0];
    PyObject *args = nargs > 2 ? argv[2] : EMPTY;
    PyObject *kwargs = nargs > 3 && argv[3] != Py_None ? argv[3] : NULL;
    if (!PyTuple_Check(args) || (kwargs != NULL && !PyDict_Check(kwargs)))
        return call_twin(h, argv, nargs, kwnames);
    PyObject *entry = PyDict_GetItemWithError(h->table, func);
    if (entry == NULL) {
        if (PyErr_Occurred())
            return NULL;
        return PyObject_Call(func, args, kwargs);
    }
    if (!PyTuple_CheckExact(entry)) { /* an alias is made (api_capture.ALIASES): the call, then Summarizer.taint */
        Py_INCREF(entry); /* the table's, held while Python code runs (the call may change the table) */
        PyObject *out = PyObject_Call(func, args, kwargs);
        if (out == NULL) {
            Py_DECREF(entry);
            return NULL;
        }
        PyObject *pair[] = {args, out};
        PyObject *done = PyObject_Vectorcall(entry, pair, 2, NULL); /* guarded: reports its own failures */
        Py_DECREF(entry);
        if (done == NULL)
            Py_CLEAR(out);
        Py_XDECREF(done);
        return out;
    }
    PyObject *on = PyObject_GetAttr(h->session, S_forward_on);
    int collecting = on ? PyObject_IsTrue(on) : -1;
    Py_XDECREF(on);
    if (collecting < 0)
        return NULL;
    if (!collecting)
        return PyObject_Call(func, args, kwargs);
    if (!h->fast || PyTuple_GET_SIZE(entry) != 2) /* (prefix, api, FORGETS): api_capture.UNVERSIONED_WRITES */
        return call_twin(h, argv, nargs, kwnames);

    Py_INCREF(entry); /* the table's, held while Python code runs */
    Flight f = {NULL, NULL, NULL, NULL};
    int modes = modes_on(h);
    if ((modes < 0 || begin(h, entry, args, kwargs, &f, modes) < 0) && !reported(h, S_site_begin)) {
        Py_DECREF(entry);
        return NULL;
    }
    PyObject *out = PyObject_Call(func, args, kwargs);
    if (out == NULL && f.name != NULL) /* begun (a failed begin clears the flight) */
        abandon(h, &f);
    else if (out != NULL && f.name != NULL && end(h, entry, args, out, &f, modes) < 0 && !reported(h, S_site_end))
        Py_CLEAR(out);
    flight_clear(&f);
    Py_DECREF(entry);
    return out;
}

/* What PyTorch gets for the mode's `__torch_function__` (Handler_getattro below): the bound method, in an object
   of this type when the method is the handler's own. Why: for every call it hands to a mode, PyTorch also
   reads `__torch_function__.__self__` (to refuse a classmethod) by PyObject_FastGetAttrString, which on a
   bound method makes a str and looks it up in the method's class (a miss in CPython's type cache: the str is
   new each time). Here `__self__` is the handler at once; the call goes to Handler_torch_function directly;
   every other attribute is the bound method's. Only C-string lookups get it: `mode.__torch_function__`
   in Python is the usual bound method. */
typedef struct {
    PyObject_HEAD
    PyObject *bound; /* the handler's bound __torch_function__; its __self__ is the handler */
    vectorcallfunc vectorcall;
} TorchFunctionCall;

#define TORCH_FUNCTION_CALL_FIELDS(X) X(bound)

GC_FIELD_FUNCTIONS(TorchFunctionCall, TorchFunctionCall_traverse, TorchFunctionCall_clear,
                   TORCH_FUNCTION_CALL_FIELDS)

static void TorchFunctionCall_dealloc(TorchFunctionCall *c) {
    PyObject_GC_UnTrack(c);
    TorchFunctionCall_clear(c);
    PyObject_GC_Del(c);
}

static PyObject *Handler_torch_function(Handler *h, PyObject *const *argv, Py_ssize_t nargs, PyObject *kwnames);

/* 0 while the object holds its method; -1 with an exception once the collector cleared it */
static int torch_function_call_alive(TorchFunctionCall *c) {
    if (c->bound != NULL)
        return 0;
    PyErr_SetString(PyExc_RuntimeError, "the debugger's __torch_function__ was released");
    return -1;
}

static PyObject *TorchFunctionCall_vectorcall(TorchFunctionCall *c, PyObject *const *args, size_t nargsf,
                                              PyObject *kwnames) {
    if (torch_function_call_alive(c) < 0)
        return NULL;
    return Handler_torch_function((Handler *)PyCFunction_GetSelf(c->bound), args, PyVectorcall_NARGS(nargsf),
                                  kwnames);
}

static PyObject *TorchFunctionCall_getattr(TorchFunctionCall *c, char *name) {
    if (torch_function_call_alive(c) < 0)
        return NULL;
    if (strcmp(name, "__self__") == 0) {
        PyObject *handler = PyCFunction_GetSelf(c->bound);
        Py_INCREF(handler);
        return handler;
    }
    return PyObject_GetAttrString(c->bound, name);
}

static PyObject *TorchFunctionCall_getattro(TorchFunctionCall *c, PyObject *name) {
    if (torch_function_call_alive(c) < 0)
        return NULL;
    return PyObject_GetAttr(c->bound, name);
}

static PyTypeObject TorchFunctionCallType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "msprobe_lite.pytorch._fast_capture.TorchFunctionCall",
    .tp_basicsize = sizeof(TorchFunctionCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "The handler's bound __torch_function__ as PyTorch's C++ side sees it (see Handler_getattro).",
    .tp_vectorcall_offset = offsetof(TorchFunctionCall, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_getattr = (getattrfunc)TorchFunctionCall_getattr,
    .tp_getattro = (getattrofunc)TorchFunctionCall_getattro,
    .tp_traverse = (traverseproc)TorchFunctionCall_traverse,
    .tp_clear = (inquiry)TorchFunctionCall_clear,
    .tp_dealloc = (destructor)TorchFunctionCall_dealloc,
};

/* `value` (a new reference, the mode's `__torch_function__`) as a TorchFunctionCall when it is the handler's
   own bound method, else as it is. */
static PyObject *torch_function_call(Handler *h, PyObject *value) {
    if (!PyCFunction_Check(value) || PyCFunction_GetSelf(value) != (PyObject *)h ||
        PyCFunction_GetFunction(value) != (PyCFunction)(void (*)(void))Handler_torch_function)
        return value;
    TorchFunctionCall *c = PyObject_GC_New(TorchFunctionCall, &TorchFunctionCallType);
    if (c == NULL) {
        Py_DECREF(value);
        return NULL;
    }
    c->bound = value;
    c->vectorcall = (vectorcallfunc)TorchFunctionCall_vectorcall;
    PyObject_GC_Track(c);
    return (PyObject *)c;
}

/* tp_getattro, inherited by the Python subclass: PyTorch looks up a mode's `__torch_function__` by name twice for
   every call it hands to the mode, the ones that only pass through included; by default each binds a new
   method object. Here the bound method made by the first lookup is handed out again until `release()` (when
   the mode is popped, at each stop()): the class is the debugger's own, and a change made to it while the
   mode is active is seen from the next start(). The instance's dict is the debugger's. PyTorch refuses a mode
   whose `__torch_function__` is not a method of its class. Every other name: the usual lookup. */
static PyObject *Handler_getattro(Handler *h, PyObject *name) {
    int wanted = PyUnicode_Check(name) && PyUnicode_GET_LENGTH(name) == 18 &&
                 PyUnicode_CompareWithASCIIString(name, "__torch_function__") == 0;
    if (!wanted)
        return PyObject_GenericGetAttr((PyObject *)h, name);
    if (h->torch_function != NULL) {
        Py_INCREF(h->torch_function);
        return h->torch_function;
    }
    PyObject *value = PyObject_GenericGetAttr((PyObject *)h, name);
    if (value != NULL)
        value = torch_function_call(h, value);
    if (value != NULL) {
        Py_INCREF(value);
        h->torch_function = value;
    }
    return value;
}

#define FIELDS(X)                                                                                          \
    X(table) X(session) X(encode) X(seal) X(record_type) X(grad_enabled) X(file_known) X(file_new) X(quiet)   \
    X(report) X(twin) X(call_type) X(before) X(after) X(abandon) X(current)

#define GRAD_FIELDS(X)                                                                                     \
    X(grad_slots) X(handles) X(recorder) X(tensor_type) X(plain) X(hook_dict) X(keys) X(on_grad)

#define FILTER_FIELDS(X) X(on_start) X(wants) X(on_end) X(end_places) X(slots)

/* bind(table, session, encode, seal, record_type, grad_enabled, file_known, file_new, quiet, report, twin,
        call_type, before, after, abandon, current, fast, has_modules, inputs, outputs, numbers) */
static PyObject *Handler_bind(Handler *h, PyObject *args) {
#define DECLARE(f) PyObject *f;
    FIELDS(DECLARE)
    int fast, has_modules, inputs, outputs, numbers;
    if (!PyArg_ParseTuple(args, "O!OOOOOOOOOOOOOOOppppp:bind", &PyDict_Type, &table, &session, &encode, &seal,
                          &record_type, &grad_enabled, &file_known, &file_new, &quiet, &report, &twin, &call_type,
                          &before, &after, &abandon, &current, &fast, &has_modules, &inputs, &outputs, &numbers))
        return NULL;
#define KEEP(f) Py_INCREF(f); Py_XSETREF(h->f, f);
    FIELDS(KEEP)
    if (slots_find(&h->record_slots, record_type, RECORD_SLOTS, 2) < 0)
        return NULL;
    h->fast = (char)fast;
    h->has_modules = (char)has_modules;
    h->inputs = (char)inputs;
    h->outputs = (char)outputs;
    h->numbers = (char)numbers;
    Py_RETURN_NONE;
}

static const char *const CALL_SLOTS[] = {"name",     "record",     "backward", "save_as",
                                          "bwd_name", "bwd_parent", "n_in",     "backward_name"};
static const char *const BACKWARD_SLOTS[] = {"name", "recorder", "record", "n_in", "n_out", "parent", "save_as",
                                             "abandoned"};
static const char *const GRAD_SLOT_SLOTS[] = {"places", "tensor", "version", "fired"};
static const char *const HANDLE_SLOTS[] = {"hooks", "key"};

/* bind_gradients(call_type, backward_type, grad_slot_type, handle_type, grad_slots, handles, recorder,
                  tensor_type, plain, hook_dict, keys, on_grad, max_depth) -> bool: the gradient half in C from
   here on (after bind()), when every class is one _slots.h can fill; False leaves it to Python. The classes
   are kept alive by their modules; the handler holds the objects. */
static PyObject *Handler_bind_gradients(Handler *h, PyObject *args) {
    PyObject *types[4];
#define DECLARE_G(f) PyObject *f;
    GRAD_FIELDS(DECLARE_G)
    int max_depth;
    if (!PyArg_ParseTuple(args, "OOOOO!O!OOO!OOOi:bind_gradients", &types[0], &types[1], &types[2], &types[3],
                          &PyDict_Type, &grad_slots, &PyList_Type, &handles, &recorder, &tensor_type, &PyTuple_Type,
                          &plain, &hook_dict, &keys, &on_grad, &max_depth))
        return NULL;
    h->grads_in_c = 0;
    int found[4] = {slots_find(&h->call_slots, types[0], CALL_SLOTS, 8),
                    slots_find(&h->backward_slots, types[1], BACKWARD_SLOTS, 8),
                    slots_find(&h->grad_slot_slots, types[2], GRAD_SLOT_SLOTS, 4),
                    slots_find(&h->handle_slots, types[3], HANDLE_SLOTS, 2)};
    for (int i = 0; i < 4; i++) {
        if (found[i] < 0)
            return NULL;
        if (found[i] == 0)
            Py_RETURN_FALSE;
    }
    if (!PyIter_Check(keys)) {
        PyErr_SetString(PyExc_TypeError, "bind_gradients: keys must be an iterator");
        return NULL;
    }
#define KEEP_G(f) Py_INCREF(f); Py_XSETREF(h->f, f);
    GRAD_FIELDS(KEEP_G)
    h->max_depth = max_depth;
    h->grads_in_c = 1;
    Py_RETURN_TRUE;
}

/* bind_filter(on_start, wants, on_end, end_places, slots): the run's RecordFilter (scope, list, a direction left
   out) asked by name, as CallRecorder.begin/end ask it; before bind() (which may let calls be recorded here). */
static PyObject *Handler_bind_filter(Handler *h, PyObject *args) {
#define DECLARE_F(f) PyObject *f;
    FILTER_FIELDS(DECLARE_F)
    if (!PyArg_ParseTuple(args, "OOOOO!:bind_filter", &on_start, &wants, &on_end, &end_places, &PyDict_Type, &slots))
        return NULL;
    if (!PyCallable_Check(on_start) || !PyCallable_Check(wants) || !PyCallable_Check(on_end) ||
        !PyCallable_Check(end_places)) {
        PyErr_SetString(PyExc_TypeError, "bind_filter: expected four callables and a dict");
        return NULL;
    }
#define KEEP_F(f) Py_INCREF(f); Py_XSETREF(h->f, f);
    FILTER_FIELDS(KEEP_F)
    Py_RETURN_NONE;
}

/* bind_quiet(bare, mode_count): the encoder's bare(value) and torch._C._len_torch_function_stack, so that a
   call made while no torch-function mode is active skips quiet (see modes_on). */
static PyObject *Handler_bind_quiet(Handler *h, PyObject *args) {
    PyObject *bare, *mode_count;
    if (!PyArg_ParseTuple(args, "OO:bind_quiet", &bare, &mode_count))
        return NULL;
    if (!PyCallable_Check(bare) || !PyCallable_Check(mode_count)) {
        PyErr_SetString(PyExc_TypeError, "bind_quiet: expected two callables");
        return NULL;
    }
    Py_INCREF(bare);
    Py_XSETREF(h->bare, bare);
    Py_INCREF(mode_count);
    Py_XSETREF(h->mode_count, mode_count);
    Py_RETURN_NONE;
}

static int Handler_traverse(Handler *h, visitproc visit, void *arg) {
#define VISIT(f) Py_VISIT(h->f);
    FIELDS(VISIT)
    GRAD_FIELDS(VISIT)
    FILTER_FIELDS(VISIT)
    Py_VISIT(h->bare);
    Py_VISIT(h->mode_count);
    Py_VISIT(h->torch_function);
    return 0;
}

static int Handler_clear(Handler *h) {
#define CLEAR(f) Py_CLEAR(h->f);
    FIELDS(CLEAR)
    GRAD_FIELDS(CLEAR)
    FILTER_FIELDS(CLEAR)
    Py_CLEAR(h->bare);
    Py_CLEAR(h->mode_count);
    Py_CLEAR(h->torch_function);
    slots_clear(&h->record_slots);
    slots_clear(&h->call_slots);
    slots_clear(&h->backward_slots);
    slots_clear(&h->grad_slot_slots);
    slots_clear(&h->handle_slots);
    h->grads_in_c = 0;
    return 0;
}

static void Handler_dealloc(Handler *h) {
    PyObject_GC_UnTrack(h);
    Handler_clear(h);
    Py_TYPE(h)->tp_free((PyObject *)h);
}

/* release(): lets go of the bound __torch_function__ kept by Handler_getattro (it refers to the handler). */
static PyObject *Handler_release(Handler *h, PyObject *unused) {
    Py_CLEAR(h->torch_function);
    Py_RETURN_NONE;
}

static PyMethodDef HANDLER_METHODS[] = {
    {"release", (PyCFunction)Handler_release, METH_NOARGS,
     "release(): lets go of the bound __torch_function__ kept for PyTorch's lookups (see the module)."},
    {"__torch_function__", (PyCFunction)(void (*)(void))Handler_torch_function, METH_FASTCALL | METH_KEYWORDS,
     "__torch_function__(func, types, args=(), kwargs=None): the mode's entry point (see the module)."},
    {"bind_gradients", (PyCFunction)Handler_bind_gradients, METH_VARARGS,
     "bind_gradients(call_type, backward_type, grad_slot_type, handle_type, grad_slots, handles, recorder, "
     "tensor_type, plain, hook_dict, keys, on_grad, max_depth) -> bool: CallRecorder's gradient half in C (see "
     "the module); False when a class is not one it can fill."},
    {"bind_filter", (PyCFunction)Handler_bind_filter, METH_VARARGS,
     "bind_filter(on_start, wants, on_end, end_places, slots): the run's record filter, asked by name (see the "
     "module); before bind()."},
    {"bind_quiet", (PyCFunction)Handler_bind_quiet, METH_VARARGS,
     "bind_quiet(bare, mode_count): the encoder's bare() and torch._C._len_torch_function_stack; calls made "
     "while no torch-function mode is active then skip quiet (see the module)."},
    {"bind", (PyCFunction)Handler_bind, METH_VARARGS,
     "bind(table, session, encode, seal, record_type, grad_enabled, file_known, file_new, quiet, report, twin, "
     "call_type, before, after, abandon, current, fast, has_modules, inputs, outputs, numbers): what the "
     "handler works with, once (ApiCapture.make)."},
    {NULL, NULL, 0, NULL}};

static PyMemberDef HANDLER_MEMBERS[] = {
    {"in_optimizer", T_BOOL, offsetof(Handler, in_optimizer), 0,
     "True while the optimizer steps (set by its step hooks)."},
    {NULL, 0, 0, 0, NULL}};

static PyTypeObject HandlerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "msprobe_lite.pytorch._fast_capture.Handler",
    .tp_basicsize = sizeof(Handler),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The C side of ApiCapture (a base class of it): its __torch_function__ (see the module).",
    .tp_new = PyType_GenericNew,
    .tp_getattro = (getattrofunc)Handler_getattro,
    .tp_methods = HANDLER_METHODS,
    .tp_members = HANDLER_MEMBERS,
    .tp_traverse = (traverseproc)Handler_traverse,
    .tp_clear = (inquiry)Handler_clear,
    .tp_dealloc = (destructor)Handler_dealloc,
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_fast_capture",
                                    "The API capture's __torch_function__ in C (see pytorch/api_capture.py).", -1,
                                    NULL};

PyMODINIT_FUNC PyInit__fast_capture(void) {
    INTERN(S_forward_on, "forward_on");
    INTERN(S_counters, "counters");
    INTERN(S_construct, "construct");
    INTERN(S_records, "records");
    INTERN(S_dirty, "dirty");
    INTERN(S_fields, "_fields");
    INTERN(S_setitem, "__setitem__");
    INTERN(S_optimizer, "optimizer");
    INTERN(S_input_args, "input_args");
    INTERN(S_input_kwargs, "input_kwargs");
    INTERN(S_output, "output");
    INTERN(S_site, "site");
    INTERN(S_what, "API capture");
    INTERN(S_site_begin, "ApiCapture._begin");
    INTERN(S_site_end, "ApiCapture._end");
    INTERN(S_name, "name");
    INTERN(S_bwd_name, "bwd_name");
    INTERN(S_backward_name, "backward_name");
    INTERN(S_requires_grad, "requires_grad");
    INTERN(S_version, "_version");
    INTERN(S_backward_hooks, "_backward_hooks");
    INTERN(S_grad_fn, "grad_fn");
    INTERN(S_register_hook_dict, "_register_hook_dict");
    INTERN(S_n_out, "n_out");
    INTERN(S_input, "input");
    INTERN(S_step_open, "step_open");
    INTERN(S_data, "data");
    INTERN(S_site_hook, "backward hook");
    if ((ZERO = PyLong_FromLong(0)) == NULL)
        return NULL;
    if ((EMPTY = PyTuple_New(0)) == NULL || PyType_Ready(&GradHookType) < 0 ||
        PyType_Ready(&TorchFunctionCallType) < 0)
        return NULL;
    return module_with_type(&MODULE, "Handler", &HandlerType);
}

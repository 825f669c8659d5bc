"""Reading MindSpore's own Dump (seed 002) into our records, with numpy only (no MindSpore needed).

MindSpore 2.10 on the CPU writes, for `saved_data` "tensor" (the only value the CPU accepts: "statistic" and
"full" fail at the first compile with "storing statistic dump is only supported on GPU and Ascend"):

    {path}/rank_{id}/{net_name}/{graph_id}/{iteration}/{op_type}.{op_name}.{task}.{stream}.{timestamp}.
        {input|output}.{slot}.{format}.{dtype}.npy      (dtype, e.g. Float32, is a field the seed does not name)
    {path}/rank_{id}/execution_order/ms_execution_order_graph_{graph_id}.csv   (full names, in order)
    {path}/rank_{id}/graphs/ms_output_trace_code_graph_{graph_id}.ir          ("# In file" source lines)

`op_name` is the kernel's full name with scope, "/" written "_": `Default_d-Dense_MatMul-op0` is
`Default/d-Dense/MatMul-op0`, the MatMul of the cell `d` (class Dense) of the compiled root cell. Backward
kernels are under `Gradients/`. A `statistic.csv` (GPU, Ascend) is read when there are no npy files.

Records: one per kernel execution, `Kernel.{cell path}.{op}.{n}.{forward|backward}` (the op without its
`-op{k}`), and one per call of a cell whose scope the kernels carry, `Cell.{path}.{Class}.forward.{n}`:
input_args = the first kernel's first input, output = the last kernel's first output (what the cell takes and
gives for the layers of nn, which pairs with a PyNative dump at cell level).
"""
from __future__ import annotations

import csv
import os
import re

import numpy as np

from .statistics import numpy_stats

TENSOR_TYPE = "mindspore.Tensor"
_ITER = re.compile(r"^\d+$")
_RANK = re.compile(r"^rank_(\d+)$")
# cells that wrap the user's network in MindSpore's training helpers: not part of the network's cell paths
WRAPPERS = ("WithLossCell", "TrainOneStepCell", "TrainOneStepWithLossScaleCell", "WithGradCell", "WithEvalCell")
_DTYPES = {"float32": "Float32", "float16": "Float16", "float64": "Float64", "int32": "Int32", "int64": "Int64",
           "bool": "Bool", "int8": "Int8", "uint8": "UInt8", "int16": "Int16", "bfloat16": "BFloat16"}


def is_native(path: str) -> bool:
    """A native Dump `path` (holding rank_{id}/), or one of its rank_{id} folders."""
    if not os.path.isdir(path):
        return False
    if _RANK.match(os.path.basename(os.path.normpath(path))) and _has_net(path):
        return True
    try:
        return any(_RANK.match(d) and _has_net(os.path.join(path, d)) for d in os.listdir(path))
    except OSError:
        return False


def _has_net(rank_dir: str) -> bool:
    return os.path.isdir(os.path.join(rank_dir, "execution_order")) or os.path.isdir(os.path.join(rank_dir, "graphs"))


def iterations(path: str) -> list:
    """[(iteration, rank, [iteration folders])] of a native Dump, folders of every net and graph of that
    iteration together (one step of a run that compiled several graphs)."""
    base = os.path.basename(os.path.normpath(path))
    ranks = [path] if _RANK.match(base) else [os.path.join(path, d) for d in sorted(os.listdir(path)) if _RANK.match(d)]
    found: dict = {}
    for rank_dir in ranks:
        rank = int(_RANK.match(os.path.basename(os.path.normpath(rank_dir))).group(1))
        for net in sorted(os.listdir(rank_dir)):
            if net in ("execution_order", "graphs") or net.startswith("."):
                continue
            net_dir = os.path.join(rank_dir, net)
            for graph in sorted(d for d in os.listdir(net_dir) if _ITER.match(d)):
                for it in sorted((d for d in os.listdir(os.path.join(net_dir, graph)) if _ITER.match(d)), key=int):
                    found.setdefault((int(it), rank), []).append(os.path.join(net_dir, graph, it))
    return [(it, rank, dirs) for (it, rank), dirs in sorted(found.items())]


def parse_name(file_name: str):
    """(op_type, op_name, timestamp, "input"|"output", slot) of a tensor file, or None."""
    parts = file_name.split(".")
    if parts[-1] != "npy":
        return None
    io = next((i for i in range(len(parts) - 1, 4, -1) if parts[i] in ("input", "output")), None)
    if io is None or not parts[io + 1].isdecimal() or not parts[io - 1].isdecimal():
        return None
    head = ".".join(parts[:io - 3])
    if "." not in head:
        return None
    op_type, op_name = head.split(".", 1)
    return op_type, op_name, int(parts[io - 1]), parts[io], int(parts[io + 1])


def _graph_of(iter_dir: str) -> tuple:
    """(rank folder, graph id) of an iteration folder."""
    graph_dir = os.path.dirname(os.path.normpath(iter_dir))
    return os.path.dirname(os.path.dirname(graph_dir)), os.path.basename(graph_dir)


def full_names(rank_dir: str, graph: str) -> dict:
    """op_name as in file names ("/" written "_") -> the full name with scope, from the execution order."""
    out = {}
    try:
        with open(os.path.join(rank_dir, "execution_order", f"ms_execution_order_graph_{graph}.csv")) as f:
            for row in csv.reader(f):
                if row and "/" in row[0]:
                    out.setdefault(row[0].replace("/", "_"), row[0])
    except OSError:
        pass
    return out


_IN_FILE = re.compile(r"#\s*In file (.+?):(\d+)(?:~\d+)?(?:, (\d+)~(\d+))?/(.*)/\s*$")
_FRAMEWORK = re.compile(r"[/\\](site|dist)-packages[/\\]mindspore[/\\]")
_FULLNAME = re.compile(r"#\s*Fullname with scope: \((.+)\)")


def _items(text: str) -> list:
    """The top-level items of `(a, <b, c>, d)`."""
    text = text.strip()
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1]
    items, depth, cur = [], 0, ""
    for ch in text:
        if ch in "<([{":
            depth += 1
        elif ch in ">)]}":
            depth -= 1
        if ch == "," and depth == 0:
            items.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        items.append(cur.strip())
    return items


_TENSOR = re.compile(r"^<Tensor\[\w+\], \(([\d, ]*)\)>$")


def _shapes(text: str) -> list:
    out = []
    for item in _items(text):
        m = _TENSOR.match(item)
        out.append(tuple(int(v) for v in m.group(1).replace(" ", "").split(",") if v) if m else None)
    return out


_NODE = re.compile(r"^\s*%(\d+)\([^)]*\) = (?:PrimFunc_)?(\w+)\(")
_PARA = re.compile(r"^%para\d+_")


def _call_args(text: str) -> list:
    """The arguments of `a, b, C(d, e)) {attrs}`: up to the parenthesis that closes the call."""
    depth, end = 0, len(text)
    for i, ch in enumerate(text):
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            if depth == 0:
                end = i
                break
            depth -= 1
    return _items(text[:end])


def source_lines(rank_dir: str, graph: str) -> tuple:
    """({full name: [(file, line, column range or None, source text)], outermost first},
    {full name: ([input shapes], [output shapes])}, {full name: {input slot: parameter name}}), from the .ir
    file (a kernel's inputs that are Parameters, or Loads of them)."""
    out: dict = {}
    shapes: dict = {}
    params: dict = {}
    path = os.path.join(rank_dir, "graphs", f"ms_output_trace_code_graph_{graph}.ir")
    try:
        f = open(path, errors="replace")
    except OSError:
        return out, shapes, params
    current, signature, node_args = None, None, None
    loads: dict = {}
    with f:
        for line in f:
            m = _NODE.match(line)
            if m:
                args = _call_args(line[m.end():])
                if m.group(2) == "Load" and args and args[0].startswith("%para"):
                    loads[m.group(1)] = _PARA.sub("", args[0])
                node_args = args
            m = _FULLNAME.search(line)
            if m:
                current = out.setdefault(m.group(1), []) if m.group(1) not in out else None
                if signature is not None:
                    shapes.setdefault(m.group(1), signature)
                if node_args:
                    found = {i: _PARA.sub("", a) if a.startswith("%para") else loads.get(a[1:])
                             for i, a in enumerate(node_args) if a.startswith("%")}
                    found = {i: n for i, n in found.items() if n}
                    if found:
                        params.setdefault(m.group(1), found)
                signature, node_args = None, None
                continue
            m = _IN_FILE.search(line)
            if m and current is not None:
                cols = (int(m.group(3)), int(m.group(4))) if m.group(3) else None
                current.append((m.group(1), int(m.group(2)), cols, m.group(5)))
            elif line.lstrip().startswith(": (") and ") -> (" in line and "<Tensor[" in line and signature is None:
                left, right = line.strip()[2:].split(" -> ", 1)
                signature = (_shapes(left), _shapes(right))
            elif not line.lstrip().startswith("#"):
                current = None
                if line.lstrip().startswith("%"):
                    signature = None
    return out, shapes, params


def cells_of(full_name: str) -> tuple:
    """(direction, [(cell name, class)], op) of a full name with scope: `Default/d-Dense/MatMul-op0` ->
    ("forward", [("d", "Dense")], "MatMul"); `Gradients/Default/d-Dense/Grad_MatMul/MatMul-op1` -> backward."""
    segs = full_name.split("/")
    direction = "backward" if segs and segs[0] == "Gradients" else "forward"
    op = re.sub(r"-op\d+$", "", segs[-1])
    cells = []
    for seg in segs[:-1]:
        if "-" in seg:
            name, cls = seg.rsplit("-", 1)
            cells.append((name, cls))
    while cells and cells[0][1] in WRAPPERS or (cells and cells[0][0] in ("_backbone", "network", "_network")):
        cells.pop(0)
    return direction, cells, op


def cells_from_source(frames: list) -> list:
    """Cell names from the calls in the source lines (`self.conv(x)` -> conv): what a kernel compiled from a
    `mindspore.jit` function (whose scopes are only `Default/`) says of the cells it ran in."""
    names = []
    for _file, _line, cols, text in frames:
        if cols is None:
            continue
        m = re.fullmatch(r"self\.(\w+)(?:\[(\d+)\])?", text[cols[0]:cols[1]].strip())
        if m:
            names.append(m.group(1) + (f".{m.group(2)}" if m.group(2) else ""))
    return names


def _dtype_name(array) -> str:
    return _DTYPES.get(array.dtype.name, array.dtype.name)


def _json(value) -> dict:
    return value if isinstance(value, dict) else tensor_json(value)


def tensor_json(array) -> dict:
    stats = numpy_stats(np.asarray(array))
    out = {"type": TENSOR_TYPE, "dtype": _dtype_name(array), "shape": list(array.shape)}
    out.update(zip(("Max", "Min", "Mean", "Norm"), stats))
    return out


def _load(path: str, signature, side: int, slot: int):
    """A tensor file, in the shape the graph gives it: a kernel that only reshapes (Reshape on the CPU) is
    written with the shape of the buffer it shares with its input."""
    if isinstance(path, dict):   # a row of statistic.csv: the statistics MindSpore computed
        return path
    array = np.load(path, allow_pickle=False)
    shapes = signature[side] if signature else []
    want = shapes[slot] if slot < len(shapes) else None
    if want is not None and tuple(array.shape) != want and int(np.prod(want)) == array.size:
        array = array.reshape(want)
    return array


def _column(header: list, *words) -> int | None:
    for i, h in enumerate(header):
        if any(w in h.lower().replace(" ", "") for w in words):
            return i
    return None


def _number(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def statistic_rows(path: str) -> list:
    """statistic.csv (saved_data "statistic" or "full", GPU and Ascend; seed 002: Op Type, Op Name, Task ID,
    Stream ID, Timestamp, IO, Slot, Data Size, Data Type, Shape, then the statistic_category columns) as
    [(timestamp, (op_type, op_name, timestamp, io, slot), tensor object)]."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        return []
    header = rows[0]
    col = {k: _column(header, *w) for k, w in (("type", ("optype",)), ("name", ("opname",)), ("ts", ("timestamp",)),
                                                ("io", ("io",)), ("slot", ("slot",)), ("dtype", ("datatype",)),
                                                ("shape", ("shape",)), ("max", ("max",)), ("min", ("min",)),
                                                ("avg", ("avg", "mean")), ("norm", ("l2norm", "norm")))}
    out = []
    for row in rows[1:]:
        get = lambda k: row[col[k]] if col[k] is not None and col[k] < len(row) else None  # noqa: E731
        try:
            ts, slot = int(get("ts")), int(get("slot"))
        except (TypeError, ValueError):
            continue
        io = "input" if (get("io") or "").lower().startswith("in") else "output"
        name = (get("name") or "").replace("/", "_")
        shape = [int(v) for v in re.findall(r"\d+", get("shape") or "")]
        dtype = get("dtype") or ""
        obj = {"type": TENSOR_TYPE, "dtype": _DTYPES.get(dtype.lower(), dtype), "shape": shape,
               "Max": _number(get("max")), "Min": _number(get("min")), "Mean": _number(get("avg")),
               "Norm": _number(get("norm"))}
        out.append((ts, (get("type") or "", name, ts, io, slot), obj))
    return out


def kernel_runs(iter_dirs: list, only=None) -> list:
    """[(timestamp, full name, source frames, {"input": {slot: file}, "output": {slot: file}})], one per
    kernel execution in execution order: files in time order, a new execution where the kernel changes or a
    slot repeats."""
    files = []
    names: dict = {}
    sources: dict = {}
    signatures: dict = {}
    param_inputs: dict = {}
    for d in iter_dirs:
        rank_dir, graph = _graph_of(d)
        names.update(full_names(rank_dir, graph))
        lines, sig, para = source_lines(rank_dir, graph)
        for k, v in para.items():
            param_inputs.setdefault(k, v)
        for k, v in lines.items():
            sources.setdefault(k, v)
        for k, v in sig.items():
            signatures.setdefault(k, v)
        found = []
        for fn in os.listdir(d):
            parsed = parse_name(fn)
            if parsed and parsed[0] != "Parameter" and (only is None or os.path.join(d, fn) in only):
                found.append((parsed[2], parsed, os.path.join(d, fn)))
        csv_file = os.path.join(d, "statistic.csv")
        if not found and os.path.isfile(csv_file) and (only is None or csv_file in only):
            found = statistic_rows(csv_file)
        files += found
    files.sort(key=lambda f: f[0])
    runs: list = []
    for ts, (op_type, op_name, _ts, io, slot), path in files:
        last = runs[-1] if runs else None
        if last is None or last[1] != op_name or slot in last[3][io] or (io == "input" and last[3]["output"]):
            full = names.get(op_name, op_name.replace("_", "/"))
            last = (ts, op_name, full, {"input": {}, "output": {}})
            runs.append(last)
        last[3][io][slot] = path
    return [(ts, full, sources.get(full, []), slots, signatures.get(full), param_inputs.get(full, {}))
            for ts, _name, full, slots in runs]


def records(iter_dirs: list, root_cells=None, only=None, save=None) -> tuple:
    """(records, parents, stacks) of one step from its iteration folders. `root_cells(names, classes)` maps
    the cell names of a scope to (path, class) pairs when the debugger knows the network (None: the scope's
    own); `only`: the files to read (None: all); `save(file name, array)` (task tensor) keeps each tensor and
    returns its data_name."""
    data, parents, stacks = {}, {}, {}
    counters: dict = {}
    calls: dict = {}           # cell path -> (its current call's record name, the kernels it ran)
    for _ts, full, frames, slots, signature, param_slots in kernel_runs(iter_dirs, only):
        direction, cells, op = cells_of(full)
        if not cells and frames:
            names = cells_from_source(frames)
            cells = root_cells(names, None) if root_cells else [(n, None) for n in names]
        elif root_cells:
            cells = root_cells([c[0] for c in cells], [c[1] for c in cells])
        path = ".".join(c[0] for c in cells)
        base = f"Kernel.{path + '.' if path else ''}{op}"
        n = counters[(base, direction)] = counters.get((base, direction), -1) + 1
        name = f"{base}.{n}.{direction}"
        in_values = [_load(slots["input"][s], signature, 0, s) for s in sorted(slots["input"])]
        out_values = [_load(slots["output"][s], signature, 1, s) for s in sorted(slots["output"])]
        ins, outs = [_json(v) for v in in_values], [_json(v) for v in out_values]
        for category, values, objs in (("input", in_values, ins), ("output", out_values, outs)) if save else ():
            for i, (value, obj) in enumerate(zip(values, objs)):
                if not isinstance(value, dict):
                    obj["data_name"] = save(f"{name}.{category}.{i}.npy", value)
        if direction == "forward":
            data[name] = {"input_args": ins, "input_kwargs": {}, "output": outs}
        else:
            data[name] = {"input": ins, "output": outs}
        users = [f for f in frames if not _FRAMEWORK.search(f[0])]
        if users:
            stacks[name] = [f"File {f}, line {line}, in construct, \n {text.strip()}" for f, line, _c, text in
                            reversed(users)]
        if direction != "forward":
            parents[name] = None
            continue
        # the cells this kernel runs in. The scheduler may interleave cells (a Reshape of `q` before the
        # kernels of `v`): a kernel joins its cell's current call, unless that call ran this very kernel
        # already (then the cell is called again, and so are the cells inside it)
        parent, new = None, False
        for depth in range(len(cells)):
            cpath = ".".join(c[0] for c in cells[:depth + 1])
            cur = calls.get(cpath)
            if new or cur is None or full in cur[1]:
                cbase = f"Cell.{cpath}.{cells[depth][1] or 'Cell'}"   # a class unknown: named from source only
                k = counters[(cbase, "cell")] = counters.get((cbase, "cell"), -1) + 1
                cur = calls[cpath] = (f"{cbase}.forward.{k}", set())
                data[cur[0]] = {"input_args": ins[:1], "input_kwargs": {}, "output": []}
                parents[cur[0]] = parent
                new = True
            cur[1].add(full)
            data[cur[0]]["output"] = outs[:1]
            parent = cur[0]
            _own_parameters(data[cur[0]], cpath, param_slots, sorted(slots["input"]), ins)
        parents[name] = parent
    return data, parents, stacks


NOT_PARAMETERS = ("moving_mean", "moving_variance")   # BatchNorm's running statistics: buffers, as in PyNative


def _own_parameters(record: dict, cell_path: str, param_slots: dict, input_slots: list, ins: list) -> None:
    """The cell's own parameters among the kernel's inputs (their values as the kernel read them, before the
    step's update: MindSpore's Parameter files hold them after it)."""
    prefix = cell_path + "."
    for slot, pname in param_slots.items():
        own = pname[len(prefix):] if pname.startswith(prefix) else None
        if own and "." not in own and own not in NOT_PARAMETERS and slot in input_slots:
            record.setdefault("parameters", {})[own] = ins[input_slots.index(slot)]


def dump_content(data: dict, task: str = "statistics", level: str = "mix") -> dict:
    return {"task": task, "level": level, "framework": "mindspore", "dump_data_dir": None, "data": data}

"""Pairing the records of two runs.

Exact names pair only when the two runs made the same calls. One extra call on one side (an added
`.contiguous()`, a fused op split in two) shifts the call index of every later call of that API, so pairing
by name alone would compare the wrong calls from there on. Instead, each side's calls are grouped by API (or
module), direction and parent module. Within a group, the two call sequences are aligned by order and
signature (argument and result shapes, and dtype kind: bf16 and fp32 are both float), using difflib. Calls
left over are unmatched, and a pair whose names differ is reported as aligned, not exact. Where one side's
calls of a group all meet their own names on the other side with the same signatures (a dump filtered by
`list` or `scope` against a whole one), they pair by name.
"""
from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass


_DIRECTIONS = ("forward", "backward")


@dataclass
class Pair:
    target: str | None
    golden: str | None
    how: str            # exact / aligned / unmatched
    joined: tuple = ()  # the other calls of a run read as one call with the record named (runs.py)


def split_name(name: str):
    """(base, direction, index): `Functional.linear.3.forward` -> (Functional.linear, forward, 3),
    `Module.fc.Linear.backward.1` -> (Module.fc.Linear, backward, 1); anything else -> (name, None, None)."""
    parts = name.split(".")
    if len(parts) >= 3 and parts[-1] in _DIRECTIONS and parts[-2].isdecimal():
        return ".".join(parts[:-2]), parts[-1], int(parts[-2])
    if len(parts) >= 3 and parts[-2] in _DIRECTIONS and parts[-1].isdecimal():
        return ".".join(parts[:-2]), parts[-2], int(parts[-1])
    return name, None, None


def is_module(name: str) -> bool:
    """A module's (PyTorch) or a cell's (MindSpore) record, not an API call's."""
    return name.startswith(("Module.", "Cell."))


@functools.lru_cache(maxsize=256)
def dtype_kind(dtype: str) -> str:
    d = dtype.lower()
    if "complex" in d:
        return "complex"
    if "float" in d or "half" in d or "bf16" in d:
        return "float"
    if "bool" in d:
        return "bool"
    if "int" in d:
        return "int"
    return d


def signature(name: str, rows, first_output: bool = False) -> tuple:
    """What a call was given and gave back: role, shape and dtype kind of each tensor. A module's parameters
    are left out: the reference tool's 1.0 versions did not dump them, and a call is the same call whether
    or not its weights were written down. So are scalar arguments: frameworks spell defaults differently
    (PyTorch's `F.relu` passes `inplace=False`, MSAdapter's does not), and a call whose scalar differs is
    better paired and judged ("argument differs") than left unmatched. `first_output` (across frameworks):
    a forward call's outputs after its first are left out too, as MindSpore's LayerNorm and BatchNorm
    return their batch statistics beside the result that PyTorch's return alone."""
    params = name + ".parameters."
    later = name + ".output." if first_output and split_name(name)[1] == "forward" else None
    found = tuple((row.role, None if row.shape is None else tuple(row.shape), dtype_kind(row.dtype))
                  for row in rows if row.is_tensor and not row.name.startswith(params)
                  and not (later and row.name.startswith(later) and not _first_output(row.name, later)))
    if split_name(name)[1] == "backward":  # gradients in either order, a weight's transposed or not: the
        # reference tool writes them in autograd's order, for addmm the gradient of weight.t()
        return tuple(sorted(((role, None if shape is None else tuple(sorted(shape)), kind)
                             for role, shape, kind in found), key=repr))
    return found


def _first_output(row_name: str, prefix: str) -> bool:
    rest = row_name[len(prefix):]
    return rest == "0" or rest.startswith("0.")


def _on_roles(sigs: list, roles) -> list:
    """Signatures on the roles both dumps hold: a dump made with `data_mode` ["output"] has no inputs, and
    its calls are still the golden's (they paired with none before)."""
    return [tuple(part for part in sig if part[0] in roles) for sig in sigs]


def _group_key(name: str, parents: dict, rename) -> tuple:
    base, direction, _ = split_name(rename(name))
    parent = parents.get(name)
    parent_base = split_name(rename(parent))[0] if isinstance(parent, str) else parent
    return base, direction, parent_base


def _align(t_names, g_names, sig_t, sig_g):
    """(target, golden) pairs of two call sequences that differ: the blocks difflib finds in common. Only
    needed where the two runs did not make the same calls (the same signatures pair one to one)."""
    matcher = difflib.SequenceMatcher(None, sig_t, sig_g, autojunk=False)
    for block in matcher.get_matching_blocks():
        for i in range(block.size):
            yield t_names[block.a + i], g_names[block.b + i]


def _by_name(t_names, g_names, sig_t, sig_g, rename, rename_golden):
    """(target, golden) pairs of the same name, when every call of the shorter sequence meets its name on the
    other side with the same signature: one dump filtered by `list` or `scope` (numbering never depends on
    a filter, so its calls keep their names) against a whole one. Aligning by order there paired
    `Functional.linear.6` with the golden's `linear.2`, another layer of the same shapes. None otherwise."""
    golden = {rename_golden(g): (g, sig) for g, sig in zip(g_names, sig_g)}
    t_renamed = [rename(name) for name in t_names]
    if len(set(t_renamed)) < len(t_renamed) or len(golden) < len(g_names):
        return None  # names that meet in one (MatMul and BatchMatMul are both Torch.matmul): order decides
    pairs = []
    for name, renamed, sig in zip(t_names, t_renamed, sig_t):
        hit = golden.get(renamed)
        if hit is not None and _agrees(sig, hit[1]):
            pairs.append((name, hit[0]))
    return pairs if len(pairs) == min(len(t_names), len(g_names)) else None


def _agrees(sig, other) -> bool:
    """The same signature, a tensor that could not be read when it was dumped (shape None) agreeing with
    any tensor of its role on the other side."""
    return sig == other or (len(sig) == len(other) and all(
        a == b or ((a[1] is None or b[1] is None) and a[0] == b[0]) for a, b in zip(sig, other)))


def _fill_unread(sigs: list, others: list) -> None:
    """A tensor that could not be read when it was dumped has no shape to pair by: where the other side's
    call of the same place in the group agrees on everything else, it takes that call's signature."""
    for i, sig in enumerate(sigs):
        if i < len(others) and any(part[1] is None for part in sig) and _agrees(sig, others[i]):
            sigs[i] = others[i]


def _same(name):
    return name


def _canonical(rename):
    """`rename`, then one name for the two layouts of parameter-gradient records: the reference tool's
    1.2 to 8.1 versions wrote `X.parameters_grad`, once per module and step; current versions and
    msprobe_lite write `X.parameters_grad.0` (the index counts the module's calls)."""
    def name_of(name):
        name = rename(name)
        return name + ".0" if name.endswith(".parameters_grad") else name
    return name_of


def _same_names_left(target, golden, partner, rename, rename_golden, across, common) -> None:
    """Calls left unpaired on both sides under one name and one signature pair: their parents differed (the
    reference tool gives a first layer's API backward no parent, its module's backward having ended)."""
    paired = set(partner.values())
    left = {rename_golden(g): g for g in golden.records if g not in paired and split_name(g)[1] is not None}
    for name in target.records:
        g = left.get(rename(name)) if name not in partner else None
        if g is None or (isinstance(target.parents.get(name), str) and isinstance(golden.parents.get(g), str)):
            continue
        sig_t, sig_g = signature(name, target.rows(name), across), signature(g, golden.rows(g), across)
        if common is not None:
            sig_t, sig_g = _on_roles([sig_t], common)[0], _on_roles([sig_g], common)[0]
        if _agrees(sig_t, sig_g):
            partner[name] = g


def pair_records(target, golden, rename=_same, rename_golden=_same, by_parent: bool = True,
                 across: bool = False) -> list:
    """Pairs in target execution order; golden-only records follow the pair of the golden record before them.

    `rename` and `rename_golden` map each side's names into one naming where they can meet: user mappings
    on the target, and a MindSpore side read in PyTorch's names when the frameworks differ. `by_parent`
    False groups calls without their parent modules (an L1 dump has none to match a mix dump's). `across`: the
    two dumps are of two frameworks (see `signature`)."""
    rename, rename_golden = _canonical(rename), _canonical(rename_golden)
    parents_t, parents_g = (target.parents, golden.parents) if by_parent else ({}, {})
    groups_t: dict = {}
    groups_g: dict = {}
    for name in target.records:
        groups_t.setdefault(_group_key(name, parents_t, rename), []).append(name)
    for name in golden.records:
        groups_g.setdefault(_group_key(name, parents_g, rename_golden), []).append(name)
    partner: dict = {}
    common = None if target.roles() == golden.roles() else target.roles() & golden.roles()
    for key, t_names in groups_t.items():
        g_names = groups_g.get(key, [])
        if not g_names:
            continue
        if key[1] is None:  # not a call (parameter gradients, save() entries): the name is the identity
            golden_names = {rename_golden(g): g for g in g_names}
            partner.update({n: golden_names[rename(n)] for n in t_names if rename(n) in golden_names})
            continue
        sig_t = [signature(n, target.rows(n), across) for n in t_names]
        sig_g = [signature(n, golden.rows(n), across) for n in g_names]
        if common is not None:
            sig_t, sig_g = _on_roles(sig_t, common), _on_roles(sig_g, common)
        if sig_t == sig_g:
            partner.update(zip(t_names, g_names))
            continue
        by_name = _by_name(t_names, g_names, sig_t, sig_g, rename, rename_golden)
        if by_name is None:  # by order: a tensor not read pairs like the other side's call at its place
            _fill_unread(sig_t, sig_g)
            _fill_unread(sig_g, sig_t)
        partner.update(by_name or _align(t_names, g_names, sig_t, sig_g))
    _same_names_left(target, golden, partner, rename, rename_golden, across, common)
    paired_golden = {g: t for t, g in partner.items()}
    pairs = []
    index_of = {}
    for name in target.records:
        g = partner.get(name)
        how = "unmatched" if g is None else ("exact" if rename(name) == rename_golden(g) else "aligned")
        index_of[name] = len(pairs)
        pairs.append(Pair(name, g, how))
    # golden-only records, each placed after the pair of the golden record that precedes it
    inserts: dict = {}
    previous = None
    for name in golden.records:
        if name in paired_golden:
            previous = paired_golden[name]
        else:
            inserts.setdefault(previous, []).append(Pair(None, name, "unmatched"))
    result = list(inserts.get(None, []))
    for pair in pairs:
        result.append(pair)
        result.extend(inserts.get(pair.target, []))
    return result

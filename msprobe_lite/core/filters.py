"""Which records are written: step and rank selection, `scope`, `list` and `data_mode`.

Filters never touch numbering: call indices are assigned before a filter is asked, so the same call keeps
the same name whatever the filter (that is what lets two differently filtered dumps be compared).
"""
from __future__ import annotations

from .naming import BACKWARD, FORWARD, PARAMS_GRAD, counterpart, direction_of


def matches_fragment(name: str, fragment: str) -> bool:
    """`linear` matches every `*.linear.*`; a full record name matches that record."""
    return name == fragment or f".{fragment}." in f".{name}."


class RecordFilter:
    """Decides, per record name, whether a record is kept, following `scope`, `list` and `data_mode`.

    `scope` is a range of record names in execution order, both ends included, the last one *fully*
    (a module's inner calls count as inside it): the range opens when the first name starts and closes when
    the last name ends. Records of the other direction follow their counterpart (the backward of a call in
    the forward scope is kept).
    """

    def __init__(self, scope, names, directions, parts):
        self.scope = list(scope or [])
        self.names = list(names or [])
        self.directions = set(directions)
        self.parts = set(parts)
        self._scope_direction = direction_of(self.scope[0]) if self.scope else None
        # the usual case, answered without parsing names: nothing filtered at all
        self.everything = not self.scope and not self.names and self.directions >= {FORWARD, BACKWARD}
        self.reset()

    def reset(self) -> None:
        """Start of a step: the scope has not opened yet."""
        self._in_scope = not self.scope
        self._scope_opened = False
        self._scope_done = False
        self._scope_end_seen = False  # the last name came as a record (a backward one never reaches on_end)
        self._scope_end_early = False  # ... before the first name opened the range
        self._scope_end_started = False  # ... inside the range, as a call of its direction that did not end
        self._listed = set()          # the `list` entries a record name matched this step
        self._scoped = set()
        self._scoped_modules = set()  # `Module.path.Class` of module calls in scope: their gradients follow

    # -- scope bookkeeping, driven by the hooks -------------------------------------------------------------
    def on_start(self, name: str) -> None:
        if self.scope and not self._in_scope and not self._scope_done and name == self.scope[0]:
            self._in_scope = self._scope_opened = True

    def on_end(self, name: str) -> None:
        if self.scope and self._in_scope and name == self.scope[1]:
            self._in_scope = False
            self._scope_done = True

    def _scope_allows(self, name: str, direction: str | None) -> bool:
        if not self.scope:
            return True
        if name == self.scope[1]:
            self._scope_end_seen = True
            # before the range opened: the two given in the wrong order (a last name of the other direction is
            # asked for at its forward call's start already: that is not this)
            self._scope_end_early |= not self._scope_opened and direction == self._scope_direction
            self._scope_end_started |= self._in_scope and direction == self._scope_direction
        if direction == PARAMS_GRAD:
            return name.split(f".{PARAMS_GRAD}.")[0] in self._scoped_modules
        if direction == self._scope_direction or direction is None:
            if self._in_scope or name in self._scoped:
                self._scoped.add(name)
                if f".{FORWARD}." in name:
                    self._scoped_modules.add(name.split(f".{FORWARD}.")[0])
                return True
            return False
        return counterpart(name) in self._scoped

    # -- the decision -------------------------------------------------------------------------------------
    def wants(self, name: str) -> bool:
        if self.everything:
            return True
        direction = direction_of(name)
        in_scope = self._scope_allows(name, direction)  # first: scope membership must not depend on data_mode
        if self.names:  # before data_mode: whether `list` matched anything must not depend on it either
            if len(self._listed) < len(self.names):  # which entries match, until each has (a typo is said)
                matched = {f for f in self.names if matches_fragment(name, f)}
                self._listed |= matched
                listed = bool(matched)
            else:
                listed = any(matches_fragment(name, f) for f in self.names)
            if not listed:
                return False
        if direction in (FORWARD, BACKWARD) and direction not in self.directions:
            return False
        if direction == PARAMS_GRAD and BACKWARD not in self.directions:
            return False
        return in_scope

    def unmatched(self) -> list:
        """At the end of a collected step: what of `scope` and `list` matched nothing (most likely a misspelt
        name), in words; empty when all did."""
        found = []
        if self.scope and not self._scope_opened:
            found.append(f"scope's first name {self.scope[0]!r} was not reached: nothing in the scope was dumped")
        elif self.scope and not self._scope_done and self._scope_end_early:
            found.append(f"scope's last name {self.scope[1]!r} ran before its first name {self.scope[0]!r} (are they "
                         f"in the wrong order?): dumped from {self.scope[0]!r} to the end of the step")
        elif self.scope and not self._scope_done and self._scope_end_started:
            found.append(f"scope's last name {self.scope[1]!r} started but did not end (its call raised?): dumped "
                         f"from {self.scope[0]!r} to the end of the step")
        elif self.scope and not self._scope_done and self._scope_end_seen:
            found.append(f"scope's last name {self.scope[1]!r} is a record of the other direction, which does not "
                         f"end a range of {self._scope_direction} records: dumped from {self.scope[0]!r} to the "
                         f"end of the step")
        elif self.scope and not self._scope_done:
            found.append(f"scope's last name {self.scope[1]!r} was not reached: dumped from {self.scope[0]!r} "
                         f"to the end of the step")
        missing = [f for f in self.names if f not in self._listed]
        if self.names and len(missing) == len(self.names):
            found.append(f"no record name matched list {self.names}")
        elif missing:
            found.append(f"list entries {missing} matched no record name (the others did; a misspelt name?)")
        return found

    def wants_part(self, part: str) -> bool:
        """part is `input` or `output`."""
        return part in self.parts

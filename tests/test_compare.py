"""Compare: metrics, first divergence of injected faults, alignment, modes, reference dumps, CLI."""
from __future__ import annotations

import csv
import json
import math
import os
import shutil

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers import load
from models import TinyTransformer

from msprobe_lite.cli import main as cli
from msprobe_lite.compare import CompareError, compare
from msprobe_lite.compare.metrics import stat_error, tensor_metrics
from msprobe_lite.compare.report import console_line
from msprobe_lite.pytorch import PrecisionDebugger

DATA = os.path.join(os.path.dirname(__file__), "data")


def dump_transformer(path, level="mix", task="statistics", fault=None, boost=1.0, **cfg):
    """Dump one forward/backward of the seeded transformer, with one injected `fault` (or none)."""
    torch.manual_seed(0)
    model = TinyTransformer()
    model.eval()  # no dropout: two runs differ only by the fault
    for block in model.blocks:
        block.attn.boost = boost
    if fault == "gelu":
        model.blocks[0].mlp[1].approximate = "tanh"
    elif fault == "ln_eps":
        model.blocks[1].ln2.eps = 1e-2
    elif fault == "scale":
        model.blocks[0].attn.scale = 1.01 * 8 ** -0.5
    elif fault == "overflow":
        model.blocks[0].attn.half_scores = True
    elif fault == "extra":
        model.extra_call = True
    tokens = torch.randint(0, 32, (2, 6), generator=torch.Generator().manual_seed(1))
    config = dict(cfg, task=task, level=level, dump_path=str(path))
    os.makedirs(str(path) + "_cfg", exist_ok=True)
    config_file = os.path.join(str(path) + "_cfg", "config.json")
    with open(config_file, "w") as f:
        json.dump(config, f)
    d = PrecisionDebugger(config_file)
    d.start(model=model)
    logits, _ = model(tokens)
    logits.float().pow(2).mean().backward()
    d.stop()
    d.step()
    return path


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    return dump_transformer(tmp_path_factory.mktemp("golden"))


def run(target, golden, out, **kw):
    return compare(str(target), str(golden), str(out), quiet=True, **kw)


def dump_step(path, model, x, loss=lambda out: out.float().pow(2).mean(), **cfg):
    """One forward and backward of `model(x)` dumped to `path` (cfg: level, task, statistics, ... as in
    config.json; L0 statistics by default)."""
    config = path.parent / f"{path.name}_config.json"
    config.write_text(json.dumps({"task": "statistics", "level": "L0", "dump_path": str(path), **cfg}))
    d = PrecisionDebugger(str(config))
    d.start(model=model)
    loss(model(x)).backward()
    d.stop()
    d.step()
    return path


# -- metrics --------------------------------------------------------------------------------------------
def test_tensor_metrics_against_numpy():
    rng = np.random.default_rng(0)
    g = rng.standard_normal(3000).astype(np.float32)
    t = g + rng.standard_normal(3000).astype(np.float32) * 1e-3
    m = tensor_metrics(t, g, 1.19e-7)
    a, b = t.astype(np.float64), g.astype(np.float64)
    assert math.isclose(m["Cosine"], a @ b / np.linalg.norm(a) / np.linalg.norm(b), rel_tol=1e-12)
    assert math.isclose(m["EucDist"], np.linalg.norm(a - b), rel_tol=1e-12)
    assert m["MaxAbsErr"] == np.abs(a - b).max()
    rel = np.abs(a - b) / np.abs(b)
    assert m["MaxRelativeErr"] == rel.max()
    assert m["One Thousandth Err Ratio"] == (rel < 0.001).mean()
    assert m["Five Thousandths Err Ratio"] == (rel < 0.005).mean()


def test_metrics_edge_cases():
    zeros = np.zeros(4)
    assert tensor_metrics(zeros, zeros, 1e-7)["Cosine"] == 1.0
    one_zero = tensor_metrics(np.ones(4), zeros, 1e-7)
    assert math.isnan(one_zero["Cosine"]) and "cosine undefined" in one_zero["note"]
    assert one_zero["MaxRelativeErr"] == 1 / 1e-7          # golden 0: the denominator is the dtype's eps
    nan_both = tensor_metrics(np.array([np.nan, 1.0]), np.array([np.nan, 1.0]), 1e-7)
    assert nan_both["nonfinite"] == 0 and nan_both["One Thousandth Err Ratio"] == 1.0
    inf_one = tensor_metrics(np.array([np.inf, 1.0]), np.array([5.0, 1.0]), 1e-7)
    assert inf_one["nonfinite"] == 1
    assert "size-1" in tensor_metrics(np.ones(1), np.full(1, 2.0), 1e-7)["note"]
    assert tensor_metrics(np.ones(1), np.ones(1), 1e-7)["note"] == ""  # a loss equal to itself: no warning
    empty = tensor_metrics(np.zeros(0), np.zeros(0), 1e-7)
    assert empty["EucDist"] == 0 and empty["Cosine"] == 1.0
    same = {"Max": 1.0, "Min": -1.0, "Mean": 0.0, "Norm": 2.0, "shape": [4]}
    assert stat_error(same, same) == 0
    assert math.isclose(stat_error(dict(same, Mean=1e-4), same), 1e-4)   # relative to magnitude, not to Mean
    wide = {"Max": 1.0, "Min": -1.0, "Mean": 0.0, "Norm": 5.0, "shape": [4, 25]}
    assert math.isclose(stat_error(dict(wide, Norm=6.0), wide), 0.2)  # the Norm against itself, not the max
    assert stat_error(dict(wide, Norm=math.nan), wide) == math.inf    # a NaN that max() would pass over
    assert stat_error(dict(wide, Max=1.5, Norm=math.nan), wide) == math.inf
    masked = {"Max": 2.0, "Min": -math.inf, "Mean": -math.inf, "Norm": math.inf, "shape": [4, 4]}  # scores
    assert math.isclose(stat_error(dict(masked, Max=2.002), masked), 1e-3)  # against the finite magnitude
    assert stat_error(dict(same, Max=math.nan), same) == math.inf


# -- first divergence ------------------------------------------------------------------------------------
def test_identical_runs_pass_everything(tmp_path, golden):
    target = dump_transformer(tmp_path / "t")
    s = run(target, golden, tmp_path / "out")
    (pair,) = s.pairs
    assert pair["first_divergence"] is None
    assert pair["counts"]["error"] == pair["counts"]["warning"] == 0
    assert pair["counts"]["unmatched_target"] == pair["counts"]["unmatched_golden"] == 0


def test_dumps_of_l1_and_mix_pair_their_api_calls_and_say_the_levels_differ(tmp_path, golden):
    """An L1 dump keeps no parent modules, a mix dump does: its calls were grouped apart and never paired,
    and the answer read "no divergent call found; a call only in the target: ..." for a call both made."""
    target = dump_transformer(tmp_path / "t", level="L1")
    (pair,) = run(target, golden, tmp_path / "out").pairs
    counts = pair["counts"]
    assert pair["first_divergence"] is None and pair["first_only_in_target"] is None
    assert counts["error"] == counts["warning"] == counts["unmatched_target"] == 0 and counts["pass"] > 100
    golden_data = json.load(open(os.path.join(golden, "step0", "rank", "dump.json")))["data"]
    assert counts["unmatched_golden"] == sum(1 for k in golden_data if k.startswith("Module."))
    assert pair["note"] == ("levels differ (target L1, golden mix): API calls paired without their modules, "
                            "module records left unmatched")
    assert console_line(pair).startswith("[step 0] (levels differ (target L1, golden mix)")


@pytest.mark.parametrize("levels", [("mix", "L1"), ("mix", "L0")])
def test_a_mix_target_names_no_record_of_the_kind_the_goldens_level_does_not_record(tmp_path, levels):
    """The same run dumped at mix (target) and L1 (golden): "no divergent call found; a call only in the
    target: Module..." named a module that the L1 dump cannot have as added code (a new user's trial); so
    did an API call against an L0 golden."""
    target = dump_transformer(tmp_path / "t", level=levels[0])
    golden = dump_transformer(tmp_path / "g", level=levels[1])
    (pair,) = run(target, golden, tmp_path / "out").pairs
    assert pair["first_only_in_target"] is None and pair["first_divergence"] is None, pair
    assert pair["counts"]["unmatched_target"] > 0 and pair["counts"]["error"] == 0
    assert "a call only in the target" not in console_line(pair)


def test_dumps_of_l0_and_l1_are_refused(tmp_path):
    modules = dump_transformer(tmp_path / "modules", level="L0")
    apis = dump_transformer(tmp_path / "apis", level="L1")
    with pytest.raises(CompareError, match="L0 records modules and L1 records APIs, so they have no record in common"):
        run(modules, apis, tmp_path / "out")


class _ConvBN(nn.Module):
    """Convolutions before BatchNorm: their bias gradients are zero in exact arithmetic, noise in practice."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.bn2, self.fc = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Linear(8, 10)

    def forward(self, x):
        h = torch.relu(self.bn2(self.conv2(torch.relu(self.bn(self.conv(x))))))
        return self.fc(h.mean((2, 3)))


def _train_conv_bn(path, level, autocast=False, clip=False, steps=3, data_mode=("all",), shift_buffer=0.0):
    torch.manual_seed(0)
    model = _ConvBN()
    model.bn.running_mean += shift_buffer
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(1)
    data = [(torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))) for _ in range(steps)]
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"task": "statistics", "level": level, "dump_path": str(path),
                                                  "statistics": {"data_mode": list(data_mode)}}))
    d = PrecisionDebugger(str(path / "config.json"))
    for x, y in data:
        d.start(model=model)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(x)
        torch.nn.functional.cross_entropy(logits.float(), y).backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        d.stop()
        d.step()
    return path


@pytest.mark.parametrize("level,clip,data_mode", [("L1", False, ["all"]), ("mix", True, ["all"]),
                                                   ("L1", False, ["forward"])])
def test_calls_after_the_backward_pass_are_not_asked_about_their_inputs(tmp_path, level, clip, data_mode):
    """The optimizer's calls and gradient clipping take gradients: a conv bias's before BatchNorm is noise, and
    against the forward outputs alone it read "inputs already differ by 5.17e+03" at every step of a clean
    bf16-autocast run (a review). Only the forward pass's API calls are asked; a dump without backward
    records, where nothing marks the forward pass's end, asks none (a second review)."""
    s = run(_train_conv_bn(tmp_path / "t", level, autocast=True, clip=clip, data_mode=data_mode),
            _train_conv_bn(tmp_path / "g", level, clip=clip, data_mode=data_mode), tmp_path / "out")
    for p in s.pairs:
        assert p["first_seen"] is None and p["counts"]["error"] == 0, p


def test_a_buffer_that_differs_is_named_at_mix(tmp_path):
    """BatchNorm's running mean is no parameter: a module's record does not hold it, and at mix its change
    read "89 pass, 0 warning" (a review). The batch_norm call inside takes it as an argument, and is asked."""
    s = run(_train_conv_bn(tmp_path / "t", "mix", steps=1, shift_buffer=0.5),
            _train_conv_bn(tmp_path / "g", "mix", steps=1), tmp_path / "out")
    seen = s.pairs[0]["first_seen"]
    assert seen["name"] == "Functional.batch_norm.0.forward" and "(most in input.1)" in seen["reason"], seen


def test_a_mix_dump_against_an_l1_dump_asks_its_api_calls(tmp_path):
    """Against an L1 golden a mix target's module records are unmatched by design, so its API calls are asked
    as at L1 (they were not: a module holds them); those module records are not "earlier calls that did not
    pair"."""
    def dump(path, level, shift=0.0):
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        x, y = torch.randn(4, 8) + shift, torch.randint(0, 4, (4,))
        d = PrecisionDebugger(dump_path=str(path), task="statistics", level=level)
        d.start(model=model)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        d.stop()
        d.step()
        return path

    for target, golden in ((dump(tmp_path / "mix", "mix", 0.5), dump(tmp_path / "l1", "L1")),
                           (dump(tmp_path / "l1s", "L1", 0.5), dump(tmp_path / "mixg", "mix"))):
        (p,) = run(target, golden, tmp_path / f"out_{target.name}").pairs
        assert p["first_seen"]["name"] == "Functional.linear.0.forward", p
        assert "did not pair" not in p["first_seen"]["reason"]


def test_an_introduced_call_whose_inputs_hold_infinities_on_both_sides_says_its_statistics_are_blind(tmp_path):
    """A causal mask shifted by one (triu(2) for triu(1)) masks other positions with -inf: the scores' Max
    agrees and Min, Mean and Norm are infinite on both sides, so softmax read "introduced ... while inputs
    agree" (a new user's trial), a false fact. The reason now says the statistics cannot see where."""
    def dump(path, diagonal):
        torch.manual_seed(0)
        scores = torch.randn(6, 6)
        scores[0, 0] = 10.0  # the largest score, masked by neither: the masked scores' Max agrees
        d = PrecisionDebugger(dump_path=str(path), task="statistics", level="L1")
        d.start()
        mask = torch.ones(6, 6, dtype=torch.bool).triu(diagonal)
        torch.softmax(scores.masked_fill(mask, float("-inf")), -1)
        d.stop()
        d.step()
        return path

    (p,) = run(dump(tmp_path / "t", 2), dump(tmp_path / "g", 1), tmp_path / "out").pairs
    assert p["first_divergence"]["name"] == "Torch.softmax.0.forward", p
    assert "input.0 holds NaN/Inf in both runs: its statistics cannot show where" in p["first_divergence"]["reason"]


def test_an_operation_the_target_left_out_is_named(tmp_path):
    """Attention without its 1/sqrt(d) scale: the golden's div pairs with nothing, and nothing named it (a
    new user's trial). A call only in the golden between paired calls is now named, with the golden's
    stack; not when a filter left calls out (many of them, or only around a scope's range)."""
    from msprobe_lite.compare.report import console_line

    def dump(path, scaled, **selection):
        torch.manual_seed(0)
        q, k = torch.randn(4, 8), torch.randn(4, 8)
        path.mkdir()
        (path / "c.json").write_text(json.dumps({"task": "statistics", "level": "L1", "dump_path": str(path),
                                                 "statistics": selection}))
        d = PrecisionDebugger(str(path / "c.json"))
        d.start()
        for _ in range(4):  # four blocks of attention-like calls
            h = torch.tanh(q @ k.t() * 0.5 + 1.0).relu()
            att = h @ h.t()
            if scaled:
                att = att / 8 ** 0.5
            q = torch.softmax(att, -1) @ q
        d.stop()
        d.step()
        return path

    golden = dump(tmp_path / "g", True)
    (p,) = run(dump(tmp_path / "t", False), golden, tmp_path / "out").pairs
    lost = p["first_only_in_golden"]
    assert lost["name"] == "Tensor.div.0.forward", p
    assert any("att = att / 8 ** 0.5" in frame for frame in lost["stack"]), lost  # the golden's place
    assert "a call only in the golden (the target does not make it): Tensor.div.0.forward" in console_line(p)
    for name, selection in (("list", {"list": ["softmax", "tanh"]}),
                            ("scope", {"scope": ["Torch.softmax.0.forward", "Torch.softmax.1.forward"]})):
        (p,) = run(dump(tmp_path / name, True, **selection), golden, tmp_path / f"out_{name}").pairs
        assert p["first_only_in_golden"] is None, (name, p)


class _Masked(nn.Module):
    def __init__(self, diagonal):
        super().__init__()
        self.qk, self.diagonal = nn.Linear(8, 8), diagonal

    def forward(self, x):
        att = self.qk(x) @ x.t()
        mask = torch.ones(5, 5, dtype=torch.bool).triu(self.diagonal)
        return torch.softmax(att.masked_fill(mask, float("-inf")), -1) @ x


def test_a_module_that_made_nan_names_the_call_inside_it_that_made_it_first(tmp_path):
    """A causal mask that also hides the diagonal (triu(0)) leaves row 0 all -inf, and softmax makes NaN. At
    mix the softmax's inputs hold -inf, so the module (finite inputs) is the introducing call, and the
    softmax was only the step's first error (a new user's trial). The module's line now names it."""
    def dump(path, diagonal):
        torch.manual_seed(0)
        model, x = nn.Sequential(_Masked(diagonal)), torch.randn(5, 8)
        d = PrecisionDebugger(dump_path=str(path), task="statistics", level="mix")
        d.start(model=model)
        model(x)
        d.stop()
        d.step()
        return path

    (p,) = run(dump(tmp_path / "t", 0), dump(tmp_path / "g", 1), tmp_path / "out").pairs
    first = p["first_divergence"]
    assert first["name"] == "Module.0._Masked.forward.0", first
    assert "; inside it, Torch.softmax.0.forward erred first: target output has NaN/Inf" in first["reason"]


def test_folders_of_other_steps_or_ranks_are_compared_and_said(tmp_path):
    """Two step folders of different steps were refused ("point both at the steps or rank folders", which
    the user had done), and two rank folders of other steps or ranks compared silently under the target's
    label (a new user's trial). Both compare, and the line says what differs."""
    import shutil

    from msprobe_lite.compare.report import console_line

    dump = dump_transformer(tmp_path / "d", level="L1")
    shutil.copytree(dump / "step0", dump / "step1")
    os.rename(dump / "step1" / "rank", dump / "step1" / "rank1")
    os.makedirs(dump / "step1" / "rank0")
    shutil.copy(dump / "step0" / "rank" / "dump.json", dump / "step1" / "rank0")
    os.makedirs(dump / "step0" / "rank0")
    shutil.copy(dump / "step0" / "rank" / "dump.json", dump / "step0" / "rank0")
    shutil.rmtree(dump / "step0" / "rank")
    (pair,) = run(dump / "step1" / "rank1", dump / "step0" / "rank0", tmp_path / "out").pairs
    assert pair["note"] == "steps differ: target step 1, golden step 0; ranks differ: target rank 1, golden rank 0"
    assert console_line(pair).startswith("[step 1 rank 1] (steps differ: target step 1, golden step 0; ranks")
    pairs = run(dump / "step1", dump / "step0", tmp_path / "out2").pairs
    assert [(p["step"], p["rank"], p["note"]) for p in pairs] == [
        (1, 0, "steps differ: target step 1, golden step 0")]
    # what is not compared keeps its own step (the golden's leftover rank was said as of the target's step)
    summary = run(dump / "step0", dump / "step1", tmp_path / "out4")
    assert summary.not_compared == {"target": [], "golden": [{"step": 1, "rank": 1}]}
    (pair,) = run(dump / "step0" / "rank0", dump / "step1" / "rank0", tmp_path / "out3").pairs
    assert pair["note"] == "steps differ: target step 0, golden step 1"


@pytest.mark.parametrize("level,names", [("L0", None), ("mix", ["Module.0.Linear"])])
def test_gradients_that_enter_the_dump_already_different_are_said(tmp_path, level, names):
    """The runs part after the dumped calls in the forward pass (a scale on the output, outside any module at
    L0, left out by a `list` at mix): every forward call agrees, and the gradients flowing back into the dump
    differ by 2 %. The answer read "no divergent call found; all pass" (a new user's trial with a scope);
    the step's first backward record is now asked whether its gradients came in different."""
    def dump(path, scale):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))
        config = {"level": level, **({"statistics": {"list": names}} if names else {})}
        return dump_step(path, model, torch.randn(5, 4), loss=lambda out: (out * scale).pow(2).sum(), **config)

    (pair,) = run(dump(tmp_path / "t", 1.01), dump(tmp_path / "g", 1.0), tmp_path / "out").pairs
    assert pair["first_divergence"] is None
    seen = pair["first_seen"]
    first_backward = "Module.2.Linear.backward.0" if level == "L0" else "Module.0.Linear.backward.0"
    assert seen["name"] == first_backward, seen
    assert "the gradients flowing in already differ by 0.0201 of their magnitude" in seen["reason"]
    assert "earlier calls' outputs do not:" in seen["reason"]
    (pair,) = run(dump(tmp_path / "t2", 1.0), dump(tmp_path / "g2", 1.0), tmp_path / "out2").pairs
    assert pair["first_seen"] is None and pair["first_divergence"] is None


def test_a_collective_that_differs_on_every_rank_is_said_across_ranks():
    """Every rank's inputs agree and every rank's all_reduce result differs: each line said the difference
    came from another rank, a circle (a review). The step's verdict across ranks names the collective."""
    from msprobe_lite.compare.judge import ACROSS_RANKS_COLLECTIVE, across_ranks
    from msprobe_lite.compare.report import across_ranks_line

    def pair(rank):
        return {"step": 0, "rank": rank, "first_divergence": {"name": "Distributed.all_reduce.0.forward",
                                                               "reason": f"introduced: ...; {ACROSS_RANKS_COLLECTIVE}"}}
    (verdict,) = across_ranks([pair(0), pair(1)])
    assert verdict == {"step": 0, "parted": {}, "received": {0: "Distributed.all_reduce.0.forward",
                                                             1: "Distributed.all_reduce.0.forward"}}
    assert across_ranks_line(verdict) == ("[step 0] across ranks: every rank's difference comes in at "
                                          "Distributed.all_reduce.0.forward while its inputs agree: the collective "
                                          "itself differs")
    assert across_ranks([pair(0)]) == [] and across_ranks([dict(pair(0), rank=None)]) == []


@pytest.mark.parametrize("scale,named", [(1.2, True), (1.0, False)])
def test_a_wrong_weight_under_bf16_autocast_is_named_at_its_own_dtypes_tolerance(tmp_path, scale, named):
    """A conv weight loaded 20 % off, in a target run under bf16 autocast: the fp32 weight was judged at the
    call's bf16 tolerance and against the earlier outputs' bf16 drift, and read "pass" (a new user's trial).
    At the first step the weights are the golden's or not, at their own dtype's tolerance."""
    def dump(path, bf16, factor):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
                              nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 36, 4))
        with torch.no_grad():
            model[3].weight.mul_(factor)
        d = PrecisionDebugger(dump_path=str(path), task="statistics", level="L0")
        d.start(model=model)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model(torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(1)))
        out.float().pow(2).mean().backward()
        d.stop()
        d.step()
        return path

    (pair,) = run(dump(tmp_path / "t", True, scale), dump(tmp_path / "g", False, 1.0), tmp_path / "out").pairs
    seen = pair["first_seen"]
    if named:
        assert seen["name"] == "Module.3.Conv2d.forward.0" and "its parameters differ by 0.2 " in seen["reason"]
    else:  # bf16 alone: weights unchanged, nothing said of them
        assert seen is None or "its parameters differ" not in seen["reason"], seen


class _Scaled(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.fc, self.scale = nn.Linear(4, 4), scale

    def forward(self, x):
        h = self.fc(x)
        if self.scale != 1.0:
            h = h * self.scale
        return torch.tanh(h)


def test_a_scoped_target_does_not_count_the_goldens_calls_before_its_range_as_unpaired(tmp_path):
    """A mix target scoped to one block, against a whole golden: the golden's calls before the scope were
    counted as "N earlier forward calls did not pair ... the difference may come from them", casting doubt on
    a right answer (a new user's trial). Only calls after the first paired one count."""
    def dump(path, scale, scope=None):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh(), _Scaled(scale))
        config = {"level": "mix", **({"statistics": {"scope": scope}} if scope else {})}
        return dump_step(path, model, torch.randn(3, 4), **config)

    scope = ["Module.4.fc.Linear.forward.0", "Module.4._Scaled.forward.0"]
    (pair,) = run(dump(tmp_path / "t", 1.01, scope), dump(tmp_path / "g", 1.0), tmp_path / "out").pairs
    assert pair["first_only_in_target"]["name"] == "Tensor.mul.0.forward"
    seen = pair["first_seen"]
    assert seen["name"] == "Torch.tanh.2.forward", seen   # its input is the extra call's output
    assert "; 1 earlier forward call did not pair with a call of the other run" in seen["reason"], seen


@pytest.mark.parametrize("cast", ["one", "all"])
def test_a_layer_cast_on_its_own_is_said(tmp_path, cast):
    """One layer left in another dtype (a stray `.half()`, a `.to()` that missed it) under bf16 autocast: its
    parameters' dtype differed from the golden's and nothing said so (a new user's trial). Said when most
    modules keep theirs; a whole model cast is the precision under test."""
    def dump(path, bf16):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))
        if bf16:
            for layer in (model[2],) if cast == "one" else (model[0], model[2], model[4]):
                layer.to(torch.bfloat16)
        d = PrecisionDebugger(dump_path=str(path), task="statistics", level="L0")
        d.start(model=model)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model(torch.randn(3, 4, generator=torch.Generator().manual_seed(1)))
        out.float().pow(2).mean().backward()
        d.stop()
        d.step()
        return path

    (pair,) = run(dump(tmp_path / "t", True), dump(tmp_path / "g", False), tmp_path / "out").pairs
    said = [p for p in (pair["first_warning"], pair["first_seen"], pair["first_divergence"])
            if p and "of another dtype than the golden's" in p["reason"]]
    if cast == "one":
        assert said and said[0]["name"] == "Module.2.Linear.forward.0", pair
        assert "(bias torch.bfloat16 / torch.float32, weight torch.bfloat16 / torch.float32)" in said[0]["reason"]
    else:
        assert not said, said


def test_a_dump_compared_with_itself_is_said(tmp_path):
    """Every call passes, which proves nothing when both paths name one dump (a new user's slip)."""
    from msprobe_lite.compare.report import console_line

    dump = dump_transformer(tmp_path / "d", level="L1")
    (pair,) = run(dump, dump, tmp_path / "out").pairs
    assert pair["note"] == "target and golden are the same dump"
    assert console_line(pair).startswith("[step 0] (target and golden are the same dump) no divergent call found")
    (pair,) = run(dump, dump_transformer(tmp_path / "d2", level="L1"), tmp_path / "out2").pairs
    assert pair["note"] is None


def test_structure_dumps_are_refused(tmp_path):
    """A structure dump holds no numbers: against a statistics dump its calls all read "only in golden",
    and against another structure dump "8 pass" with nothing compared (a new user's trial)."""
    structure = dump_transformer(tmp_path / "structure", level="L1", task="structure")
    values = dump_transformer(tmp_path / "values", level="L1")
    with pytest.raises(CompareError, match=r"the golden \(.*\) is a structure dump \(task \"structure\": names, "
                                           r"stacks and hierarchy, no numbers\): nothing to compare \(expected"):
        run(values, structure, tmp_path / "out")
    with pytest.raises(CompareError, match=r"the target \(.*\) and the golden \(.*\) are structure dumps"):
        run(structure, structure, tmp_path / "out2")


class _KeyBiasAttention(nn.Module):
    """Attention whose key projection has a bias: its gradient is zero in exact arithmetic (softmax does not
    change when one value is added to all of a query's scores), rounding noise of about 1e-10 in practice."""

    def __init__(self, d=16, scale=4.0):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.scale = scale

    def forward(self, x):
        scores = self.q(x) @ self.k(x).transpose(-2, -1) / self.scale
        return self.o(F.softmax(scores, dim=-1) @ self.v(x))


@pytest.mark.parametrize("target, named", [("bf16", None), ("scale", "Tensor.div.0.forward"),
                                           ("bf16 scale", "Tensor.div.0.forward")])
def test_a_gradient_that_is_rounding_noise_is_not_a_divergence(tmp_path, target, named):
    """fp32 against bf16 autocast named the key projection's backward ("outputs differ by 5.27e+04 of their
    magnitude"): its bias gradient is noise in both runs. It is now measured against what it was computed
    from; a real change in the same model is still named, in fp32 and against bf16."""
    def dump(path, bf16=False, scale=4.0):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), _KeyBiasAttention(scale=scale), nn.Linear(16, 4))
        x = torch.randn(2, 12, 8, generator=torch.Generator().manual_seed(1))
        d = PrecisionDebugger(dump_path=str(path), task="statistics", level="L1")
        d.start(model=model)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model(x)
        out.float().pow(2).mean().backward()
        d.stop()
        d.step()
        return path

    scale = {"scale": 4.4, "bf16 scale": 8.0}.get(target, 4.0)   # under bf16, a change beyond its tolerance
    changed = dump(tmp_path / "t", bf16="bf16" in target, scale=scale)
    (pair,) = run(changed, dump(tmp_path / "g"), tmp_path / "out").pairs
    fd = pair["first_divergence"]
    assert (fd and fd["name"]) == named, fd
    golden_k_bias = json.load(open(os.path.join(tmp_path, "g", "step0", "rank", "dump.json")))["data"][
        "Functional.linear.2.backward"]["output"][2]
    assert abs(golden_k_bias["Max"]) < 1e-8    # the noise-sized gradient is there


def _residual_scale(m, x, changed):   # a LayerScale-like branch: a product, small by design
    return m[1](x + m[0](x) * (1.5e-3 if changed else 1e-3))


def _masked_attention(m, x, changed):  # an additive -1e9 mask makes the inputs' magnitude huge
    q, k, v = m[0](x).chunk(3, -1)
    mask = torch.triu(torch.full((12, 12), -1e9), 1)
    return m[1](F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.5 if changed else 0.25))


@pytest.mark.parametrize("program, widths, bf16, named", [
    (_residual_scale, (16, 16), True, "Tensor.mul.0.forward"),
    (_masked_attention, (48, 16), False, "Functional.scaled_dot_product_attention.0.forward"),
    (_masked_attention, (48, 16), True, "Functional.scaled_dot_product_attention.0.forward"),
])
def test_small_forward_outputs_are_not_taken_for_noise(tmp_path, program, widths, bf16, named):
    """A review of the noise rule's first version: measured against the largest input (an additive mask of
    -1e9, or any input eight times the output under bf16's tolerance), a changed scale on a product or on
    attention went unseen. The rule now holds for gradients only, from floating-point inputs, when both
    runs' values are that small."""
    def dump(path, changed, autocast):
        torch.manual_seed(0)
        model = nn.ModuleList([nn.Linear(16, widths[0]), nn.Linear(widths[1], 4)])
        x = torch.randn(2, 12, 16, generator=torch.Generator().manual_seed(1))
        d = PrecisionDebugger(dump_path=str(path), task="statistics", level="L1")
        d.start(model=model)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = program(model, x, changed)
        out.float().pow(2).mean().backward()
        d.stop()
        d.step()
        return path

    (pair,) = run(dump(tmp_path / "t", True, bf16), dump(tmp_path / "g", False, False), tmp_path / "out").pairs
    assert (pair["first_divergence"] or {}).get("name") == named, pair["first_divergence"]


def test_a_backward_divergence_is_placed_at_its_forward_call(tmp_path):
    """stack.json holds forward calls: a backward record named as the first divergence had no place in the
    code on the answer line. Here the target scales the gradient that reaches the head's linear (a hook on
    its output, after the debugger's): the forward passes agree, and that call's backward introduces it."""
    def dump(path, scaled):
        torch.manual_seed(0)
        model = TinyTransformer().eval()
        def scale_its_gradient(module, args, out):
            out.register_hook(lambda g: g * 1.05)

        if scaled:
            model.head.register_forward_hook(scale_its_gradient)
        tokens = torch.randint(0, 32, (2, 6), generator=torch.Generator().manual_seed(1))
        d = PrecisionDebugger(dump_path=str(path), task="statistics", level="L1")
        d.start(model=model)
        model(tokens)[0].pow(2).mean().backward()
        d.stop()
        d.step()
        return path

    fd = run(dump(tmp_path / "t", True), dump(tmp_path / "g", False), tmp_path / "out").pairs[0]["first_divergence"]
    assert fd is not None and fd["name"] == "Functional.linear.14.backward", fd   # the head
    assert fd["stack"] and "models.py" in fd["stack"][0], fd


@pytest.mark.parametrize("fault,check", [
    ("gelu", lambda fd: fd["name"] == "Functional.gelu.0.forward" and "approximate" in fd["reason"]),
    ("ln_eps", lambda fd: fd["name"] == "Functional.layer_norm.3.forward"
     and fd["parents"][0] == "Module.blocks.1.ln2.LayerNorm.forward.0"),
    ("scale", lambda fd: fd["name"].startswith("Tensor.mul.")
     and fd["parents"][0] == "Module.blocks.0.attn.Attention.forward.0"),
    ("overflow", lambda fd: fd["name"] == "Torch.matmul.0.forward" and "NaN/Inf" in fd["reason"]),
])
def test_injected_fault_is_localised_to_the_exact_call(tmp_path, fault, check):
    boost = 2e4 if fault == "overflow" else 1.0  # large scores: fine in fp32, overflow in fp16
    golden = dump_transformer(tmp_path / "g", boost=boost)
    target = dump_transformer(tmp_path / "t", fault=fault, boost=boost)
    s = run(target, golden, tmp_path / "out")
    fd = s.pairs[0]["first_divergence"]
    assert fd is not None and check(fd), fd
    assert fd["stack"] and "models.py" in fd["stack"][0]


def test_the_one_line_answer_names_a_call_only_in_the_target_made_before_the_divergence():
    counts = {"pass": 5, "warning": 0, "error": 1, "unmatched_target": 2, "unmatched_golden": 0}
    extra = {"name": "Tensor.mul.0.forward", "stack": ["File m.py, line 9, in forward, \n x = x * 1.001"],
             "parents": []}
    divergence = {"name": "Functional.conv2d.1.backward", "golden_name": "Functional.conv2d.1.backward",
                  "reason": "introduced", "stack": [], "parents": []}
    pair = {"step": 0, "rank": None, "counts": counts, "first_divergence": divergence,
            "first_only_in_target": extra}
    assert console_line(pair) == ("[step 0] first divergence: Functional.conv2d.1.backward -- introduced; before it, "
                                  "a call only in the target: Tensor.mul.0.forward at File m.py, line 9, in forward: "
                                  "x = x * 1.001; 5 pass, 0 warning, 1 error, 2 unmatched in target, 0 in golden")
    pair["first_only_in_target"] = None
    assert console_line(pair).startswith(
        "[step 0] first divergence: Functional.conv2d.1.backward -- introduced; 5 pass")


def test_the_one_line_answer_names_the_first_error_when_no_call_introduced_one():
    counts = {"pass": 5, "warning": 0, "error": 1, "unmatched_target": 0, "unmatched_golden": 0}
    error = {"name": "Functional.conv2d.0.forward", "golden_name": "Functional.conv2d.0.forward",
             "reason": "shape differs: [1, 2] vs [2, 1]", "stack": ["File m.py, line 3, in forward, \n y = conv(x)"],
             "parents": []}
    pair = {"step": 0, "rank": None, "counts": counts, "first_divergence": None, "first_only_in_target": None,
            "first_error": error}
    assert console_line(pair) == ("[step 0] no divergent call found; first error: Functional.conv2d.0.forward -- "
                                  "shape differs: [1, 2] vs [2, 1] at File m.py, line 3, in forward: y = conv(x); "
                                  "5 pass, 0 warning, 1 error, 0 unmatched in target, 0 in golden")


@pytest.mark.parametrize("in_err, out_err, introduced, result", [
    (0.0, 1e-4, True, "error"),        # inputs agree, one fp32 op is off by 1e-4
    (1.9e-6, 1.99e-6, False, "pass"),  # inputs at the tolerance, the output just as far: nothing introduced
    (2e-3, 1.78, True, "error"),       # the spec's coarse rule: Adam's first update near its eps, bf16 vs fp32
    (0.02, 0.3, False, "warning"),     # amplified, not introduced
    (1e-6, 2.5e-6, False, "warning"),  # inputs agree, the output beyond the tolerance and 2.5x theirs
    (3.45e-7, 4.21e-6, False, "warning"),  # a matmul over weights drifted in earlier steps: 12x, 2.2 tolerances
    (3.45e-7, 1e-4, True, "error"),       # the same drift, and a 1e-4 change in the op
])
def test_a_call_introduces_a_divergence_only_beyond_what_its_inputs_explain(in_err, out_err, introduced, result):
    from msprobe_lite.compare.judge import Judge, Verdict
    from msprobe_lite.compare.rows import INPUT, OUTPUT

    verdict = Verdict()
    fp32_eps = 2.0 ** -23   # tolerance 16 eps: 1.91e-06
    Judge("statistics")._decide(verdict, {INPUT: [in_err], OUTPUT: [out_err]}, {INPUT: {}, OUTPUT: {}}, fp32_eps,
                                [], False)
    assert (verdict.introduced, verdict.result) == (introduced, result), verdict.reasons


@pytest.mark.parametrize("argument_err, introduced, result", [
    (99.0, True, "error"),     # a LayerNorm eps of 1e-3 against 1e-5, two optimizer steps later
    (3e-5, False, "warning"),  # a scalar computed from the drifted data (x * (0.5 / x.max().item()))
])
def test_a_scalar_argument_set_differently_is_named_however_far_the_inputs_drifted(argument_err, introduced,
                                                                                    result):
    from msprobe_lite.compare.judge import Judge, Verdict
    from msprobe_lite.compare.rows import INPUT, OUTPUT

    verdict = Verdict()   # inputs differ by 3e-05 (drift), the output by 4e-04
    Judge("statistics")._decide(verdict, {INPUT: [3e-5], OUTPUT: [4e-4]}, {INPUT: {}, OUTPUT: {}}, 2.0 ** -23, [],
                                False, argument_err)
    assert (verdict.introduced, verdict.result) == (introduced, result), verdict.reasons


@pytest.mark.parametrize("later_step,introduced", [(False, True), (True, False)])
def test_at_a_later_step_drifted_inputs_need_a_wider_margin(later_step, introduced):
    """A LayerNorm at step 1 of a DDP run: its inputs' statistics moved 5.7e-7 (weights updated differently
    at step 0), its output's Min 3e-5 of its magnitude. Named as introduced, ahead of the call whose setting
    really differed (a new user's trial). At a later step, drifted inputs need the output 64 tolerances off."""
    from msprobe_lite.compare.judge import Judge, Verdict
    from msprobe_lite.compare.rows import INPUT, OUTPUT

    verdict = Verdict()
    Judge("statistics", later_step=later_step)._decide(verdict, {INPUT: [5.7e-7], OUTPUT: [3.03e-5]},
                                                       {INPUT: {}, OUTPUT: {}}, 2.0 ** -23, [], False)
    assert verdict.introduced is introduced and verdict.result in ("error", "warning"), verdict.reasons


def test_a_setting_that_is_not_a_number_is_named_though_drift_exceeds_its_output_difference():
    """`approximate="tanh"` at a later step whose inputs drifted more than its output differs (GELU shrinks
    negative inputs): it read as a warning, and nothing was named at that step (a new user's trial)."""
    from msprobe_lite.compare.judge import Judge, Verdict
    from msprobe_lite.compare.rows import INPUT, OUTPUT

    verdict = Verdict()
    Judge("statistics", later_step=True)._decide(verdict, {INPUT: [2.16e-4], OUTPUT: [1.15e-4]},
                                                 {INPUT: {}, OUTPUT: {}}, 2.0 ** -23, [], False, math.inf,
                                                 setting=True)
    assert verdict.introduced and verdict.result == "error", verdict.reasons
    verdict = Verdict()  # the same setting difference with outputs that agree (a barrier's process group)
    Judge("statistics", later_step=True)._decide(verdict, {INPUT: [0.0], OUTPUT: [0.0]},
                                                 {INPUT: {}, OUTPUT: {}}, 2.0 ** -23, [], False, math.inf,
                                                 setting=True)
    assert not verdict.introduced
    verdict = Verdict()  # a number whose golden value is 0 also differs by inf: not a setting by that alone
    Judge("statistics", later_step=True)._decide(verdict, {INPUT: [2.16e-4], OUTPUT: [1.15e-4]},
                                                 {INPUT: {}, OUTPUT: {}}, 2.0 ** -23, [], False, math.inf)
    assert not verdict.introduced


@pytest.mark.parametrize("later_step", [False, True])
def test_weights_that_differ_at_a_later_step_point_to_the_earliest_step(later_step):
    """At L0, a GELU that differs at every step was named at step 0; steps 1 and 2 named the first layer's
    weights (updated differently by step 0) with nothing pointing back (a new user's trial)."""
    from msprobe_lite.compare.judge import _EARLIER_STEP, Judge, Verdict

    verdict = Verdict()
    Judge("statistics", later_step=later_step)._first_seen(
        verdict, "Module.bn.BatchNorm2d.forward.0", 0.0, 1.9e-6, (0.0, "", False), (7.6e-5, 1.9e-6), None, False, 0)
    assert verdict.first_seen and "its parameters differ by 7.6e-05" in verdict.reasons[0]
    assert (_EARLIER_STEP in verdict.reasons[0]) is later_step


def _train_gelu_mlp(path, **gelu_kwargs):
    """Three AdamW steps of a seeded MLP at L1 whose activation is `F.gelu(h, **gelu_kwargs)`."""
    torch.manual_seed(0)
    fc1, fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)
    opt = torch.optim.AdamW([*fc1.parameters(), *fc2.parameters()], lr=1e-2)
    x = torch.randn(5, 8)
    d = PrecisionDebugger(dump_path=str(path), task="statistics", level="L1")
    for _ in range(3):
        d.start()
        fc2(torch.nn.functional.gelu(fc1(x), **gelu_kwargs)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        d.stop()
        d.step()
    return path


def test_an_argument_passed_by_one_run_only_is_named_as_a_setting(tmp_path):
    """`F.gelu(h, approximate="tanh")` against `F.gelu(h)`: the argument is a row of the target only. It was
    left as an unmatched row, and once the weights had drifted (steps 1 and 2) no call was named."""
    golden = _train_gelu_mlp(tmp_path / "golden")
    s = run(_train_gelu_mlp(tmp_path / "tanh", approximate="tanh"), golden, tmp_path / "out")
    assert [p["first_divergence"]["name"] for p in s.pairs] == ["Functional.gelu.0.forward"] * 3
    assert all("argument input.approximate differs: target 'tanh', golden not passed" in p["first_divergence"]["reason"]
               for p in s.pairs)
    s = run(golden, _train_gelu_mlp(tmp_path / "tanh2", approximate="tanh"), tmp_path / "out2")  # the other way
    assert all("differs: target not passed, golden 'tanh'" in p["first_divergence"]["reason"] for p in s.pairs)
    # the default passed explicitly: said, and no call introduces a divergence (the numbers are the same)
    s = run(_train_gelu_mlp(tmp_path / "none", approximate="none"), golden, tmp_path / "out3")
    assert all(p["first_divergence"] is None and p["counts"]["error"] == 0 and p["counts"]["warning"] >= 1
               for p in s.pairs)


def test_a_name_mapping_pairs_renamed_modules_and_says_a_fragment_that_matches_nothing(tmp_path, capsys):
    """`-dm MAPPING.yaml`: target name fragments to golden ones. A fragment that matched no record name (a typo)
    renamed nothing without a word (a trial)."""
    def dump(path, name):
        torch.manual_seed(0)
        model = nn.Sequential()
        model.add_module(name, nn.Linear(4, 4))
        model.add_module("head", nn.Linear(4, 2))
        return dump_step(path, model, torch.ones(3, 4))

    target, golden = dump(tmp_path / "t", "encoder_v2"), dump(tmp_path / "g", "encoder")
    assert run(target, golden, tmp_path / "plain").pairs[0]["counts"]["unmatched_target"] > 0
    mapping = tmp_path / "map.yaml"
    mapping.write_text("Module.encoder_v2: Module.encoder\n")
    (pair,) = compare(str(target), str(golden), str(tmp_path / "mapped"), mapping=str(mapping)).pairs
    assert pair["counts"]["unmatched_target"] == pair["counts"]["unmatched_golden"] == 0 and pair["counts"]["pass"]
    assert pair["mapping_unused"] == [] and "matched no record name" not in capsys.readouterr().out
    mapping.write_text("Module.encodr_v2: Module.encoder\n")
    (pair,) = compare(str(target), str(golden), str(tmp_path / "typo"), mapping=str(mapping)).pairs
    assert pair["mapping_unused"] == ["Module.encodr_v2"]
    assert pair["mapping_close"] == {"Module.encodr_v2": "Module.encoder_v2"}  # from the dump's names
    assert "mapping: 'Module.encodr_v2' (did you mean 'Module.encoder_v2'?) matched no record name of the target" \
        in capsys.readouterr().out
    mapping.write_text("Zzz.qqq: Module.encoder\n")
    (pair,) = compare(str(target), str(golden), str(tmp_path / "far"), mapping=str(mapping)).pairs
    assert pair["mapping_close"] == {} and "mapping: 'Zzz.qqq' matched no record" in capsys.readouterr().out


def test_steps_and_ranks_of_one_side_only_are_said_and_lone_ranks_pair(tmp_path, capsys):
    """A step or rank that only one side dumped was dropped without a word; a single-process `rank/` against
    a lone `rank1/` paired at a step folder but was refused at the root, showing Python tuples (a trial)."""
    target = _train_gelu_mlp(tmp_path / "three")
    golden = tmp_path / "two"
    shutil.copytree(target, golden)
    shutil.rmtree(golden / "step2")
    s = compare(str(target), str(golden), str(tmp_path / "out"))
    assert [p["step"] for p in s.pairs] == [0, 1]
    assert s.not_compared == {"target": [{"step": 2, "rank": None}], "golden": []}
    assert "only in target, not compared: step 2" in capsys.readouterr().out
    with open(tmp_path / "out" / "summary.json") as f:
        assert json.load(f)["not_compared"]["target"] == [{"step": 2, "rank": None}]
    for step in ("step0", "step1"):
        os.rename(golden / step / "rank", golden / step / "rank1")
    s = run(target, golden, tmp_path / "out2")
    assert [p["step"] for p in s.pairs] == [0, 1] and all(p["counts"]["pass"] > 0 for p in s.pairs)
    shards = tmp_path / "rank0"                          # lone rank 0 against lone rank 1: two shards, unpaired
    for step in ("step0", "step1"):
        shutil.copytree(golden / step / "rank1", shards / step / "rank0")
    with pytest.raises(CompareError, match=r"\(step 0 rank 0, step 1 rank 0\) and .*\(step 0 rank 1, step 1 rank 1\)"):
        run(shards, golden, tmp_path / "out_shards")
    with pytest.raises(CompareError, match="in common"):                  # one step each: the same rule
        run(shards / "step0", golden / "step0", tmp_path / "out_step")
    run(shards / "step0" / "rank0", golden / "step0" / "rank1", tmp_path / "out_named")  # named: compared
    later = tmp_path / "later"
    shutil.copytree(target / "step0", later / "step5")
    with pytest.raises(CompareError, match=r"in common between .*\(step 0, step 1, step 2\) and .*\(step 5\)"):
        run(target, later, tmp_path / "out3")


def test_two_keywords_of_equal_value_are_two_settings(tmp_path):
    """`clamp(h, min=0.)` against `clamp(h, max=0.)`: both arguments are said (a review found them cancelled
    as if one were passed by position)."""
    def dump(path, **kwargs):
        torch.manual_seed(0)
        d = PrecisionDebugger(dump_path=str(path), task="statistics", level="L1")
        d.start()
        torch.clamp(torch.randn(8), **kwargs)
        d.stop()
        d.step()
        return path

    (pair,) = run(dump(tmp_path / "t", min=0.0), dump(tmp_path / "g", max=0.0), tmp_path / "out").pairs
    reason = pair["first_divergence"]["reason"]
    assert "argument input.min differs: target 0.0, golden not passed" in reason and "input.max differs: target not passed" in reason


def test_an_argument_passed_by_position_in_one_run_and_by_keyword_in_the_other_is_the_same(tmp_path):
    """`h.softmax(-1)` against `h.softmax(dim=-1)`: two one-sided rows of the same value cancel (a review
    found them named as a setting that differs, ahead of the real change)."""
    tensor = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, 3], "Max": 0.9, "Min": 0.1,
              "Mean": 0.33, "Norm": 1.2, "requires_grad": False}

    def dump(folder, args, kwargs):
        os.makedirs(folder)
        record = {"input_args": [tensor, *args], "input_kwargs": kwargs, "output": [tensor]}
        with open(os.path.join(folder, "dump.json"), "w") as f:
            json.dump({"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None,
                       "data": {"Tensor.softmax.0.forward": record}}, f)
        return folder

    minus_one = {"type": "int", "value": -1}
    s = run(dump(tmp_path / "t" / "rank", [minus_one], {}), dump(tmp_path / "g" / "rank", [], {"dim": minus_one}),
            tmp_path / "out")
    assert s.pairs[0]["counts"]["pass"] == 1 and s.pairs[0]["counts"]["warning"] == 0
    dims = [{"type": "int", "value": 0}, {"type": "int", "value": 1}]  # a list: rows .input.1.0 and .input.dim.0
    s = run(dump(tmp_path / "tl" / "rank", [dims], {}), dump(tmp_path / "gl" / "rank", [], {"dim": dims}),
            tmp_path / "out_list")
    assert s.pairs[0]["counts"]["pass"] == 1 and s.pairs[0]["counts"]["warning"] == 0
    zero = {"type": "int", "value": 0}
    s = run(dump(tmp_path / "t2" / "rank", [minus_one], {}), dump(tmp_path / "g2" / "rank", [], {"dim": zero}),
            tmp_path / "out2")
    assert s.pairs[0]["counts"]["warning"] == 1


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_a_weight_that_differs_at_the_first_step_is_named(tmp_path, level):
    """The commonest porting bug: one weight converted wrongly. The module's output differs as much as its
    parameters, which count as its inputs, so the compare read "all pass" (a new user's trial, with a bias
    off by 0.01); the first module whose parameters differ more than earlier outputs explain is now named."""
    def dump(path, bump):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU(), torch.nn.Linear(12, 3))
        with torch.no_grad():
            model[2].bias[1] += bump
        d = PrecisionDebugger(dump_path=str(path), task="statistics", level=level)
        d.start(model=model)
        model(torch.randn(8, 6)).pow(2).mean().backward()
        d.stop()
        d.step()
        return path

    s = run(dump(tmp_path / "t", 0.01), dump(tmp_path / "g", 0.0), tmp_path / "out")
    (p,) = s.pairs
    if level == "L0":
        assert p["first_seen"]["name"] == "Module.2.Linear.forward.0", p
        assert "its parameters differ by" in p["first_seen"]["reason"]
    else:  # the call inside it that takes the weight comes first, as an argument that requires grad
        assert p["first_seen"]["name"] == "Functional.linear.1.forward", p
        assert p["first_seen"]["parents"] == ["Module.2.Linear.forward.0"]
        assert "(most in input.2, which requires grad, as a weight does)" in p["first_seen"]["reason"]
        assert "the weights are not the golden's" in p["first_seen"]["reason"]
    s = run(dump(tmp_path / "same", 0.0), tmp_path / "g", tmp_path / "out_same")
    assert s.pairs[0]["first_seen"] is None and s.pairs[0]["counts"]["warning"] == 0


class _Glued(torch.nn.Module):
    """Layers joined by code that no L0 record covers: a clamp between fc1 and fc2."""

    def __init__(self, bound):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = torch.nn.Linear(6, 12), torch.nn.Linear(12, 12), torch.nn.Linear(12, 2)
        self.bound = bound

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(self.fc1(x).clamp(-self.bound, self.bound))))


def _train_glued(path, bound):
    torch.manual_seed(0)
    model, x = _Glued(bound), torch.randn(8, 6)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    d = PrecisionDebugger(dump_path=str(path), task="statistics", level="L0")
    for _ in range(3):
        d.start(model=model)
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        d.stop()
        d.step()
    return path


def test_a_difference_that_arises_between_modules_is_shown_where_it_is_first_seen(tmp_path):
    """At L0 the clamp between two modules is no record: fc2's input differs by 20% while fc1's output agrees,
    and every call only passes its inputs' difference on. The compare said "9 pass, 0 error" (a new-user
    trial); it now names the first module call whose inputs differ more than earlier outputs explain."""
    from msprobe_lite.compare.report import console_line

    s = run(_train_glued(tmp_path / "t", 0.8), _train_glued(tmp_path / "g", 1.0), tmp_path / "out")
    first, *later = sorted(s.pairs, key=lambda p: p["step"])
    assert first["first_divergence"] is None and first["first_seen"]["name"] == "Module.fc2.Linear.forward.0"
    assert "first difference seen in the inputs of Module.fc2.Linear.forward.0" in console_line(first)
    assert "inputs already differ by" in first["first_seen"]["reason"] and first["counts"]["warning"] >= 1
    for p in later:  # step 0's updates differed: fc1's weights are the first thing that differs
        assert p["first_divergence"] is None and p["first_seen"]["name"] == "Module.fc1.Linear.forward.0"
        assert "its parameters differ by" in p["first_seen"]["reason"]
        assert "earlier steps updated them differently" in p["first_seen"]["reason"]
    s = run(_train_glued(tmp_path / "same", 1.0), tmp_path / "g", tmp_path / "out_same")
    assert all(p["first_seen"] is None and p["counts"]["warning"] == 0 for p in s.pairs)


def test_at_l1_inputs_or_a_weight_that_differ_before_any_call_are_named(tmp_path):
    """At L1 the first call of a step has no earlier call to explain its inputs, and its output differs only
    as much as they do: runs fed different data, or one with a weight loaded wrongly, read "7 pass, 0
    warning" (a new user's trial). API calls that no module record holds are asked as module calls are;
    a weight is an argument there, and the input that differs most is named."""
    from msprobe_lite.compare.report import console_line

    def dump(path, shift=0.0, bump=0.0, scale=None):
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        x, y = torch.randn(4, 8) + shift, torch.randint(0, 4, (4,))
        with torch.no_grad():
            model[2].weight[0] += bump
        d = PrecisionDebugger(dump_path=str(path), task="statistics", level="L1")
        d.start(model=model)
        if scale is not None:
            x = torch.mul(x, scale)  # a call the golden does not make
        torch.nn.functional.cross_entropy(model(x), y).backward()
        d.stop()
        d.step()
        return path

    golden = dump(tmp_path / "g")
    (p,) = run(dump(tmp_path / "data", shift=0.5), golden, tmp_path / "out_data").pairs
    # the input's difference, computed here: x + 0.5 moves Max, Min and Mean by 0.5, which counts against
    # the golden's magnitude (its largest |value| or its RMS), and its Norm, which counts against the Norm
    torch.manual_seed(1)
    torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x = torch.randn(4, 8).double()
    magnitude = max(float(x.abs().max()), float(x.pow(2).mean().sqrt()))
    expected = max(0.5 / magnitude, float(((x + 0.5).norm() - x.norm()).abs() / x.norm()))
    assert p["first_divergence"] is None and p["first_seen"]["name"] == "Functional.linear.0.forward", p
    reason = p["first_seen"]["reason"]
    assert f"inputs already differ by {expected:.3g} of their magnitude (most in input.0)" in reason, reason
    assert "in the input data, in a weight passed to it" in reason
    assert "first difference seen in the inputs of Functional.linear.0.forward" in console_line(p)
    assert p["counts"]["warning"] == 1 and p["counts"]["error"] == 0

    (p,) = run(dump(tmp_path / "weight", bump=0.3), golden, tmp_path / "out_weight").pairs
    assert p["first_seen"]["name"] == "Functional.linear.1.forward", p  # the second linear takes the weight
    reason = p["first_seen"]["reason"]
    assert "(most in input.1, which requires grad, as a weight does)" in reason and "weights are not the golden's" in reason
    assert "for an input made to require grad, the input data" in reason

    (p,) = run(dump(tmp_path / "same"), golden, tmp_path / "out_same").pairs
    assert p["first_seen"] is None and p["counts"]["warning"] == 0 and p["counts"]["error"] == 0

    # an earlier call that paired with nothing is not compared: the reason points at it
    (p,) = run(dump(tmp_path / "extra", scale=1.5), golden, tmp_path / "out_extra").pairs
    assert p["first_only_in_target"]["name"] == "Torch.mul.0.forward", p
    assert p["first_seen"]["name"] == "Functional.linear.0.forward"
    assert p["first_seen"]["reason"].endswith("; 1 earlier forward call did not pair with a call of the other run "
                                              "and is not compared: the difference may come from it")


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_fp32_against_bf16_at_module_level_names_no_call(tmp_path, level):
    """Parameter gradients that are zero in exact arithmetic (attention's key bias) are noise against the
    module's other parameter gradients: they were named as introduced at every step of an L0 or mix
    compare of a transformer in bf16 against fp32. Nor is any module call's input a "first difference"."""
    def train(path, dtype):
        torch.manual_seed(0)
        model = TinyTransformer().to(dtype)
        model.eval()
        x, y = torch.randint(0, 32, (2, 6), generator=torch.Generator().manual_seed(1)), \
            torch.randint(0, 32, (2, 6), generator=torch.Generator().manual_seed(2))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        d = PrecisionDebugger(dump_path=str(path), task="statistics", level=level)
        for _ in range(3):
            d.start(model=model)
            logits, _ = model(x)
            torch.nn.functional.cross_entropy(logits.float().reshape(-1, 32), y.reshape(-1)).backward()
            opt.step()
            opt.zero_grad()
            d.stop()
            d.step()
        return path

    s = run(train(tmp_path / "bf16", torch.bfloat16), train(tmp_path / "fp32", torch.float32), tmp_path / "out")
    assert all(p["first_divergence"] is None and p["first_seen"] is None and p["counts"]["error"] == 0
               for p in s.pairs), [p["first_divergence"] for p in s.pairs]
    # said, so that a user sees bf16 took effect and was judged at its rounding
    assert all("one run computes in bf16, the other finer" in p["note"] for p in s.pairs)


@pytest.mark.parametrize("selection", [{"list": ["mlp"]}, {"data_mode": ["output"]}, {"data_mode": ["input"]},
                                       {"data_mode": ["forward", "input"]}, {"data_mode": ["backward"]},
                                       {"list": ["Functional.linear.5.forward", "Functional.layer_norm.2.forward"]},
                                       {"scope": ["Functional.linear.5.forward", "Functional.linear.7.forward"]}])
def test_a_filtered_dump_pairs_with_an_unfiltered_golden(tmp_path, golden, selection):
    """A dump made with a filter holds the same calls, fewer of them or fewer parts: each pairs with its
    golden call. Before, a `list` filter left the backward parents of the calls inside a filtered-out module
    null (the golden names them), and a `data_mode` filter's records paired with none (their signatures
    lacked the inputs or the outputs), so compare reported calls only in the target (a new-user trial)."""
    target = dump_transformer(tmp_path / "t", statistics=selection)
    s = run(target, golden, tmp_path / "out")
    (pair,) = s.pairs
    counts = pair["counts"]
    assert counts["unmatched_target"] == counts["error"] == counts["warning"] == 0, pair
    assert counts["pass"] == len(load(target)["data"]) and pair["first_divergence"] is None
    # each call with its own golden call: by order, a filtered `linear.5` met the golden's `linear.0` (a trial)
    with open(pair["result_file"]) as f:
        rows = list(csv.DictReader(f))
    paired = [(row["NPU Name"], row["Bench Name"]) for row in rows if row["NPU Name"] and row["Bench Name"]]
    assert paired and all(t == g for t, g in paired), [(t, g) for t, g in paired if t != g][:3]
    parents, golden_parents = load(target, name="construct.json"), load(golden, name="construct.json")
    assert parents and all(golden_parents[name] == parent for name, parent in parents.items())


def test_names_that_meet_in_one_are_paired_by_order_not_by_name():
    """Pairing by name (filtered dumps) must not pair two target calls with one golden call: across
    frameworks `Functional.matmul` and `Mint.matmul` both read as `Torch.matmul` (a review)."""
    from msprobe_lite.compare.frameworks import Translation
    from msprobe_lite.compare.pair import pair_records
    from msprobe_lite.compare.rows import Row

    class Dump:
        def __init__(self, names):
            self.records, self.parents = {n: None for n in names}, {}

        def roles(self):
            return frozenset({"input", "output"})

        def rows(self, name):
            tensor = {"type": "t", "dtype": "float32", "shape": [2, 2]}
            return [Row(name + ".input.0", "input", tensor), Row(name + ".output.0", "output", tensor)]

    target = Dump(["Functional.matmul.0.forward", "Mint.matmul.0.forward"])
    golden = Dump([f"Torch.matmul.{i}.forward" for i in range(3)])
    pairs = pair_records(target, golden, Translation().record, lambda n: n, by_parent=False)
    partners = [p.golden for p in pairs if p.target]
    assert partners == ["Torch.matmul.0.forward", "Torch.matmul.1.forward"], pairs


def test_dumps_with_no_part_in_common_are_refused(tmp_path, golden):
    """A target with only outputs against a golden with only inputs (data_mode): every call read as a pass
    though no tensor was compared (a new user's trial). It is bad input, said as such."""
    outputs = dump_transformer(tmp_path / "t", statistics={"data_mode": ["output"]})
    inputs = dump_transformer(tmp_path / "g", statistics={"data_mode": ["input"]})
    with pytest.raises(CompareError, match="holds only its calls' outputs and the golden only their inputs"):
        run(outputs, inputs, tmp_path / "out")
    assert run(outputs, golden, tmp_path / "out2").pairs[0]["counts"]["error"] == 0  # a part in common


@pytest.mark.parametrize("data_mode", [["all"], ["output"]])
def test_a_conv_bias_gradient_before_batchnorm_is_noise_with_or_without_backward_inputs(tmp_path, data_mode):
    """A convolution bias followed by BatchNorm gets a gradient that is zero in exact arithmetic. With the
    module's backward inputs left out of the dump (data_mode ["output"]), its noise floor had no reference
    and a one-ulp input difference was named there (a review); the record's own gradients stand in."""
    def dump(path, scale):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3))
        return dump_step(path, model, torch.randn(4, 3, 10, 10) * scale, lambda out: out.pow(2).sum(),
                         statistics={"data_mode": data_mode})

    (pair,) = run(dump(tmp_path / "t", 1 + 2 ** -22), dump(tmp_path / "g", 1.0), tmp_path / "out").pairs
    assert pair["first_divergence"] is None and pair["counts"]["error"] == 0, pair


def test_a_conv_bias_gradient_summed_over_many_positions_is_noise_after_drift(tmp_path):
    """fp32 runs whose weights drifted (BatchNorm eps 1e-3 against 1e-5, step 1): the bias gradient of the
    convolution before BatchNorm, zero in exact arithmetic, was 1e-7 in one run and 2e-7 in the other, sums
    of 256 output gradients of 0.03 each. Set against one value's rounding it was named as introduced at
    L0; the floor now grows with the square root of the number of values summed."""
    def dump(path, eps):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8, eps=eps), nn.ReLU(inplace=True),
                              nn.Flatten(), nn.Linear(8 * 8 * 8, 10))
        opt = torch.optim.AdamW(model.parameters(), 1e-3)
        x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))
        d = PrecisionDebugger(dump_path=str(path), task="statistics", level="L0")
        for _ in range(2):
            d.start(model=model)
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            d.stop()
            d.step()
        return path

    s = run(dump(tmp_path / "t", 1e-3), dump(tmp_path / "g", 1e-5), tmp_path / "out")
    assert s.pairs[0]["first_divergence"]["name"] == "Module.1.BatchNorm2d.forward.0"
    assert all("parameters_grad" not in (p["first_divergence"] or p["first_error"] or {"name": ""})["name"]
               for p in s.pairs), [p["first_divergence"] for p in s.pairs]


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_a_conv_bias_gradient_under_autocast_is_judged_at_the_backward_precision(tmp_path, level):
    """bf16 autocast against fp32 (a new user's trial): a convolution's backward runs in bf16, its parameter
    gradients are fp32. The bias gradient before BatchNorm, zero in exact arithmetic, was 1e-8 in fp32 and
    9e-5 in bf16, and judged at fp32's tolerance it was named as introduced at every step, above a real
    change made later. Its noise floor now takes the precision of its module's backward."""
    def dump(path, autocast, scale):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
                              nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
                              nn.Flatten(), nn.Linear(8 * 8 * 8, 10))
        opt = torch.optim.AdamW(model.parameters(), 1e-3)
        x, y = torch.randn(8, 3, 8, 8), torch.randint(0, 10, (8,))
        d = PrecisionDebugger(dump_path=str(path), task="statistics", level=level)
        for _ in range(2):
            d.start(model=model)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                out = model(x)
            F.cross_entropy(out.float() * scale, y).backward()
            opt.step()
            opt.zero_grad()
            d.stop()
            d.step()
        return path

    golden = dump(tmp_path / "g", False, 1.0)
    s = run(dump(tmp_path / "t", True, 1.0), golden, tmp_path / "out")
    assert [p["first_divergence"] for p in s.pairs] == [None, None], s.pairs
    assert all(p["counts"]["error"] == 0 for p in s.pairs), s.pairs
    if level == "mix":  # a real change after the convolutions is still named first
        s = run(dump(tmp_path / "bug", True, 3.0), golden, tmp_path / "out_bug")
        assert s.pairs[0]["first_divergence"]["name"] == "Tensor.mul.0.forward", s.pairs[0]["first_divergence"]


def test_a_parameter_gradient_named_first_has_its_modules_place(tmp_path):
    """A module's parameter gradients have no stack of their own (they are summed over its calls): named as
    the first divergence, they read with no place in the code (a new user's trial). They now take the place
    and parents of the module's first call."""
    def dump(path, doubled):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 8), nn.Sequential(nn.Tanh(), nn.Linear(8, 3)))
        if doubled:  # the target doubles one weight gradient: a wrong gradient hook
            model[1][1].weight.register_hook(lambda g: g * 2)
        x = torch.randn(4, 6)
        d = PrecisionDebugger(dump_path=str(path), task="statistics", level="L0")
        d.start(model=model)
        model(x).square().mean().backward()
        d.stop()
        d.step()
        return path

    s = run(dump(tmp_path / "t", True), dump(tmp_path / "g", False), tmp_path / "out")
    first = s.pairs[0]["first_divergence"]
    assert first["name"] == "Module.1.1.Linear.parameters_grad.0", first
    assert any("model(x).square().mean().backward()" in line for line in first["stack"]), first["stack"]
    assert first["parents"] == ["Module.1.Sequential.forward.0"], first["parents"]


def test_a_parameter_gradient_is_noise_only_against_the_gradients_it_was_computed_from(tmp_path):
    """A Linear fed unnormalised features has a bias gradient far below its weight gradient: set against the
    weight gradient, a real 1.5x difference in it (a wrong reduction) passed as noise (a review). It is set
    against its module's backward inputs, the output gradients it sums."""
    def train(path, bias_scale):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)).to(torch.bfloat16)
        model[0].bias.register_hook(lambda g: g * bias_scale)
        return dump_step(path, model, (torch.randn(16, 4) * 50).to(torch.bfloat16))

    s = run(train(tmp_path / "t", 1.5), train(tmp_path / "g", 1.0), tmp_path / "out")
    assert s.pairs[0]["first_divergence"]["name"] == "Module.0.Linear.parameters_grad.0"


def test_bf16_inputs_within_tolerance_and_an_output_three_times_as_far_is_a_warning():
    from msprobe_lite.compare.judge import Judge, Verdict
    from msprobe_lite.compare.rows import INPUT, OUTPUT

    verdict = Verdict()   # bf16: tolerance 16 * 2**-7 = 0.125
    Judge("statistics")._decide(verdict, {INPUT: [0.05], OUTPUT: [0.17]}, {INPUT: {}, OUTPUT: {}}, 2.0 ** -7, [], False)
    assert (verdict.introduced, verdict.result) == (False, "warning")
    assert verdict.reasons == ["amplified: outputs differ by 0.17 of their magnitude, inputs by 0.05"]


def _train_transformer(path, steps=3, ln_eps=None, scale=None, gelu=None, bf16=False):
    """`steps` AdamW steps of the seeded transformer at mix, one planted change or none: by the later steps
    every weight has drifted between two runs that differ anywhere."""
    torch.manual_seed(0)
    model = TinyTransformer()
    model.eval()
    if ln_eps is not None:
        model.blocks[1].ln2.eps = ln_eps
    if gelu is not None:
        for block in model.blocks:
            block.mlp[1].approximate = gelu
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tokens = torch.randint(0, 32, (2, 6), generator=torch.Generator().manual_seed(1))
    d = PrecisionDebugger(dump_path=str(path), task="statistics", level="mix")
    for _ in range(steps):
        d.start(model=model)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits, _ = model(tokens)
        if scale is not None:
            logits = logits * scale
        logits.float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        d.stop()
        d.step()
    return path


def test_a_planted_change_is_named_at_every_step_after_the_weights_drift(tmp_path):
    """Steps after the first have every weight updated differently: the changed call is still the one named,
    not a matmul over drifted weights or a block whose layers' weights drifted."""
    golden = _train_transformer(tmp_path / "golden")
    s = run(_train_transformer(tmp_path / "eps", ln_eps=1e-2), golden, tmp_path / "out")
    assert [p["first_divergence"]["name"] for p in s.pairs] == ["Functional.layer_norm.3.forward"] * 3
    assert all("input.eps differs: target 0.01, golden 1e-05" in p["first_divergence"]["reason"] for p in s.pairs)
    s = run(_train_transformer(tmp_path / "tanh", gelu="tanh"), golden, tmp_path / "out_tanh")
    assert [p["first_divergence"]["name"] for p in s.pairs] == ["Functional.gelu.0.forward"] * 3
    s = run(_train_transformer(tmp_path / "same"), golden, tmp_path / "out_same")
    assert all(p["first_divergence"] is None and p["counts"]["error"] == p["counts"]["warning"] == 0
               for p in s.pairs)


def test_an_inserted_call_does_not_shift_later_pairs(tmp_path, golden):
    target = dump_transformer(tmp_path / "t", fault="extra")
    s = run(target, golden, tmp_path / "out")
    (pair,) = s.pairs
    assert pair["first_divergence"] is None
    assert pair["counts"]["error"] == 0
    assert pair["counts"]["unmatched_target"] >= 1 and pair["counts"]["unmatched_golden"] == 0
    # the one-line answer names the inserted line's first call (`torch.matmul(pos, pos.t())`), and where
    extra = pair["first_only_in_target"]
    assert extra["name"] == "Tensor.t.0.forward" and "torch.matmul(self.pos, self.pos.t())" in extra["stack"][0]
    line = console_line(pair)
    assert "no divergent call found; a call only in the target: Tensor.t.0.forward at File" in line
    rows = list(csv.DictReader(open(pair["result_file"])))
    aligned = [r for r in rows if r["NPU Name"].startswith("Torch.matmul.1.") and r["Bench Name"]]
    assert aligned and aligned[0]["Bench Name"].startswith("Torch.matmul.0.")
    assert {r["Result"] for r in rows if r["NPU Name"].startswith("Torch.matmul.0.")} == {"unmatched"}
    # report.html details the call only in the target with its stack, not only the answer line (a trial: its
    # one table showed a later call whose inputs differ)
    html = (tmp_path / "out" / "report.html").read_text()
    assert "<h3>Call only in the target</h3>" in html and "torch.matmul(self.pos, self.pos.t())" in html


def test_bf16_against_fp32_is_not_divergent_everywhere(tmp_path, golden):
    torch.manual_seed(0)
    path = tmp_path / "bf16"
    model = TinyTransformer()
    model.eval()
    tokens = torch.randint(0, 32, (2, 6), generator=torch.Generator().manual_seed(1))
    d = PrecisionDebugger(dump_path=str(path), level="mix", task="statistics")
    d.start(model=model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, _ = model(tokens)
    logits.float().pow(2).mean().backward()
    d.stop()
    d.step()
    (pair,) = run(path, golden, tmp_path / "out").pairs
    total = sum(pair["counts"][k] for k in ("pass", "warning", "error"))
    assert pair["counts"]["error"] <= total * 0.02, pair["counts"]


def test_an_optimizer_amplification_of_rounding_noise_is_not_the_lines_warning(tmp_path):
    """bf16 against fp32 with AdamW inside start()/stop(): attention's key bias has a gradient that is zero in
    exact arithmetic, and Adam scales its rounding noise to a full step, so its update reads "amplified".
    The line named that optimizer call as its first warning, in the demo itself (a new user's trial). It
    stays a warning in the table."""
    (pair,) = run(_train_transformer(tmp_path / "t", steps=1, bf16=True), _train_transformer(tmp_path / "g", steps=1),
                  tmp_path / "out").pairs
    warned = {r["NPU Name"].split(".forward")[0] for r in csv.DictReader(open(pair["result_file"]))
              if r["Result"] == "warning"}
    assert warned and all(name.startswith("Tensor.addcmul_.") for name in warned), warned
    assert pair["first_warning"] is None and pair["first_divergence"] is None


# -- modes --------------------------------------------------------------------------------------------------
def test_md5_mode(tmp_path):
    golden = dump_transformer(tmp_path / "g", statistics={"summary_mode": "md5"})
    target = dump_transformer(tmp_path / "t", fault="gelu", statistics={"summary_mode": "md5"})
    s = run(target, golden, tmp_path / "out")
    assert s.mode == "md5"
    assert s.pairs[0]["first_divergence"]["name"] == "Functional.gelu.0.forward"
    rows = list(csv.DictReader(open(s.pairs[0]["result_file"])))
    assert "NPU MD5" in rows[0] and rows[0]["NPU MD5"] == rows[0]["BENCH MD5"]
    # every row whose checksum differs is an error, not only the call's that made the difference: the rows
    # after the changed call passed (their inputs differed too), and a run fed other data read "0 error"
    assert all(r["Result"] == ("error" if r["NPU MD5"] != r["BENCH MD5"] else r["Result"]) for r in rows)
    assert sum(r["NPU MD5"] != r["BENCH MD5"] for r in rows) > 10
    assert "the outputs' md5 differ while the inputs' are equal" in s.pairs[0]["first_divergence"]["reason"]


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_tensor_mode_bf16_against_fp32_names_no_call(tmp_path, level):
    """Tensor mode's "fewer than 10% of output elements within 0.1% while inputs agree" took a record without
    tensor inputs (parameter gradients) for one whose inputs agree, and asked bf16 for 0.1%: every
    parameter gradient of a bf16 run was named (a new-user trial). A dump compared with itself is all pass."""
    def train(path, dtype):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(dtype)
        return dump_step(path, model, torch.randn(6, 8).to(dtype), task="tensor", level=level)

    golden = train(tmp_path / "fp32", torch.float32)
    (pair,) = run(train(tmp_path / "bf16", torch.bfloat16), golden, tmp_path / "out").pairs
    assert pair["first_divergence"] is None and pair["counts"]["error"] == 0, pair
    (pair,) = run(golden, golden, tmp_path / "self").pairs
    assert pair["counts"]["warning"] == pair["counts"]["error"] == 0, pair


def test_tensor_mode_names_a_one_percent_error_after_drift(tmp_path):
    """Weights drifted by 1e-5 (later steps), then a module off by 1% (a kernel bug): its tensor inputs agree
    element by element, so "fewer than 10% within 0.1%" still names it (a review caught a version that
    asked the drifted in_err instead)."""
    class Scale(nn.Module):
        def __init__(self, k):
            super().__init__()
            self.k = k

        def forward(self, h):
            return torch.tanh(h) * self.k

    def dump(path, drift, k):
        torch.manual_seed(0)
        lin = nn.Linear(16, 16)
        with torch.no_grad():
            lin.weight.mul_(1 + drift * torch.randn(lin.weight.shape, generator=torch.Generator().manual_seed(1)))
        model = nn.Sequential(lin, Scale(k), nn.Linear(16, 4))
        return dump_step(path, model, torch.randn(32, 16), lambda out: out.sum(), task="tensor")

    (pair,) = run(dump(tmp_path / "t", 1e-5, 1.01), dump(tmp_path / "g", 0.0, 1.0), tmp_path / "out").pairs
    assert pair["first_divergence"]["name"] == "Module.1.Scale.forward.0"


def test_tensor_mode_metrics_match_numpy(tmp_path):
    golden = dump_transformer(tmp_path / "g", level="L1", task="tensor")
    target = dump_transformer(tmp_path / "t", level="L1", task="tensor", fault="ln_eps")
    s = run(target, golden, tmp_path / "out")
    assert s.mode == "tensor"
    assert s.pairs[0]["first_divergence"]["name"] == "Functional.layer_norm.3.forward"
    rows = {r["NPU Name"]: r for r in csv.DictReader(open(s.pairs[0]["result_file"]))}
    row = rows["Functional.layer_norm.3.forward.output.0"]
    folder = lambda p: p / "step0" / "rank" / "dump_tensor_data"  # noqa: E731
    t = torch.load(folder(target) / "Functional.layer_norm.3.forward.output.0.pt", weights_only=True).double()
    g = torch.load(folder(golden) / "Functional.layer_norm.3.forward.output.0.pt", weights_only=True).double()
    assert math.isclose(float(row["Cosine"]), float(F.cosine_similarity(t.flatten(), g.flatten(), dim=0)),
                        rel_tol=1e-9)
    assert math.isclose(float(row["EucDist"]), float((t - g).norm()), rel_tol=1e-9)
    assert math.isclose(float(row["MaxAbsErr"]), float((t - g).abs().max()), rel_tol=1e-9)


# -- reading the reference tool's dumps -------------------------------------------------------------------
class RefNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 3)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(3, 2)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)) + torch.tanh(x[:, :3]))


def test_reads_dumps_written_by_the_reference_tool(tmp_path):
    """tests/data/msprobe_L0 was written by mindstudio-probe for this model (make_reference_dump.py)."""
    torch.manual_seed(0)
    net = RefNet()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    d = PrecisionDebugger(dump_path=str(tmp_path / "ours"), level="L0", task="statistics")
    d.start(model=net)
    net(torch.randn(5, 4)).sum().backward()
    opt.step()
    d.stop()
    d.step()
    reference = os.path.join(DATA, "msprobe_L0", "step0")
    s = run(tmp_path / "ours" / "step0", reference, tmp_path / "out")
    (pair,) = s.pairs
    assert pair["first_divergence"] is None
    assert pair["counts"]["error"] == 0 and pair["counts"]["unmatched_target"] == 0
    assert pair["counts"]["pass"] == 8
    s = run(reference, reference, tmp_path / "out2")  # proc<pid> folders as both sides
    assert s.pairs[0]["counts"]["pass"] == 8


# -- interface --------------------------------------------------------------------------------------------
def test_outputs_and_cli(tmp_path, golden, capsys):
    target = dump_transformer(tmp_path / "t", fault="gelu")
    assert cli(["compare", "-tp", str(target), "-gp", str(golden), "-o", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "first divergence: Functional.gelu.0.forward" in out
    files = os.listdir(tmp_path / "out")
    assert {"summary.json", "report.html"} <= set(files)
    assert any(f.startswith("compare_result_rank_step0_") and f.endswith(".csv") for f in files)
    summary = json.load(open(tmp_path / "out" / "summary.json"))
    assert summary["mode"] == "statistics"
    pair = summary["pairs"][0]
    assert set(pair["counts"]) == {"pass", "warning", "error", "unmatched_target", "unmatched_golden"}
    assert set(pair["first_divergence"]) >= {"name", "golden_name", "reason", "stack", "parents"}
    html = (tmp_path / "out" / "report.html").read_text()
    assert "First divergence" in html and "<svg" in html
    rows = list(csv.DictReader(open(pair["result_file"])))
    assert list(rows[0])[:2] == ["NPU Name", "Bench Name"] and list(rows[0])[-3:] == \
        ["Result", "Err_message", "NPU_Stack_Info"]
    assert {r["Result"] for r in rows} <= {"pass", "warning", "error", "unmatched"}


def test_bad_inputs_give_clear_errors(tmp_path, golden, capsys):
    assert cli(["compare", "-tp", str(tmp_path / "nothing"), "-gp", str(golden)]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    bad = tmp_path / "bad" / "step0" / "rank"
    bad.mkdir(parents=True)
    (bad / "dump.json").write_text('{"task": "statistics", "data": {"a": ')
    with pytest.raises(CompareError, match="not valid JSON.*truncated"):
        run(bad / "dump.json", golden, tmp_path / "out")
    (bad / "dump.json").write_text('{"task": "statistics", "data": {"a')
    with pytest.raises(CompareError, match="Unterminated string starting at line 1, column 33 -- is"):
        run(bad / "dump.json", golden, tmp_path / "out")
    (bad / "dump.json").write_text('[1, 2]')
    with pytest.raises(CompareError, match="not a dump.json"):
        run(bad / "dump.json", golden, tmp_path / "out")


def test_overflow_check_command(tmp_path, capsys):
    path = tmp_path / "o"
    dump_transformer(path, fault="overflow", boost=2e4)
    assert cli(["overflow_check", "-i", str(path / "step0"), "-o", str(tmp_path)]) == 0
    result = json.load(open(tmp_path / "overflow_summary.json"))
    first = result["ranks"][0]["first_overflow"]
    assert first["name"] == "Torch.matmul.0.forward"
    assert first["parents"][0] == "Module.blocks.0.attn.Attention.forward.0"
    out = capsys.readouterr().out
    assert "first overflow: Torch.matmul.0.forward" in out
    assert "rank None" not in out  # a single-process run's place is its step (it read "rank None")


def test_xlsx_highlights_and_several_steps_in_parallel(tmp_path):
    from openpyxl import load_workbook

    for side, fault in (("g", None), ("t", "gelu")):
        dump_transformer(tmp_path / side, fault=fault)
        shutil.copytree(tmp_path / side / "step0", tmp_path / side / "step1")  # a dump root with two steps
    s = compare(str(tmp_path / "t"), str(tmp_path / "g"), str(tmp_path / "out"), quiet=True, xlsx=True, workers=2)
    assert [p["step"] for p in s.pairs] == [0, 1]
    assert all(p["first_divergence"]["name"] == "Functional.gelu.0.forward" for p in s.pairs)
    book = load_workbook(next(f for f in s.files if f.endswith(".xlsx")))
    sheet = book.active
    header = [c.value for c in sheet[1]]
    result = header.index("Result")
    colours = {row[result].value: row[0].fill.fgColor.rgb for row in sheet.iter_rows(min_row=2)}
    assert colours["error"].endswith("FFC7CE") and colours["pass"] in (None, "00000000")


def test_several_reference_proc_folders_pair_by_position(tmp_path):
    ref = os.path.join(DATA, "msprobe_L0", "step0", os.listdir(os.path.join(DATA, "msprobe_L0", "step0"))[0])
    for side in ("t", "g"):
        for proc in ("proc111", "proc222"):
            shutil.copytree(ref, tmp_path / side / "step0" / proc)
    s = run(tmp_path / "t" / "step0", tmp_path / "g" / "step0", tmp_path / "out")
    assert [p["rank"] for p in s.pairs] == [0, 1]
    assert [p["target"].split(os.sep)[-2] for p in s.pairs] == ["proc111", "proc222"]
    assert [p["golden"].split(os.sep)[-2] for p in s.pairs] == ["proc111", "proc222"]
    assert len({p["result_file"] for p in s.pairs}) == 2


def test_dtype_spellings_of_both_frameworks_are_the_same_dtype():
    from msprobe_lite.compare.judge import Judge
    from msprobe_lite.compare.rows import OUTPUT, Row

    t = Row("x.output.0", OUTPUT, {"type": "mindspore.Tensor", "dtype": "Int64", "shape": [2], "Max": 3, "Min": 1,
                                   "Mean": 2.0, "Norm": 3.2})
    g = Row("x.output.0", OUTPUT, {"type": "torch.Tensor", "dtype": "torch.int64", "shape": [2], "Max": 3, "Min": 1,
                                   "Mean": 2.0, "Norm": 3.2})
    _, err, problems = Judge("statistics")._row(t, g, None, None)
    assert err == 0 and problems == []


def test_tensors_the_debugger_could_not_read_are_said_not_fatal(tmp_path):
    """A tensor the framework refused to read when it was dumped (MindSpore without a CPU kernel) is written
    with null dtype, shape and statistics: compare refused the whole dump ("shape is None"), even against
    itself. One whose statistics failed (all null) passed against real values, unsaid. Both are now rows
    that are not compared, with a warning that says why (a new user's trial)."""
    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))

    x = torch.randn(5, 4)
    golden = dump_step(tmp_path / "g", model(), x)
    target = dump_step(tmp_path / "t", model(), x)
    path = target / "step0" / "rank" / "dump.json"
    dump = json.loads(path.read_text())
    unread = dump["data"]["Module.1.Tanh.forward.0"]["output"][0]
    unread.update(dtype=None, shape=None, Max=None, Min=None, Mean=None, Norm=None)
    failed = dump["data"]["Module.2.Linear.forward.0"]["input_args"][0]
    failed.update(Max=None, Min=None, Mean=None, Norm=None)
    # PyTorch's form when only the shape cannot be read (a nested tensor): the dtype stays (a review)
    dump["data"]["Module.0.Linear.forward.0"]["input_args"][0].update(shape=None, Max=None, Min=None, Mean=None,
                                                                      Norm=None)
    path.write_text(json.dumps(dump))
    for t, g in ((target, golden), (target, target)):
        s = run(t, g, tmp_path / "out")
        (p,) = s.pairs
        assert p["counts"]["error"] == 0 and p["counts"]["unmatched_target"] == 0, (p["counts"], p["first_error"])
        rows = {r["NPU Name"]: r for r in csv.DictReader(open(p["result_file"]))}
        assert "could not be read when it was dumped" in rows["Module.1.Tanh.forward.0.output.0"]["Err_message"]
        assert "could not be read when it was dumped" in rows["Module.0.Linear.forward.0.input.0"]["Err_message"]
        if g == golden:
            assert "statistics missing in the target" in rows["Module.2.Linear.forward.0.input.0"]["Err_message"]
            assert rows["Module.2.Linear.forward.0.input.0"]["Result"] == "warning"


def test_compare_piped_into_a_reader_that_leaves_early_ends_without_a_traceback(tmp_path):
    """`msprobe-lite compare ... | head -1` ended in a BrokenPipeError traceback (a new user's trial)."""
    import subprocess
    import sys

    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 3), nn.Tanh())

    x = torch.randn(5, 4)
    target, golden = dump_step(tmp_path / "t", model(), x), dump_step(tmp_path / "g", model(), x)
    process = subprocess.Popen([sys.executable, "-m", "msprobe_lite", "compare", "-tp", str(target), "-gp",
                                str(golden), "-o", str(tmp_path / "out")],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()  # the reader leaves before the first line
    err = process.stderr.read().decode()
    assert process.wait(timeout=120) in (0, 141) and "Traceback" not in err, err


# -- dumps that hold one part only (data_mode) ---------------------------------------------------------------
class _ResidualNorm(nn.Module):
    """Linear -> residual add -> LayerNorm -> Linear: under bf16 autocast the add takes the linear's bf16
    output and gives fp32, so its output differs from fp32's by bf16 rounding at fp32's tolerance."""

    def __init__(self, eps=1e-5):
        super().__init__()
        self.fc1, self.ln, self.fc2 = nn.Linear(32, 32), nn.LayerNorm(32, eps=eps), nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(self.ln(x + self.fc1(x)))


def _dump_residual_norm(path, bf16=False, eps=1e-5, scale=1.0, fc2_scale=1.0, **cfg):
    torch.manual_seed(0)
    model = _ResidualNorm(eps)
    with torch.no_grad():
        model.fc2.weight.mul_(fc2_scale)
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(1))
    config = path.parent / f"{path.name}_config.json"
    config.write_text(json.dumps({"task": "statistics", "dump_path": str(path), **cfg}))
    d = PrecisionDebugger(str(config))
    d.start(model=model)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = model(x) * scale
    out.float().pow(2).mean().backward()
    d.stop()
    d.step()
    return path


@pytest.mark.parametrize("level", ["L1", "mix"])
@pytest.mark.parametrize("data_mode", [["forward", "output"], ["output"], ["forward", "input"], ["input"]])
def test_a_clean_bf16_port_reads_clean_when_one_part_is_dumped(tmp_path, level, data_mode):
    """With inputs left out, a call's inputs read as agreeing (differing by 0), so the add after a bf16 linear
    was "introduced: outputs differ ... while inputs agree (inputs differ by 0)" and a clean port read 38
    errors; with outputs left out, a call's inputs were said to differ more than "earlier calls' outputs by at
    most 0" (a new user's trial). The earlier calls' outputs (or inputs) now stand in for the missing part."""
    golden = _dump_residual_norm(tmp_path / "g", level=level, statistics={"data_mode": data_mode})
    target = _dump_residual_norm(tmp_path / "t", bf16=True, level=level, statistics={"data_mode": data_mode})
    (pair,) = run(target, golden, tmp_path / "out").pairs
    assert pair["counts"]["error"] == 0 and pair["first_divergence"] is None and pair["first_seen"] is None, pair


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_with_inputs_left_out_the_first_call_whose_outputs_differ_is_named(tmp_path, level):
    """Both runs fp32; the target scales the model's output (`* 1.5`): the first call whose outputs differ
    while every earlier call's outputs agree is that multiplication, and the reason says inputs were not
    dumped instead of claiming they agreed."""
    selection = {"data_mode": ["forward", "output"]}
    golden = _dump_residual_norm(tmp_path / "g", level=level, statistics=selection)
    target = _dump_residual_norm(tmp_path / "t", scale=1.5, level=level, statistics=selection)
    (pair,) = run(target, golden, tmp_path / "out").pairs
    first = pair["first_divergence"]
    assert first["name"] == "Tensor.mul.0.forward", first
    assert "while earlier calls' outputs (inputs not dumped) agree" in first["reason"], first["reason"]


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_with_outputs_left_out_a_changed_setting_is_named(tmp_path, level):
    """LayerNorm's eps 0.5 against 1e-5 under bf16 autocast, only inputs dumped: the eps argument is in the
    dump, and with no outputs to show its effect it is the evidence; it was a CSV warning, and the answer
    named the next call's inputs."""
    selection = {"data_mode": ["forward", "input"]}
    golden = _dump_residual_norm(tmp_path / "g", level=level, statistics=selection)
    target = _dump_residual_norm(tmp_path / "t", bf16=True, eps=0.5, level=level, statistics=selection)
    (pair,) = run(target, golden, tmp_path / "out").pairs
    first = pair["first_divergence"]
    assert first["name"] == "Functional.layer_norm.0.forward", first
    assert "(outputs not dumped)" in first["reason"] and "argument input.eps differs: target 0.5, golden 1e-05" in first["reason"]


def test_with_outputs_left_out_the_first_call_whose_inputs_differ_blames_what_ran_before(tmp_path):
    """fp32 both, the target's input data scaled: at L0 with outputs left out, the first module's inputs
    differ; the reason says the earlier calls' inputs (not their outputs, which are not dumped) agree."""
    selection = {"data_mode": ["forward", "input"]}
    model = _ResidualNorm()
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(1))
    golden = dump_step(tmp_path / "g", model, x, statistics=selection)
    target = dump_step(tmp_path / "t", model, x * 1.5, statistics=selection)
    (pair,) = run(target, golden, tmp_path / "out").pairs
    seen = pair["first_seen"]
    assert seen["name"] == "Module.fc1.Linear.forward.0", seen
    assert "earlier calls' inputs do not:" in seen["reason"] and "outputs are not dumped" in seen["reason"]


def test_with_nothing_introduced_the_first_warning_is_named(tmp_path):
    """LayerNorm's eps 0.5 against 1e-5, the target under bf16 autocast, at L0: its inputs already differ by
    bf16's rounding, so its output differing hundreds of times as much is a warning (amplified), not "introduced";
    the answer read "no divergent call found; 8 pass, 1 warning" and named nothing (a new user's trial)."""
    golden = _dump_residual_norm(tmp_path / "g", level="L0")
    target = _dump_residual_norm(tmp_path / "t", bf16=True, eps=0.5, level="L0")
    (pair,) = run(target, golden, tmp_path / "out").pairs
    assert pair["first_divergence"] is None and pair["first_warning"]["name"] == "Module.ln.LayerNorm.forward.0"
    assert "no divergent call found; first warning: Module.ln.LayerNorm.forward.0 -- amplified: outputs differ by" \
           in console_line(pair)
    clean = _dump_residual_norm(tmp_path / "c", bf16=True, level="L0")
    (pair,) = run(clean, golden, tmp_path / "out2").pairs
    assert pair["first_warning"] is None and "first warning" not in console_line(pair)


def test_with_outputs_left_out_a_changed_weight_is_not_blamed_on_the_call_before(tmp_path):
    """L0, inputs only, fc2's weight scaled in the target: the reason said the call before it changed its
    inputs (review); it is the module's own parameters, and the reason says so."""
    selection = {"data_mode": ["forward", "input"]}
    model = _ResidualNorm()
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(1))
    golden = dump_step(tmp_path / "g", model, x, statistics=selection)
    with torch.no_grad():
        model.fc2.weight.mul_(1.05)
    target = dump_step(tmp_path / "t", model, x, statistics=selection)
    (pair,) = run(target, golden, tmp_path / "out").pairs
    seen = pair["first_seen"]
    assert seen["name"] == "Module.fc2.Linear.forward.0", seen
    assert "its parameters differ" in seen["reason"] and "the weights are not the golden's" in seen["reason"]
    assert "the call before it" not in seen["reason"]


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_backward_records_with_outputs_left_out_show_a_changed_weight(tmp_path, level):
    """data_mode ["backward", "input"], fc2's weight scaled in the target: every call passed and the line
    named nothing (review). Backward records are asked about their inputs too; the reason names the forward
    pass among the causes, since its values are not in the dump."""
    selection = {"data_mode": ["backward", "input"]}
    golden = _dump_residual_norm(tmp_path / "g", level=level, statistics=selection)
    target = _dump_residual_norm(tmp_path / "t", scale=1.0, level=level, statistics=selection, fc2_scale=1.05)
    (pair,) = run(target, golden, tmp_path / "out").pairs
    seen = pair["first_seen"]
    assert seen is not None and seen["name"].endswith(".backward"), pair
    assert "the forward pass, the backward call before it" in seen["reason"], seen["reason"]


def test_the_first_error_is_the_first_call_that_introduced_a_nan(tmp_path):
    """The first divergent call is itself an error (its output turns NaN while its inputs agree, as from a
    broken kernel: written into a copy of a real dump): it is the step's first error too, not a later call
    that only carries the NaN on."""
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)), torch.randn(3, 4)
    golden = dump_step(tmp_path / "golden", model, x, level="L1")
    target = tmp_path / "target"
    shutil.copytree(golden, target)
    dump = load(target)
    calls = dump["data"]
    relu = calls["Functional.relu.0.forward"]
    for value in (calls["Functional.linear.0.forward"]["output"][0], relu["input_args"][0], relu["output"][0]):
        value.update(Max=float("nan"), Mean=float("nan"), Norm=float("nan"))
    (target / "step0" / "rank" / "dump.json").write_text(json.dumps(dump))
    (pair,) = run(target, golden, tmp_path / "out").pairs
    assert pair["first_divergence"]["name"] == "Functional.linear.0.forward"
    assert pair["first_error"]["name"] == "Functional.linear.0.forward"

"""Compare's culprit on the harder cases (issue 32): where a value that was already bad came in, constants that
are not causes, and the rules that hold them. Small seeded models, each case trained twice (target with the
fault, golden without) and compared.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers import classifier_steps, dumped_steps
from lm import Net, batch

from msprobe_lite.compare import compare, report
from msprobe_lite.compare.overflow import analyse
from msprobe_lite.pytorch import PrecisionDebugger


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))


def train(path, level, model=mlp, before=None, steps=2, task="statistics"):
    """AdamW steps of `model()`, dumped at `level` (the update inside the window); `before(model, x)` plants a
    fault before step 0."""
    classifier_steps(path, level, model(), lambda p: torch.optim.AdamW(p, lr=1e-2), steps, before, task=task)


def train_lm(path, level, steps, compiled=False, tanh=False, bf16=False, optimizer_in_window=False):
    """AdamW steps of the small transformer (tests/lm.py), dumped at `level`: compiled by inductor, its GELUs
    with the tanh approximation, its forward under bf16 autocast, or its optimizer's step inside the window."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = Net()
    if tanh:
        for block in net.blocks:
            block.mlp[1] = nn.GELU(approximate="tanh")
    model = torch.compile(net) if compiled else net
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    dbg = PrecisionDebugger(dump_path=str(path), task="statistics", level=level)
    tokens, target = batch()

    def loss():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model(tokens)
        return F.cross_entropy(out.float().flatten(0, 1), target.flatten())

    dumped_steps(dbg, model, loss, opt, steps, optimizer_in_window)


def pairs(tmp_path, level, fault, **kw):
    train(tmp_path / "target", level, before=fault, **kw)
    train(tmp_path / "golden", level, **kw)
    return compare(str(tmp_path / "target"), str(tmp_path / "golden"), str(tmp_path / "out"), quiet=True).to_json()["pairs"]


def nan_weight(m, x):
    m[2].weight[3, 5] = float("nan")


def nan_input(m, x):
    x[2, 3] = float("nan")


@pytest.mark.parametrize("level, call, weight", [
    ("L0", "Module.2.Linear.forward.0", "the weight of Module.2.Linear is NaN at the start of step 0"),
    ("L1", "Functional.linear.1.forward", "its input.1, which requires grad as a weight does, is NaN at the start "
                                          "of step 0"),
    ("mix", "Functional.linear.1.forward", "the weight of Module.2.Linear is NaN at the start of step 0"),
])
def test_a_weight_already_nan_is_named_at_its_first_use(tmp_path, level, call, weight):
    """The loss's backward is the first call to make NaN from finite inputs of its own, but the NaN came in
    with a weight: that weight and its first use are the answer, at every level, in compare and
    overflow_check alike; the next step names the weight that step 0's NaN update spoiled first."""
    step0, step1 = pairs(tmp_path, level, nan_weight)
    first = step0["first_divergence"]
    assert first["name"] == call and first["reason"].startswith(weight), first
    assert step1["first_divergence"]["reason"].split(" is NaN")[0] in (
        "the weight of Module.0.Linear", "its input.1, which requires grad as a weight does,")
    found = analyse(str(tmp_path / "target"), str(tmp_path / "overflow"), quiet=True)["ranks"][0]["first_overflow"]
    assert found["name"] == call and found["reason"].startswith(weight.replace(" (the golden's is finite)", ""))


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_input_data_already_nan_is_the_first_error_not_a_divergence(tmp_path, level):
    """NaN in the batch is no call's doing: no divergent call found; the first error is the first call that
    takes it, as docs/compare.md says, and no later call (the loss's backward) is named for it."""
    (step0,) = pairs(tmp_path, level, nan_input, steps=1)
    assert step0["first_divergence"] is None
    first = step0["first_error"]
    assert first["name"] in ("Module.0.Linear.forward.0", "Functional.linear.0.forward")
    assert first["reason"].startswith("its input.0 is NaN where the golden's is finite, and no earlier call made it")


class MaskedAttention(nn.Module):
    """T5's mask: masked scores set to the smallest value of the scores' own dtype."""

    def __init__(self):
        super().__init__()
        self.q, self.out = nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x):
        scores = self.q(x) @ x.t()
        mask = torch.ones(6, 6, dtype=torch.bool).tril()
        scores = torch.where(mask, scores, torch.finfo(scores.dtype).min)
        return self.out(torch.softmax(scores.float(), -1) @ x)


def train_autocast(path, level, bf16):
    torch.manual_seed(0)
    m = MaskedAttention()
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(6, 8, generator=gen), torch.randint(0, 4, (6,), generator=gen)
    dbg = PrecisionDebugger(dump_path=str(path), task="statistics", level=level)
    dbg.start(model=m)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = m(x)
    F.cross_entropy(out.float(), y).backward()
    dbg.stop()
    dbg.step()


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_a_dtypes_own_constant_is_the_same_argument_in_both_runs(tmp_path, level):
    """finfo(bf16).min and finfo(fp32).min are one argument: bf16 against fp32 names no call for it, at L1 as
    at mix, and the row of the argument passes."""
    train_autocast(tmp_path / "target", level, bf16=True)
    train_autocast(tmp_path / "golden", level, bf16=False)
    (p,) = compare(str(tmp_path / "target"), str(tmp_path / "golden"), str(tmp_path / "out"),
                   quiet=True).to_json()["pairs"]
    for key in ("first_divergence", "first_warning", "first_error"):
        assert p[key] is None or "Torch.where" not in p[key]["name"], (key, p[key])
    assert "finfo" not in (p["first_divergence"] or {}).get("reason", "")
    assert "differs: -3.3895" not in open(p["result_file"]).read()


def scaled_by_a_hook(m, x):
    m[2].register_forward_hook(lambda module, args, out: out * 1.001)


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_a_call_only_the_target_makes_is_named_before_the_optimizers_update(tmp_path, level):
    """A forward hook of the target scales a layer's output (a Tensor.mul only the target makes), AdamW's
    update in the dump's window: the hook's call is the answer at every step (at mix, with the module whose
    hook made it), no update of the optimizer's."""
    for p in pairs(tmp_path, level, scaled_by_a_hook):
        assert p["first_only_in_target"]["name"] == "Tensor.mul.0.forward", p["first_only_in_target"]
        assert (p["first_divergence"] or {}).get("name") in (None, "Module.2.Linear.forward.0"), p["first_divergence"]


def test_the_optimizer_amplifies_a_healthy_compiles_rounding(tmp_path):
    """Compiled against eager, AdamW's update in the window: the gradients differ by rounding only, and Adam
    divides by their own size, so its update departs far more than its inputs. It introduces nothing (a
    warning that says so); a healthy compile has no divergence at any step."""
    train_lm(tmp_path / "target", "L1", steps=2, compiled=True, optimizer_in_window=True)
    train_lm(tmp_path / "golden", "L1", steps=2, optimizer_in_window=True)
    result = compare(str(tmp_path / "target"), str(tmp_path / "golden"), str(tmp_path / "out"), quiet=True)
    assert [p["first_divergence"] for p in result.to_json()["pairs"]] == [None, None]
    rows = "".join(open(p["result_file"]).read() for p in result.to_json()["pairs"])
    assert "Tensor.addcdiv_" in rows and "amplified: an update after the backward pass" in rows


def test_a_clean_run_up_to_the_optimizer_names_the_update_that_departs(tmp_path):
    """Nothing differs before the update (same model, same gradients) but the target's optimizer updates
    differently: the update is named, as before."""
    def sgd_step(path, lr):
        m = mlp()
        opt = torch.optim.SGD(m.parameters(), lr=lr)
        gen = torch.Generator().manual_seed(1)
        x, y = torch.randn(6, 8, generator=gen), torch.randint(0, 4, (6,), generator=gen)
        dbg = PrecisionDebugger(dump_path=str(path), task="statistics", level="L1")
        dbg.start(model=m)
        F.cross_entropy(m(x), y).backward()
        if lr == 0.2:  # the target's own update rule: a hand-written step that scales the gradient first
            for p in m.parameters():
                p.grad.mul_(1.5)
        opt.step()
        dbg.stop()
        dbg.step()
    sgd_step(tmp_path / "target", 0.2)
    sgd_step(tmp_path / "golden", 0.1)
    (p,) = compare(str(tmp_path / "target"), str(tmp_path / "golden"), str(tmp_path / "out"),
                   quiet=True).to_json()["pairs"]
    named = p["first_divergence"] or p["first_only_in_target"]
    assert named["name"].startswith("Tensor.mul_") or "lr" in named.get("reason", ""), named


REFERENCE = Path(__file__).parent / "data" / "msprobe_26_2"  # dumps written by mindstudio-probe 26.2 (make.py)


def test_a_reference_dump_is_judged_in_the_order_its_values_are_made(tmp_path):
    """The reference tool writes a module's parameter gradients before its backward record. Its loss scaled
    by 1.001 (a fault no forward record sees): the gradients entering the last layer's backward already
    differ, said there, not 'introduced' at the parameter gradients; the line shown is the user's script,
    not torch's module.py that the reference's stacks hold innermost."""
    (p,) = compare(str(REFERENCE / "loss_scaled_L0_target"), str(REFERENCE / "loss_scaled_L0_golden"),
                   str(tmp_path / "out"), quiet=True).to_json()["pairs"]
    assert p["first_divergence"] is None, p["first_divergence"]
    seen = p["first_seen"]
    assert seen["name"] == "Module.4.Linear.backward.0"
    assert seen["reason"].startswith("the gradients flowing in already differ by 0.001")
    assert report.at(seen).startswith(" at File /tmp/q/ref/dump.py, line 17"), report.at(seen)


def the_reference_mlp(path, level):
    """make.py's run, dumped by msprobe_lite."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(m.parameters(), lr=1e-2)
    dbg = PrecisionDebugger(dump_path=str(path), task="statistics", level=level)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(6, 8, generator=gen), torch.randint(0, 4, (6,), generator=gen)
    dbg.start(model=m)
    (F.cross_entropy(m(x), y) * 1.0).backward()
    opt.step()
    dbg.stop()
    dbg.step()


@pytest.mark.parametrize("ours_first", [True, False])
def test_our_dump_and_the_references_of_the_same_run_agree(tmp_path, ours_first):
    """The same run dumped by both tools: every record pairs (`Tensor.mul` is the reference's
    `Tensor.__mul__`, a backward's gradients in autograd's order and a weight's transposed, the first layer's
    API backward without a parent), nothing departs, and cross_entropy's backward, a different quantity in
    each tool, is 'not comparable', no divergence."""
    the_reference_mlp(tmp_path / "ours", "mix")
    ours, theirs = str(tmp_path / "ours"), str(REFERENCE / "mlp_mix")
    target, golden = (ours, theirs) if ours_first else (theirs, ours)
    (p,) = compare(target, golden, str(tmp_path / "out"), quiet=True).to_json()["pairs"]
    assert p["first_divergence"] is None and p["first_warning"] is None and p["first_seen"] is None, p
    assert p["counts"]["unmatched_target"] == p["counts"]["unmatched_golden"] == p["counts"]["error"] == 0, p
    rows = open(p["result_file"]).read()
    assert rows.count("not comparable (different quantities)") >= 1 and "Functional.cross_entropy.0.backward" in rows


def test_a_dropout_left_active_is_named_with_the_way_to_turn_it_off(tmp_path):
    """Two runs whose dropout draws other masks (another seed, another framework's generator): the dropout
    is named, and the reason says how to compare without it."""
    def run(path, seed):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.Linear(16, 4))
        dbg = PrecisionDebugger(dump_path=str(path), task="statistics", level="L1")
        x = torch.randn(6, 8, generator=torch.Generator().manual_seed(1))
        torch.manual_seed(seed)
        dbg.start(model=m)
        m(x).sum().backward()
        dbg.stop()
        dbg.step()

    run(tmp_path / "target", 1)
    run(tmp_path / "golden", 2)
    (p,) = compare(str(tmp_path / "target"), str(tmp_path / "golden"), str(tmp_path / "out"),
                   quiet=True).to_json()["pairs"]
    first = p["first_divergence"]
    assert first["name"] == "Functional.dropout.0.forward", first
    assert "seed_all(rm_dropout=True)" in first["reason"]


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_an_optimizer_that_differs_is_named_as_the_place(tmp_path, level):
    """AdamW with weight decay against Adam (a port's AdamWeightDecay against Adam): step 0 agrees in every
    record, gradients included; step 1's weights differ, and the answer names the update between the steps."""
    def run(path, decay):
        optimizer = (lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.5)) if decay else \
            (lambda p: torch.optim.Adam(p, lr=1e-2))
        classifier_steps(path, level, mlp(), optimizer, optimizer_in_window=False)

    run(tmp_path / "target", True)
    run(tmp_path / "golden", False)
    step0, step1 = compare(str(tmp_path / "target"), str(tmp_path / "golden"), str(tmp_path / "out"),
                           quiet=True).to_json()["pairs"]
    assert step0["first_seen"] is None and step0["first_divergence"] is None
    found = step1["first_divergence"] or step1["first_seen"]
    assert found["place"] == "optimizer"
    assert "the optimizer's update after step 0 differs (step 0 agreed in every record" in found["reason"]


def test_a_fault_at_every_step_is_named_at_every_step(tmp_path):
    """The target's GELU uses the tanh approximation (a fault in every step), dumped at L0. At step 0 the GELU
    module is named; at later steps every weight carries step 0's different update, so inputs never quite
    agree and the first layers read first: the call named before, still departing far beyond its inputs,
    is named again, and the reason says the weights carry the drift."""
    train_lm(tmp_path / "target", "L0", steps=3, tanh=True)
    train_lm(tmp_path / "golden", "L0", steps=3)
    steps = compare(str(tmp_path / "target"), str(tmp_path / "golden"), str(tmp_path / "out"),
                    quiet=True).to_json()["pairs"]
    assert [p["first_divergence"]["name"] for p in steps] == ["Module.blocks.0.mlp.1.GELU.forward.0"] * 3
    for p in steps[1:]:
        assert p["first_divergence"]["reason"].startswith("still departing as at step 0: outputs differ by")
        assert "carry the earlier steps' drift" in p["first_divergence"]["reason"]


def test_clean_bf16_steps_read_as_the_expected_drift_of_low_precision(tmp_path):
    """bf16 autocast against fp32, nothing wrong: at a later step the weights differ (each update rounds
    differently), which is what low-precision training does; said so, with its size and where it grows
    fastest, not as weights loaded or converted wrongly, and not as an optimizer that differs."""
    train_lm(tmp_path / "target", "L0", steps=3, bf16=True)
    train_lm(tmp_path / "golden", "L0", steps=3)
    steps = compare(str(tmp_path / "target"), str(tmp_path / "golden"), str(tmp_path / "out"),
                    quiet=True).to_json()["pairs"]
    assert all(p["first_divergence"] is None for p in steps)
    drifted = [p["first_seen"] for p in steps if p["first_seen"]]
    assert drifted, [p["counts"] for p in steps]
    for found in drifted:
        assert "the expected drift of bf16 training" in found["reason"] and "grows fastest at" in found["reason"]
        assert "converted" not in found["reason"] and "optimizer" not in found["reason"]


def test_a_second_micro_batch_that_departs_is_named_after_the_first_ones_backward(tmp_path):
    """Gradient accumulation: the first micro-batch is zeros (where the target's tanh GELU agrees with the
    exact one), the second is not. The second forward pass comes after a backward record, but a
    model's call there is not an optimizer's update: it is named, not read as an amplification."""
    def run(path, tanh):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(8, 16, bias=False), nn.GELU(approximate="tanh" if tanh else "none"),
                          nn.Linear(16, 4))
        dbg = PrecisionDebugger(dump_path=str(path), task="statistics", level="L0")
        gen = torch.Generator().manual_seed(1)
        dbg.start(model=m)
        for scale in (0.0, 3.0):
            m(torch.randn(6, 8, generator=gen) * scale).pow(2).mean().backward()
        dbg.stop()
        dbg.step()

    run(tmp_path / "target", True)
    run(tmp_path / "golden", False)
    (p,) = compare(str(tmp_path / "target"), str(tmp_path / "golden"), str(tmp_path / "out"),
                   quiet=True).to_json()["pairs"]
    assert p["first_divergence"]["name"] == "Module.1.GELU.forward.1", p["first_divergence"]


def test_the_console_answer_is_a_short_block_of_lines_a_terminal_reads(tmp_path, capsys):
    """Per step a verdict block: the verdict and the call, why, the user's source line, the counts; no line
    over 160 characters (the reasoning of 400 to 1,100 characters is wrapped, and whole behind --explain);
    the results folder in one line; the library says it through logging, which a program can silence."""
    import logging

    from msprobe_lite.cli import main as cli

    train(tmp_path / "target", "mix", before=nan_weight, steps=1)
    train(tmp_path / "golden", "mix", steps=1)
    argv = ["compare", "-tp", str(tmp_path / "target"), "-gp", str(tmp_path / "golden"), "-o", str(tmp_path / "o")]
    assert cli(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "[step 0] first divergence: Functional.linear.1.forward"
    assert lines[1].startswith("    why: the weight of Module.2.Linear is NaN at the start of step 0")
    assert any(line.startswith("    at tests/helpers.py:") and "F.cross_entropy(model(x), y)" in line for line in lines)
    assert lines[-2].endswith("0 unmatched in target, 0 in golden")
    assert lines[-1].startswith(f"results in {tmp_path / 'o'}: 1 CSV table, summary.json, report.html")
    assert max(map(len, lines)) <= 160
    assert cli(argv + ["--explain"]) == 0
    explained = capsys.readouterr().out.splitlines()
    assert max(map(len, explained)) <= 160 and sum(map(len, explained)) > sum(map(len, lines[:-1]))
    logging.getLogger("msprobe_lite.answer").disabled = True
    try:
        compare(str(tmp_path / "target"), str(tmp_path / "golden"), str(tmp_path / "p"))
    finally:
        logging.getLogger("msprobe_lite.answer").disabled = False
    assert capsys.readouterr().out == ""


def test_the_verdict_blocks_why_keeps_a_parenthesis_whole():
    """The block's "why" is a reason's first clause: cut at "; " outside parentheses, not inside one."""
    from msprobe_lite.compare.console import block

    reason = ("inputs already differ by 0.2 of their magnitude, earlier calls' outputs do not: the runs "
              "parted before this module, in code that is not recorded (at L0 what runs between modules; or the "
              "input data); 1 earlier forward call did not pair")
    found = {"name": "Module.attn.Attention.forward.0", "reason": reason, "stack": []}
    pair = {"step": 0, "rank": None, "first_divergence": None, "first_seen": found, "note": None,
            "counts": {"pass": 1, "warning": 1, "error": 0, "unmatched_target": 0, "unmatched_golden": 0}}
    lines = block(pair).splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("    why: "))
    why = " ".join([lines[at][9:]] + [line.strip() for line in lines[at + 1:] if line.startswith(" " * 8)])
    assert why.endswith("(at L0 what runs between modules; or the input data)"), why


def test_ranks_of_a_step_that_say_the_same_share_one_block(capsys):
    """Hundreds of ranks that agree read as one answer: `[step 0 ranks 0-2, 4]`, a rank that differs apart."""
    from msprobe_lite.compare.console import Blocks, spans

    counts = {"pass": 3, "warning": 0, "error": 0, "unmatched_target": 0, "unmatched_golden": 0}
    found = {"name": "Functional.linear.0.forward", "reason": "introduced: outputs differ", "stack": []}

    def pair(rank, first=None, step=0):
        return {"step": step, "rank": rank, "first_divergence": first, "note": None, "counts": counts}
    blocks = Blocks()
    for p in (pair(0), pair(1), pair(2), pair(3, found), pair(4), pair(0, step=1)):
        blocks.add(p)
    blocks.close()
    out = capsys.readouterr().out.splitlines()
    heads = [line for line in out if line.startswith("[")]
    assert heads == ["[step 0 ranks 0-2] no divergent call found",
                     "[step 0 rank 3] first divergence: Functional.linear.0.forward",
                     "[step 0 rank 4] no divergent call found", "[step 1 rank 0] no divergent call found"]
    assert spans([0, 1, 2, 3, 5, 7, 8]) == "0-3, 5, 7-8"


def test_the_verdict_blocks_why_is_not_how_the_call_was_paired():
    from msprobe_lite.compare.console import block

    found = {"name": "Primitive.MatMul.0.forward", "stack": [],
             "reason": "aligned with Functional.linear.0.forward; introduced: outputs differ by 0.3 of their magnitude"}
    pair = {"step": 0, "rank": None, "first_divergence": found, "note": None,
            "counts": {"pass": 1, "warning": 0, "error": 1, "unmatched_target": 0, "unmatched_golden": 0}}
    assert "    why: introduced: outputs differ by 0.3 of their magnitude" in block(pair).splitlines()

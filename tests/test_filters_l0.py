"""step, rank, scope, list and data_mode at module level; numbering never depends on them."""
from __future__ import annotations

import json

import pytest

from helpers import data
from models import make, train

from msprobe_lite.pytorch import PrecisionDebugger


def run(tmp_path, steps=1, **cfg):
    """Write a config file with `cfg` over the defaults, train the MLP, return the step-0 data."""
    body = {"task": "statistics", "dump_path": str(tmp_path / "dump"), "level": "L0"}
    body.update({k: v for k, v in cfg.items() if k not in ("statistics",)})
    if "statistics" in cfg:
        body["statistics"] = cfg["statistics"]
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(body))
    debugger = PrecisionDebugger(str(path))
    train("mlp", steps=steps, debugger=debugger)
    return tmp_path / "dump"


def test_step_filter_with_ranges(tmp_path):
    dump = run(tmp_path, steps=7, step=[0, "4-5"])
    assert sorted(p.name for p in dump.iterdir()) == ["step0", "step4", "step5"]


def test_rank_filter_in_single_process_counts_as_rank_0(tmp_path, capsys):
    dump = run(tmp_path, rank=[0])
    assert (dump / "step0" / "rank" / "dump.json").exists()
    other = run(tmp_path / "other", rank=[1])
    assert not other.exists()
    assert "selects no rank of this non-distributed run" in capsys.readouterr().err


def test_a_distributed_rank_left_out_by_the_rank_filter_says_so(tmp_path, monkeypatch, caplog):
    """Under torch.distributed a rank the filter leaves out logged only 'dumping ... to ...', as a chosen one
    does: when no rank at all was chosen (a wrong list), nothing said why nothing came."""
    monkeypatch.setattr(PrecisionDebugger, "current_rank", staticmethod(lambda: 1))
    with caplog.at_level("INFO", logger="msprobe_lite"):
        dump = run(tmp_path, rank=[5])
    assert not dump.exists()
    assert caplog.text.count("config rank=[5] does not select rank 1: this process dumps nothing") == 1


def test_list_by_fragment_and_full_name(tmp_path):
    dump = run(tmp_path, statistics={"list": ["fc2"]})
    assert list(data(dump)) == ["Module.fc2.Linear.forward.0", "Module.fc2.Linear.backward.0",
                                "Module.fc2.Linear.parameters_grad.0"]
    dump = run(tmp_path / "b", statistics={"list": ["Module.act.ReLU.forward.0"]})
    assert list(data(dump)) == ["Module.act.ReLU.forward.0"]


def test_scope_range_inclusive_and_backward_follows(tmp_path):
    dump = run(tmp_path, statistics={"scope": ["Module.act.ReLU.forward.0", "Module.fc2.Linear.forward.0"]})
    assert list(data(dump)) == ["Module.act.ReLU.forward.0", "Module.fc2.Linear.forward.0",
                                "Module.fc2.Linear.backward.0", "Module.fc2.Linear.parameters_grad.0",
                                "Module.act.ReLU.backward.0"]


@pytest.mark.parametrize("mode,keys", [
    (["forward"], {"forward": {"input_args", "input_kwargs", "parameters", "output"}}),
    (["backward"], {"backward": {"input", "output"}, "parameters_grad": {"weight", "bias"}}),
    (["forward", "input"], {"forward": {"input_args", "input_kwargs", "parameters"}}),
    (["output"], {"forward": {"output"}, "backward": {"output"}, "parameters_grad": {"weight", "bias"}}),
])
def test_data_mode(tmp_path, mode, keys):
    dump = data(run(tmp_path, statistics={"data_mode": mode}))
    kinds = {}
    for name, record in dump.items():
        kind = next(k for k in ("forward", "backward", "parameters_grad") if f".{k}." in name)
        kinds.setdefault(kind, set()).update(record)
    assert kinds == keys


def test_numbering_does_not_depend_on_filters(tmp_path):
    model, x, _ = make("mlp")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"task": "statistics", "level": "L0", "dump_path": str(tmp_path / "dump"),
                                  "statistics": {"list": ["Module.fc1.Linear.forward.1"]}}))
    debugger = PrecisionDebugger(str(config))
    debugger.start(model=model)
    model.fc1(x)
    model.fc1(x)  # only the second call is selected, and it keeps its index 1
    debugger.stop()
    debugger.step()
    assert list(data(tmp_path / "dump")) == ["Module.fc1.Linear.forward.1"]

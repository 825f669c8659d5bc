"""`msprobe-lite ckpt convert`: the checkpoints users actually have (a state_dict inside a training checkpoint,
DDP's `module.` names, attributes renamed in the port) convert, every converted value equals its source, and a
conversion that leaves a MindSpore parameter without a source writes nothing and says so."""
from __future__ import annotations

import os
import sys

import mindspore as ms
import numpy as np
import pytest
import torch

from msprobe_lite.cli import main as cli
from msprobe_lite.mindspore.checkpoint import load_into

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
from demo_mindspore import MsCNN, MsMLP, TorchCNN, TorchMLP  # noqa: E402  (the paired networks of the demo)

ms.set_context(mode=ms.PYNATIVE_MODE)
# MindSpore parameter -> the PyTorch parameter it must equal (names as each framework's net holds them)
CNN_PAIRS = {"conv.weight": "conv.weight", "bn.gamma": "bn.weight", "bn.beta": "bn.bias",
             "bn.moving_mean": "bn.running_mean", "bn.moving_variance": "bn.running_var",
             "head.weight": "head.weight", "head.bias": "head.bias"}


def trained_cnn() -> TorchCNN:
    """A PyTorch CNN whose running statistics moved too (one training step), so every value is its own."""
    torch.manual_seed(0)
    net = TorchCNN()
    net(torch.randn(8, 3, 4, 4)).sum().backward()
    return net


def convert(tmp_path, checkpoint, template_net, *extra) -> tuple:
    """(exit status, output path) of `ckpt convert` on `checkpoint` saved with torch.save."""
    torch.save(checkpoint, tmp_path / "in.pt")
    ms.save_checkpoint(template_net, str(tmp_path / "template.ckpt"))
    out = tmp_path / "out.ckpt"
    code = cli(["ckpt", "convert", "-i", str(tmp_path / "in.pt"), "-o", str(out), "-t",
                str(tmp_path / "template.ckpt"), *extra])
    return code, out


def assert_equals_source(out, tnet, pairs) -> None:
    loaded = ms.load_checkpoint(str(out))
    source = dict(tnet.state_dict())
    assert set(loaded) == set(pairs)
    for ms_name, torch_name in pairs.items():
        assert np.array_equal(loaded[ms_name].asnumpy(), source[torch_name].detach().numpy()), ms_name


@pytest.mark.parametrize("layout", ["model_and_epoch", "state_dict", "model_state_dict_and_optimizer",
                                    "dataparallel", "wrapped_dataparallel"])
def test_a_training_checkpoint_converts_every_parameter(tmp_path, capsys, layout):
    """`{"model": sd, "epoch": 3}` and DDP's `module.` names converted 0 parameters and wrote an empty
    checkpoint (a trial). The state_dict is found where training scripts put it."""
    tnet = trained_cnn()
    optimizer = torch.optim.Adam(tnet.parameters())
    optimizer.step()  # its state holds tensors too: they must not be taken for the weights
    with torch.no_grad():
        parallel = torch.nn.DataParallel(tnet)  # the `module.` names of DDP and DataParallel alike
    checkpoint = {"model_and_epoch": lambda: {"model": tnet.state_dict(), "epoch": 3},
                  "state_dict": lambda: {"state_dict": tnet.state_dict()},
                  "model_state_dict_and_optimizer": lambda: {"model_state_dict": tnet.state_dict(),
                                                             "optimizer_state_dict": optimizer.state_dict(),
                                                             "step": 10},
                  "dataparallel": lambda: parallel.state_dict(),
                  "wrapped_dataparallel": lambda: {"model": parallel.state_dict(), "epoch": 1}}[layout]()
    code, out = convert(tmp_path, checkpoint, MsCNN())
    lines = capsys.readouterr().out.splitlines()
    assert code == 0, lines
    assert "converted 7 parameters" in lines and f"wrote {out}" in lines
    assert not any(line.startswith(("no PyTorch source", "unused")) for line in lines)
    if "dataparallel" in layout:
        assert any("'module.'" in line for line in lines)  # what was done to the names is said
    assert_equals_source(out, tnet, CNN_PAIRS)


class RenamedMLP(torch.nn.Module):
    """TorchMLP with its attributes named otherwise than in the MindSpore port (`fc1` there is `encoder` here)."""

    def __init__(self):
        super().__init__()
        self.encoder, self.head = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)
        self.norm = torch.nn.LayerNorm(16)


def test_renamed_attributes_convert_through_a_name_map(tmp_path, capsys):
    torch.manual_seed(1)
    tnet = RenamedMLP()
    code, out = convert(tmp_path, tnet.state_dict(), MsMLP())
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert code == 1 and not out.exists()  # not half a checkpoint: a net loading it would keep random weights
    assert "no PyTorch source for fc1.weight" in text and "unused PyTorch entry encoder.weight" in text
    assert "nothing written" in text and "--name-map" in text
    (tmp_path / "names.yaml").write_text("encoder: fc1\nhead: fc2\n")
    code, out = convert(tmp_path, tnet.state_dict(), MsMLP(), "--name-map", str(tmp_path / "names.yaml"))
    lines = capsys.readouterr().out.splitlines()
    assert code == 0 and "converted 6 parameters" in lines, lines
    assert_equals_source(out, tnet, {"fc1.weight": "encoder.weight", "fc1.bias": "encoder.bias",
                                     "fc2.weight": "head.weight", "fc2.bias": "head.bias",
                                     "norm.gamma": "norm.weight", "norm.beta": "norm.bias"})


def test_a_name_map_renames_whole_parts_anywhere_in_a_name(tmp_path):
    """`attn: attention` renames that part in every block, never a part that only starts with it."""
    torch.manual_seed(2)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn, self.attn_out = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    class MsBlock(ms.nn.Cell):
        def __init__(self):
            super().__init__()
            self.attention, self.attn_out = ms.nn.Dense(4, 4), ms.nn.Dense(4, 4)

    tnet, mnet = torch.nn.Sequential(Block(), Block()), ms.nn.SequentialCell([MsBlock(), MsBlock()])
    names = tmp_path / "names.yaml"
    names.write_text("attn: attention\n")
    from msprobe_lite.mindspore.checkpoint import load_name_map

    report = load_into(mnet, tnet.state_dict(), name_map=load_name_map(str(names)))
    assert report.complete and not report.unused, report.lines()
    for i in (0, 1):
        assert np.array_equal(mnet[i].attention.weight.asnumpy(), tnet[i].attn.weight.detach().numpy())
        assert np.array_equal(mnet[i].attn_out.bias.asnumpy(), tnet[i].attn_out.bias.detach().numpy())


def test_nothing_converting_writes_nothing_and_exits_nonzero(tmp_path, capsys):
    code, out = convert(tmp_path, TorchCNN().state_dict(), MsMLP())
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert code == 1 and not out.exists()
    assert "converted 0 parameters" in text and "nothing written" in text


@pytest.mark.parametrize("checkpoint, words", [({"epoch": 3, "lr": 0.1}, "no state_dict"),
                                               ({}, "no state_dict"),
                                               ([torch.zeros(2)], "no state_dict")])
def test_a_file_without_weights_is_a_clear_error(tmp_path, capsys, checkpoint, words):
    code, out = convert(tmp_path, checkpoint, MsMLP())
    err = capsys.readouterr().err
    assert code == 2 and not out.exists()
    assert words in err and str(tmp_path / "in.pt") in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("content, words", [("- a\n- b\n", "a mapping of old: new names"),
                                            ("a: 3\n", "'a'"), ("a: [\n", "YAML"), ("'': b\n", "''")])
def test_a_bad_name_map_is_a_clear_error(tmp_path, capsys, content, words):
    (tmp_path / "names.yaml").write_text(content)
    code, out = convert(tmp_path, TorchMLP().state_dict(), MsMLP(), "--name-map", str(tmp_path / "names.yaml"))
    err = capsys.readouterr().err
    assert code == 2 and not out.exists() and words in err and "Traceback" not in err
    assert str(tmp_path / "names.yaml") in err
    code, _ = convert(tmp_path, TorchMLP().state_dict(), MsMLP(), "--name-map", "/dev/zero")
    assert code == 2 and "character device" in capsys.readouterr().err


def test_ckpt_compare_reads_the_same_checkpoints(tmp_path, capsys):
    """The converted checkpoint against its wrapped source: paired parameter by parameter, all equal."""
    tnet = trained_cnn()
    checkpoint = {"model": torch.nn.DataParallel(tnet).state_dict(), "epoch": 3}
    code, out = convert(tmp_path, checkpoint, MsCNN())
    assert code == 0
    capsys.readouterr()
    assert cli(["ckpt", "compare", str(tmp_path / "in.pt"), str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "7 equal"


def training_checkpoint(kind: str, tnet) -> dict:
    """What training scripts save beside the weights: their argparse arguments, numpy metrics."""
    import argparse

    extra = {"namespace": {"args": argparse.Namespace(lr=0.1)}, "numpy_scalar": {"best_acc": np.float64(0.9)},
             "both": {"args": argparse.Namespace(lr=0.1), "best": np.float64(0.9), "hist": np.zeros(3)}}[kind]
    return {"model": tnet.state_dict(), "epoch": 3, **extra}


@pytest.mark.parametrize("kind, words", [("namespace", "argparse.Namespace"), ("numpy_scalar", "a numpy scalar"),
                                         ("both", "argparse.Namespace and numpy values")])
def test_python_objects_in_a_checkpoint_are_named_in_one_line_and_load_when_trusted(tmp_path, capsys, monkeypatch,
                                                                                   kind, words):
    """`{"model": sd, "args": argparse.Namespace(...)}` gave ~1,000 characters of torch's weights_only text,
    ANSI escapes included, naming no file and advising a torch.load the user cannot run (a trial)."""
    monkeypatch.chdir(tmp_path)
    tnet = trained_cnn()
    torch.save(training_checkpoint(kind, tnet), "in.pt")
    ms.save_checkpoint(MsCNN(), "template.ckpt")
    for command in (["convert", "-i", "in.pt", "-o", "out.ckpt", "-t", "template.ckpt"], ["compare", "in.pt", "in.pt"]):
        assert cli(["ckpt", *command]) == 2
        captured = capsys.readouterr()
        err = captured.err
        assert len(err.splitlines()) == 1 and not captured.out, err
        assert len(err.rstrip("\n")) <= 160 and "\x1b" not in err and "Traceback" not in err, err
        assert "in.pt" in err and words in err and "--trust-checkpoint" in err and "state_dict" in err, err
        assert "weights_only" not in err, err
    assert not os.path.exists("out.ckpt")
    assert cli(["ckpt", "convert", "-i", "in.pt", "-o", "out.ckpt", "-t", "template.ckpt", "--trust-checkpoint"]) == 0
    assert_equals_source(tmp_path / "out.ckpt", tnet, CNN_PAIRS)
    assert cli(["ckpt", "compare", "--trust-checkpoint", "in.pt", "out.ckpt"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "7 equal"


@pytest.mark.parametrize("content", [b"hello, not a checkpoint\n", bytes(range(256)) * 3, b"",
                                     b"\x80\x04\x95\x0b\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x01a\x94K\x01s."])
@pytest.mark.parametrize("trust", [False, True])
def test_a_file_that_is_not_a_pytorch_checkpoint_says_so_in_one_line(tmp_path, capsys, monkeypatch, content, trust):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.pt").write_bytes(content)
    ms.save_checkpoint(MsCNN(), "template.ckpt")
    extra = ["--trust-checkpoint"] if trust else []
    for command in (["convert", "-i", "in.pt", "-o", "out.ckpt", "-t", "template.ckpt"], ["compare", "in.pt", "in.pt"]):
        assert cli(["ckpt", *command, *extra]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and len(err.rstrip("\n")) <= 160 and "\x1b" not in err, err
        assert "in.pt: not a PyTorch checkpoint" in err, err


def test_unused_entries_are_named_as_the_report_says_after_removing_the_prefix(tmp_path, capsys):
    """The report said "prefix 'module.' removed from every name", then "unused PyTorch entry module.fc.weight"."""
    torch.manual_seed(1)
    code, out = convert(tmp_path, torch.nn.DataParallel(RenamedMLP()).state_dict(), MsMLP())
    captured = capsys.readouterr()
    assert code == 1 and "prefix 'module.' removed from every name" in captured.out
    assert "unused PyTorch entry encoder.weight" in captured.out.splitlines(), captured.out
    assert "module." not in captured.out.replace("prefix 'module.' removed", "")

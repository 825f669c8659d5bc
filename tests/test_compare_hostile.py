"""Damaged and hostile dumps (issue 29): compare and overflow_check answer, never with a traceback.

Every case starts from a real dump of a seeded model made here, damages it the way a full disk, a deleted
folder or a hostile hand would, and runs the command line: bad input is exit status 2 and one line naming the
file and the problem; a tensor file that is not there is its record's error while everything else is
compared.
"""
from __future__ import annotations

import csv
import errno
import json
import os
import shutil
import stat
import subprocess
import sys

import pytest
import torch

from helpers import assert_stats, data, load
from models import make

from msprobe_lite.cli import main as cli
from msprobe_lite.core import safety
from msprobe_lite.pytorch import PrecisionDebugger

RECORD = "Module.fc1.Linear.forward.0"


@pytest.fixture(autouse=True)
def fresh_reports(monkeypatch):
    """Failures are reported once per process: each test starts with none reported yet."""
    monkeypatch.setattr(safety, "_seen", {})


def dump_mlp(path, task="statistics", steps=1, during=None):
    """`steps` training steps of the seeded MLP dumped at L0; `during(step, debugger)` runs mid-step (between
    the forward and the backward pass)."""
    model, x, _ = make("mlp")
    d = PrecisionDebugger(dump_path=str(path), level="L0", task=task)
    for step in range(steps):
        d.start(model=model)
        out = model(x)
        if during:
            during(step, d)
        out.sum().backward()
        d.stop()
        d.step()
    return path


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    root = tmp_path_factory.mktemp("golden")
    return {task: dump_mlp(root / task, task) for task in ("statistics", "tensor")}


def run(capsys, *argv):
    """(exit status, stdout: each step's verdict block as one line, stderr lines) of the command line."""
    capsys.readouterr()
    status = cli([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, blocks(out), [line for line in err.splitlines() if not line.startswith("[msprobe_lite]")]


def blocks(out: str) -> list:
    """The console's verdict blocks (a `[step N]` line and the indented lines under it) as one line each, the
    wrapped lines joined again; other lines as they are."""
    found = []
    for line in out.splitlines():
        if line.startswith(" ") and found:
            found[-1] += " " + line.strip()
        else:
            found.append(line)
    return found


def damaged(golden_dump, tmp_path, change):
    """A copy of a dump whose dump.json content went through `change(content)`."""
    copy = tmp_path / "damaged"
    shutil.copytree(golden_dump, copy)
    path = copy / "step0" / "rank" / "dump.json"
    content = json.loads(path.read_text())
    change(content)
    path.write_text(json.dumps(content))
    return copy, path


def one_line(err, *words):
    assert len(err) == 1 and "Traceback" not in err[0], err
    for word in words:
        assert str(word) in err[0], (word, err[0])
    return err[0]


def rows_of(csv_path):
    with open(csv_path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def result_csv(out_dir, step=0):
    return next(os.path.join(out_dir, n) for n in os.listdir(out_dir)
                if n.startswith(f"compare_result_rank_step{step}_") and n.endswith(".csv"))


# -- 1. tensor files that were not written ----------------------------------------------------------------------
def test_a_tensor_file_not_written_is_marked_and_only_its_record_errs(tmp_path, monkeypatch, capsys, golden):
    """A full disk while one tensor file is written: dump.json used to name the file as if it were there, and
    compare then exited 2 on the whole dump. The record now says the file was not written, and why; compare
    errs on that record alone and compares the rest."""
    real_write = os.write
    last = "Module.fc2.Linear.forward.0"   # its output is the model's: no later record links to its file
    lost = f"{last}.output.0.pt"

    def full_disk(fd, payload):
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            path = ""
        if os.path.basename(path).startswith(lost):  # its temporary file
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, payload)

    model, x, _ = make("mlp")
    monkeypatch.setattr(os, "write", full_disk)
    d = PrecisionDebugger(dump_path=str(tmp_path / "t"), level="L0", task="tensor")
    d.start(model=model)
    model(x).sum().backward()
    d.stop()
    d.step()
    monkeypatch.setattr(os, "write", real_write)

    records = data(tmp_path / "t")
    entry = records[last]["output"][0]
    assert entry["data_name"] == lost and entry["data_error"] == os.strerror(errno.ENOSPC)
    assert_stats(entry, model(x))              # the statistics are kept, computed here independently
    folder = load(tmp_path / "t")["dump_data_dir"]
    assert not os.path.exists(os.path.join(folder, lost))
    marked = [n for n, r in records.items() for part in r.values() for t in (part if isinstance(part, list) else [])
              if isinstance(t, dict) and "data_error" in t]
    assert marked == [last]                    # only the file that failed
    # every file written holds its tensor: the input of fc1 is x
    saved = torch.load(os.path.join(folder, records[RECORD]["input_args"][0]["data_name"]), weights_only=True)
    torch.testing.assert_close(saved, x, rtol=0, atol=0)

    status, out, err = run(capsys, "compare", "-tp", tmp_path / "t", "-gp", golden["tensor"], "-o", tmp_path / "o")
    assert status == 0 and err == [], err
    assert "1 tensor file not read, its record erred" in out[0] and lost in out[0] and "No space left" in out[0]
    assert "7 pass, 0 warning, 1 error" in out[0]
    rows = rows_of(result_csv(tmp_path / "o"))
    lost_row = next(r for r in rows if r["NPU Name"] == f"{last}.output.0")
    assert lost_row["Result"] == "error" and "was not written when it was dumped" in lost_row["Err_message"]
    assert all(r["Result"] == "pass" for r in rows if not r["NPU Name"].startswith(last))
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert len(summary["pairs"][0]["tensor_files_not_read"]) == 1


def test_a_tensor_folder_deleted_mid_step_keeps_the_other_steps(tmp_path, capsys):
    """The step's tensor folder deleted mid-step (a clean-up script): the files written before are gone. The
    step's records say so, and compare answers for every step instead of exiting 2 on the first lost file."""
    def delete(step, debugger):
        if step == 1:
            debugger.session.files.wait()  # the forward pass's files are on disk: the deletion takes them
            shutil.rmtree(tmp_path / "t" / "step1" / "rank" / "dump_tensor_data")

    target = dump_mlp(tmp_path / "t", "tensor", steps=2, during=delete)
    gold = dump_mlp(tmp_path / "g", "tensor", steps=2)
    lost = {n for n, r in data(target, 1).items() if "data_error" in json.dumps(r)}
    assert lost == {n for n in data(target, 1) if ".forward." in n}  # the backward's files came after
    assert "its folder was deleted" in json.dumps(data(target, 1))
    assert not any("data_error" in json.dumps(r) for r in data(target, 0).values())

    status, out, err = run(capsys, "compare", "-tp", target, "-gp", gold, "-o", tmp_path / "o")
    assert status == 0 and err == [], err
    step0 = next(line for line in out if line.startswith("[step 0]"))
    step1 = next(line for line in out if line.startswith("[step 1]"))
    assert " 0 error" in step0 and "not read" not in step0
    files = json.dumps(data(target, 1)).count('"data_error"')
    assert f"{files} tensor files not read" in step1 and f" {len(lost)} error" in step1
    rows = rows_of(result_csv(tmp_path / "o", 1))
    assert {r["Result"] for r in rows if ".backward." in r["NPU Name"] or "parameters_grad" in r["NPU Name"]} \
        == {"pass"}


def test_a_tensor_file_deleted_after_dumping_is_its_records_error(tmp_path, capsys, golden):
    copy = tmp_path / "t"
    shutil.copytree(golden["tensor"], copy)
    (copy / "step0" / "rank" / "dump_tensor_data" / f"{RECORD}.output.0.pt").unlink()
    status, out, err = run(capsys, "compare", "-tp", copy, "-gp", golden["tensor"], "-o", tmp_path / "o")
    assert status == 0 and err == [], err
    assert "1 tensor file not read" in out[0] and "missing" in out[0] and "7 pass, 0 warning, 1 error" in out[0]


# -- 2 and 3. content that is not the format: exit 2, one line naming the file and the problem ------------------
def _first_output(content):
    return content["data"][RECORD]["output"][0]


def _nest(depth):
    def change(content):
        value = None
        for _ in range(depth):
            value = [value]
        content["data"][RECORD]["input_args"].append(value)
    return change


CONTENT = {
    "empty name": (lambda c: c["data"].__setitem__("", c["data"][RECORD]), 'a record named ""'),
    "Max not a number": (lambda c: _first_output(c).__setitem__("Max", "abc"), "\"Max\" is 'abc'"),
    "unknown dtype": (lambda c: _first_output(c).__setitem__("dtype", "torch.float99"), "torch.float99"),
    "tensor without type": (lambda c: _first_output(c).pop("type"), 'without "type"'),
    "output a text": (lambda c: c["data"][RECORD].__setitem__("output", "x"), "'x' where a value belongs"),
    "huge shape": (lambda c: _first_output(c).__setitem__("shape", [2 ** 62, 2 ** 62]), "\"shape\""),
    "negative size": (lambda c: _first_output(c).__setitem__("shape", [-4, -4]), "\"shape\""),
    "nested 200 deep": (_nest(200), "nested more than 100 levels"),
}


@pytest.mark.parametrize("command", ["compare", "overflow_check"])
@pytest.mark.parametrize("case", sorted(CONTENT))
def test_off_format_content_is_an_error_not_a_verdict(tmp_path, capsys, golden, case, command):
    change, said = CONTENT[case]
    target, dump_json = damaged(golden["statistics"], tmp_path, change)
    argv = ["-tp", target, "-gp", golden["statistics"]] if command == "compare" else ["-i", target]
    status, out, err = run(capsys, command, *argv, "-o", tmp_path / "o")
    assert status == 2, (out, err)
    one_line(err, f"msprobe-lite {command}: {dump_json}", said)


@pytest.mark.parametrize("command", ["compare", "overflow_check"])
def test_a_value_nested_10000_deep_is_one_line(tmp_path, capsys, golden, command):
    """JSON nested deeper than Python's recursion limit: a RecursionError before."""
    target = tmp_path / "t"
    shutil.copytree(golden["statistics"], target)
    path = target / "step0" / "rank" / "dump.json"
    text = path.read_text()
    path.write_text(text.replace('"input_args": [', '"input_args": [' + "[" * 10000 + "]" * 10000 + ", ", 1))
    argv = ["-tp", target, "-gp", golden["statistics"]] if command == "compare" else ["-i", target]
    status, _, err = run(capsys, command, *argv, "-o", tmp_path / "o")
    assert status == 2
    one_line(err, path, "nested too deep")


# -- 2. where the output goes, and an input that is not a file ----------------------------------------------------
def test_an_output_path_that_cannot_be_a_folder_is_one_line(tmp_path, capsys, golden):
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere" / "at-all")
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    cases = [(dangling, "which does not exist"), (a_file / "below", f"{a_file} is not a folder"),
             (a_file, "is not a folder")]
    if os.path.isdir("/proc/self"):
        cases.append(("/proc/msprobe-lite-out", "takes no new folders"))
    for out_dir, said in cases:
        for command, argv in (("compare", ["-tp", golden["statistics"], "-gp", golden["statistics"]]),
                              ("overflow_check", ["-i", golden["statistics"]])):
            status, _, err = run(capsys, command, *argv, "-o", out_dir)
            assert status == 2, (out_dir, command, err)
            one_line(err, out_dir, said)
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_given_as_a_dump_is_refused_without_blocking(tmp_path, golden):
    """Opened, a FIFO blocks until a writer comes: a FIFO as -tp, or as a rank folder's stack.json, is
    refused at once (the timeout is a backstop against a hang, not a measure)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    copy = tmp_path / "copy"
    shutil.copytree(golden["statistics"], copy)
    stack = copy / "step0" / "rank" / "stack.json"
    stack.unlink()
    os.mkfifo(stack)
    for target, said in ((fifo, "a FIFO"), (copy, "but this is a FIFO")):
        done = subprocess.run([sys.executable, "-m", "msprobe_lite", "compare", "-tp", str(target), "-gp",
                               str(golden["statistics"]), "-o", str(tmp_path / "o")],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        one_line(done.stderr.splitlines(), target if target == fifo else stack, said)


# -- 4. tensor files outside the dump -----------------------------------------------------------------------------
def test_dump_data_dir_outside_the_dump_is_refused(tmp_path, capsys, golden):
    outside = tmp_path / "outside"
    shutil.copytree(golden["tensor"] / "step0" / "rank" / "dump_tensor_data", outside)
    target, dump_json = damaged(golden["tensor"], tmp_path, lambda c: c.__setitem__("dump_data_dir", str(outside)))
    shutil.rmtree(target / "step0" / "rank" / "dump_tensor_data")
    status, _, err = run(capsys, "compare", "-tp", target, "-gp", golden["tensor"], "-o", tmp_path / "o")
    assert status == 2
    one_line(err, dump_json, "outside the dump", "refused")


def test_a_tensor_file_that_is_a_symbolic_link_is_not_followed(tmp_path, capsys, golden):
    """The link points at the golden's own file, equal byte for byte: followed, the row would pass."""
    copy = tmp_path / "t"
    shutil.copytree(golden["tensor"], copy)
    name = f"{RECORD}.output.0.pt"
    planted = copy / "step0" / "rank" / "dump_tensor_data" / name
    planted.unlink()
    planted.symlink_to(golden["tensor"] / "step0" / "rank" / "dump_tensor_data" / name)
    status, out, err = run(capsys, "compare", "-tp", copy, "-gp", golden["tensor"], "-o", tmp_path / "o")
    assert status == 0 and err == [], err
    assert "a symbolic link" in out[0] and "refused" in out[0] and "1 error" in out[0]
    row = next(r for r in rows_of(result_csv(tmp_path / "o")) if r["NPU Name"] == f"{RECORD}.output.0")
    assert row["Result"] == "error" and "symbolic link" in row["Err_message"]


def test_a_tensor_folder_that_is_a_symbolic_link_is_refused(tmp_path, capsys, golden):
    copy = tmp_path / "t"
    shutil.copytree(golden["tensor"], copy)
    folder = copy / "step0" / "rank" / "dump_tensor_data"
    shutil.rmtree(folder)
    folder.symlink_to(golden["tensor"] / "step0" / "rank" / "dump_tensor_data")
    status, _, err = run(capsys, "compare", "-tp", copy, "-gp", golden["tensor"], "-o", tmp_path / "o")
    assert status == 2
    one_line(err, folder, "symbolic link", "refused")


# -- 5. nothing paired ------------------------------------------------------------------------------------------
def test_an_empty_target_against_a_full_golden_pairs_nothing_and_exits_1(tmp_path, capsys, golden):
    target, _ = damaged(golden["statistics"], tmp_path, lambda c: c.__setitem__("data", {}))
    status, out, err = run(capsys, "compare", "-tp", target, "-gp", golden["statistics"], "-o", tmp_path / "o")
    assert status == 1 and err == []
    count = len(data(golden["statistics"]))
    assert "nothing paired: the target holds no record, the golden " + str(count) in out[0]
    assert "no divergent call found" not in out[0]
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["pairs"][0]["nothing_paired"] is True
    status, out, _ = run(capsys, "compare", "-tp", golden["statistics"], "-gp", golden["statistics"], "-o",
                         tmp_path / "o2")
    assert status == 0 and "nothing paired" not in out[0]


# -- 6. modes of what compare writes ------------------------------------------------------------------------------
@pytest.mark.parametrize("umask", [0o000, 0o022])
def test_compare_outputs_get_the_dumps_modes_whatever_the_umask(tmp_path, capsys, golden, umask):
    out_dir = tmp_path / "new" / "nested" / "out"
    old = os.umask(umask)
    try:
        status, _, err = run(capsys, "compare", "-tp", golden["statistics"], "-gp", golden["statistics"], "-o",
                             out_dir, "--xlsx")
        status2, _, _ = run(capsys, "overflow_check", "-i", golden["statistics"], "-o", tmp_path / "ov" / "er")
    finally:
        os.umask(old)
    assert status == 0 and status2 == 0, err
    folders = [tmp_path / "new", tmp_path / "new" / "nested", out_dir, tmp_path / "ov", tmp_path / "ov" / "er"]
    files = [out_dir / n for n in os.listdir(out_dir)] + [tmp_path / "ov" / "er" / "overflow_summary.json"]
    assert {p.suffix for p in files} >= {".csv", ".json", ".html", ".xlsx"}
    for folder in folders:
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o750, folder
    for f in files:
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o640, f


def test_ranks_are_compared_in_rank_order(tmp_path):
    """rank2 before rank10: the table and the answer follow the ranks' numbers, not their folders' names."""
    source = dump_mlp(tmp_path / "one") / "step0" / "rank"
    for side in ("t", "g"):
        for rank in (0, 1, 2, 10, 11):
            shutil.copytree(source, tmp_path / side / "step0" / f"rank{rank}")
    from msprobe_lite.compare import compare

    summary = compare(str(tmp_path / "t"), str(tmp_path / "g"), str(tmp_path / "out"), quiet=True, workers=1)
    assert [p["rank"] for p in summary.pairs] == [0, 1, 2, 10, 11]

"""tools/bench.py runs end to end: the interleaved groups, one row per configuration, the JSON it writes.

Timings are not checked here (targets live in the benchmark itself); the counts are: the small step at L1
is a known program, 387 records a step."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))

import bench  # noqa: E402


def test_modes_are_interleaved_in_groups_and_each_row_counts_its_own_steps(tmp_path):
    out = tmp_path / "bench.json"
    assert bench.main(["--sizes", "small", "--modes", "L1", "tensor", "--steps", "2", "--per", "1",
                       "--warmup", "1", "--out", str(out), "--dump-dir", str(tmp_path)]) == 0
    written = json.loads(out.read_text())
    assert written["meta"]["interleaved"] is True
    rows = written["rows"]
    # the statistics group, then tensor mode with steps without the debugger of its own
    assert [r["mode"] for r in rows] == ["off", "L1", "off", "tensor"]
    assert all(r["steps"] == 2 and r["median_ms"] > 0 for r in rows)
    assert rows[1]["records_per_step"] == rows[3]["records_per_step"] == 387
    assert rows[1]["slowdown"] == rows[1]["median_ms"] / rows[0]["median_ms"]
    assert rows[3]["slowdown"] == rows[3]["median_ms"] / rows[2]["median_ms"]
    assert rows[3]["bytes_per_step"] > 20 * rows[1]["bytes_per_step"]  # tensor files besides the JSON
    assert not [d for d in os.listdir(tmp_path) if d.startswith("msprobe_lite_bench_")]  # the dumps removed


def test_groups_keep_the_statistics_modes_together_and_tensor_mode_apart():
    assert bench.mode_groups(["L0", "tensor", "L1", "mix"]) == [["L0", "L1", "mix"], ["tensor"]]
    assert bench.mode_groups(["tensor"]) == [["tensor"]]
    assert bench.mode_groups(["md5"]) == [["md5"]]


def test_the_phase_timer_prints_each_phase_and_cleans_up(tmp_path, capsys):
    import bench_phases

    assert bench_phases.main(["--steps", "2", "--dump-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert all(f"  {phase} " in out for phase in bench_phases.PHASES + ("total",)), out
    assert not os.listdir(tmp_path)

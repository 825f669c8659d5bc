"""Compare of many ranks: the local process pool against a Dask LocalCluster (`compare --scheduler`).

A dump of --ranks ranks (default 64) a side, each rank's dump.json one synthetic dump of --records records
(tools/bench_compare.py's, linked into every rank folder), compared twice: locally with --workers processes and
on a LocalCluster of --workers worker processes (started beforehand, as a real cluster is; its start is timed
apart). Both runs must write the same summary.

    .venv/bin/python tools/bench_cluster.py --ranks 64 --records 4000 --workers 2
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_compare import write_dump  # noqa: E402
from msprobe_lite.compare import compare  # noqa: E402


def ranks_dump(root, ranks: int, records: int, seed: int, noise: float) -> str:
    """A dump root of `ranks` rank folders (step 0), each with one dump.json linked in (no disk per rank)."""
    first = write_dump(os.path.join(root, "step0", "rank0"), records, seed, noise)
    for rank in range(1, ranks):
        os.makedirs(os.path.join(root, "step0", f"rank{rank}"))
        os.link(first, os.path.join(root, "step0", f"rank{rank}", "dump.json"))
    return root


def timed(target, golden, out, workers, scheduler=None) -> tuple:
    start = time.perf_counter()
    summary = compare(target, golden, out, quiet=True, workers=workers, scheduler=scheduler)
    pairs = [{k: v for k, v in p.items() if k != "result_file"} for p in summary.to_json()["pairs"]]
    return time.perf_counter() - start, json.dumps(pairs, sort_keys=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--records", type=int, default=4000, help="records per rank and side")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="local processes, and LocalCluster worker processes (default: one per CPU)")
    args = parser.parse_args(argv)
    from distributed import LocalCluster

    with tempfile.TemporaryDirectory() as tmp:
        target = ranks_dump(os.path.join(tmp, "t"), args.ranks, args.records, 1, 1e-6)
        golden = ranks_dump(os.path.join(tmp, "g"), args.ranks, args.records, 2, 0.0)
        local, local_pairs = timed(target, golden, os.path.join(tmp, "local"), args.workers)
        start = time.perf_counter()
        with LocalCluster(n_workers=args.workers, processes=True, threads_per_worker=1,
                          dashboard_address=":0") as cluster:
            started = time.perf_counter() - start
            remote, remote_pairs = timed(target, golden, os.path.join(tmp, "cluster"), None,
                                         cluster.scheduler_address)
    if remote_pairs != local_pairs:
        print("the LocalCluster's summary differs from the local run's", file=sys.stderr)
        return 1
    print(f"{args.ranks} ranks x {args.records} records a side, {args.workers} processes: local {local:.1f} s, "
          f"LocalCluster {remote:.1f} s (+{started:.1f} s to start it), same summary")
    return 0


if __name__ == "__main__":
    sys.exit(main())

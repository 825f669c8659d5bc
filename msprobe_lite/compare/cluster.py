"""Step/rank pairs compared on a Dask distributed cluster (`compare --scheduler ADDRESS`): a job of hundreds
of ranks is more than one machine compares in reasonable time. Dask is an optional extra,
msprobe_lite[distributed], imported only here and only when a scheduler is named."""
from __future__ import annotations

import gc

from .api import CompareError
from .read import place

WAIT_FOR_WORKERS = 30  # seconds


def run_on(address: str, function, jobs: list):
    """function(job) for every job on the workers of the Dask scheduler at `address`, the results yielded in
    job order (as the local process pool's map yields them). A job's exception is raised here as the worker
    raised it: a CompareError from a worker reads as one from this process."""
    client = _connect(address)
    try:
        from distributed import KilledWorker

        _check_workers(client, address)
        futures = client.map(function, jobs, pure=False)  # pure=False: each call writes files, never a cached result
        for job, future in zip(jobs, futures):
            try:
                result = future.result()
            except KilledWorker:
                raise CompareError(f"the Dask workers of the scheduler at {address} died comparing "
                                   f"{place(job[0], job[1])} (out of memory? each needs a pair's memory)") from None
            except CompareError:
                raise
            except OSError as exc:  # most often an output folder the worker does not see under the same path
                raise CompareError(f"a Dask worker of the scheduler at {address}, comparing {place(job[0], job[1])}: "
                                   f"{exc} (each worker must see the dumps and the output folder under the same "
                                   f"paths)") from None
            future.release()  # the result no longer held in a worker's memory
            yield result
    finally:
        client.close()


def _connect(address: str):
    try:
        from distributed import Client
    except ImportError:
        raise CompareError(f"--scheduler {address}: Dask is not installed "
                           f"(pip install msprobe_lite[distributed])") from None
    try:
        return Client(address, set_as_default=False)
    except (OSError, ValueError) as exc:  # OSError: nothing answered in time; ValueError: not an address
        message = f"cannot reach the Dask scheduler at {address}: {' '.join(str(exc).split())}"
    # a Client that failed to connect closes itself when collected; left to the interpreter's exit, its
    # event loop is gone by then and it prints a traceback
    gc.collect()
    raise CompareError(message)


def _check_workers(client, address: str) -> None:
    """Workers are there, and every one imports msprobe_lite's compare, or none is sent a pair: a worker that
    cannot unpickle its task breaks its connection to the scheduler, and the pair would wait for ever. `exec`
    of an import is the probe because a builtin reaches any worker, and its None comes back. A scheduler
    without workers (started before them, or left by them) gets WAIT_FOR_WORKERS seconds to have one."""
    try:
        client.wait_for_workers(1, timeout=WAIT_FOR_WORKERS)
    except TimeoutError:
        raise CompareError(f"the Dask scheduler at {address} has no worker (none joined within "
                           f"{WAIT_FOR_WORKERS} s): start them with `dask worker {address}`") from None
    for worker, failed in client.run(exec, "import msprobe_lite.compare.api", on_error="return").items():
        if failed is not None:
            raise CompareError(f"the Dask worker {worker} of the scheduler at {address} cannot import msprobe_lite "
                               f"({' '.join(str(failed).split())}): install msprobe_lite on every worker")

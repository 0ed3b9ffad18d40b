"""How many CPU threads torch uses in this process.

torch starts one thread per core of the machine, whatever share of it the process was given. Two rollout shards
on one 2-core machine then run 2 x 2 threads on 2 cores, and each slows to a crawl (1.3 tokens/s each against
42.8 for one process alone, measured). The count is taken from, in order: `--threads`, SLURM_CPUS_PER_TASK
(what a Slurm job step was given), OMP_NUM_THREADS, and the CPUs this process may run on
(os.sched_getaffinity, which `taskset`, cgroups' cpusets and Slurm's binding all restrict); under torchrun
the CPUs are divided among the node's LOCAL_WORLD_SIZE processes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from cosearch_cli.errors import ConfigError

def thread_count(requested: int | None = None, environ: Mapping[str, str] | None = None,
                 usable_cpus: int | None = None) -> tuple[int, str]:
    """(threads, where the number came from)."""
    if requested is not None:
        if requested < 1:
            raise ConfigError(f"--threads must be at least 1, got {requested}",
                              fix="leave it out to use the CPUs this process may run on")
        return requested, "--threads"
    environ = os.environ if environ is None else environ
    # Under torchrun the node's (or the Slurm task's) CPUs are shared by LOCAL_WORLD_SIZE processes;
    # OMP_NUM_THREADS is per process already (torchrun sets it to 1).
    local = _positive(environ.get("LOCAL_WORLD_SIZE")) or 1
    shared = f" / {local} local processes" if local > 1 else ""
    if slurm := _positive(environ.get("SLURM_CPUS_PER_TASK")):
        return max(1, slurm // local), "SLURM_CPUS_PER_TASK" + shared
    if omp := _positive(environ.get("OMP_NUM_THREADS")):
        return omp, "OMP_NUM_THREADS"
    if usable_cpus is None:
        usable_cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, usable_cpus // local), "CPUs this process may use" + shared


def _positive(value: str | None) -> int | None:
    value = (value or "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def set_threads(requested: int | None = None) -> tuple[int, str]:
    """Give torch (intra-op) the thread count above; returns it and its source, for a log line."""
    import torch

    threads, source = thread_count(requested)
    torch.set_num_threads(threads)
    return threads, source

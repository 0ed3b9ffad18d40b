"""examples/slurm/paper-7b/submit.sh queues the whole run with the right order, inputs and checkpoints
(sbatch replaced by a recorder; nothing runs)."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import orjson

from cosearch_cli.records import read_questions
from cosearch_cli.train import TrainConfig, iteration_questions

ROOT = Path(__file__).resolve().parents[1]

RECORDER = """#!/bin/bash
n=$(( $(wc -l < "$SBATCH_LOG" 2>/dev/null || echo 0) + 1 ))
printf '%s|%s|%s|%s\\n' "$*" "$FOLDER" "$AGENT" "$RANKER" >> "$SBATCH_LOG"
echo "$n"
"""


def test_submit_chains_every_step_and_feeds_each_iteration_the_previous_checkpoints(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(RECORDER)
    sbatch.chmod(sbatch.stat().st_mode | stat.S_IEXEC)
    log, run = tmp_path / "sbatch.log", tmp_path / "run"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SBATCH_LOG": str(log), "RUN": str(run),
           "QUESTIONS": str(ROOT / "fixtures" / "train.jsonl"), "DEV": "dev.jsonl", "INDEX": "idx",
           "MODEL": "/models/qwen7b", "ITERATIONS": "2", "EVAL_EVERY": "2", "PER_ITERATION": "3",
           "PYTHON": sys.executable}
    result = subprocess.run(["bash", str(ROOT / "examples" / "slurm" / "paper-7b" / "submit.sh")], env=env,
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    calls = [line.split("|") for line in log.read_text().splitlines()]
    scripts = [Path(args.split()[-1]).name for args, *_ in calls]
    assert scripts == ["rollout.sbatch", "group_reward.sbatch", "update.sbatch"] * 2 + ["evaluate.sbatch"]
    # job n waits for job n - 1 (the recorder numbers jobs 1, 2, ...); the first waits for nothing
    assert "--dependency" not in calls[0][0]
    assert all(f"--dependency=afterok:{n}" in calls[n][0] for n in range(1, len(calls)))
    first, second = run / "iter-0000", run / "iter-0001"
    assert calls[0][1:] == [str(first), "/models/qwen7b", "/models/qwen7b"]
    assert calls[3][1:] == [str(second), f"{first}/agent", f"{first}/ranker"]
    questions = read_questions(ROOT / "fixtures" / "train.jsonl")[0]
    for i, folder in enumerate((first, second)):
        written = [orjson.loads(line)["id"] for line in (folder / "questions.jsonl").read_bytes().splitlines()]
        expected = iteration_questions(questions, TrainConfig(questions_per_iteration=3), i)
        assert written == [q.id for q in expected]  # the same questions `cosearch train` would take


def test_serve_sbatch_publishes_the_address_once_serving_and_stops_cleanly(tmp_path, fixture_bm25):
    """examples/slurm/serve.sbatch, run as Slurm would (bash, the repo as working folder): the address file
    appears once /health answers, the server answers there, and SIGTERM (scancel) stops it with exit 0 and
    removes the address file so no rollout job reads a stale one."""
    import signal
    import socket
    import time
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = tmp_path / "retrieval-server"
    env = {**os.environ, "INDEX": str(fixture_bm25.folder), "ADDRESS_FILE": str(address), "PORT": str(port),
           "SERVE_OPTIONS": "--serial --quiet"}
    job = subprocess.Popen(["bash", str(ROOT / "examples" / "slurm" / "serve.sbatch")], env=env, cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not address.exists():
            assert job.poll() is None and time.monotonic() < deadline, job.stderr.read() if job.poll() else "slow"
            time.sleep(0.2)
        url = address.read_text().strip()
        assert url.startswith("http://") and url.endswith(f":{port}")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as reply:
            assert orjson.loads(reply.read())["passages"] == len(fixture_bm25.docs)
    finally:
        job.send_signal(signal.SIGTERM)
        _, stderr = job.communicate(timeout=60)
    assert job.returncode == 0, stderr
    assert not address.exists()

"""scripts/gpu_check.sh's checks rehearsed on the CPU, so the script that a GPU session runs does not rot."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_rehearsal_on_the_cpu_passes_every_check(tmp_path):
    out = tmp_path / "gpu_check.txt"
    env = {**os.environ, "COSEARCH_GPU_CHECK_DEVICE": "cpu", "PYTHON": sys.executable, "GPU_CHECK_OUT": str(out),
           "OMP_NUM_THREADS": "1"}
    result = subprocess.run([str(ROOT / "scripts" / "gpu_check.sh")], env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    text = out.read_text()
    for name in ("rollout", "update-bf16", "recompute-old-logprobs", "fsdp-one-rank", "memory small", "train"):
        assert f"[PASS] {name}" in text
    assert "SUMMARY: PASS (6/6 checks passed) on cpu" in text

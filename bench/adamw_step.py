"""One AdamW step, foreach (torch's default) against fused, on SmolLM2-135M-sized parameters with random gradients:
time (min of 5 steps after one warm-up step), peak RSS and the resulting parameter sum. Run each in its own
process, alternating, on a quiet machine:

    for m in foreach fused foreach fused; do .venv/bin/python bench/adamw_step.py $m; done

Measured 2026-12-04 on the 2-core CPU (load 0.4-0.9): foreach 431 / 598 ms a step, fused 73 / 85 ms, the same sum
to 6 digits; peak RSS foreach 2774 MiB, fused 2967 MiB (an earlier ad-hoc run read 2557 for fused: RSS does not
show a saving on the CPU). update/step.py's make_optimizer cites it.
"""

import resource
import sys
import time

import torch

fused = sys.argv[1:] == ["fused"]
torch.manual_seed(0)
sizes = [49152 * 576] + [576 * 576 * 4 + 576 * 1536 * 3] * 30  # embeddings + 30 layers' matrices
params = [torch.nn.Parameter(torch.randn(n)) for n in sizes]
for p in params:
    p.grad = torch.randn_like(p) * 1e-3
optimizer = torch.optim.AdamW(params, lr=1e-5, fused=fused or None)
optimizer.step()
times = []
for _ in range(5):
    started = time.perf_counter()
    optimizer.step()
    times.append(time.perf_counter() - started)
peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before the sum's temporaries
with torch.no_grad():
    total = float(sum(p.sum() for p in params))
print(f"{'fused' if fused else 'foreach'}: {sum(sizes) / 1e6:.0f}M parameters, step {min(times) * 1000:.0f} ms, "
      f"peak RSS {peak_mib:.0f} MiB, sum {total:.6f}")

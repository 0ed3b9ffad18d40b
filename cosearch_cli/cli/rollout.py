"""`cosearch rollout`: G agent trajectories per question with the ranker in the loop, streamed as JSONL."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated, Literal

import typer

from cosearch_cli.artifacts import Writer, input_file, make_manifest
from cosearch_cli.cli import app
from cosearch_cli.cli.common import (FIXTURE_INDEX, FIXTURES, Device, Dtype, OldSizes, Output, Questions, Quiet,
                                     Seed, Sizes, Threads, fixture_default, progress, stderr, use_threads)
from cosearch_cli.errors import ConfigError, InputError
from cosearch_cli.records import read_questions


def engine_options(backend: str, device: str, dtype: str) -> dict:
    """The device and dtype a generation backend is loaded with (recorded in the rollout manifest, so the
    update can tell whether the recorded log-probs are the trainer's numerics); vLLM places itself on GPUs."""
    from cosearch_cli.models import resolve_device

    return {"device": "cuda" if backend == "vllm" else resolve_device(device), "dtype": dtype}


def read_template(path: str):
    """An AgentTemplate from an instruction file, checked by formatting it once."""
    from cosearch_cli.agent import AgentTemplate, render_instruction

    file = input_file(path, "template file")
    template = AgentTemplate(instruction=file.read_text())
    try:
        render_instruction(template, "question?", 1)
    except (KeyError, IndexError, ValueError) as exc:
        raise InputError(f"the template has an unknown placeholder ({exc})", path=path,
                         fix="use {question}, {max_turns} and the tag names only; double literal braces") from None
    return template


def parse_shard(value: str | None) -> tuple[int, int]:
    """`i/N` -> (i, N), 0 <= i < N; questions go round-robin, so shard i holds questions i, i+N, i+2N, ..."""
    if value is None:
        return 0, 1
    try:
        i, n = (int(part) for part in value.split("/"))
    except ValueError:
        i, n = -1, 0
    if not 0 <= i < n:
        raise ConfigError(f"--shard {value!r} is not i/N with 0 <= i < N", fix="e.g. --shard 0/4 ... --shard 3/4")
    return i, n


@app.command("rollout")
def rollout(
    questions: Questions = None,
    index: Annotated[str | None, typer.Option(
        help="Index folder from `cosearch index`, or http://HOST:PORT of `cosearch serve` (default: "
             "indexes/fixture, announced on stderr).")] = None,
    n: Annotated[int | None, typer.Option(help="G: trajectories per question (default: --sizes').")] = None,
    agent: Annotated[str, typer.Option(help="Agent model: 'smollm2' (embedded) or a local HF folder.")] = "smollm2",
    ranker: Annotated[Literal["llm", "none", "oracle"], typer.Option(
        help="llm: generative listwise ranker; none: the retriever's top-K (Search-R1); oracle: candidates "
             "holding a gold answer first.")] = "llm",
    ranker_model: Annotated[str | None, typer.Option(
        help="Ranker model for --ranker llm (default: the agent's model, loaded once).")] = None,
    backend: Annotated[Literal["hf", "vllm"], typer.Option(
        help="Generation backend: hf (transformers) or vllm (pip install 'cosearch[vllm]').")] = "hf",
    preset: Sizes = "cpu",
    old_preset: OldSizes = None,
    max_turns: Annotated[int | None, typer.Option(help="T: search turns allowed; then the agent must answer.")] = None,
    top_n: Annotated[int | None, typer.Option(help="N: retriever candidates per search (the ranker's input).")] = None,
    k: Annotated[int | None, typer.Option(help="K: passages the ranker picks and the agent sees.")] = None,
    greedy: Annotated[bool, typer.Option("--greedy", help="Argmax decoding (evaluation); default: sampling.")] = False,
    temperature: Annotated[float, typer.Option(help="Sampling temperature (log-probs are recorded at it).")] = 1.0,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling mass.")] = 1.0,
    max_new_tokens: Annotated[int | None, typer.Option(help="Agent tokens per turn (default: --sizes').")] = None,
    ranker_max_new_tokens: Annotated[int | None, typer.Option(
        help="Ranker tokens per call, reason + ranking (default: --sizes').")] = None,
    passage_tokens: Annotated[int | None, typer.Option(
        help="Tokens of each passage shown to the agent (default: --sizes').")] = None,
    question_chunk: Annotated[int | None, typer.Option(
        help="Questions in flight at once (batch = G x this); bounds memory.")] = None,
    template: Annotated[str | None, typer.Option(
        help="Text file with the agent's instruction; it may use {question}, {max_turns} and the tag names "
             "{search_open}, {search_close}, {answer_open}, ... (default: the built-in one).")] = None,
    retriever: Annotated[str | None, typer.Option(help="bm25 or dense (default: the index's first).")] = None,
    encoder: Annotated[str | None, typer.Option(
        help="Query encoder the dense index must have been built with (checked; default: the index's).")] = None,
    constrain: Annotated[str, typer.Option(
        help="Constrained decoding: auto (on for each role whose model is the embedded one or a "
             "checkpoint trained from it), none, or agent,ranker.")] = "auto",
    lenient_ranker: Annotated[bool, typer.Option(
        "--lenient-ranker", help="Repair invalid llm rankings (keep valid ids, fill in retriever order) instead "
                                 "of falling back to the retriever's top-K; for evaluation.")] = False,
    shard: Annotated[str | None, typer.Option(
        help="i/N: run only the i-th (0-based) of N round-robin slices of the questions (job arrays).")] = None,
    limit: Annotated[int | None, typer.Option(help="Run only the first L questions (after --shard).")] = None,
    device: Device = "auto",
    gpu_fraction: Annotated[float | None, typer.Option(
        help="vLLM only: share of the GPU each engine takes (gpu_memory_utilization; default vLLM's 0.9, or "
             "0.45 each when agent and ranker are two models on one GPU).")] = None,
    dtype: Dtype = "float32",
    seed: Seed = 0,
    output: Output = "-",
    threads: Threads = None,
    quiet: Quiet = False,
) -> None:
    """Run the search agent G times per question; every search goes retriever top-N -> ranker -> K passages.

    Streams one JSON line per finished question (its G trajectories with token ids, loss mask and log-probs,
    and every ranker call) to stdout or -o, then the manifest (last line on stdout, a sidecar for a file).
    Pipe it into `cosearch group`. Without --questions and --index it runs the fixture's 104 training
    questions on indexes/fixture (with --n 8 about 40 min on a 2-core CPU: --limit runs fewer).
    """
    from cosearch_cli.index import index_location, open_index
    from cosearch_cli.rollout import LiveRollout, RolloutStats, constraint_factories, load_backend
    from cosearch_cli.rollout import preset as make_preset
    from cosearch_cli.rollout import run_rollouts

    preset = old_preset or preset
    if gpu_fraction is not None and not 0 < gpu_fraction < 1:
        raise ConfigError(f"--gpu-fraction {gpu_fraction} is not in (0, 1)", fix="e.g. --gpu-fraction 0.45")
    overrides = dict(n=n, max_turns=max_turns, top_n=top_n, k=k, max_new_tokens=max_new_tokens,
                     ranker_max_new_tokens=ranker_max_new_tokens, passage_tokens=passage_tokens,
                     question_chunk=question_chunk)
    config = make_preset(preset, ranker=ranker, greedy=greedy, temperature=temperature, top_p=top_p, seed=seed,
                         lenient_ranker=lenient_ranker, retriever=retriever,
                         **{key: value for key, value in overrides.items() if value is not None})
    if template is not None:
        config = replace(config, template=read_template(template))
    shard_i, shard_n = parse_shard(shard)
    if limit is not None and limit < 1:
        raise ConfigError("--limit must be at least 1", fix="leave it out to run every question")
    config.check(has_ranker_backend=True)

    questions = fixture_default(questions, "--questions", [str(FIXTURES / "train.jsonl")], quiet)
    index = fixture_default(index, "--index", FIXTURE_INDEX, quiet)
    use_threads(threads, quiet)
    all_questions, reader = read_questions(questions)
    todo = all_questions[shard_i::shard_n][:limit]
    opened = open_index(index)
    opened.retriever(retriever, encoder=encoder)  # fails now (not mid-run) on a missing or mismatched index
    ranker_model = ranker_model or agent
    engine = engine_options(backend, device, dtype)
    loading = dict(engine)
    if backend == "vllm":
        two_engines = ranker == "llm" and ranker_model != agent
        loading["gpu_memory_utilization"] = gpu_fraction or (0.45 if two_engines else 0.9)
    agent_backend = load_backend(agent, backend, **loading)
    ranker_backend = None
    if ranker == "llm":
        ranker_backend = agent_backend if ranker_model == agent else load_backend(ranker_model, backend, **loading)
    agent_c, ranker_c = constraint_factories(constrain, agent, agent_backend, ranker_backend, ranker_model)
    config = replace(config, agent_constraint=agent_c, ranker_constraint=ranker_c)

    options = {"questions": questions, "index": index_location(index), "agent": agent,
               "ranker_model": ranker_model if ranker == "llm" else None, "backend": backend, **engine,
               "preset": preset,
               "shard": f"{shard_i}/{shard_n}", "limit": limit, "encoder": encoder, **config.sampling()}
    stats = RolloutStats()
    with Writer(output) as writer, progress(quiet) as bar:
        task = bar.add("rollout", len(todo), unit="questions",
                       live=LiveRollout(stats, (agent_backend, ranker_backend), len(todo) * config.n))
        for record in run_rollouts(todo, agent=agent_backend, ranker_backend=ranker_backend, index=opened,
                                   config=config, stats=stats):
            writer.write(record)
            bar.advance(task)
        writer.manifest = make_manifest("rollout", options, inputs=reader.hashes, seed=seed,
                                        upstream=reader.upstream + [opened.manifest])
    if not quiet:
        stderr.print(summary(stats))


def summary(stats) -> str:
    spent = stats.agent_seconds + stats.ranker_seconds + stats.retrieval_seconds
    rate = (stats.agent_tokens + stats.ranker_tokens) / spent if spent else 0.0
    ranked = stats.ranker_calls - stats.ranker_no_candidates
    empty = f" ({stats.ranker_no_candidates} with no candidates)" if stats.ranker_no_candidates else ""
    invalid = f", {stats.ranker_invalid}/{ranked} invalid" if stats.ranker_tokens else ""
    return (f"{stats.trajectories} trajectories, {stats.format_failures} format failures; ranker calls "
            f"{stats.ranker_calls}{empty}{invalid}; {stats.agent_tokens + stats.ranker_tokens} tokens at "
            f"{rate:.1f}/s; agent {stats.agent_seconds:.1f} s, ranker {stats.ranker_seconds:.1f} s, retrieval "
            f"{stats.retrieval_seconds:.1f} s")

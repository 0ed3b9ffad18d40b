"""`cosearch warmup`: demonstrations from the training data, a brief supervised fine-tune, a HF checkpoint."""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Literal

import typer

from cosearch_cli.artifacts import Writer, make_manifest, sweep_temporaries, temporary_path, write_json_atomic
from cosearch_cli.cli import app
from cosearch_cli.cli.common import (Device, OldSizes, Overwrite, Quiet, Seed, Threads, progress, refuse_existing,
                                     stderr, use_threads)
from cosearch_cli.errors import ConfigError, NothingToDo
from cosearch_cli.ranker import RANKER_DEMOS


@app.command("warmup")
def warmup(
    questions: Annotated[list[str], typer.Option(
        "--questions", help="Training question JSONL file(s) or quoted globs (HotpotQA, MuSiQue, 2Wiki annotations "
                            "are used where present). Repeat for several files.")],
    index: Annotated[str, typer.Option(help="Index folder from `cosearch index`, or http://HOST:PORT of "
                                                           "`cosearch serve` (observations come from it).")],
    out: Annotated[str, typer.Option(help="Folder for the fine-tuned checkpoint (safetensors, tokenizer, config) "
                                          "and demonstrations.jsonl.")],
    model: Annotated[str, typer.Option(help="Model to fine-tune: 'smollm2' (embedded) or a local HF folder.")]
    = "smollm2",
    exclude: Annotated[list[str] | None, typer.Option(
        help="Evaluation question files (repeatable); refuse to train on any question in them.")] = None,
    preset: Annotated[Literal["cpu", "paper"], typer.Option(
        "--sizes", help="Rollout sizes (as in `cosearch rollout`) whose prompt format, T, N, K and passage lengths "
                        "the demonstrations follow.")] = "cpu",
    old_preset: OldSizes = None,
    max_turns: Annotated[int | None, typer.Option(help="T: most searches per demonstration (default: --sizes').")]
    = None,
    k: Annotated[int | None, typer.Option(help="K: passages shown per search (default: --sizes').")] = None,
    top_n: Annotated[int | None, typer.Option(
        help="N: retriever candidates per ranker demonstration (default: --sizes'); use the rollout's N.")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(
        help="Agent tokens per turn: the gold answer is shortened to fit (default: --sizes').")] = None,
    retriever: Annotated[str | None, typer.Option(help="bm25 or dense (default: the index's first).")] = None,
    ranker: Annotated[bool, typer.Option(help="Also train on ranker demonstrations (same model).")] = True,
    ranker_demos: Annotated[Literal[RANKER_DEMOS], typer.Option(
        help="Ranker calls to train on: 'all', or only 'evidence' ones (some candidate bears a gold answer or "
             "title). Calls without evidence demonstrate the retriever's order, so a ranker warmed up on them "
             "learns to copy the retriever. 'shuffled': the evidence calls with their candidates listed in a "
             "fixed random order, so position alone does not give the demonstrated choice. 'balanced': the "
             "evidence calls in the retriever's order, as many choosing its first candidate as choosing another "
             "(the surplus of the former left out).")] = "all",
    visible_evidence: Annotated[bool, typer.Option(
        "--visible-evidence", help="Count an answer as evidence only where the prompt shows it: ranker "
                                   "demonstrations judge each candidate by its first --ranker-passage-tokens "
                                   "tokens, agent ones need the answer in their observations' first "
                                   "--passage-tokens (default: anywhere in the passage, even past the cut).")]
    = False,
    passage_tokens: Annotated[int | None, typer.Option(
        help="Tokens of each passage the agent reads (default: --sizes'); use the rollout's value.")] = None,
    ranker_passage_tokens: Annotated[int | None, typer.Option(
        help="Tokens of each candidate the ranker reads (default: --sizes'); use the rollout's value.")] = None,
    keep_unsupported: Annotated[bool, typer.Option(
        "--keep-unsupported", help="Keep agent demonstrations whose observations never show a gold answer "
                                   "(default: drop them; they teach answering from memory).")] = False,
    epochs: Annotated[int, typer.Option(help="Passes over the demonstrations.")] = 1,
    lr: Annotated[float, typer.Option(help="AdamW learning rate.")] = 5e-5,
    token_budget: Annotated[int, typer.Option(help="Tokens (rows x longest row) per optimiser step.")] = 4096,
    limit: Annotated[int | None, typer.Option(help="Use only the first L training questions.")] = None,
    device: Device = "auto",
    dtype: Annotated[str, typer.Option(help="Compute dtype: float32, or bfloat16 (autocast over fp32 weights "
                                            "and AdamW state, as the update does).")] = "float32",
    seed: Seed = 0,
    overwrite: Overwrite = False,
    threads: Threads = None,
    quiet: Quiet = False,
) -> None:
    """Fine-tune briefly on demonstrations built from the data, so a small model starts with valid actions.

    Each training question becomes an agent trajectory (searches for its gold titles / decomposition / evidence
    triples, observations from the index, the gold answer) and ranker calls that put answer-bearing passages
    first, in exactly the rollout's format. Loss: cross-entropy on generated tokens only (prompts and
    observations masked). Writes a Hugging Face checkpoint usable as `--agent OUT` / `--model OUT`.
    """
    import torch

    from cosearch_cli.records import read_questions
    from cosearch_cli.index import index_location, open_index
    from cosearch_cli.models import load_causal_lm
    from cosearch_cli.update.precision import compute_in
    from cosearch_cli.rollout import preset as make_preset
    from cosearch_cli.warmup import DemoStats, FinetuneConfig, build_demonstrations, check_no_overlap, finetune

    if epochs < 1 or lr <= 0 or token_budget < 1:
        raise ConfigError("--epochs and --token-budget must be at least 1 and --lr positive",
                          fix="e.g. --epochs 1 --lr 5e-5 --token-budget 4096")
    preset = old_preset or preset
    refuse_existing(out, overwrite)
    use_threads(threads, quiet)
    given = dict(max_turns=max_turns, k=k, top_n=top_n, max_new_tokens=max_new_tokens, passage_tokens=passage_tokens,
                 ranker_passage_tokens=ranker_passage_tokens)
    overrides = {key: value for key, value in given.items() if value is not None}
    config = make_preset(preset, retriever=retriever, **overrides)
    config.top_n = max(config.top_n, config.k)
    train, reader = read_questions(questions)
    train = train[:limit] if limit else train
    hashes = dict(reader.hashes)
    for path in exclude or []:
        excluded, ex_reader = read_questions(path)
        check_no_overlap(train, excluded)
        hashes.update(ex_reader.hashes)
    opened = open_index(index)
    torch.manual_seed(seed)
    lm, tokenizer = load_causal_lm(model, device=device)

    stats = DemoStats()
    demos = build_demonstrations(train, index=opened, tokenizer=tokenizer, config=config,
                                 require_evidence=not keep_unsupported, with_ranker=ranker,
                                 ranker_demos=ranker_demos, visible_evidence=visible_evidence, stats=stats)
    if not demos:
        raise NothingToDo("no demonstrations: no question's searches showed a gold answer",
                          fix="check that the index holds the questions' corpus, or pass --keep-unsupported")
    if not quiet:
        stderr.print(f"{stats.agent} agent and {stats.ranker} ranker demonstrations from {stats.questions} "
                     f"questions ({stats.skipped_no_evidence} without evidence skipped"
                     + (f"; {stats.ranker_uninformed_skipped} ranker calls without evidence skipped)"
                        if ranker_demos != "all" else ")"))
    ft = FinetuneConfig(epochs=epochs, lr=lr, token_budget=token_budget, seed=seed)
    with progress(quiet) as bar:
        task = bar.add("warm-up", unit="steps")
        losses = finetune(compute_in(lm, dtype), demos, ft, pad_id=tokenizer.pad_token_id or 0,
                          on_step=lambda i, total, loss: bar.update(task, done=i, total=total,
                                                                    label=f"warm-up loss {loss:.3f}"))

    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    sweep_temporaries(target.parent)  # e.g. a warm-up killed with -9 while saving
    tmp = temporary_path(target)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        lm.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        _write_demos(tmp / "demonstrations.jsonl", demos, tokenizer)
        options = {"questions": questions, "index": index_location(index), "model": model,
                   "exclude": exclude or [], "preset": preset, "max_turns": config.max_turns, "k": config.k,
                   "top_n": config.top_n, "max_new_tokens": config.max_new_tokens, "retriever": retriever,
                   "ranker": ranker,
                   "passage_tokens": config.passage_tokens, "ranker_passage_tokens": config.ranker_passage_tokens,
                   "ranker_demos": ranker_demos, "visible_evidence": visible_evidence,
                   "keep_unsupported": keep_unsupported, "limit": limit, **asdict(ft)}
        manifest = make_manifest("warmup", options, inputs=hashes, seed=seed,
                                 upstream=reader.upstream + [opened.manifest])
        manifest["demonstrations"] = asdict(stats)
        manifest["losses"] = {"first": losses[0], "last": losses[-1], "steps": len(losses)}
        write_json_atomic(tmp / "warmup.manifest.json", manifest)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not quiet:
        stderr.print(f"warm-up: {len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}; checkpoint in {out}")


def _write_demos(path: Path, demos, tokenizer) -> None:
    with Writer(path) as w:
        for d in demos:
            w.write({"key": d.key, "role": d.role, "queries": d.queries, "answer_shown": d.answer_shown,
                     "token_ids": d.token_ids, "mask": d.mask,
                     "generated_text": tokenizer.decode([t for t, m in zip(d.token_ids, d.mask) if m])})

"""`cosearch group`: GRPO groups for agent and ranker from rollout records."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict
from typing import Annotated, Literal

import orjson
import typer

from cosearch_cli import grouping
from cosearch_cli.artifacts import Reader, Writer, dumps, make_manifest, mark_partial
from cosearch_cli.cli import app
from cosearch_cli.cli.common import AllowPartial, Inputs, OldRules, Output, Quiet, stderr
from cosearch_cli.errors import InputError, RecordError
from cosearch_cli.gcpause import paused_gc
from cosearch_cli.records import GroupInfo, RolloutRecord, read_rollout

Preset = Annotated[Literal["paper", "official"], typer.Option(
    "--rules", help="Named rules: paper (size >= k_min) or official code (size > k_min); "
         "the options below override single values.")]
Summary = Annotated[str | None, typer.Option(help="Also write one row per group (question_id, group, role, size, "
                                                  "kept, reason) to this .parquet or .jsonl path.")]


def iter_records(inputs: list[str], min_stage: str, check, allow_partial: bool = False
                 ) -> tuple[Reader, Iterator[RolloutRecord]]:
    """The inputs' records, each checked as it is read; a question that appears twice (e.g. overlapping
    shards) is refused."""
    reader = Reader.open(inputs or ["-"], stage_stream=True, allow_partial=allow_partial)

    def records() -> Iterator[RolloutRecord]:
        first_seen: dict[str, str] = {}
        for row in reader.rows():
            record = read_rollout(row.data, row.path, row.line, min_stage=min_stage)
            if record.question_id in first_seen:
                raise RecordError(f"question {record.question_id!r} appears twice (first at "
                                  f"{first_seen[record.question_id]})", path=row.path, line=row.line,
                                  fix="pass each question's rollouts once: shards must not overlap")
            first_seen[record.question_id] = f"{row.path}:{row.line}"
            check(record, row.path, row.line)
            yield record

    return reader, records()


def read_records(inputs: list[str], min_stage: str, check, allow_partial: bool = False
                 ) -> tuple[list[RolloutRecord], Reader]:
    """Every record of the inputs in memory (for stages that need the whole batch), checked."""
    reader, records = iter_records(inputs, min_stage, check, allow_partial)
    out = list(records)
    if not out:
        raise no_records(inputs)
    return out, reader


def no_records(inputs: list[str] | None) -> InputError:
    """Empty input is bad input data (exit 3) in every stage."""
    return InputError("the input holds no rollout records", path=", ".join(inputs or ["-"]),
                      fix="check the upstream stage's output")


def write_outputs(items: list, groups: list[tuple[str, list[GroupInfo]]], output: str, summary: str | None,
                  manifest: dict) -> None:
    """Records (or their serialised lines) to `output`, one row per group to `summary`, both atomically."""
    with Writer(output) as writer:
        writer.write_all(items)
        writer.manifest = manifest
    if summary:
        with Writer(summary) as writer:
            writer.write_all(grouping.summary_rows(groups))
            writer.manifest = manifest


@app.command("group")
def group(
    inputs: Inputs = None,
    output: Output = "-",
    preset: Preset = "paper",
    old_preset: OldRules = None,
    tau: Annotated[float | None, typer.Option(help="Unigram F1 a normalised sub-query needs with a cluster's "
                                                   "first member to join it. Default 0.8 (both rule sets).")] = None,
    kmin: Annotated[int | None, typer.Option(help="Smallest ranker cluster that trains. Default 3.")] = None,
    kmin_strict: Annotated[bool | None, typer.Option(
        "--kmin-strict/--kmin-inclusive",
        help="Strict keeps clusters of size > k_min (official code); inclusive keeps size >= k_min (paper). "
             "Default: --rules'.")] = None,
    summary: Summary = None,
    allow_partial: AllowPartial = False,
    quiet: Quiet = False,
) -> None:
    """Form GRPO groups: the G trajectories of a question for the agent, and clusters of similar ranker calls
    (same question, easy/hard split, greedy sub-query clustering) for the ranker.

    Reads rollout records (several files or globs, e.g. shard outputs) and writes them at stage "grouped" with
    `groups` filled and every trajectory and ranker call naming its group. Ranker calls from trajectories
    that failed the agent's format check are left out before clustering. Clusters whose rewards turn out all
    equal are dropped later, by `cosearch reward`.
    """
    preset = old_preset or preset
    config = grouping.resolve_config(preset, tau=tau, kmin=kmin, kmin_strict=kmin_strict)
    reader, records = iter_records(inputs, "rollout", grouping.check_rollout, allow_partial)
    # Questions group independently, so each record is serialised as soon as it is grouped and only its
    # line is kept: nothing reaches the output before every input line has been read and checked.
    lines, groups = [], []
    with paused_gc():
        for record in records:
            grouping.group_record(record, config)
            lines.append(orjson.Fragment(dumps(record)[:-1]))
            groups.append((record.question_id, record.groups))
    if not lines:
        raise no_records(inputs)
    manifest = mark_partial(make_manifest("group", {"preset": preset, **asdict(config)}, inputs=reader.hashes,
                                          upstream=reader.upstream), [reader])
    write_outputs(lines, groups, output, summary, manifest)
    if not quiet:
        stderr.print(f"group: {len(lines):,} questions, rules {preset} (tau {config.tau}, keep size "
                     f"{'>' if config.kmin_strict else '>='} {config.kmin})\n{grouping.describe_groups(groups)}",
                     highlight=False, markup=False, soft_wrap=True)

"""`cosearch train`: config checks before any work, question slicing, and a short resumable run."""

from pathlib import Path

import orjson
import pytest

from cosearch_cli.errors import ConfigError
from cosearch_cli.records import Question
from cosearch_cli.train import PRESETS, TrainConfig, iteration_questions, load_config


def test_unknown_key_is_named_before_any_work(tmp_path, cli):
    config = tmp_path / "c.toml"
    config.write_text(f'name = "x"\nout = "{tmp_path / "runs"}"\nlearning_rate = 0.1\n')
    result = cli("train", "--config", config)
    assert result.exit_code == 4
    assert "unknown config key 'learning_rate'" in result.stderr and result.stderr.count("\n") == 1
    assert not (tmp_path / "runs").exists()


def test_impossible_values_are_rejected_with_the_key(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text("n = 2\nmax_turns = 2\nkmin = 5\n")  # at most 2 x 2 = 4 ranker calls per question
    with pytest.raises(ConfigError, match="config key 'kmin'"):
        load_config(config)
    config.write_text('iterations = "three"\n')
    with pytest.raises(ConfigError, match="'iterations' should be int, got str"):
        load_config(config)
    with pytest.raises(ConfigError, match="'train_ranker' needs ranker = 'llm'"):
        load_config(ranker="none", train_ranker=True)
    with pytest.raises(ConfigError, match="unknown preset"):
        load_config(preset="nope")


def test_preset_then_file_then_options(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text("iterations = 7\nlr = 1\n")  # an int where a float is expected is fine
    cfg = load_config(config, preset="search-r1", iterations=9)
    assert (cfg.ranker, cfg.train_ranker, cfg.iterations, cfg.lr) == ("none", False, 9, 1.0)
    # the comparison presets differ only in what the paper varies, so they cost the same compute
    base = {k: v for k, v in vars(TrainConfig()).items() if k not in ("name", "ranker", "train_ranker")}
    for name in ("search-r1", "fixed-ranker", "cosearch"):
        cfg = vars(load_config(preset=name))
        assert {k: cfg[k] for k in base} == base, name
    assert set(PRESETS) >= {"demo", "search-r1", "fixed-ranker", "cosearch", "paper-7b"}


def test_iteration_questions_cycle_through_a_fixed_shuffle():
    questions = [Question(str(i), "?", ["a"]) for i in range(5)]
    cfg = TrainConfig(questions_per_iteration=2, seed=1)
    first_epoch = [q.id for i in range(2) for q in iteration_questions(questions, cfg, i)] + \
        [iteration_questions(questions, cfg, 2)[0].id]
    assert sorted(first_epoch) == ["0", "1", "2", "3", "4"]  # every question once per epoch
    assert iteration_questions(questions, cfg, 1) == iteration_questions(questions, cfg, 1)


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, tiny_lm):
    model, tokenizer = tiny_lm
    folder = tmp_path_factory.mktemp("tiny-lm")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _config(tmp_path: Path, model: Path, **overrides) -> TrainConfig:
    values = dict(name="t", out=str(tmp_path / "runs"), index=str(tmp_path / "index"), agent=str(model),
                  ranker_model=str(model), constrain="agent,ranker", iterations=2, questions_per_iteration=1,
                  n=2, kmin=2, max_turns=1, max_new_tokens=24, top_n=4, k=2, eval_limit=1, lr=1e-3,
                  kl_coef=0.001, eval_every=0, seed=3)
    values.update(overrides)
    return load_config(**values)


def _artifacts(root: Path) -> dict[str, bytes]:
    """Every artifact of a run except what records wall-clock time (manifests, metrics with seconds)."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.name.endswith((".manifest.json", "manifest.json", "metrics.json",
                                                        "metrics.parquet", ".png", ".toml")):
            out[str(path.relative_to(root))] = path.read_bytes()
    return out


def test_short_run_completes_and_resumes_to_the_same_artifacts(tmp_path, tiny_model_dir, monkeypatch):
    from cosearch_cli import train as training

    # uninterrupted
    straight = _config(tmp_path / "a", tiny_model_dir)
    root = training.Runner(straight).run()
    import polars as pl

    log = pl.read_parquet(root / "metrics.parquet")
    assert log["iteration"].to_list() == [-1, 0, 1]
    assert {"train_reward", "ranker_hit_at_k", "search_turns", "dev_f1"} <= set(log.columns)
    assert (root / "curves.png").stat().st_size > 0
    assert (root / "iter-0001" / "agent" / "model.safetensors").is_file() or \
        (root / "iter-0001" / "agent.skipped.json").is_file()

    # killed right after the first iteration's reward step, then started again
    killed = _config(tmp_path / "b", tiny_model_dir)
    original = training.Runner.update

    def die(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(training.Runner, "update", die)
    with pytest.raises(KeyboardInterrupt):
        training.Runner(killed).run()
    resumed_root = Path(killed.out) / killed.name
    assert (resumed_root / "iter-0000" / "scored.jsonl").is_file()
    assert not (resumed_root / "iter-0000" / "metrics.json").exists()
    monkeypatch.setattr(training.Runner, "update", original)
    training.Runner(killed).run()
    assert _artifacts(resumed_root) == _artifacts(root)
    rows = [orjson.loads(line) for line in (root / "iter-0000" / "scored.jsonl").read_bytes().splitlines()]
    assert all(r["stage"] == "scored" for r in rows)


def test_rerun_with_other_options_is_refused(tmp_path, tiny_model_dir):
    from cosearch_cli import train as training

    cfg = _config(tmp_path, tiny_model_dir, iterations=1, eval_init=False)
    training.Runner(cfg).prepare()
    with pytest.raises(ConfigError, match="holds a run with another configuration"):
        training.Runner(_config(tmp_path, tiny_model_dir, iterations=1, eval_init=False, lr=0.5)).prepare()


def test_a_finished_run_continues_to_more_iterations_as_the_longer_run(tmp_path, tiny_model_dir):
    from cosearch_cli import train as training

    longer = training.Runner(_config(tmp_path / "a", tiny_model_dir, iterations=2, eval_init=False)).run()
    short = _config(tmp_path / "b", tiny_model_dir, iterations=1, eval_init=False)
    root = training.Runner(short).run()
    assert (root / "iter-0000" / "eval").is_dir() and not (root / "iter-0001").exists()
    with pytest.raises(ConfigError, match="another configuration"):  # only `iterations` may change
        training.Runner(_config(tmp_path / "b", tiny_model_dir, iterations=2, eval_init=False, lr=0.5)).prepare()
    messages = []
    training.Runner(_config(tmp_path / "b", tiny_model_dir, iterations=2, eval_init=False),
                    log=messages.append).run()
    assert f"continuing {root} from 1 to 2 iterations" in messages
    assert "iterations = 2\n" in (root / "config.toml").read_text()
    extended = _artifacts(root)
    # the old last iteration's evaluation stays; everything else is the 2-iteration run's, byte for byte
    assert {k: v for k, v in extended.items() if not k.startswith("iter-0000/eval")} == _artifacts(longer)
    with pytest.raises(ConfigError, match="holds a run of 2 iterations; --iterations 1 would shorten it"):
        training.Runner(_config(tmp_path / "b", tiny_model_dir, iterations=1, eval_init=False)).prepare()


def test_a_run_folder_copied_under_another_name_continues_as_that_run(tmp_path, tiny_model_dir):
    import shutil

    from cosearch_cli import train as training

    training.Runner(_config(tmp_path, tiny_model_dir, name="a", iterations=1, eval_init=False)).prepare()
    shutil.copytree(tmp_path / "runs" / "a", tmp_path / "moved" / "b")
    messages = []
    branch = _config(tmp_path, tiny_model_dir, name="b", out=str(tmp_path / "moved"), iterations=3, eval_init=False)
    training.Runner(branch, log=messages.append).prepare()
    root = tmp_path / "moved" / "b"
    assert messages == [f"continuing {root} (a copy of the run named a) from 1 to 3 iterations"]
    assert 'name = "b"\n' in (root / "config.toml").read_text()
    assert 'name = "a"\n' in (tmp_path / "runs" / "a" / "config.toml").read_text()  # the original is untouched
    with pytest.raises(ConfigError, match="another configuration"):  # a copy still refuses other options
        training.Runner(_config(tmp_path, tiny_model_dir, name="b", out=str(tmp_path / "moved"), iterations=3,
                                eval_init=False, lr=0.5)).prepare()


def test_demo_flow_reuses_the_final_evaluation_for_the_oracle_study(tmp_path, tiny_model_dir):
    from cosearch_cli import train as training
    from cosearch_cli.demo import run_demo

    cfg = _config(tmp_path, tiny_model_dir, iterations=1, eval_init=True)
    runner = training.Runner(cfg)
    summary = run_demo(cfg, runner)
    root = Path(summary["run"])
    final_eval = (root / "iter-0000" / "eval" / "rollouts.jsonl").read_bytes()
    standard = (root / "oracle" / "llm.jsonl").read_bytes()
    assert [orjson.loads(x)["trajectories"] for x in final_eval.splitlines()] == \
        [orjson.loads(x)["trajectories"] for x in standard.splitlines()]
    assert [row["ranker"] for row in summary["oracle_table"]] == ["llm", "oracle"]
    assert any("relative gap" in line for line in summary["lines"]) and (root / "oracle" / "report.md").is_file()
    # what training changed, with paired CIs, and what each update did
    assert "95% CI" in summary["lines"][0] and summary["lines"][0].startswith("held-out dev F1 (1 questions")
    for key in ("kl_agent", "kl_ranker", "ranker_groups_kept", "dev_f1_gain_ci", "ranker_hit1_init"):
        assert key in summary
    learning = orjson.loads((root / "learning.json").read_bytes())
    assert learning["dev_f1_trained"] == summary["dev_f1_trained"]
    assert learning["dev_f1_gain_ci"][0] <= learning["dev_f1_trained"] - learning["dev_f1_init"] <= \
        learning["dev_f1_gain_ci"][1]
    # the training reward is printed with its CI over the iteration's questions (as curves.png draws it)
    (low, high), reward = learning["train_reward_ci"][0], learning["train_reward"][0]
    assert low <= reward <= high
    (line,) = [x for x in summary["lines"] if x.startswith("training reward per iteration (95% CI")]
    assert line.endswith(f"{reward:.3f} [{low:.3f}, {high:.3f}]")
    # this tiny agent never searched, so no ranker call can be re-ranked and there are no held-out ranker points
    assert learning["ranker_calls"] is None and not (root / "ranker-heldout.json").exists()


def test_the_demos_oracle_study_is_redone_when_the_models_it_was_made_with_changed(tmp_path, tiny_model_dir):
    from dataclasses import asdict

    from cosearch_cli import train as training
    from cosearch_cli.demo import run_demo

    cfg = _config(tmp_path, tiny_model_dir, iterations=1, eval_init=True)
    root = Path(run_demo(cfg, training.Runner(cfg))["run"])
    models = asdict(training.current_models(training.RunPaths(root), cfg, 1))
    folder = root / "oracle"
    assert orjson.loads((folder / "models.json").read_bytes()) == models

    def rerun() -> list[str]:
        messages = []
        run_demo(cfg, training.Runner(cfg, log=messages.append))
        return [m for m in messages if m.startswith("the oracle study in")]

    assert rerun() == []  # same models: the finished halves are reused
    # as after `--iterations` grew: the halves were made with the models of an earlier iteration
    (folder / "models.json").write_bytes(orjson.dumps({"agent": "iter-0000/agent", "ranker": "iter-0000/ranker"}))
    (folder / "oracle.jsonl").write_bytes(b"stale\n")
    assert rerun() == [f"the oracle study in {folder} was made with iter-0000/agent; redoing it with {models['agent']}"]
    assert orjson.loads((folder / "models.json").read_bytes()) == models
    assert orjson.loads((folder / "oracle.manifest.json").read_bytes())["options"]["models"] == models
    assert (folder / "oracle.jsonl").read_bytes() != b"stale\n"
    # a folder from before models.json was written: a finished half's manifest says which models made it
    (folder / "models.json").unlink()
    manifest = orjson.loads((folder / "llm.manifest.json").read_bytes())
    manifest["options"]["models"] = {"agent": "older", "ranker": "older"}
    (folder / "llm.manifest.json").write_bytes(orjson.dumps(manifest))
    assert rerun() == [f"the oracle study in {folder} was made with older; redoing it with {models['agent']}"]


def test_the_rankers_held_out_hit1_joins_the_metrics_rows_and_the_curves(tmp_path):
    from test_ranker_quality import hand_records

    from cosearch_cli import train as training
    from cosearch_cli.demo import write_heldout_ranker
    from cosearch_cli.ranker_quality import fixed_calls, recorded_scores, retriever_scores

    cfg = TrainConfig(name="d", out=str(tmp_path), iterations=1)
    runner = training.Runner(cfg)
    paths = runner.paths
    for folder, row in (("eval-base", {"iteration": -2, "dev_f1": 0.1}),
                        ("eval-init", {"iteration": -1, "dev_f1": 0.3}),
                        ("iter-0000", {"iteration": 0, "train_reward": 0.2, "dev_f1": 0.25})):
        (paths.root / folder).mkdir(parents=True)
        (paths.root / folder / "metrics.json").write_bytes(orjson.dumps(row))
    calls = fixed_calls(hand_records())
    # Hit@1 by hand (test_ranker_quality): retriever 0.25, the recorded ranker 0.75; one counted question per
    # dataset, so each CI is its point
    write_heldout_ranker(paths.heldout_ranker, calls, [(-2, retriever_scores(calls)), (0, recorded_scores(calls))])
    runner.write_metrics_log()
    heldout = orjson.loads(paths.heldout_ranker.read_bytes())
    assert (heldout["calls"], heldout["calls_with_answer"], heldout["questions"]) == (4, 3, 3)
    import polars as pl

    frame = pl.read_parquet(paths.metrics).sort("iteration")
    assert frame["iteration"].to_list() == [-2, -1, 0] and frame["dev_f1"].to_list() == [0.1, 0.3, 0.25]
    assert frame["heldout_ranker_hit1"].to_list() == [0.25, None, 0.75]
    assert frame["heldout_ranker_hit1_ci_low"].to_list() == [0.25, None, 0.75]
    assert frame["heldout_retriever_hit1"].to_list() == [0.25, None, 0.25]
    assert (paths.root / "curves.png").is_file()
    runner.write_metrics_log()  # rebuilt from the files: the same rows, not duplicated
    assert pl.read_parquet(paths.metrics).height == 3


def test_eval_questions_cover_every_dataset_first():
    from cosearch_cli.train import eval_questions

    questions = [Question(f"{d}{i}", "?", ["a"], dataset=d) for d in ("nq", "hotpotqa", "musique") for i in range(3)]
    assert [q.id for q in eval_questions(questions, 4)] == ["nq0", "hotpotqa0", "musique0", "nq1"]
    assert eval_questions(questions, 0) == questions


def test_older_checkpoints_are_deleted_and_the_newest_kept(tmp_path, tiny_model_dir):
    from cosearch_cli import train as training

    cfg = _config(tmp_path, tiny_model_dir, iterations=5)
    paths = training.RunPaths(Path(cfg.out) / cfg.name)
    # agent trained in iterations 0, 1, 3 (2 skipped), ranker in 0 and 2; iteration 4 has not finished
    for i, role in ((0, "agent"), (1, "agent"), (3, "agent"), (0, "ranker"), (2, "ranker"), (4, "agent")):
        folder = paths.iteration(i) / role
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        (folder / "model.safetensors").write_bytes(b"w")
        (folder / "optimizer.pt").write_bytes(b"adam")
    (paths.iteration(2) / "scored.jsonl").write_text("kept\n")

    training.prune_checkpoints(paths, 0, upto=4)
    assert len(list(paths.root.glob("iter-*/*/config.json"))) == 6
    # every checkpoint stays, but only the newest finished one per role keeps its optimizer state (resume)
    with_state = sorted(str(p.parent.relative_to(paths.root)) for p in paths.root.glob("iter-*/*/optimizer.pt"))
    assert with_state == ["iter-0002/ranker", "iter-0003/agent", "iter-0004/agent"]
    training.prune_checkpoints(paths, 1, upto=4)
    left = sorted(str(p.parent.relative_to(paths.root)) for p in paths.root.glob("iter-*/*/config.json"))
    assert left == ["iter-0002/ranker", "iter-0003/agent", "iter-0004/agent"]
    assert (paths.iteration(2) / "scored.jsonl").read_text() == "kept\n"
    # a run resumed at iteration 4 starts from exactly what was kept
    models = training.current_models(paths, cfg, 4)
    assert (models.agent, models.ranker) == (str(paths.iteration(3) / "agent"), str(paths.iteration(2) / "ranker"))
    with pytest.raises(ConfigError, match="keep_checkpoints"):
        _config(tmp_path / "c", tiny_model_dir, keep_checkpoints=-1)


def test_lr_warmup_rises_linearly_then_stays():
    from cosearch_cli.train import lr_at

    cfg = TrainConfig(lr=1e-5, lr_warmup=4)
    assert [lr_at(cfg, i) for i in range(6)] == pytest.approx([2.5e-6, 5e-6, 7.5e-6, 1e-5, 1e-5, 1e-5])
    assert lr_at(TrainConfig(lr=1e-5), 0) == 1e-5


def test_question_stream_continues_the_iteration_slices():
    from itertools import islice

    from cosearch_cli.train import question_stream

    questions = [Question(str(i), "?", ["a"]) for i in range(5)]
    cfg = TrainConfig(questions_per_iteration=2, seed=1)
    sliced = [q.id for i in range(6) for q in iteration_questions(questions, cfg, i)]
    assert [q.id for q in islice(question_stream(questions, 1, 0), 12)] == sliced
    assert [q.id for q in islice(question_stream(questions, 1, 3), 4)] == sliced[3:7]  # across an epoch's end


def test_has_spread_needs_two_unequal_rewards():
    from cosearch_cli.records import RolloutRecord, Trajectory
    from cosearch_cli.train import has_spread

    def record(*rewards):
        trajs = [Trajectory(sample=i, turns=[], answer=None, n_searches=0, format_ok=True, token_ids=[],
                            loss_mask=[], logprobs=[], prompt_len=0, reward=r) for i, r in enumerate(rewards)]
        return RolloutRecord("q", "?", ["a"], "nq", trajs)

    assert has_spread(record(0.0, 0.5, 0.0))
    assert not has_spread(record(0.3, 0.3, 0.3))
    assert not has_spread(record(1.0))
    assert not has_spread(record(None, 1.0))


def test_dynamic_sampling_draws_until_enough_groups_or_the_cap(tmp_path, tiny_model_dir):
    from cosearch_cli import train as training

    # the random tiny model answers nothing: every group is flat, so each iteration draws up to its cap
    cfg = _config(tmp_path, tiny_model_dir, iterations=2, questions_per_iteration=1, dynamic_sampling=True,
                  max_draw=3, eval_init=False, train_ranker=False, max_new_tokens=8)
    root = training.Runner(cfg).run()
    rows = [orjson.loads((root / f"iter-{i:04d}" / "metrics.json").read_bytes()) for i in range(2)]
    assert [r["questions_drawn"] for r in rows] == [3, 3]
    drawn = [[orjson.loads(x)["question_id"] for x in (root / f"iter-{i:04d}" / "rollouts.jsonl").read_bytes()
              .splitlines() if b'"kind"' not in x[:20]] for i in range(2)]
    from cosearch_cli.train import question_stream, read_questions
    from itertools import islice

    expected = [q.id for q in islice(question_stream(read_questions(cfg.questions), cfg.seed, 0), 6)]
    assert drawn[0] + drawn[1] == expected  # iteration 1 continues where iteration 0 stopped
    assert (root / "iter-0000" / "agent.skipped.json").is_file()  # no group with a spread: nothing to train


def test_rl_draws_only_answerable_questions_and_the_warmup_all(tmp_path, tiny_model_dir):
    from itertools import islice

    from cosearch_cli import train as training
    from cosearch_cli.answerable import answerable_questions
    from cosearch_cli.models import load_tokenizer
    from cosearch_cli.train import question_stream, read_questions

    with pytest.raises(ConfigError, match="rl_questions"):
        _config(tmp_path, tiny_model_dir, rl_questions="easy")
    cfg = _config(tmp_path, tiny_model_dir, iterations=1, questions_per_iteration=1, dynamic_sampling=True,
                  max_draw=3, eval_init=False, train_ranker=False, max_new_tokens=8, top_n=5, k=3,
                  rl_questions="answerable")
    lines = []
    runner = training.Runner(cfg, log=lines.append)
    root = runner.run()
    every = read_questions(cfg.questions)
    pool = answerable_questions(every, index=runner.index, retriever=None, tokenizer=load_tokenizer(cfg.agent),
                                k=3, top_n=5, passage_tokens=cfg.passage_tokens)
    assert 0 < len(pool) < len(every)
    assert any(f"RL draws from the {len(pool)} of {len(every)} training questions" in line for line in lines)
    drawn = [orjson.loads(x)["question_id"] for x in (root / "iter-0000" / "rollouts.jsonl").read_bytes()
             .splitlines() if b'"kind"' not in x[:20]]
    assert drawn == [q.id for q in islice(question_stream(pool, cfg.seed, 0), 3)]
    assert set(drawn) <= {q.id for q in pool}
    with pytest.raises(ConfigError, match="no training question is answerable"):
        runner.rl_questions([q for q in every if q not in pool][:3])


def test_metrics_log_has_the_update_diagnostics(tmp_path, tiny_model_dir, monkeypatch):
    from cosearch_cli import train as training
    import polars as pl

    def alternate(records, **_):  # the random model's groups are flat; give the agent a signal to train on
        for record in records:
            for group in record.groups:
                group.kept, group.reason = group.role == "agent", "" if group.role == "agent" else "singleton"
            for t in record.trajectories:
                t.advantage = 1.0 if t.sample % 2 == 0 else -1.0

    monkeypatch.setattr(training.advantages, "assign_advantages", alternate)
    cfg = _config(tmp_path, tiny_model_dir, iterations=1, lr_warmup=2, heldout_kl=2, train_ranker=False)
    root = training.Runner(cfg).run()
    log = pl.read_parquet(root / "metrics.parquet")
    wanted = {"agent_kl_batch", "agent_kl_heldout", "agent_grad_norm", "agent_grad_norm_clipped", "agent_lr",
              "agent_adv_token_share", "agent_norm_tokens", "agent_entropy", "agent_clip_frac", "questions_drawn"}
    assert wanted <= set(log.columns)
    row = orjson.loads((root / "iter-0000" / "metrics.json").read_bytes())
    assert row["agent_skipped"] is False
    assert row["agent_lr"] == pytest.approx(cfg.lr / 2)
    assert row["agent_adv_token_share"] == 1.0  # every member has a non-zero advantage
    assert row["agent_kl_batch"] > 0 and row["agent_kl_heldout"] > 0


def test_warmup_runs_first_and_the_run_starts_from_it(tmp_path, tiny_model_dir):
    from cosearch_cli import train as training

    cfg = _config(tmp_path, tiny_model_dir, iterations=1, warmup_questions=3, warmup_epochs=1, kl_coef=0.001,
                  passage_tokens=24, ranker_passage_tokens=12)
    runner = training.Runner(cfg)
    root = runner.run()
    warm = root / "warmup"
    manifest = orjson.loads((warm / "warmup.manifest.json").read_bytes())
    assert (warm / "model.safetensors").is_file() and manifest["options"]["demonstrations"]["questions"] == 3
    # the demonstrations show the passages as the run's rollouts do
    assert manifest["options"]["shown"] == {"passage_tokens": 24, "ranker_passage_tokens": 12,
                                            "visible_evidence": False}
    assert (root / "eval-base" / "summary.json").is_file() and (root / "eval-init" / "summary.json").is_file()
    # eval-base ran the given model, eval-init and the first iteration the warm-up checkpoint
    assert orjson.loads((root / "eval-base" / "rollouts.manifest.json").read_bytes())["options"]["models"][
        "agent"] == str(tiny_model_dir)
    assert orjson.loads((root / "eval-init" / "rollouts.manifest.json").read_bytes())["options"]["models"][
        "agent"] == str(warm)
    models = training.current_models(runner.paths, cfg, 0)
    assert (models.agent, models.ranker) == (str(warm), str(warm))
    assert runner._reference("agent") is not None and runner._ref[0] == str(warm)
    with pytest.raises(ConfigError, match="warmup"):
        _config(tmp_path / "c", tiny_model_dir, warmup_epochs=0)
    with pytest.raises(ConfigError, match="warmup_ranker_demos"):
        _config(tmp_path / "d", tiny_model_dir, warmup_ranker_demos="some")
    assert manifest["options"]["demonstrations"]["ranker_uninformed_skipped"] == 0  # "all" keeps every call
    # metrics.parquet (and curves.png) hold the given models' evaluation at -2 and the start's at -1, each
    # dev F1 with its CI (the summary's f1_ci)
    import polars as pl

    log = pl.read_parquet(root / "metrics.parquet").sort("iteration")
    assert log["iteration"].to_list() == [-2, -1, 0]
    base = orjson.loads((root / "eval-base" / "summary.json").read_bytes())
    assert log.row(0, named=True)["dev_f1_ci_low"] == base["f1_ci"][0]
    assert all(r["dev_f1_ci_low"] <= r["dev_f1"] <= r["dev_f1_ci_high"] for r in log.iter_rows(named=True))


def test_curve_cis_resample_whole_questions_by_hand():
    from types import SimpleNamespace

    from cosearch_cli.train import _ci_columns, _eval_row, _f1_ci

    # q1: three trajectories at 1, q2: one at 0 (pooled mean 3/4). A replicate draws two questions: q1 twice
    # -> 1 (p 1/4), q2 twice -> 0 (p 1/4), one each -> 3/4 (p 1/2); so the 95% interval is [0, 1]. A question
    # with no values (no trajectory with a reward, no valid ranker call) is left out.
    assert _ci_columns("train_reward", [[1.0, 1.0, 1.0], [0.0], []]) == {"train_reward_ci_low": 0.0,
                                                                          "train_reward_ci_high": 1.0}
    assert _ci_columns("ranker_hit_at_k", [[0.5], [0.5, 0.5]]) == {"ranker_hit_at_k_ci_low": 0.5,
                                                                  "ranker_hit_at_k_ci_high": 0.5}
    assert _ci_columns("x", [[]]) == {"x_ci_low": None, "x_ci_high": None}
    # dev F1 is the unweighted mean over datasets, resampled within each: nq always 1, hotpotqa always 0.
    scores = [SimpleNamespace(dataset=d, f1=f) for d, f in (("nq", 1.0), ("nq", 1.0), ("hotpotqa", 0.0))]
    assert _f1_ci(SimpleNamespace(questions=scores)) == [0.5, 0.5]
    summary = {"groups": [{"dataset": "average", "f1": 0.5, "em": 0.5, "searches": 1.0, "format_fail": 0.0}]}
    assert _eval_row(0, summary)["dev_f1_ci_low"] is None  # a summary made before f1_ci was kept
    assert _eval_row(0, {**summary, "f1_ci": [0.5, 0.5]})["dev_f1_ci_high"] == 0.5


def test_demo_summary_says_which_models_were_updated_with_how_many_groups(tmp_path):
    from cosearch_cli.demo import _updates_line

    rows = [{"iteration": 0, "agent_skipped": True, "ranker_skipped": True, "agent_groups_kept": 0},
            {"iteration": 1, "agent_skipped": False, "agent_groups_kept": 2, "ranker_skipped": True,
             "ranker_groups_kept": 0},
            {"iteration": 2, "agent_skipped": True, "ranker_skipped": True}]
    for row in rows:
        folder = tmp_path / f"iter-{row['iteration']:04d}"
        folder.mkdir()
        (folder / "metrics.json").write_bytes(orjson.dumps(row))
    assert _updates_line(tmp_path, TrainConfig()) == (
        "updates: agent updated in 1 of 3 iterations (iteration 1: 2 groups), ranker updated in 0 of 3 "
        "iterations (no kept group with unequal rewards)")
    assert _updates_line(tmp_path, TrainConfig(train_ranker=False)).endswith(", ranker frozen")


def test_greedy_baseline_rolls_out_each_drawn_question_greedily_and_measures_from_it(tmp_path, tiny_model_dir,
                                                                                     monkeypatch):
    from cosearch_cli import train as training
    from cosearch_cli.rewards import agent_reward, resolve_config

    # the random tiny model's samples all score what its greedy answer scores (nothing): a baseline 0.5 above the
    # greedy trajectory's reward gives every group a signal, so one drawn question is enough and the agent trains
    real = training.rewards.greedy_rewards
    monkeypatch.setattr(training.rewards, "greedy_rewards",
                        lambda records, config: {q: r + 0.5 for q, r in real(records, config).items()})
    cfg = _config(tmp_path, tiny_model_dir, iterations=1, questions_per_iteration=1, dynamic_sampling=True,
                  max_draw=2, eval_init=False, train_ranker=False, max_new_tokens=8, agent_baseline="greedy")
    root = training.Runner(cfg).run()
    folder = root / "iter-0000"
    greedy = training.read_records(folder / "baseline.jsonl")
    scored = training.read_records(folder / "scored.jsonl", "scored")
    assert [r.question_id for r in greedy] == [r.question_id for r in scored] and len(scored) == 1
    assert len(greedy[0].trajectories) == 1 and greedy[0].sampling["greedy"]
    group = next(g for g in scored[0].groups if g.role == "agent")
    base = greedy[0].trajectories[0]
    assert group.kept and group.baseline == agent_reward(base, greedy[0].answers, resolve_config("paper"))[0] + 0.5
    assert [t.advantage for t in scored[0].trajectories] == [t.reward - group.baseline
                                                             for t in scored[0].trajectories]
    assert (folder / "agent" / "config.json").is_file()  # trained on the baseline's signal
    row = orjson.loads((folder / "metrics.json").read_bytes())
    assert row["train_greedy_reward"] == group.baseline
    assert (row["samples_above_greedy"], row["samples_below_greedy"]) == (0.0, 1.0)


def test_unknown_agent_baseline_is_refused(tmp_path, tiny_model_dir):
    with pytest.raises(ConfigError, match="agent_baseline"):
        _config(tmp_path, tiny_model_dir, agent_baseline="mean")


def test_greedy_baseline_without_dynamic_sampling_covers_the_iterations_questions(tmp_path, tiny_model_dir):
    from cosearch_cli import train as training

    cfg = _config(tmp_path, tiny_model_dir, iterations=1, questions_per_iteration=2, eval_init=False,
                  train_ranker=False, max_new_tokens=8, agent_baseline="greedy")
    folder = training.Runner(cfg).run() / "iter-0000"
    greedy = training.read_records(folder / "baseline.jsonl")
    scored = training.read_records(folder / "scored.jsonl", "scored")
    expected = [q.id for q in iteration_questions(training.read_questions(cfg.questions), cfg, 0)]
    assert [r.question_id for r in greedy] == [r.question_id for r in scored] == expected
    assert all(g.baseline is not None for r in scored for g in r.groups if g.role == "agent")


def test_demo_config_file_changes_the_preset_for_a_variant(tmp_path, monkeypatch, cli):
    from dataclasses import replace

    import cosearch_cli.demo as demo_module

    seen = []

    def fake_demo(config, runner):
        seen.append(config)
        return {"run": str(tmp_path / "runs" / config.name), "lines": ["summary"]}

    monkeypatch.setattr(demo_module, "run_demo", fake_demo)
    index = tmp_path / "index"
    index.mkdir()  # exists, so the demo does not build the fixture index
    variant = tmp_path / "variant.toml"
    variant.write_text(f'name = "variant"\nrl_questions = "answerable"\nindex = "{index}"\n')
    result = cli("demo", "--config", variant, "--out", tmp_path / "runs", "--iterations", "3", "-q")
    assert result.exit_code == 0, result.stderr
    (config,) = seen
    assert (config.name, config.rl_questions, config.iterations, config.out) == ("variant", "answerable", 3,
                                                                                 str(tmp_path / "runs"))
    assert (config.lr, config.warmup_questions) == (PRESETS["demo"]["lr"], PRESETS["demo"]["warmup_questions"])
    # the variant config itself: the demo's own preset and the file, and nothing else
    assert load_config(variant, preset="demo") == replace(load_config(preset="demo"), name="variant",
                                                          rl_questions="answerable", index=str(index))
    bad = tmp_path / "bad.toml"
    bad.write_text('rl_questions = "easy"\n')
    assert cli("demo", "--config", bad, "-q").exit_code != 0

"""Warm-up demonstrations per dataset kind, the masked loss, and the checkpoint the CLI writes."""

from __future__ import annotations

import orjson
import pytest
import torch

from cosearch_cli import ranker as ranking
from cosearch_cli.agent import observation_text, parse_turn, prompt_ids
from cosearch_cli.constrain import AgentConstraint, RankerConstraint, TokenClasses
from cosearch_cli.records import Question, read_question
from cosearch_cli.rollout import RolloutConfig
from cosearch_cli.update.batch import TrainSeq
from cosearch_cli.warmup import (build_demonstrations, check_no_overlap, demo_ranking, finetune, FinetuneConfig,
                                 sft_loss, sub_queries)
from cosearch_cli.errors import InputError
from tests.conftest import run_cli


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def train_questions(fixtures_dir):
    rows = (fixtures_dir / "train.jsonl").read_bytes().splitlines()
    return [read_question(orjson.loads(line), "train.jsonl", i + 1) for i, line in enumerate(rows)]


@pytest.fixture(scope="module")
def index(tmp_path_factory, fixtures_dir):
    from cosearch_cli.index import open_index
    from cosearch_cli.index.build import build_index
    from cosearch_cli.index.corpus import Corpus

    folder = tmp_path_factory.mktemp("warmup") / "ix"
    build_index(Corpus(str(fixtures_dir / "corpus.jsonl")), folder)
    return open_index(folder)


def _first(questions, dataset):
    return next(q for q in questions if q.dataset == dataset)


def test_sub_queries_per_dataset_kind(train_questions):
    musique = next(q for q in train_questions if q.id == "musique-2hop__334380_326459")
    # "#1" is the first hop's answer; ">>" joins entity and relation
    assert sub_queries(musique) == ["Black Hawk Township located in the administrative territorial entity",
                                    "Jefferson County shares border with"]
    wiki = next(q for q in train_questions if q.question == "Where was the husband of Jeanne Raunay born?")
    assert sub_queries(wiki) == ["Jeanne Richomme Raunay spouse", "André Beaunier place of birth"]
    hotpot = Question("h", "Which dog breed has more derivative breeds, German Spitz or Norfolk Spaniel?",
                      ["German Spitz"], "hotpotqa", ["German Spitz", "Norfolk Spaniel"])
    assert sub_queries(hotpot) == ["German Spitz", "Norfolk Spaniel"]
    nq = _first(train_questions, "nq")
    assert sub_queries(nq) == [nq.question]
    popqa = Question("p", "Who was the composer of Bad Things?", ["Jace Everett"], "popqa",
                     ["Bad Things (Jace Everett song)"])
    assert sub_queries(popqa) == ["Who was the composer of Bad Things?"]  # one title would leak the answer


def test_demo_ranking_puts_answer_bearing_then_gold_first():
    from cosearch_cli.records import Passage

    q = Question("q", "Where was the husband of Jeanne Raunay born?", ["Évreux"], "2wikimultihopqa",
                 ["André Beaunier"], extra={"gold_passage_ids": ["g"]})
    candidates = [Passage("a", "Paris", "A city."), Passage("g", "André Beaunier", "A critic."),
                  Passage("b", "Évreux", "Évreux is a commune."), Passage("c", "Other", "Nothing.")]
    order, reason = demo_ranking(q, candidates, 3)
    assert order == [2, 1, 0]
    assert reason == " [3] mentions Évreux."


def test_demonstrations_match_the_rollout_format(train_questions, index, tiny_lm):
    tokenizer = tiny_lm[1]
    config = RolloutConfig(max_turns=2, top_n=10, k=3)
    kinds = ["hotpotqa", "musique", "2wikimultihopqa", "nq"]
    questions = [_first(train_questions, d) for d in kinds]
    demos = build_demonstrations(questions, index=index, tokenizer=tokenizer, config=config,
                                 require_evidence=False)
    classes = TokenClasses(tokenizer)
    agent_demos = {d.key.split("/")[0]: d for d in demos if d.role == "agent"}
    assert len(agent_demos) == 4
    for q in questions:
        d = agent_demos[q.id]
        prompt = prompt_ids(tokenizer, q.question, config.max_turns)
        assert d.token_ids[:len(prompt)] == prompt and not any(d.mask[:len(prompt)])
        # split the generated spans (mask 1) and the inserted spans (mask 0) after the prompt
        spans, start = [], len(prompt)
        for i in range(len(prompt) + 1, len(d.mask) + 1):
            if i == len(d.mask) or d.mask[i] != d.mask[start]:
                spans.append((d.mask[start], d.token_ids[start:i]))
                start = i
        turns = [ids for m, ids in spans if m == 1]
        observations = [ids for m, ids in spans if m == 0]
        assert len(turns) == len(d.queries) + 1 and len(observations) == len(d.queries)
        for t, ids in enumerate(turns):
            parsed = parse_turn(tokenizer.decode(ids))
            last = t == len(turns) - 1
            assert parsed.action == ("answer" if last else "search")
            assert parsed.content == (q.answers[0] if last else d.queries[t])
            constraint = AgentConstraint(classes, final=t == config.max_turns)
            assert constraint.is_complete(ids)  # tokenised exactly as the constraint forces the tags
        # each observation is the rollout's block for the passages the ranker demonstration chose
        ranker_demos = [r for r in demos if r.key.startswith(f"{q.id}/ranker/")]
        assert len(ranker_demos) == len(d.queries)
        for t, (obs, r) in enumerate(zip(observations, ranker_demos)):
            hits = index.retriever().search([d.queries[t]], config.top_n)[0]
            candidates = index.docs.get([h.id for h in hits])
            out_ids = [tok for tok, m in zip(r.token_ids, r.mask) if m]
            text = tokenizer.decode(out_ids)
            parsed = ranking.parse_ranking(text, len(candidates), config.k)
            assert parsed.valid, text
            assert RankerConstraint(classes, n=len(candidates), k=config.k).is_complete(out_ids)
            shown = [candidates[i] for i in parsed.permutation]
            expected = observation_text(tokenizer, shown, config.passage_tokens, last=t + 1 >= config.max_turns)
            assert tokenizer.decode(obs) == expected
    assert {q.dataset for q in questions} == set(kinds)


def test_single_hop_demo_shows_the_answer_bearing_passage_first(train_questions, index, tiny_lm):
    from cosearch_cli.metrics import has_answer

    tokenizer = tiny_lm[1]
    config = RolloutConfig(max_turns=2, top_n=10, k=3)
    singles = [q for q in train_questions if q.dataset in ("nq", "triviaqa")]
    demos = build_demonstrations(singles, index=index, tokenizer=tokenizer, config=config)
    agent = [d for d in demos if d.role == "agent"]
    assert agent and all(d.answer_shown and len(d.queries) == 1 for d in agent)
    for d in [r for r in demos if r.role == "ranker" and f"{r.key.split('/')[0]}/agent" in {a.key for a in agent}]:
        q = next(q for q in singles if d.key.startswith(q.id + "/"))
        hits = index.retriever().search([q.question], config.top_n)[0]
        candidates = index.docs.get([h.id for h in hits])
        text = tokenizer.decode([t for t, m in zip(d.token_ids, d.mask) if m])
        first = candidates[ranking.parse_ranking(text, len(candidates), config.k).permutation[0]]
        assert has_answer(f"{first.title}\n{first.text}", q.answers)


def test_overlap_with_evaluation_questions_is_refused(train_questions):
    same_text = Question("other-id", train_questions[3].question.upper() + "?", ["x"])
    with pytest.raises(InputError, match="also evaluation questions"):
        check_no_overlap(train_questions, [same_text])
    check_no_overlap(train_questions[:5], train_questions[5:])


class _Logits:
    """A stand-in model whose logits are one leaf tensor, so the gradient per position can be read."""

    def __init__(self, logits):
        self.leaf = logits

    def __call__(self, input_ids, attention_mask, logits_to_keep, use_cache):
        return type("Out", (), {"logits": self.leaf[:, logits_to_keep]})()


def test_loss_masks_prompt_and_observation_tokens():
    vocab = 7
    ids = [1, 2, 3, 4, 5, 6, 2, 3]
    mask = [0, 0, 1, 1, 0, 0, 1, 0]  # prompt, a turn, an observation, a turn, an observation
    leaf = torch.zeros(1, len(ids), vocab, requires_grad=True)
    loss = sft_loss(_Logits(leaf), [TrainSeq("d", ids, mask, [0.0] * len(ids), 1.0, 1.0)])
    assert loss.item() == pytest.approx(torch.log(torch.tensor(7.0)).item())  # uniform logits: log V
    loss.backward()
    per_position = leaf.grad[0].abs().sum(-1)
    # position t predicts token t+1: only predictions of mask-1 tokens (2, 3, 6) carry gradient
    assert [bool(g > 0) for g in per_position] == [False, True, True, False, False, True, False, False]
    # hand-computed: d(-mean log softmax)/d logit = (p - onehot) / 3 with p = 1/7
    assert leaf.grad[0, 1, 3].item() == pytest.approx((1 / 7 - 1) / 3)
    assert leaf.grad[0, 1, 0].item() == pytest.approx((1 / 7) / 3)


def test_finetune_lowers_the_demo_loss(train_questions, index, tiny_lm):
    import copy

    model, tokenizer = tiny_lm
    model = copy.deepcopy(model)
    config = RolloutConfig(max_turns=1, top_n=5, k=2, passage_tokens=16, ranker_passage_tokens=8)
    demos = build_demonstrations(train_questions[:4], index=index, tokenizer=tokenizer, config=config,
                                 require_evidence=False)
    losses = finetune(model, demos, FinetuneConfig(epochs=4, lr=3e-3, token_budget=4096),
                      pad_id=tokenizer.pad_token_id)
    assert losses[-1] < losses[0] - 0.5, losses


def test_cli_writes_a_checkpoint_that_loads(tmp_path, tiny_lm, fixtures_dir, index):
    from cosearch_cli.constrain import parse_roles
    from cosearch_cli.models import load_causal_lm, lm_base

    model, tokenizer = tiny_lm
    base = tmp_path / "tiny"
    model.save_pretrained(base)
    tokenizer.save_pretrained(base)
    # marked as descending from the embedded model, as every checkpoint saved from `smollm2` is
    config = orjson.loads((base / "config.json").read_bytes())
    (base / "config.json").write_bytes(orjson.dumps({**config, "cosearch_base": "smollm2"}))
    out = tmp_path / "warm"
    args = ["warmup", "--questions", fixtures_dir / "train.jsonl", "--index", index.folder, "--model", base,
            "--out", out, "--limit", "6", "--max-turns", "1", "--k", "2", "--exclude", fixtures_dir / "dev.jsonl",
            "--top-n", "4", "--max-new-tokens", "48", "--keep-unsupported", "--quiet"]
    result = run_cli(*args)
    assert result.exit_code == 0, result.stderr
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    manifest = orjson.loads((out / "warmup.manifest.json").read_bytes())
    assert manifest["stage"] == "warmup" and manifest["demonstrations"]["agent"] == 6
    rows = [orjson.loads(line) for line in (out / "demonstrations.jsonl").read_bytes().splitlines()]
    assert {r["role"] for r in rows} == {"agent", "ranker"}
    assert manifest["options"]["top_n"] == 4 and manifest["options"]["max_new_tokens"] == 48
    ranker_prompts = [tokenizer.decode(r["token_ids"]) for r in rows if r["role"] == "ranker"]
    # --top-n 4: each ranker demonstration lists at most the rollout's N = 4 candidates
    assert all("\n[5] " not in text for text in ranker_prompts) and any("\n[4] " in text for text in ranker_prompts)
    loaded, _ = load_causal_lm(str(out))
    assert not torch.equal(loaded.model.embed_tokens.weight, model.model.embed_tokens.weight)  # it trained
    assert lm_base(str(out)) == "smollm2" and parse_roles("auto", str(out)) == {"agent", "ranker"}
    again = run_cli(*args)
    assert again.exit_code == 8 and "already exists" in again.stderr
    clash = run_cli(*args[:-2], "--exclude", fixtures_dir / "train.jsonl", "--overwrite", "--quiet")
    assert clash.exit_code == 3 and "also evaluation questions" in clash.stderr
    # what the prompts show, and judged by what they show: recorded, and the ranker prompts cut to 12 tokens
    seen = run_cli(*args, "--overwrite", "--visible-evidence", "--ranker-passage-tokens", "12",
                   "--passage-tokens", "20")
    assert seen.exit_code == 0, seen.stderr
    options = orjson.loads((out / "warmup.manifest.json").read_bytes())["options"]
    assert options["visible_evidence"] is True
    assert (options["ranker_passage_tokens"], options["passage_tokens"]) == (12, 20)
    cut = [tokenizer.decode(orjson.loads(line)["token_ids"])
           for line in (out / "demonstrations.jsonl").read_bytes().splitlines() if b'"ranker"' in line]
    by_length = zip(sorted(cut, key=len), sorted(ranker_prompts, key=len))
    assert cut and all(len(text) < len(full) for text, full in by_length)


def test_demo_ranking_of_no_candidates_is_empty():
    assert demo_ranking(Question("q", "?", ["a"]), [], 3) == ([], "")


def test_informed_calls_rest_on_an_answer_or_a_gold_title():
    from cosearch_cli.records import Passage
    from cosearch_cli.warmup import informed

    q = Question("q", "Where was the husband of Jeanne Raunay born?", ["Évreux"], "2wikimultihopqa",
                 ["André Beaunier"], extra={"gold_passage_ids": ["g"]})
    nothing = [Passage("a", "Paris", "A city."), Passage("c", "Other", "Nothing.")]
    assert not informed(q, nothing)
    assert informed(q, nothing + [Passage("b", "Évreux", "Évreux is a commune.")])  # answer-bearing
    assert informed(q, nothing + [Passage("x", "andré beaunier", "A critic.")])  # gold title, any case
    assert informed(q, nothing + [Passage("g", "Elsewhere", "Text.")])  # gold passage id


def test_evidence_ranker_demos_drop_the_calls_that_copy_the_retriever(train_questions, index, tiny_lm):
    from cosearch_cli.warmup import DemoStats, informed

    tokenizer = tiny_lm[1]
    config = RolloutConfig(max_turns=2, top_n=10, k=3)
    every, kept = DemoStats(), DemoStats()
    all_demos = build_demonstrations(train_questions, index=index, tokenizer=tokenizer, config=config,
                                     require_evidence=False, stats=every)
    evidence = build_demonstrations(train_questions, index=index, tokenizer=tokenizer, config=config,
                                    require_evidence=False, ranker_demos="evidence", stats=kept)
    # the agent demonstrations are the same; only uninformed ranker calls go
    assert [d.key for d in all_demos if d.role == "agent"] == [d.key for d in evidence if d.role == "agent"]
    by_id = {q.id: q for q in train_questions}
    uninformed = []
    for d in all_demos:
        if d.role != "ranker":
            continue
        hits = index.retriever().search(d.queries, config.top_n)[0]
        if not informed(by_id[d.key.split("/")[0]], index.docs.get([h.id for h in hits])):
            uninformed.append(d.key)
    assert uninformed, "the fixture should hold some uninformed ranker calls"
    assert kept.ranker_uninformed_skipped == len(uninformed) and every.ranker_uninformed_skipped == 0
    assert kept.ranker == every.ranker - len(uninformed)
    assert sorted(d.key for d in evidence if d.role == "ranker") == sorted(
        d.key for d in all_demos if d.role == "ranker" and d.key not in uninformed)
    with pytest.raises(ValueError, match="ranker_demos"):
        build_demonstrations(train_questions[:1], index=index, tokenizer=tokenizer, config=config,
                             ranker_demos="some")


def test_shuffled_positions_are_a_fixed_permutation():
    from cosearch_cli.warmup import shuffled_positions

    first = shuffled_positions("q1/t0", 5)
    assert sorted(first) == [0, 1, 2, 3, 4] and shuffled_positions("q1/t0", 5) == first
    assert any(shuffled_positions(f"q{i}/t0", 5) != first for i in range(2, 6))
    assert shuffled_positions("q1/t0", 1) == [0] and shuffled_positions("q1/t0", 0) == []


def _demo_sets(questions, index, tokenizer, config, *kinds):
    """(demonstrations, their DemoStats) for each `ranker_demos` kind, agent demonstrations without evidence kept."""
    from cosearch_cli.warmup import DemoStats

    out = []
    for kind in kinds:
        stats = DemoStats()
        out.append((build_demonstrations(questions, index=index, tokenizer=tokenizer, config=config,
                                         require_evidence=False, ranker_demos=kind, stats=stats), stats))
    return out


def test_shuffled_ranker_demos_list_the_candidates_in_the_permuted_order(train_questions, index, tiny_lm):
    from cosearch_cli import ranker as ranking
    from cosearch_cli.metrics import passage_has_answer
    from cosearch_cli.warmup import demo_ranking, informed, shuffled_positions

    tokenizer = tiny_lm[1]
    config = RolloutConfig(max_turns=2, top_n=10, k=3)
    (evidence, kept), (mixed, shuffled) = _demo_sets(train_questions, index, tokenizer, config, "evidence",
                                                     "shuffled")
    # the same calls are kept, and the agent demonstrations do not change
    assert [d.key for d in mixed] == [d.key for d in evidence] and shuffled.ranker == kept.ranker
    assert all(m.token_ids == e.token_ids for m, e in zip(mixed, evidence) if m.role == "agent")
    by_id = {q.id: q for q in train_questions}
    moved = 0
    for d in (d for d in mixed if d.role == "ranker"):
        question = by_id[d.key.split("/")[0]]
        hits = index.retriever().search(d.queries, config.top_n)[0]
        candidates = index.docs.get([h.id for h in hits])
        listed = [candidates[i] for i in shuffled_positions(f"{question.id}/t{d.key[-1]}", len(candidates))]
        prompt = ranking.prompt_ids(tokenizer, question.question, d.queries[0], listed, config.k,
                                    config.ranker_passage_tokens)
        assert d.token_ids[:len(prompt)] == prompt  # the prompt lists the candidates in the permuted order
        order, _ = demo_ranking(question, listed, config.k)
        chosen = listed[order[0]]
        best = candidates[demo_ranking(question, candidates, config.k)[0][0]]  # the unshuffled demo's choice
        assert informed(question, [chosen]) and \
            passage_has_answer(chosen, question.answers) == passage_has_answer(best, question.answers)
        moved += order[0] != candidates.index(chosen)
    assert moved, "some demonstrated first choice should sit at another position than the retriever's"


def test_in_view_demo_ranking_judges_only_the_text_the_prompt_shows(tiny_lm):
    from cosearch_cli.records import Passage
    from cosearch_cli.warmup import in_view, informed

    tokenizer = tiny_lm[1]
    q = Question("q", "Which city hosts the festival?", ["Lyon"], "nq", [])
    far = "The festival began in a small hall near the river, and after many years it moved to Lyon."
    candidates = [Passage("a", "Paris", "A city."), Passage("b", "Festival", far),
                  Passage("c", "Other", "Lyon hosts it.")]
    assert demo_ranking(q, candidates, 2) == ([1, 2], " [2] mentions Lyon.")  # the answer past the cut counts
    seen = in_view(tokenizer, candidates, 6)
    assert [p.id for p in seen] == ["a", "b", "c"] and [p.title for p in seen] == ["Paris", "Festival", "Other"]
    assert "Lyon" not in seen[1].text and seen[2].text == "Lyon hosts it." and seen[0].text == "A city."
    assert demo_ranking(q, seen, 2) == ([2, 0], " [3] mentions Lyon.")  # only [3] shows the answer
    assert informed(q, candidates[:2]) and not informed(q, seen[:2])


def test_visible_evidence_keeps_the_demonstrations_whose_evidence_is_in_view(train_questions, index, tiny_lm):
    from cosearch_cli.metrics import has_answer
    from cosearch_cli.warmup import DemoStats, in_view, informed

    tokenizer = tiny_lm[1]
    config = RolloutConfig(max_turns=2, top_n=10, k=3, passage_tokens=8, ranker_passage_tokens=8)
    anywhere, visible = DemoStats(), DemoStats()
    full = build_demonstrations(train_questions, index=index, tokenizer=tokenizer, config=config,
                                ranker_demos="evidence", stats=anywhere)
    seen = build_demonstrations(train_questions, index=index, tokenizer=tokenizer, config=config,
                                ranker_demos="evidence", visible_evidence=True, stats=visible)
    # the ranker calls are the same; kept are exactly those informed within the ranker's 8-token view
    by_id = {q.id: q for q in train_questions}
    in_sight = set()
    for d in (d for d in full if d.role == "ranker"):
        candidates = index.docs.get([h.id for h in index.retriever().search(d.queries, config.top_n)[0]])
        if informed(by_id[d.key.split("/")[0]], in_view(tokenizer, candidates, 8)):
            in_sight.add(d.key)
    full_keys = {d.key for d in full if d.role == "ranker"}
    assert in_sight and in_sight < full_keys, "the fixture should hold calls whose answer lies past 8 tokens"
    assert {d.key for d in seen if d.role == "ranker"} == in_sight
    assert visible.ranker == len(in_sight)
    assert visible.ranker_uninformed_skipped == anywhere.ranker_uninformed_skipped + len(full_keys - in_sight)

    def observation_shows_answer(demo) -> bool:  # the masked tokens after the prompt: the observations
        question = by_id[demo.key.split("/")[0]]
        start = len(prompt_ids(tokenizer, question.question, config.max_turns))
        observed = [t for t, m in zip(demo.token_ids[start:], demo.mask[start:]) if m == 0]
        return has_answer(tokenizer.decode(observed), question.answers)

    agents_full = [d for d in full if d.role == "agent"]
    agents_seen = [d for d in seen if d.role == "agent"]
    assert 0 < len(agents_seen) < len(agents_full) and visible.agent == len(agents_seen)
    assert all(observation_shows_answer(d) for d in agents_seen)
    assert not all(observation_shows_answer(d) for d in agents_full)  # anywhere: answers past the cut count


def test_balanced_ranker_demos_keep_as_many_first_choices_of_the_retriever_as_others():
    from cosearch_cli.warmup import Demo, DemoStats, balance_first_choices

    def ranker(key, first):
        return Demo(key, "ranker", [1, 2], [0, 1], first_choice=first)

    demos = [Demo("q1/agent", "agent", [1], [1]), ranker("a", 0), ranker("b", 2), ranker("c", 0), ranker("d", 0),
             ranker("e", 1), ranker("f", 0), Demo("q2/agent", "agent", [1], [1])]
    stats = DemoStats(ranker=6)
    kept = balance_first_choices(demos, stats)
    # b and e choose another candidate: both stay, with two of the four that choose candidate 0, picked by sha1 of
    # the key (sha1 order of a, c, d, f: see below); agent demonstrations stay; the list keeps its order
    import hashlib

    zeros = sorted("acdf", key=lambda k: hashlib.sha1(k.encode()).hexdigest())[:2]
    assert [d.key for d in kept] == [k for k in ["q1/agent", "a", "b", "c", "d", "e", "f", "q2/agent"]
                                     if k not in "acdf" or k in zeros]
    assert sum(d.first_choice == 0 for d in kept) == 2 and (stats.ranker, stats.ranker_unbalanced_skipped) == (4, 2)
    # fewer first choices of the retriever than others: all stay
    few = [ranker("a", 0), ranker("b", 1), ranker("c", 2)]
    assert balance_first_choices(few) == few


def test_balanced_ranker_demos_from_the_index(train_questions, index, tiny_lm):
    config = RolloutConfig(max_turns=2, top_n=10, k=3)
    (every, _), (some, balanced) = _demo_sets(train_questions, index, tiny_lm[1], config, "evidence", "balanced")
    others = [d.key for d in every if d.role == "ranker" and d.first_choice != 0]
    firsts = [d.key for d in every if d.role == "ranker" and d.first_choice == 0]
    assert others and len(firsts) > len(others), "the fixture's evidence calls mostly choose the retriever's first"
    kept = [d for d in some if d.role == "ranker"]
    assert {d.key for d in kept} >= set(others) and sum(d.first_choice == 0 for d in kept) == len(others)
    assert balanced.ranker == 2 * len(others) and balanced.ranker_unbalanced_skipped == len(firsts) - len(others)
    # the demonstrations themselves are the evidence ones, token for token
    by_key = {d.key: d for d in every}
    assert all(d.token_ids == by_key[d.key].token_ids for d in some)

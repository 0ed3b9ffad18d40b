"""Shared test helpers: run the CLI like a user, find the fixture data, build tiny real models."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cosearch_cli.cli import app
from test_update_support import smollm2_llama_config  # noqa: F401  (test_train_vllm imports it from here)

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str


def run_cli(*args: str, input: str | bytes | None = None) -> CliResult:
    """Invoke `cosearch ARGS` in-process; stdout and stderr are kept apart as a shell would."""
    result = CliRunner().invoke(app, [str(a) for a in args], input=input, catch_exceptions=False)
    return CliResult(result.exit_code, result.stdout, result.stderr)


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture(scope="session")
def tiny_lm():
    """(model, tokenizer): a randomly initialised 2-layer Llama over the SmolLM2 tokenizer, fixed seed."""
    import torch
    from transformers import LlamaForCausalLM

    from cosearch_cli.models import load_tokenizer

    tokenizer = load_tokenizer("smollm2")
    config = smollm2_llama_config(tokenizer, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                  num_key_value_heads=2)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    return model, tokenizer


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, tiny_lm):
    """The tiny random Llama saved as a Hugging Face folder, for commands that take a model path."""
    model, tokenizer = tiny_lm
    folder = tmp_path_factory.mktemp("tiny") / "llama"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


class TextDocs:
    """A stand-in passage store for bench helpers: ids map to texts, each passage titled "title <id>"."""

    def __init__(self, texts: dict[str, str]):
        self.texts = texts

    def get(self, ids):
        from cosearch_cli.records import Passage

        return [Passage(i, f"title {i}", self.texts[i]) for i in ids]


class ForceText:
    """A test Constraint that allows exactly one token sequence (a stand-in for real grammars)."""

    def __init__(self, token_ids, vocab):
        self.target, self.vocab = list(token_ids), vocab

    def allowed(self, generated):
        import torch

        mask = torch.zeros(self.vocab, dtype=torch.bool)
        if len(generated) < len(self.target):
            mask[self.target[len(generated)]] = True
        return mask

    def is_complete(self, generated):
        return list(generated) == self.target


@pytest.fixture(scope="session")
def force_text():
    return ForceText


@pytest.fixture
def one_torch_thread():
    """Tiny models run far faster on one thread than on two contended ones (2 shared cores)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def fixture_bm25(tmp_path_factory):
    """The real BM25 index (bm25s, no dense part) over fixtures/corpus.jsonl, opened."""
    from cosearch_cli.index import Corpus, build_index, open_index

    folder = tmp_path_factory.mktemp("fixture-bm25") / "ix"
    build_index(Corpus(str(FIXTURES / "corpus.jsonl")), folder)
    return open_index(folder)

"""GRPO loss terms and aggregations against numbers computed by hand."""

import math

import pytest
import torch

from cosearch_cli.update.batch import Norms
from cosearch_cli.update.losses import LOSS_AGG, grpo_token_terms, k3_kl


def test_k3_kl_hand_values():
    logp = torch.tensor([math.log(0.5), math.log(0.3)])
    ref = torch.tensor([math.log(0.25), math.log(0.3)])
    # ref/pi = 0.5: 0.5 - ln 0.5 - 1 = 0.193147...; equal distributions give exactly 0
    assert k3_kl(logp, ref).tolist() == pytest.approx([0.5 + math.log(2) - 1, 0.0], abs=1e-7)
    assert k3_kl(logp, ref)[1].item() == 0.0


def test_clipping_takes_the_pessimistic_side():
    old = torch.full((4,), math.log(0.25))
    logp = torch.tensor([math.log(0.5), math.log(0.5), math.log(0.125), math.log(0.26)])  # ratios 2, 2, .5, 1.04
    adv = torch.tensor([1.0, -1.0, 1.0, 2.0])
    terms = grpo_token_terms(logp, old, adv, None, clip_low=0.2, clip_high=0.28, kl_coef=0.0)
    # A>0, ratio 2 -> clipped at 1.28; A<0, ratio 2 -> unclipped 2; A>0, ratio .5 -> unclipped .5 (pessimistic)
    assert terms.pg_loss.tolist() == pytest.approx([-1.28, 2.0, -0.5, -2 * 1.04], abs=1e-6)
    assert terms.clipped.tolist() == [True, False, False, False]
    assert terms.kl is None


def test_kl_term_is_added_with_its_coefficient():
    logp = torch.tensor([math.log(0.5)])
    terms = grpo_token_terms(logp, logp.clone(), torch.tensor([1.0]), torch.tensor([math.log(0.25)]),
                             clip_low=0.2, clip_high=0.2, kl_coef=0.1)
    assert terms.loss.item() == pytest.approx(-1.0 + 0.1 * (0.5 + math.log(2) - 1), abs=1e-6)


def test_aggregations_hand_values():
    # sequence A has trained tokens with losses 1, 2, 3; sequence B one token with loss 4
    values = torch.tensor([1.0, 2.0, 3.0, 4.0])
    seq_tokens = torch.tensor([3.0, 3.0, 3.0, 1.0])
    norms = Norms(tokens=4, seqs=2, horizon=3)
    assert LOSS_AGG["token-mean"](values, seq_tokens, norms).item() == pytest.approx(10 / 4)
    assert LOSS_AGG["seq-mean-token-mean"](values, seq_tokens, norms).item() == pytest.approx((2 + 4) / 2)
    assert LOSS_AGG["seq-mean-token-sum-norm"](values, seq_tokens, norms).item() == pytest.approx((6 / 3 + 4 / 3) / 2)


def test_aggregation_shares_of_split_batches_add_up():
    values = torch.tensor([1.0, 2.0, 3.0, 4.0])
    seq_tokens = torch.tensor([3.0, 3.0, 3.0, 1.0])
    norms = Norms(tokens=4, seqs=2, horizon=5)
    for agg in LOSS_AGG.values():
        whole = agg(values, seq_tokens, norms)
        parts = agg(values[:2], seq_tokens[:2], norms) + agg(values[2:], seq_tokens[2:], norms)
        assert parts.item() == pytest.approx(whole.item())

"""Group-normalised advantages by hand: scaling modes, eps, singleton and zero-variance groups."""

from __future__ import annotations

import statistics

import pytest
from test_grouping import groups_by_id, make_call, make_record, make_traj

from cosearch_cli import advantages, grouping
from cosearch_cli.errors import ConfigError


def test_group_mode_by_hand():
    # mean 0.25; sample std sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5
    assert advantages.group_advantages([1, 0, 0, 0], eps=0.0) == pytest.approx([1.5, -0.5, -0.5, -0.5])
    assert advantages.group_advantages([1, 0, 0, 0], eps=0.5) == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_none_and_batch_modes_by_hand():
    assert advantages.group_advantages([1, 0, 0, 0], mode="none") == pytest.approx([0.75, -0.25, -0.25, -0.25])
    assert advantages.group_advantages([1, 0, 0, 0], mode="batch", batch_std=2.0, eps=0.0) == \
        pytest.approx([0.375, -0.125, -0.125, -0.125])


def test_matches_a_plain_statistics_loop():
    rewards = [0.3, -0.2, 1.7, 0.0, 0.45, 0.9, -0.2]
    mean, std = statistics.mean(rewards), statistics.stdev(rewards)
    expected = [(r - mean) / (std + 1e-6) for r in rewards]
    assert advantages.group_advantages(rewards, eps=1e-6) == pytest.approx(expected, rel=1e-12)
    assert advantages.sample_std(rewards) == pytest.approx(std, rel=1e-12)


@pytest.mark.parametrize("rewards, reason", [([0.7], "singleton"), ([], "singleton"),
                                             ([0.3, 0.3, 0.3], "all-equal-rewards"),
                                             ([0.5 + 0.3, 0.8], "all-equal-rewards"),  # 0.8000000000000002
                                             ([0.0, 1e-6], "")])
def test_no_signal_groups_get_zero(rewards, reason):
    assert advantages.no_signal(rewards) == reason
    adv = advantages.group_advantages(rewards, mode="none")
    assert (adv == [0.0] * len(rewards)) is bool(reason)


def test_unknown_mode_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown advantage scaling"):
        advantages.group_advantages([0, 1], mode="token")


def two_records():
    calls = [make_call("a", s, 0, "alpha", has=(0,)) for s in range(3)]
    calls += [make_call("a", s, 1, "beta", has=(0,)) for s in range(3)]
    calls += [make_call("a", 3, 1, "gamma delta", has=(0,))]
    a = make_record("a", ["x"], [make_traj(s, "x") for s in range(4)], calls)
    b = make_record("b", ["x"], [make_traj(s, "x") for s in range(2)], [])
    config = grouping.GroupConfig(kmin=3)
    for record in (a, b):
        grouping.group_record(record, config)
    for traj, r in zip(a.trajectories + b.trajectories, [1, 0, 0, 0, 1, 0]):
        traj.reward = r
    by_id = {c.id: c for c in a.ranker_calls}
    for cid, r in {"a/s0/t0": 2.0, "a/s1/t0": 0.0, "a/s2/t0": 1.0, "a/s0/t1": 0.5, "a/s1/t1": 0.5,
                   "a/s2/t1": 0.5, "a/s3/t1": 9.0}.items():
        by_id[cid].reward = r
    return a, b, by_id


def test_assign_group_mode_drops_zero_variance_groups():
    a, b, calls = two_records()
    advantages.assign_advantages([a, b], mode="group", eps=0.0)
    assert [t.advantage for t in a.trajectories] == pytest.approx([1.5, -0.5, -0.5, -0.5])
    assert [t.advantage for t in b.trajectories] == pytest.approx([0.5 ** 0.5, -(0.5 ** 0.5)])
    assert [calls[f"a/s{s}/t0"].advantage for s in range(3)] == pytest.approx([1.0, -1.0, 0.0])
    groups = groups_by_id(a)
    assert groups["a/ranker/easy/c1"].members == ["a/s0/t1", "a/s1/t1", "a/s2/t1"]
    assert not groups["a/ranker/easy/c1"].kept and groups["a/ranker/easy/c1"].reason == "all-equal-rewards"
    assert [calls[f"a/s{s}/t1"].advantage for s in range(3)] == [0.0, 0.0, 0.0]
    assert groups["a/ranker/easy/c2"].reason == "singleton" and calls["a/s3/t1"].advantage == 0.0


def test_assign_batch_mode_pools_the_std_per_role():
    a, b, calls = two_records()
    advantages.assign_advantages([a, b], mode="batch", eps=0.0)
    # agent rewards of all trainable groups: [1, 0, 0, 0, 1, 0] -> sample std sqrt(4/15)
    agent_std = (4 / 15) ** 0.5
    assert a.trajectories[0].advantage == pytest.approx(0.75 / agent_std)
    assert b.trajectories[0].advantage == pytest.approx(0.5 / agent_std)
    # the only trainable ranker group is [2, 0, 1]: the all-equal group is not pooled
    assert calls["a/s0/t0"].advantage == pytest.approx(1.0)


def test_rescoring_judges_all_equal_groups_again():
    a, b, calls = two_records()
    advantages.assign_advantages([a, b])
    for s, r in enumerate([0.0, 1.0, 0.5]):
        calls[f"a/s{s}/t1"].reward = r
    advantages.assign_advantages([a, b], eps=0.0)
    group = groups_by_id(a)["a/ranker/easy/c1"]
    assert group.kept and group.reason == ""
    assert [calls[f"a/s{s}/t1"].advantage for s in range(3)] == pytest.approx([-1.0, 1.0, 0.0])
    assert groups_by_id(a)["a/ranker/easy/c2"].reason == "singleton"  # grouping's decisions stay


def test_greedy_baseline_measures_each_member_from_it_unscaled():
    a, b, calls = two_records()
    groups_by_id(a)["a/agent"].baseline = 0.25  # a's rewards [1, 0, 0, 0]
    groups_by_id(b)["b/agent"].baseline = 1.0  # b's rewards [1, 0]
    advantages.assign_advantages([a, b], mode="batch", eps=0.0)  # the mode does not apply to baseline groups
    assert [t.advantage for t in a.trajectories] == pytest.approx([0.75, -0.25, -0.25, -0.25])
    assert [t.advantage for t in b.trajectories] == pytest.approx([0.0, -1.0])
    # ranker groups keep GRPO's group mean: the only trainable one is [2, 0, 1], batch std 1
    assert calls["a/s0/t0"].advantage == pytest.approx(1.0)


def test_a_group_equal_to_its_baseline_drops_and_equal_members_away_from_it_train():
    a, b, _ = two_records()
    for t in b.trajectories:
        t.reward = 0.0
    for record, baseline in ((a, None), (b, 1.0)):
        groups_by_id(record)[f"{record.question_id}/agent"].baseline = baseline
    advantages.assign_advantages([a, b], eps=0.0)
    assert groups_by_id(b)["b/agent"].kept  # all members 0, greedy scored 1: every sample is pushed down
    assert [t.advantage for t in b.trajectories] == [-1.0, -1.0]
    groups_by_id(b)["b/agent"].baseline = 0.0
    advantages.assign_advantages([a, b], eps=0.0)
    group = groups_by_id(b)["b/agent"]
    assert not group.kept and group.reason == "equal-to-baseline"
    assert [t.advantage for t in b.trajectories] == [0.0, 0.0]
    groups_by_id(b)["b/agent"].baseline = 0.5  # rescoring judges the dropped group again
    advantages.assign_advantages([a, b], eps=0.0)
    assert groups_by_id(b)["b/agent"].kept and [t.advantage for t in b.trajectories] == [-0.5, -0.5]

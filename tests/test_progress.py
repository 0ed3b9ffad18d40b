"""The shared progress module: plain lines for logs and pipes, sane time-left estimates, thread counts."""

from __future__ import annotations

import io
import threading

import pytest
from rich.console import Console

from cosearch_cli.errors import ConfigError
from cosearch_cli.progress import INTERVAL, Progress, Task, duration, interval_from_env, rate_text
from cosearch_cli.threads import thread_count


class Clock:
    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def _plain(clock: Clock, quiet: bool = False) -> tuple[Progress, io.StringIO]:
    sink = io.StringIO()
    console = Console(file=sink, width=200, force_terminal=False)
    return Progress(quiet, console=console, clock=clock, plain=True, ticker=False), sink


def _messages(sink: io.StringIO) -> list[str]:
    return [line.split(" ", 1)[1] for line in sink.getvalue().splitlines()]  # drop the HH:MM:SS stamp


def test_time_left_is_the_average_rate_since_the_start():
    # The oracle's bar said "0:00:01 left" at 10/21 after 6 minutes (a burst of questions finishing together
    # made its recent-rate estimate huge). At the average rate, 10 questions in 360 s, 11 more take 396 s.
    task = Task("oracle half", 21, "questions", started=0.0, done=10)
    assert task.rate(360.0) == pytest.approx(10 / 360)
    assert task.remaining(360.0) == pytest.approx(396.0)
    assert task.line(360.0) == "oracle half: 10/21 questions (48%), 1.7/min, 6:00 elapsed, ~6:36 left"


class FakeLive:
    def __init__(self, share):
        self.value = share

    def text(self) -> str:
        return "25 trajectories finished"

    def share(self):
        return self.value


def test_time_left_uses_finer_work_when_no_question_has_finished_and_the_longer_estimate_after():
    # All four questions in flight together: no question done after 9:00, but 25 of 32 trajectories are.
    # From trajectories: 540 s x 7 / 25 = 151.2 s.
    task = Task("rollout", 4, "questions", started=0.0, done=0, live=FakeLive(25 / 32))
    assert task.remaining(540.0) == pytest.approx(151.2)
    assert task.line(540.0) == ("rollout: 0/4 questions (0%), 9:00 elapsed, ~2:31 left; "
                                "25 trajectories finished")
    # Measured: at 1 of 4 questions (9:40) the rest took 17 min: by questions 3 x 580 s = 29:00, by
    # trajectories 2:42; the longer one is shown (the last trajectories are the long ones).
    task.done = 1
    assert task.remaining(580.0) == pytest.approx(1740.0)
    assert Task("rollout", 4, "questions", started=0.0, live=FakeLive(0.0)).remaining(60.0) is None
    unknown = Task("rollout", 4, "questions", started=0.0, done=1, live=lambda: FakeLive(None))
    assert unknown.remaining(580.0) == pytest.approx(3 * 580.0)  # no finer count: questions' average rate


def test_nothing_done_yet_says_so_instead_of_guessing():
    task = Task("rollout", 8, "questions", started=100.0)
    assert task.remaining(130.0) is None
    assert task.line(130.0) == "rollout: 0/8 questions (0%), 0:30 elapsed, time left unknown yet"


def test_a_task_without_total_reports_elapsed_time_and_its_live_text():
    task = Task("iteration 0: agent update", None, "", started=0.0, live=lambda: "3 trajectories finished")
    assert task.line(75.0) == "iteration 0: agent update: running, 1:15 elapsed; 3 trajectories finished"


def test_durations_and_rates_in_readable_units():
    assert duration(59.6) == "1:00" and duration(3723) == "1:02:03" and duration(-1) == "0:00"
    assert rate_text(12.34) == "12.3/s" and rate_text(0.5) == "30.0/min" and rate_text(1 / 1800) == "2.0/h"


def test_plain_mode_prints_every_running_task_at_each_tick_and_a_final_line():
    clock = Clock(0.0)
    bar, sink = _plain(clock)
    with bar:
        rollout = bar.add("rollout", 4, unit="questions")
        clock.now = 20.0
        bar.tick()  # nothing done yet: still a line, so a log shows the job is alive
        bar.advance(rollout, 2)
        clock.now = 40.0
        bar.tick()
        bar.advance(rollout, 2)
        clock.now = 50.0
    assert _messages(sink) == [
        "rollout: 0/4 questions (0%), 0:20 elapsed, time left unknown yet",
        "rollout: 2/4 questions (50%), 3.0/min, 0:40 elapsed, ~0:40 left",
        "rollout: 4/4 questions (100%), done, 4.8/min, 0:50 elapsed",
    ]


def test_finished_tasks_leave_the_ticks_and_log_lines_are_stamped():
    clock = Clock(0.0)
    bar, sink = _plain(clock)
    with bar:
        first = bar.add("reading passages", 10, unit="passages")
        bar.advance(first, 10)
        clock.now = 5.0
        bar.finish(first)
        bar.log("iteration 0: agent update")
        bar.add("BM25 index", 10, unit="passages")
        clock.now = 25.0
        assert bar.tick() == ["BM25 index: 0/10 passages (0%), 0:20 elapsed, time left unknown yet"]
    lines = sink.getvalue().splitlines()
    assert lines[1].split(" ", 1)[1] == "iteration 0: agent update"
    assert all(line[2] == ":" and line[5] == ":" for line in lines)  # HH:MM:SS first


def test_quiet_prints_nothing():
    clock = Clock(0.0)
    bar, sink = _plain(clock, quiet=True)
    with bar:
        task = bar.add("rollout", 2)
        bar.log("hello")
        bar.advance(task)
    assert sink.getvalue() == ""


def test_the_ticker_thread_prints_without_any_update():
    # A stage that runs for minutes without finishing a unit (one long generation batch) still gets lines.
    sink = io.StringIO()
    seen = threading.Event()

    class Watched(Console):
        def print(self, *args, **kwargs):
            super().print(*args, **kwargs)
            seen.set()

    bar = Progress(console=Watched(file=sink, width=200, force_terminal=False), interval=0.01, plain=True)
    with bar:
        bar.add("update agent", unit="micro-batches")
        assert seen.wait(30), "the ticker printed nothing"
    assert "update agent: running" in sink.getvalue()


def test_interval_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("COSEARCH_PROGRESS_SECONDS", "5")
    assert interval_from_env() == 5.0
    for bad in ("0", "-3", "soon"):
        monkeypatch.setenv("COSEARCH_PROGRESS_SECONDS", bad)
        assert interval_from_env() == INTERVAL
    monkeypatch.delenv("COSEARCH_PROGRESS_SECONDS")
    assert interval_from_env() == INTERVAL == 20.0  # < 30 s: a log shows progress at least every 30 s


def test_thread_count_order_flag_then_slurm_then_omp_then_affinity():
    env = {"SLURM_CPUS_PER_TASK": "3", "OMP_NUM_THREADS": "2"}
    assert thread_count(1, env, usable_cpus=16) == (1, "--threads")
    assert thread_count(None, env, usable_cpus=16) == (3, "SLURM_CPUS_PER_TASK")
    assert thread_count(None, {"OMP_NUM_THREADS": "2"}, usable_cpus=16) == (2, "OMP_NUM_THREADS")
    assert thread_count(None, {"OMP_NUM_THREADS": "x", "SLURM_CPUS_PER_TASK": "0"}, usable_cpus=5) == (
        5, "CPUs this process may use")
    # torchrun: 8 local processes share the task's 32 CPUs; OMP_NUM_THREADS is per process (torchrun sets 1)
    assert thread_count(None, {"SLURM_CPUS_PER_TASK": "32", "LOCAL_WORLD_SIZE": "8"}) == (
        4, "SLURM_CPUS_PER_TASK / 8 local processes")
    assert thread_count(None, {"OMP_NUM_THREADS": "1", "LOCAL_WORLD_SIZE": "8"}) == (1, "OMP_NUM_THREADS")
    assert thread_count(None, {"LOCAL_WORLD_SIZE": "2"}, usable_cpus=2) == (1, "CPUs this process may use / 2 local "
                                                                            "processes")
    with pytest.raises(ConfigError, match="--threads must be at least 1"):
        thread_count(0, env)


def test_thread_count_follows_the_cpus_this_process_may_use():
    import os

    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no sched_getaffinity on this platform")
    assert thread_count(None, {}) == (len(os.sched_getaffinity(0)), "CPUs this process may use")


def test_every_train_step_reports_in_a_log_file(tmp_path):
    # The demo printed nothing for 12.6 minutes into a log: now each step the runner announces is a task, so an
    # update or evaluation gets a line every interval too, and rollouts count their questions.
    from cosearch_cli import train as training
    from cosearch_cli.cli.train import _runner

    clock = Clock(0.0)
    bar, sink = _plain(clock)
    with bar:
        runner = _runner(training.TrainConfig(out=str(tmp_path)), bar)
        runner.log("iteration 0: rollouts of 4 questions x 4")
        runner.on_rollout(0, 4)
        clock.now = 20.0
        bar.tick()
        runner.on_rollout(1, 4)
        runner.log("iteration 0: agent update")
        clock.now = 50.0
        bar.tick()
    assert _messages(sink) == [
        "iteration 0: rollouts of 4 questions x 4",
        "iteration 0: rollouts of 4 questions x 4: 0/4 questions (0%), 0:20 elapsed, time left unknown yet",
        "iteration 0: rollouts of 4 questions x 4: 1/4 questions (25%), done, 3.0/min, 0:20 elapsed",
        "iteration 0: agent update",
        "iteration 0: agent update: running, 0:30 elapsed",
        "iteration 0: agent update: done, 0:30 elapsed",
    ]


def test_terminal_bars_show_counts_rate_and_the_live_text():
    sink = io.StringIO()
    clock = Clock(0.0)
    console = Console(file=sink, width=160, force_terminal=True, color_system=None)
    ticks = []
    with Progress(console=console, clock=clock) as bar:
        assert not bar.plain
        task = bar.add("rollout", 2, unit="questions", live=lambda: ticks.append(1) or "7 tokens generated")
        clock.now = 30.0
        bar.advance(task)
        bar.log("a line above the bars")
        bar.advance(task)
        bar.finish(task)
    out = sink.getvalue()
    assert "rollout" in out and "2/2 questions" in out and "7 tokens generated" in out and ticks
    assert "a line above the bars" in out and "0:30 elapsed" in out

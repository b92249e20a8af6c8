"""The loopback sections of docs/BENCHMARKS.md (processes, ddp-hook) report medians of
interleaved rounds with their spread, since one run on a shared 2-core machine moves by up
to 2x: the rounds alternate as stated, each round's ratio is taken within that round, and
each goal is said to hold or not from the median. Nothing is measured here."""

import pytest

from benchmark_sections import ddp_hook, processes

MIB = 1 << 20


def _rows(p: int, busbw: dict[str, float], size: int = 64 * MIB) -> list[dict]:
    return [
        {"op": "allreduce", "size": size, "algo": a, "devices": p, "busbw": b, "wrong": 0, "link_alpha_s": 1e-4,
         "link_bytes_per_s": 2e9}
        for a, b in busbw.items()
    ]  # fmt: skip


class FakeRun:
    """Stands in for doctools' Run: records the commands and answers each JSON with the
    rows of the round it is in."""

    def __init__(self, answers):
        self.commands: list[str] = []
        self.answers = iter(answers)

    def __call__(self, command: str) -> str:
        self.commands.append(command)
        return ""

    def json(self, name: str) -> list[dict]:
        return next(self.answers)


def test_the_processes_rounds_alternate_the_process_counts_and_the_record_shows_each_command_once():
    rounds = processes.ROUNDS
    answers = [_rows(p, {"ring": 1.0, "gloo": 1.0}) for _ in range(rounds) for p in (2, 4)]
    run = FakeRun(answers)
    record = processes.measure(run)
    assert len(record["rounds"]) == rounds and all(len(r) == 4 for r in record["rounds"])
    assert [r[0]["devices"] for r in record["rounds"]] == [2] * rounds
    shown = [c for c in run.commands if not c.startswith("#")]
    assert len(shown) == 2 and "--nproc-per-node 2" in shown[0] and "--nproc-per-node 4" in shown[1]
    assert run.commands[0].startswith(f"# {rounds} rounds")


def test_the_processes_section_gives_the_median_of_each_rounds_ratio_and_says_which_goals_hold():
    ring = [0.90, 1.00, 0.96]  # ring / gloo in each round at P = 2: median 0.96, goal 0.95 met
    lp = [0.80, 0.95, 0.85]  # LP at P = 2: median 0.85, goal 0.90 not met
    gloo = [2.0, 1.0, 4.0]  # gloo's busbw moves by 4x between rounds; the ratios do not
    rounds = []
    for g, x, y in zip(gloo, ring, lp):
        rows = []
        for size in (16 * MIB, 64 * MIB):
            rows += _rows(2, {"lp": y * g, "ring": x * g, "gloo": g}, size)
            rows += _rows(4, {"lp": 0.5 * g, "ring": 0.9 * g, "gloo": g}, size)
        rounds.append(rows)
    text = "\n".join(processes.render({"rounds": rounds, "mpi": False}))
    assert "| 64M | 0.85x (0.80-0.95) | 0.96x (0.90-1.00) |" in text
    assert "3 rounds" in text
    goals = [line for line in text.splitlines() if line.startswith("- Goal")]
    assert len(goals) == 2
    assert goals[0].startswith("- Goal: ring at least 0.95x") and ": not met." in goals[0]
    assert "2 processes, 16M: 0.96x, met (2 of 3 rounds at or above)" in goals[0]
    assert "4 processes, 64M: 0.90x, not met (0 of 3 rounds at or above)" in goals[0]
    assert goals[1].startswith("- Goal: LP at least 0.90x") and "2 processes, 64M: 0.85x, not met" in goals[1]
    head = processes.headline({"rounds": rounds, "mpi": False})
    assert head is not None and "ring 0.96x, LP 0.85x (P = 2)" in head[1]


def test_a_record_of_one_run_renders_as_one_round():
    rows = _rows(2, {"lp": 1.0, "ring": 1.0, "gloo": 1.0}) + _rows(2, {"lp": 1.0, "ring": 1.0, "gloo": 1.0}, 16 * MIB)
    assert "1 round" in "\n".join(processes.render({"rows": rows, "mpi": False}))


def _hook(native: list[float], ring: list[float]) -> dict:
    return {"recipe": "googlenet", "where": "2 processes on loopback", "nproc": 2, "steps": 8, "bucket_mb": 25.0,
            "repeats": len(native), "labels": {}, "rounds": {"native": native, "hook:ring": ring}}  # fmt: skip


def test_the_ddp_hook_ratio_is_the_median_of_each_rounds_ratio_not_the_best():
    # native / ring in each round: 0.909, 1.077, 0.923; the best of each would give 10 / 11 = 0.91
    text = "\n".join(ddp_hook.render(_hook([10.0, 14.0, 12.0], [11.0, 13.0, 13.0])))
    assert "| hook:ring | 11.00, 13.00, 13.00 | 13.00 | 1625 | 0.92x (0.91-1.08) |" in text
    goal = [line for line in text.splitlines() if line.startswith("- Goal")]
    assert len(goal) == 1 and "0.92x" in goal[0] and "not met" in goal[0] and "1 of 3 rounds" in goal[0]


def test_the_ddp_hook_section_gives_the_warm_up_apart_from_the_timed_steps():
    record = {**_hook([10.0, 14.0, 12.0], [11.0, 13.0, 13.0]), "warmup_steps": 2,
              "warmup": {"native": [3.0, 4.0, 5.0], "hook:ring": [6.0, 7.0, 9.0]}}  # fmt: skip
    text = "\n".join(ddp_hook.render(record))
    assert "8 steps timed after 2 of warm-up" in text
    assert "| first 2 steps, median s |" in text
    assert "| hook:ring | 11.00, 13.00, 13.00 | 13.00 | 1625 | 0.92x (0.91-1.08) | 7.00 |" in text


def test_ddp_hook_rounds_that_do_not_pair_are_refused_in_one_line():
    with pytest.raises(ValueError) as err:
        ddp_hook.render(_hook([10.0, 14.0, 12.0], [11.0, 13.0]))
    assert "\n" not in str(err.value) and "hook:ring" in str(err.value)

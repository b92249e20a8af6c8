"""A stop requested at any moment is never lost: the trainer's agreement across processes.

Under torchrun every process stops after the same step: after each step the processes
agree (one small all_reduce) whether any of them was asked to stop. A Ctrl-C that lands
while that all_reduce runs must not be overwritten by the agreement's answer; it is
carried into the next step's agreement, and the run stops there with a checkpoint.

The agreement runs here on a gloo group of one process that the trainer is told has two,
so the Ctrl-C can be put exactly inside the stop check's all_reduce, every time.
"""

from __future__ import annotations

import signal
import socket

import pytest
import torch
import torch.distributed as dist

QUIET = ["trainer.progress=false", "trainer.tensorboard=false", "trainer.eval_every=0"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def group_of_one(monkeypatch):
    """The environment torchrun gives rank 0 of a one-process job; the group is left after."""
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                       "TORCHELASTIC_RUN_ID": "test-stop", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(_free_port())}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    yield
    from lptrain.train.launch import finish

    finish()


def test_a_ctrl_c_during_the_stop_agreement_stops_the_run_at_the_next_step_with_a_checkpoint(
    tmp_path, monkeypatch, group_of_one
):
    from lptrain.settings.locations import compose_config
    from lptrain.train.trainer import Trainer

    config = compose_config([*QUIET, "data=synthetic", "trainer.devices=cpu*1", "trainer.batch_per_device=8",
                             "trainer.steps=3", "trainer.checkpoint_every=0"])  # fmt: skip
    trainer = Trainer(config, tmp_path / "run")
    assert dist.is_initialized() and trainer.rank == 0
    trainer.nprocs = 2  # the agreement runs as under torchrun (the group of one answers it)

    from lptrain.comm import bounded

    real_all_reduce = bounded.all_reduce
    landed: list[int] = []

    def all_reduce(tensor, group, timeout, op=dist.ReduceOp.SUM):
        done = real_all_reduce(tensor, group, timeout, op=op)
        # The stop check is the trainer's one MAX over the default group; the first one
        # gets the Ctrl-C while it runs (its handler runs as the call returns).
        if op == dist.ReduceOp.MAX and group is None and not landed:
            landed.append(1)
            signal.raise_signal(signal.SIGINT)
        return done

    monkeypatch.setattr(bounded, "all_reduce", all_reduce)
    summary = trainer.fit()
    assert landed, "the stop check's all_reduce never ran"
    assert summary.interrupted_by == signal.SIGINT, "the Ctrl-C was lost: the run trained to its end"
    assert summary.steps == 2  # the Ctrl-C landed in step 1's agreement; step 2's carries it
    checkpoint = tmp_path / "run" / "checkpoints" / "last.pt"
    assert torch.load(checkpoint, weights_only=True)["step"] == 2


def test_a_process_stopping_because_another_was_signalled_saves_on_its_own_first_signal():
    """torchrun (and lptrain-cluster) signal every worker once, one after another: a worker
    whose stop was already agreed because another got its signal first must take its own
    signal as the first (finish and save), and only a second one as "abort now"."""
    from types import SimpleNamespace

    from lptrain.train.trainer import Trainer

    said: list[str] = []
    trainer = SimpleNamespace(_stop_signal=0, _stop_requested=True, _stop_by=signal.SIGTERM, _abort_requested=False)
    previous = Trainer._install_signal_handlers(trainer, SimpleNamespace(message=said.append))
    try:
        signal.raise_signal(signal.SIGINT)  # its own first: no abort
        assert trainer._stop_signal == signal.SIGINT and not trainer._abort_requested and said
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)  # its second
        assert trainer._abort_requested
    finally:
        Trainer._restore_signal_handlers(previous)


CHILD = """
import signal, sys, time
from lptrain.train.parent import stop_with_launcher
def stopped(signum, frame):
    print("stopped by", signal.Signals(signum).name, flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, stopped)
stop_with_launcher()
print("ready", flush=True)
time.sleep(120)
"""

LAUNCHER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=open(sys.argv[2], "w"), start_new_session=True)
print(child.pid, flush=True)
time.sleep(120)
"""


def test_a_worker_whose_launcher_is_killed_is_stopped_with_sigterm(tmp_path):
    """A launcher killed with SIGKILL passes no signal on; the kernel then sends its worker
    (in a session of its own, as torchrun starts them) SIGTERM, on which the trainer saves."""
    import os
    import subprocess
    import sys
    import time

    from lptrain.cluster.netns import _alive

    said = tmp_path / "child.txt"
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, CHILD, str(said)], stdout=subprocess.PIPE, text=True)
    child = None
    try:
        child = int(launcher.stdout.readline())
        deadline = time.monotonic() + 60
        while "ready" not in (said.read_text() if said.exists() else ""):
            assert time.monotonic() < deadline and _alive(child), said.read_text() if said.exists() else ""
            time.sleep(0.05)
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 60  # a bound against a worker left running (120 s), not a timing
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the worker outlived its killed launcher"
        assert "stopped by SIGTERM" in said.read_text()
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        if child is not None and _alive(child):
            os.kill(child, signal.SIGKILL)


def test_a_stop_whose_notice_cannot_be_printed_is_still_a_stop():
    """Rank 0's console gone (its launcher killed, its pipe without a reader): the notice
    fails to print, and the stop must still finish the step and save, not end the step
    half-way with the print's BrokenPipeError."""
    from types import SimpleNamespace

    from lptrain.train.trainer import Trainer

    def message(text):
        raise BrokenPipeError(32, "Broken pipe")

    trainer = SimpleNamespace(_stop_signal=0, _stop_requested=False, _stop_by=0, _abort_requested=False)
    previous = Trainer._install_signal_handlers(trainer, SimpleNamespace(message=message))
    try:
        signal.raise_signal(signal.SIGTERM)
        assert trainer._stop_signal == signal.SIGTERM and not trainer._abort_requested
    finally:
        Trainer._restore_signal_handlers(previous)

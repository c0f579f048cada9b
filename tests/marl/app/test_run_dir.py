"""The run folder: a fresh run refuses one that holds a run; a resumed run continues it without
logging an iteration twice."""

import csv
import dataclasses
import re
import signal
import subprocess
import sys
import time

import pytest

from marl.app.cli import main
from marl.app.trainer import Trainer
from marl.config import TrainConfig
from tests.marl.app.test_training import small_config


@pytest.mark.parametrize("held", [("metrics.csv",), ("checkpoint.pt",), ("metrics.csv", "checkpoint.pt")])
def test_a_fresh_run_refuses_a_folder_that_holds_a_run(tmp_path, held):
    run = tmp_path / "run"
    run.mkdir()
    for name in held:
        (run / name).write_text("old\n")
    with pytest.raises(ValueError, match=f"run folder {run} already holds a run \\({', '.join(held)}\\)") as error:
        Trainer(small_config(tmp_path))
    message = str(error.value)
    assert "pick another --run-name" in message
    if "checkpoint.pt" in held:
        assert f"continue it with marl train --resume {run / 'checkpoint.pt'}" in message
    else:
        assert "no checkpoint to resume from" in message
    assert all((run / name).read_text() == "old\n" for name in held)  # nothing was touched


def test_a_folder_without_a_run_is_fine(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "learning_curve.png").write_text("")  # e.g. a plot, but no run
    Trainer(small_config(tmp_path))


def test_the_cli_refuses_a_used_run_name_in_one_line(tmp_path, capsys):
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "metrics.csv").write_text("iteration\n1\n")
    assert main(["train", "--log-dir", str(tmp_path), "--run-name", "used", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "marl train: error: run folder" in err and "already holds a run" in err and "Traceback" not in err


@pytest.mark.parametrize("name", ["../escaped", "a/b", "/tmp/abs", "a\\b", "..", "."])
def test_a_run_name_that_is_not_one_folder_is_refused(tmp_path, capsys, name):
    # LOG_DIR/RUN_NAME: "../escaped" wrote beside the log dir, "/tmp/abs" anywhere, ".." into the log dir's parent.
    log_dir = tmp_path / "runs"
    argv = ["train", "--log-dir", str(log_dir), "--run-name", name, "--total-frames", "1", "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"run_name {name!r} must name one folder under the log dir ({log_dir})" in err
    assert len(err.splitlines()) == 1 and not any(tmp_path.iterdir())
    config = small_config(tmp_path).to_dict()  # an earlier version took it: its checkpoints still load
    config["run"]["run_name"] = name
    assert TrainConfig.from_dict(config).run.run_name == ""


def iterations(run_dir) -> list[int]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return [int(row["iteration"]) for row in csv.DictReader(f)]


def interrupted_after_3(tmp_path, **run_options) -> Trainer:
    """A run checkpointed every 2 iterations, interrupted (Ctrl-C) after logging iteration 3."""
    config = small_config(tmp_path)
    run_config = dataclasses.replace(config.run, checkpoint_every=2, total_frames=10**6, **run_options)
    trainer = Trainer(dataclasses.replace(config, run=run_config))
    train_iteration = trainer.train_iteration

    def iteration_or_interrupt():
        if trainer.iteration == 3:
            raise KeyboardInterrupt
        return train_iteration()

    trainer.train_iteration = iteration_or_interrupt
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    return trainer


def test_resume_drops_the_iterations_logged_after_the_checkpoint(tmp_path):
    """Interrupted at iteration 3 with the last checkpoint at 2: the resumed run logs iteration 3 again,
    replacing the old row instead of appending a duplicate."""
    trainer = interrupted_after_3(tmp_path)
    run = tmp_path / "run"
    assert iterations(run) == [1, 2, 3]

    resumed = Trainer.resume(run / "checkpoint.pt", total_frames=3 * trainer.frames_per_iteration)
    assert resumed.iteration == 2 and iterations(run) == [1, 2]  # dropped at once, before training
    rows = resumed.train()
    assert [r["iteration"] for r in rows] == [3] and iterations(run) == [1, 2, 3]
    with open(run / "metrics.csv", newline="") as f:
        last = list(csv.DictReader(f))[-1]
    assert float(last["time_s"]) == rows[0]["time_s"]  # the resumed run's row, not the old one
    assert not list(run.glob("*.tmp"))


def tensorboard_scalars(run_dir, tag: str) -> list[tuple[int, float]]:
    """(step, value) of `tag` as TensorBoard shows it: events at purged steps are dropped."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return [(event.step, event.value) for event in events.Scalars(tag)]


def test_resume_drops_the_tensorboard_steps_logged_after_the_checkpoint(tmp_path):
    """As the CSV: TensorBoard shows iteration 3 once, from the resumed run, not twice."""
    trainer = interrupted_after_3(tmp_path, tensorboard=True)
    run, frames = tmp_path / "run", trainer.frames_per_iteration
    assert [step for step, _ in tensorboard_scalars(run, "iteration")] == [frames, 2 * frames, 3 * frames]

    resumed = Trainer.resume(run / "checkpoint.pt", total_frames=4 * frames)
    rows = resumed.train()
    assert tensorboard_scalars(run, "iteration") == [(k * frames, float(k)) for k in (1, 2, 3, 4)]
    resumed_time = [value for step, value in tensorboard_scalars(run, "time_s") if step == 3 * frames]
    assert resumed_time == [pytest.approx(rows[0]["time_s"])]


def test_sigterm_stops_a_run_saying_where_its_last_checkpoint_is(tmp_path):
    """A scheduler's time limit (and torchrun, to the ranks left when one fails) sends SIGTERM: the run
    used to die without a word; now it stops as on Ctrl-C, naming the checkpoint to resume from."""
    command = [sys.executable, "-m", "marl", "train", "--env", "navigation", "--num-envs", "32",
               "--rollout-length", "16", "--minibatch-size", "256", "--epochs", "2", "--hidden", "32", "32",
               "--total-frames", "100000000", "--checkpoint-every", "1", "--log-dir", str(tmp_path),
               "--run-name", "run", "--no-progress", "--no-tensorboard"]  # fmt: skip
    checkpoint = tmp_path / "run" / "checkpoint.pt"
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        deadline = time.monotonic() + 120
        while not checkpoint.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert re.search(
        rf"the last checkpoint, of iteration \d+, is {re.escape(str(checkpoint))} \(resume with marl train --resume {re.escape(str(checkpoint))}\)",
        out,
    ), out
    assert err.strip().splitlines()[-1] == "marl train: terminated (SIGTERM)", err[-2000:]
    assert "Traceback" not in err


def summary_lines(out: str) -> list[str]:
    """The summary's line of the group's return (not the run's folder, frames or time)."""
    return [line for line in out.splitlines() if line.startswith("agent ")]


@pytest.mark.parametrize("seeds", [[], ["--seeds", "0", "1"]], ids=["single", "population"])
def test_a_resumed_run_summarises_the_whole_run_as_the_uninterrupted_one(tmp_path, capsys, seeds):
    """The summary's returns (the last tenth of the iterations, the first return) are of the whole run:
    resumed half way, it prints what the run trained in one go prints, not a summary of the second half."""
    argv = [
        "train", *("--num-envs", "8", "--rollout-length", "8", "--minibatch-size", "32", "--hidden", "8"),
        *("--env-option", "max_steps=4", "--log-dir", str(tmp_path), "--no-progress", "--no-tensorboard", *seeds),
    ]  # fmt: skip
    assert main([*argv, "--total-frames", "1280", "--run-name", "whole"]) == 0  # 20 iterations of 64 frames
    whole = summary_lines(capsys.readouterr().out)
    assert main([*argv, "--total-frames", "640", "--run-name", "halves"]) == 0
    capsys.readouterr()
    checkpoint = tmp_path / "halves" / "checkpoint.pt"
    assert main(["train", "--resume", str(checkpoint), "--total-frames", "1280", "--no-progress"]) == 0
    resumed = summary_lines(capsys.readouterr().out)
    assert whole and resumed == whole
    assert seeds or "over the last 2 iteration(s) (first: " in whole[0] and "at 64 frames)" in whole[0]

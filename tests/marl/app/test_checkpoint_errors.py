"""Loading a file that is not a vecmarl checkpoint says so in one clear error, not torch's; so does a
checkpoint that cannot be written (a full disk), which leaves the previous one as it was, and a run folder
or log row that cannot be written."""

import contextlib
import errno
import io
import os
import struct
import zipfile
from pathlib import Path

import pytest
import torch

import marl.app.logger
import marl.app.trainer
from marl.algorithms.ppo import PPOConfig
from marl.app.checkpoint import CheckpointWriteError, load_checkpoint, save_checkpoint
from marl.app.cli import main
from marl.app.trainer import Trainer
from marl.config import EnvSettings, ModelConfig, RunConfig, TrainConfig

NOT_A_CHECKPOINT = "is not a vecmarl checkpoint (a checkpoint.pt written by marl train): "


@pytest.fixture(scope="module")
def real_checkpoint(tmp_path_factory):
    """The bytes of a checkpoint that `marl train` writes, from an untrained tiny run."""
    run_dir = tmp_path_factory.mktemp("real")
    config = TrainConfig(
        env=EnvSettings(env="navigation", num_envs=4),
        algo=PPOConfig(minibatch_size=32, epochs=1),
        model=ModelConfig(hidden=(8,)),
        run=RunConfig(total_frames=32, rollout_length=8, progress=False, tensorboard=False),
    )
    path = Trainer(config, run_dir=run_dir).save()
    assert load_checkpoint(path)["config"] == config.to_dict()
    return path.read_bytes()


def _text(path):
    path.write_text("not a checkpoint\n")


def _csv(path):
    path.write_text("iteration,frames,episode_return\n1,256,-3.5\n")


def _tensor(path):
    torch.save(torch.zeros(3), path)


def _other_dict(path):
    torch.save({"policy": {"weight": torch.zeros(2)}}, path)


def _empty(path):
    path.write_bytes(b"")


@pytest.mark.parametrize(
    "write, reason",
    [
        (_text, "it is not a file written by torch.save"),
        (_csv, "it is not a file written by torch.save"),
        (_tensor, "it holds a Tensor, not a dict"),
        (_other_dict, "it is a dict without the key(s) ['config', 'iteration'"),
        (_empty, "the file is empty"),
    ],
)
def test_a_file_that_is_not_a_checkpoint_is_a_value_error(tmp_path, write, reason):
    path = tmp_path / "bad.pt"
    write(path)
    with pytest.raises(ValueError) as error:
        load_checkpoint(path)
    assert str(error.value).startswith(f"{path} {NOT_A_CHECKPOINT}")
    assert reason in str(error.value)


def test_a_truncated_checkpoint_is_a_value_error(tmp_path, real_checkpoint):
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(real_checkpoint[: len(real_checkpoint) // 2])
    with pytest.raises(ValueError, match="is truncated or corrupted"):
        load_checkpoint(path)


def test_a_checkpoint_whose_pickle_is_damaged_is_corrupted_not_python_objects(tmp_path, real_checkpoint):
    # Bytes of its data.pkl zeroed (a disk or copy error the zip does not catch): torch's weights-only
    # unpickler raises the same UnpicklingError ("Unsupported operand 0") as for a Python object.
    with zipfile.ZipFile(io.BytesIO(real_checkpoint)) as archive:
        entry = next(i for i in archive.infolist() if i.filename.endswith("/data.pkl"))  # stored uncompressed
    # Its bytes follow its local header: 30 bytes, then the name and the extra field, their lengths at 26 and 28.
    name_length, extra_length = struct.unpack_from("<HH", real_checkpoint, entry.header_offset + 26)
    middle = entry.header_offset + 30 + name_length + extra_length + entry.file_size // 2
    damaged = bytearray(real_checkpoint)
    damaged[middle : middle + 16] = bytes(16)
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(bytes(damaged))
    with pytest.raises(ValueError, match=r"is truncated or corrupted \(torch.load: Unsupported operand 0\)") as error:
        load_checkpoint(path)
    assert "Python objects" not in str(error.value) and "weights_only" not in str(error.value)


def test_a_python_object_in_the_file_is_refused_without_suggesting_weights_only_false(tmp_path):
    path = tmp_path / "bad.pt"
    torch.save({"config": object()}, path)
    with pytest.raises(ValueError, match="holds Python objects other than tensors") as error:
        load_checkpoint(path)
    assert "weights_only" not in str(error.value)


def test_a_missing_checkpoint_stays_a_file_not_found_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"no checkpoint at {tmp_path / 'nope.pt'}"):
        load_checkpoint(tmp_path / "nope.pt")
    (tmp_path / "checkpoint.pt").write_bytes(b"")  # a run folder given for its checkpoint
    with pytest.raises(FileNotFoundError, match=f"{tmp_path} is a run folder; pass its checkpoint, {tmp_path}/"):
        load_checkpoint(tmp_path)
    # A folder of runs, or one without a checkpoint (a run stopped before it wrote its first): not "no checkpoint at".
    runs = tmp_path / "runs"
    (runs / "a").mkdir(parents=True)
    (runs / "a" / "checkpoint.pt").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=f"^{runs} is a folder of runs; pass one's checkpoint, e.g. {runs}/a/"):
        load_checkpoint(runs)
    (runs / "b").mkdir()
    with pytest.raises(FileNotFoundError, match=f"^{runs / 'b'} is a folder without a checkpoint.pt; pass the"):
        load_checkpoint(runs / "b")


@pytest.mark.parametrize("command", ["train --resume", "eval --checkpoint"])
@pytest.mark.parametrize("write", [_text, _csv])
def test_the_cli_reports_a_bad_checkpoint_in_one_line(tmp_path, capsys, command, write):
    path = tmp_path / "metrics.csv"
    write(path)
    assert main([*command.split(), str(path)]) == 2
    err = capsys.readouterr().err
    assert (
        err.strip()
        == f"marl {command.split()[0]}: error: {path} {NOT_A_CHECKPOINT}it is not a file written by torch.save"
    )


# --- a checkpoint of another layout (another vecmarl version) --------------------------------------

OTHER_VERSION = "it was written by another version of vecmarl"


def _new_run_option(state):
    state["config"]["run"]["frames_per_second_limit"] = 100


def _no_run_section(state):
    del state["config"]["run"]


def _no_algo_name(state):
    del state["config"]["algo"]["algo"]


def _renamed_group(state):
    state["algorithm"]["agents"] = state["algorithm"].pop("agent")


def _wider_network(state):
    state["config"]["model"]["hidden"] = [16]


@pytest.mark.parametrize(
    "change, message",
    [
        (_new_run_option, "the checkpoint's run options ['frames_per_second_limit'] are not options of this vecmarl's"),
        (_no_run_section, "the checkpoint's config has no 'run' section"),
        (_no_algo_name, "the checkpoint's config has no 'algo' in its 'algo' section"),
        (_renamed_group, "the checkpoint's algorithm state has no entry 'agent'"),
        (_wider_network, "the checkpoint's algorithm state does not fit: size mismatch for"),
    ],
)
@pytest.mark.parametrize("command", [["eval", "--episodes", "1", "--checkpoint"], ["train", "--resume"]])
def test_a_checkpoint_of_another_layout_is_one_line_naming_what_does_not_fit(
    tmp_path, capsys, real_checkpoint, change, message, command
):
    # Before, `marl eval` printed "error: run" or "error: agent" (a bare KeyError), a traceback of torch's
    # size mismatches, or every valid option of a config; `--resume` the same but for a missing entry.
    path = tmp_path / "run" / "checkpoint.pt"
    path.parent.mkdir()
    path.write_bytes(real_checkpoint)
    state = torch.load(path, weights_only=True)
    change(state)
    torch.save(state, path)
    assert main([*command, str(path), *(["--total-frames", "64", "--no-progress"] if "train" in command else [])]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"marl {command[0]}: error: {message}") and OTHER_VERSION in err
    assert len(err.strip().splitlines()) == 1


# --- a checkpoint that cannot be written ---------------------------------------------------------

FULL = "No space left on device"


def _save_then_fill_the_disk(monkeypatch):
    """torch.save writes part of the checkpoint, then the disk is full."""

    def save_part(state, file):
        with contextlib.nullcontext(file) if hasattr(file, "write") else open(file, "wb") as out:
            out.write(b"PK\x03\x04 the first part of a checkpoint")
        raise OSError(errno.ENOSPC, FULL)

    monkeypatch.setattr(torch, "save", save_part)


class _FullDisk:
    """A file whose disk fills up after `room` bytes, each write failing as the OS's would."""

    def __init__(self, file, room: int):
        self.file, self.room = file, room

    def write(self, data) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, FULL)
        self.room -= len(data)
        return self.file.write(data)

    def __getattr__(self, name):
        return getattr(self.file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()


def _fill_the_disk_under_torch(monkeypatch):
    """The file's own writes fail mid-checkpoint: torch.save turns that into a RuntimeError of its own
    ("unexpected pos"), as on a real full disk."""
    open_path = Path.open
    monkeypatch.setattr(Path, "open", lambda path, *args, **kwargs: _FullDisk(open_path(path, *args, **kwargs), 5000))


@pytest.mark.parametrize("fill", [_save_then_fill_the_disk, _fill_the_disk_under_torch])
def test_a_full_disk_keeps_the_previous_checkpoint_and_says_so(tmp_path, real_checkpoint, monkeypatch, fill):
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(real_checkpoint)
    state = load_checkpoint(path)
    fill(monkeypatch)
    with pytest.raises(CheckpointWriteError) as error:
        save_checkpoint(path, state)
    assert str(error.value) == f"could not write the checkpoint {path}: {FULL}; the previous checkpoint there is kept"
    assert error.value.__cause__ is not None  # the OS's error and torch's stay in the traceback
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"], "no checkpoint.pt.tmp is left"
    assert path.read_bytes() == real_checkpoint and load_checkpoint(path)["iteration"] == state["iteration"]
    # Without a previous checkpoint, none is left, whole or in part.
    fill(monkeypatch)
    with pytest.raises(CheckpointWriteError, match=f"{FULL}; no checkpoint was written$"):
        save_checkpoint(tmp_path / "new" / "checkpoint.pt", state)
    assert not list((tmp_path / "new").iterdir())


class _Unpicklable:
    def __reduce__(self):
        raise TypeError("cannot pickle this")


def test_an_error_that_is_not_the_oss_leaves_no_temporary_file_and_stays_itself(tmp_path):
    with pytest.raises(TypeError, match="cannot pickle this"):
        save_checkpoint(tmp_path / "checkpoint.pt", {"config": _Unpicklable()})
    assert not list(tmp_path.iterdir())


TINY = ["--num-envs", "4", "--rollout-length", "8", "--minibatch-size", "32", "--hidden", "8", "--no-progress"]


def _one_iteration_run(tmp_path, capsys) -> Path:
    """The checkpoint of a tiny run of one iteration, in `tmp_path/run`; its output is read away."""
    run = ["train", *TINY, "--no-tensorboard", "--log-dir", str(tmp_path), "--run-name", "run"]
    assert main([*run, "--total-frames", "32"]) == 0
    capsys.readouterr()
    return tmp_path / "run" / "checkpoint.pt"


def test_the_cli_reports_a_full_disk_in_one_line(tmp_path, capsys, monkeypatch):
    path = _one_iteration_run(tmp_path, capsys)
    saved = path.read_bytes()
    _save_then_fill_the_disk(monkeypatch)
    assert main(["train", "--resume", str(path), "--total-frames", "64"]) == 1
    captured = capsys.readouterr()
    assert captured.err == (
        f"marl train: error: could not write the checkpoint {path}: {FULL}; the previous checkpoint there is kept\n"
    )
    assert f"the run failed at saving iteration 2's checkpoint; the last checkpoint, of iteration 1, is {path}" in (
        captured.out
    )
    assert path.read_bytes() == saved and not os.path.exists(f"{path}.tmp")


def test_a_log_row_that_cannot_be_written_is_one_line_and_keeps_the_checkpoint(tmp_path, capsys, monkeypatch):
    path = _one_iteration_run(tmp_path, capsys)
    saved = path.read_bytes()

    def full_disk_on_append(file, mode="r", *args, **kwargs):
        if mode == "a":
            raise OSError(errno.ENOSPC, FULL)
        return open(file, mode, *args, **kwargs)

    monkeypatch.setattr(marl.app.logger, "open", full_disk_on_append, raising=False)
    assert main(["train", "--resume", str(path), "--total-frames", "64"]) == 1
    captured = capsys.readouterr()
    metrics = tmp_path / "run" / "metrics.csv"
    assert captured.err == f"marl train: error: could not write iteration 2's row of {metrics}: {FULL}\n"
    assert f"the last checkpoint, of iteration 1, is {path}" in captured.out
    assert path.read_bytes() == saved


def test_ctrl_c_while_saving_says_which_iteration_the_checkpoint_holds(tmp_path, capsys, monkeypatch):
    """Interrupted while iteration 2's checkpoint was written, the run said "interrupted at iteration 2" and
    named the checkpoint, which held iteration 1: the resume then replayed iteration 2, unannounced."""
    path = _one_iteration_run(tmp_path, capsys)
    saved = path.read_bytes()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(marl.app.trainer, "save_checkpoint", interrupted)
    assert main(["train", "--resume", str(path), "--total-frames", "64"]) == 130
    out = capsys.readouterr().out
    assert f"interrupted while saving iteration 2's checkpoint; the last checkpoint, of iteration 1, is {path}" in out
    assert path.read_bytes() == saved


def test_a_run_folder_the_os_will_not_make_is_one_line(tmp_path, capsys, monkeypatch):
    # The up-front checks find a writable parent, yet the OS refuses the folder (e.g. one under /proc).
    run_dir = tmp_path / "run"
    mkdir = Path.mkdir

    def refuse(path, *args, **kwargs):
        if path == run_dir:
            raise OSError(errno.EROFS, "Read-only file system")
        return mkdir(path, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", refuse)
    assert main(["train", *TINY, "--total-frames", "32", "--log-dir", str(tmp_path), "--run-name", "run"]) == 1
    assert capsys.readouterr().err == (
        f"marl train: error: could not make the run folder {run_dir}: Read-only file system\n"
    )

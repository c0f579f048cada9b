"""`marl eval`, `marl plot` and `marl bench` as a new user runs them: bad paths and options are refused in
one line before any work, and what they print and write is what they did."""

import json
import math
import sys
from pathlib import Path

import pytest

import marl.app.evaluate
import marl.bench.suite
from marl.app.cli import main
from marl.bench.suite import main as bench_main
from marl.config import EnvSettings, TrainConfig


def write_run(folder: Path, returns: list[str]) -> Path:
    folder.mkdir(parents=True)
    rows = ["iteration,frames,time_s,agent/episode_return"]
    rows += [f"{i + 1},{(i + 1) * 100},{(i + 1) * 0.5},{r}" for i, r in enumerate(returns)]
    (folder / "metrics.csv").write_text("\n".join(rows) + "\n")
    return folder


# --- marl plot -----------------------------------------------------------------------------------


def test_plot_reports_the_file_it_wrote(tmp_path, capsys, monkeypatch):
    run = write_run(tmp_path / "runs" / "a", ["nan", "1.0", "2.0"])
    monkeypatch.chdir(tmp_path)
    # matplotlib adds .png to a name without an extension: the path printed must be that file.
    assert main(["plot", str(run), "--out", "curves"]) == 0
    assert (tmp_path / "curves.png").is_file() and not (tmp_path / "curves").exists()
    assert capsys.readouterr().out == "wrote curves.png\n"
    # A folder: the figure goes inside it, not to a sibling "figures.png".
    (tmp_path / "figures").mkdir()
    assert main(["plot", str(run), "--out", "figures"]) == 0
    assert (tmp_path / "figures" / "learning_curve.png").is_file() and not (tmp_path / "figures.png").exists()
    assert capsys.readouterr().out == f"wrote {Path('figures') / 'learning_curve.png'}\n"


@pytest.mark.parametrize(
    "args, message",
    [
        (["runs/a", "--out", "nodir/c.png"], "cannot write nodir/c.png: the folder nodir does not exist"),
        (["runs/a", "--out", "newdir/"], "cannot write newdir/learning_curve.png: the folder newdir does not exist"),
        # matplotlib refused a format it does not write only after drawing the figure, in its own words.
        (["runs/a", "--out", "curves.txt"], "cannot write curves.txt: matplotlib writes "),
        (
            ["runs/a", "--out", "runs/a/metrics.csv/c.png"],
            "cannot write runs/a/metrics.csv/c.png: runs/a/metrics.csv is a file",
        ),
        (["runs"], "no metrics.csv in runs: it is a folder of runs (a, b); pass one or more of them, e.g. runs/a"),
        (["runs/a/metrics.csv"], "pass the run folder that holds it (runs/a), not a file"),
        (["runs/c"], "no metrics.csv in runs/c: there is no such folder"),
        # --log-dir pops of a population: its runs hold aggregate.csv, their members' metrics one level down.
        (["pops"], "no metrics.csv in pops: it is a folder of runs (p); pass one or more of them, e.g. pops/p"),
        (["bad/none"], "bad/none: no episode has ended yet in its 2 iteration(s), so there is no return to plot"),
        (["bad/other"], "bad/other/metrics.csv has no episode_return column"),
        # Was a bare KeyError: "marl plot: error: time_s".
        (["bad/untimed", "--x", "time"], "bad/untimed/metrics.csv has no time_s column to plot against (--x time)"),
        (["bad/torn"], "bad/torn/metrics.csv, line 3: agent/episode_return is '1.2e', not a number"),
        # A population read from its aggregate.csv names that file, not a metrics.csv it does not have.
        (["bad/pop-empty"], "bad/pop-empty/aggregate.csv has no rows yet"),
        (["bad/pop-other"], "bad/pop-other/aggregate.csv has no episode_return column"),
    ],
)
def test_plot_refuses_what_it_cannot_draw_or_write_in_one_line(args, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_run(tmp_path / "runs" / "a", ["1.0", "2.0"])
    write_run(tmp_path / "runs" / "b", ["1.0", "2.0"])
    (tmp_path / "pops" / "p").mkdir(parents=True)
    (tmp_path / "pops" / "p" / "aggregate.csv").write_text("frames,time_s,agent/episode_return\n100,1,1.0\n")
    (tmp_path / "bad" / "none").mkdir(parents=True)  # iterations shorter than an episode: no return logged
    (tmp_path / "bad" / "none" / "metrics.csv").write_text("frames,time_s,agent/episode_return\n100,1,\n200,2,nan\n")
    (tmp_path / "bad" / "torn").mkdir()  # a row cut short with rows after it (a cut last row is left out)
    torn = "frames,time_s,agent/episode_return\n100,1,1.0\n200,2,1.2e\n300,3,1.0\n"
    (tmp_path / "bad" / "torn" / "metrics.csv").write_text(torn)
    (tmp_path / "bad" / "untimed").mkdir()  # a log cut down by hand
    (tmp_path / "bad" / "untimed" / "metrics.csv").write_text("frames,agent/episode_return\n100,1.0\n")
    (tmp_path / "bad" / "other").mkdir()  # some other CSV
    (tmp_path / "bad" / "other" / "metrics.csv").write_text("frames,time_s,loss\n100,1,0.5\n")
    for name, text in (("empty", "frames,time_s,agent/episode_return\n"), ("other", "frames,time_s,loss\n100,1,0.5\n")):
        (tmp_path / "bad" / f"pop-{name}").mkdir()  # a population: aggregate.csv, members' logs one level down
        (tmp_path / "bad" / f"pop-{name}" / "aggregate.csv").write_text(text)
    assert main(["plot", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.splitlines()) == 1
    assert not list(tmp_path.rglob("*.png")), "nothing is drawn when the input is refused"


def test_plot_without_matplotlib_says_which_extra_to_install(tmp_path, monkeypatch, capsys):
    run = write_run(tmp_path / "run", ["1.0", "2.0"])
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the `plot` extra were not installed
    assert main(["plot", str(run)]) == 2
    assert capsys.readouterr().err == 'marl plot: error: plotting needs matplotlib: pip install "vecmarl[plot]"\n'
    assert not list(tmp_path.rglob("*.png"))


def test_plot_refuses_a_read_only_run_folder_in_one_line_naming_out(tmp_path, capsys, read_only):
    # Was a PermissionError traceback from matplotlib, after the figure was drawn.
    run = write_run(tmp_path / "run", ["1.0", "2.0"])
    read_only(run)
    assert main(["plot", str(run)]) == 2
    assert capsys.readouterr().err == (
        f"marl plot: error: cannot write {run / 'learning_curve.png'}: the folder {run} is not writable; "
        "pass --out to write the figure elsewhere\n"
    )
    assert main(["plot", str(run), "--out", str(tmp_path / "curves.png")]) == 0
    assert (tmp_path / "curves.png").is_file() and not (run / "learning_curve.png").exists()
    read_only(tmp_path / "curves.png")  # a figure that is there already, kept read-only
    assert main(["plot", str(run), "--out", str(tmp_path / "curves.png")]) == 2
    assert capsys.readouterr().err == (  # no hint to pass the --out that was passed
        f"marl plot: error: cannot write {tmp_path / 'curves.png'}: {tmp_path / 'curves.png'} is not writable\n"
    )


# --- marl eval -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "render, message",
    [
        ("{tmp}", "cannot write {tmp}: it is a folder; give a file name such as {tmp}/episode.gif"),
        (
            "{tmp}/team.mp4",
            "cannot write {tmp}/team.mp4: --render writes an animated GIF, so give a name ending in .gif",
        ),
        ("{tmp}/team", "--render writes an animated GIF"),
    ],
)
def test_eval_refuses_a_render_path_it_cannot_write_before_evaluating(render, message, tmp_path, capsys):
    # Checked before the checkpoint is even read (c.pt does not exist): Pillow would otherwise fail only
    # after the whole evaluation, with "unknown file extension: ".
    render, message = render.format(tmp=tmp_path), message.format(tmp=tmp_path)
    assert main(["eval", "--checkpoint", "c.pt", "--render", render]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.splitlines()) == 1


def fake_result(episodes: int, std: float):
    return {"returns": {"agent": {"mean": -1.5, "std": std}}, "episodes": episodes, "episode_length": 25.0}


def test_eval_names_the_spread_it_prints(monkeypatch, capsys):
    # "+- 11.09" read as the mean's uncertainty (sqrt(100) times smaller than the episodes' spread),
    # and one episode printed "+- 0.0000 over 1 episodes".
    monkeypatch.setattr(marl.app.evaluate, "evaluate", lambda checkpoint, **kwargs: fake_result(100, 11.0931))
    assert main(["eval", "--checkpoint", "c.pt"]) == 0
    out = capsys.readouterr().out
    assert "agent: mean episode return -1.5000 over 100 episodes (std across episodes 11.0931)" in out
    assert "+-" not in out
    monkeypatch.setattr(marl.app.evaluate, "evaluate", lambda checkpoint, **kwargs: fake_result(1, 0.0))
    assert main(["eval", "--checkpoint", "c.pt", "--episodes", "1"]) == 0
    assert "agent: mean episode return -1.5000 over 1 episode\n" in capsys.readouterr().out


def test_eval_says_which_module_registers_the_checkpoints_env(monkeypatch, capsys, tmp_path):
    # A run trained with --imports my_envs, evaluated from another folder.
    config = TrainConfig(env=EnvSettings(env="my_counter", imports=("my_envs_not_here",)))
    monkeypatch.setattr(marl.app.evaluate, "load_checkpoint", lambda path: {"config": config.to_dict()})
    assert main(["eval", "--checkpoint", "c.pt"]) == 2
    err = capsys.readouterr().err
    assert (
        "--imports my_envs_not_here: no module 'my_envs_not_here' is found here: run marl from the folder that "
        "holds it" in err
    )
    # Found, but one of its own imports is missing: that is what the message names.
    (tmp_path / "my_envs_broken.py").write_text("import a_dependency_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = TrainConfig(env=EnvSettings(env="my_counter", imports=("my_envs_broken",)))
    assert main(["eval", "--checkpoint", "c.pt"]) == 2
    err = capsys.readouterr().err
    assert (
        "importing 'my_envs_broken' failed: No module named 'a_dependency_not_installed'" in err
        and "not found here" not in err
    )


@pytest.mark.parametrize(
    "metadata, listed",
    [
        ({"name": "runners_v0"}, "lists no render_modes"),
        ({"render_modes": ["ansi"]}, "lists only the render_modes ['ansi']"),
    ],
    ids=["none", "ansi"],
)
def test_eval_render_of_a_pettingzoo_env_that_cannot_draw_says_why(metadata, listed, monkeypatch, capsys, tmp_path):
    # It said only "does not render: run marl eval without --render"; then to make the env with
    # render_mode='rgb_array', which marl eval --render now asks for: an env whose metadata lists no such mode is
    # refused before it is built (its constructor would fail on the keyword, or draw nothing).
    pytest.importorskip("pettingzoo")
    import tests.envs.pz_toy

    monkeypatch.setattr(tests.envs.pz_toy.RunnersEnv, "metadata", metadata)
    config = TrainConfig(env=EnvSettings(env="pettingzoo/tests.envs.pz_toy"))
    monkeypatch.setattr(marl.app.evaluate, "load_checkpoint", lambda path: {"config": config.to_dict()})
    assert main(["eval", "--checkpoint", "c.pt", "--render", str(tmp_path / "e.gif")]) == 2
    err = capsys.readouterr().err
    assert (
        f"marl eval: error: pettingzoo/tests.envs.pz_toy cannot draw frames: its metadata {listed}, and the adapter "
        "draws with render_mode='rgb_array': run marl eval without --render\n" in err
    )


def test_eval_render_of_a_vmas_env_says_what_vmas_needs_to_draw(monkeypatch, capsys, tmp_path):
    # It said only "does not render". VMAS draws headless through EGL, else on an X display: where it
    # has neither, the message says so and what to install.
    pytest.importorskip("vmas")
    import envs.adapters.vmas

    monkeypatch.setattr(envs.adapters.vmas, "_egl_devices", lambda: 0)
    monkeypatch.delenv("DISPLAY", raising=False)
    config = TrainConfig(env=EnvSettings(env="vmas/navigation"))
    monkeypatch.setattr(marl.app.evaluate, "load_checkpoint", lambda path: {"config": config.to_dict()})
    assert main(["eval", "--checkpoint", "c.pt", "--render", str(tmp_path / "e.gif")]) == 2
    err = capsys.readouterr().err
    assert "marl eval: error: vmas/navigation cannot render on this machine: VMAS draws headless only" in err
    assert "nor is there an X display (DISPLAY is not set)" in err and "COMMAND): run marl eval without --render" in err


# --- marl bench ----------------------------------------------------------------------------------

SKIP_ALL = ["--quick", "--no-vmas", "--skip", "env", "replay", "gae", "train", "target"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--device", "gpu"], "unknown device 'gpu'; expected cpu, cuda, cuda:N or auto"),
        (["--json", "{tmp}/nodir/b.json"], "--json {tmp}/nodir/b.json: the folder {tmp}/nodir does not exist"),
        (["--json", "{tmp}"], "--json {tmp}: it is a folder"),
        (["--jaxmarl-python", "{tmp}/no-python"], "--jaxmarl-python {tmp}/no-python: no such interpreter"),
        (["--benchmarl-python", "{tmp}/no-python"], "--benchmarl-python {tmp}/no-python: no such interpreter"),
        (["--torchrl-python", "{python}"], "--torchrl-python {python}: torchrl not installed in that interpreter"),
    ],
)
@pytest.mark.parametrize("entry", ["marl", "bench"])
def test_bench_refuses_bad_paths_and_devices_before_any_section_runs(argv, message, entry, tmp_path, usage_error):
    import importlib.util
    import sys

    if "{python}" in " ".join(argv) and importlib.util.find_spec("torchrl") is not None:
        pytest.skip("torchrl is installed here")
    argv = [a.format(tmp=tmp_path, python=sys.executable) for a in argv]
    message = message.format(tmp=tmp_path, python=sys.executable)
    with usage_error() as refused:  # `marl bench` hands its arguments to the benchmark's parser
        main(["bench", *SKIP_ALL, *argv]) if entry == "marl" else bench_main([*SKIP_ALL, *argv])
    assert f"marl bench: error: {message}" in refused.err
    assert "command: marl bench" not in refused.out  # no section started


def test_bench_json_is_valid_json_when_a_target_is_not_reached(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(marl.bench.suite, "yardsticks", lambda env_name, device: (0.0, 1.0))
    monkeypatch.setattr(marl.bench.suite, "time_to_target", lambda config, target: (math.nan, 2_000_000, 0.5))
    out = tmp_path / "bench.json"
    # without --quick, which leaves out the target section
    rows = bench_main(["--device", "cpu", "--skip", "env", "replay", "gae", "train", "--json", str(out)])
    assert [math.isnan(r["vecmarl"]) for r in rows] == [True, True]
    # NaN is not JSON (JSON.parse and other strict readers refuse it): a target not reached is null.
    text = out.read_text()
    saved = json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in the JSON"))
    assert [r["vecmarl"] for r in saved] == [None, None]
    printed = capsys.readouterr().out
    assert "nan: the return did not reach 0.80 within the cap of 2,000,000 frames" in printed


def test_bench_says_the_train_rows_jaxmarl_figure_is_quoted(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(marl.bench.suite, "train_rate", lambda config, warmup, iterations, repeats: 1000.0)
    rows = bench_main(["--quick", "--device", "cpu", "--skip", "env", "replay", "gae", "target"])
    peers = {r["peer"] for r in rows if r["benchmark"].startswith("spread IPPO")}
    assert peers == {"JaxMARL (quoted)"}
    assert "not measured in the run" in " ".join(marl.bench.suite.__doc__.split())


def test_bench_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for says in ("(default: auto", "(default: 3)", "(default: on)", "(default: 0.8)"):
        assert says in out


# --- marl envs -----------------------------------------------------------------------------------


def test_envs_says_what_the_adapter_patterns_take(capsys, monkeypatch):
    # `vmas/<scenario>` and `pettingzoo/<module.env>` were listed bare: no example, no options, and no
    # word that they need an extra.
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vmas" else find_spec(name, *a))
    assert main(["envs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    vmas = lines[lines.index("vmas/<scenario>") + 1]
    assert "e.g. vmas/navigation" in vmas and "continuous_actions" in vmas
    assert vmas.endswith('(not installed: pip install "vecmarl[vmas]")')
    pettingzoo = lines[lines.index("pettingzoo/<module.env>") + 1]
    assert "e.g. pettingzoo/mpe2.simple_spread_v3" in pettingzoo and "max_steps" in pettingzoo


def test_plot_tells_apart_runs_whose_folders_share_a_name(tmp_path, monkeypatch):
    import matplotlib.axes

    labels = []
    plot = matplotlib.axes.Axes.plot
    monkeypatch.setattr(
        matplotlib.axes.Axes, "plot", lambda self, *a, **k: labels.append(k["label"]) or plot(self, *a, **k)
    )
    seed0, seed1 = write_run(tmp_path / "seed0" / "nav", ["1.0"]), write_run(tmp_path / "seed1" / "nav", ["2.0"])
    other = write_run(tmp_path / "ippo", ["3.0"])
    assert main(["plot", str(seed0), str(seed1), str(other), "--out", str(tmp_path / "all.png")]) == 0
    assert labels == [f"{seed0}: agent", f"{seed1}: agent", "ippo: agent"]


def test_plot_of_a_sweep_draws_each_setting_over_its_seeds(tmp_path, monkeypatch):
    """aggregate.csv averages over every member, whatever its setting: a sweep's plot is a curve per setting,
    the mean over that setting's seeds with a band; a setting of one seed is its run, named, with no band (it
    was labelled a mean and 95% CI over seeds, and drew a band of zero width)."""
    import matplotlib.axes

    curves, bands = {}, []
    plot, fill_between = matplotlib.axes.Axes.plot, matplotlib.axes.Axes.fill_between
    monkeypatch.setattr(
        matplotlib.axes.Axes, "plot", lambda self, x, y, **k: curves.update({k["label"]: y}) or plot(self, x, y, **k)
    )
    monkeypatch.setattr(
        matplotlib.axes.Axes, "fill_between", lambda self, x, *a, **k: bands.append(x) or fill_between(self, x, *a, **k)
    )
    run = tmp_path / "sweep"
    returns = {"seed_0-lr_0.001": ["1.0", "2.0"], "seed_1-lr_0.001": ["3.0", "nan"], "seed_0-lr_0.01": ["5.0", "6.0"]}
    for name, values in returns.items():
        write_run(run / name, values)
    write_run(tmp_path / "mean", ["3.0", "4.0"]).joinpath("metrics.csv").rename(run / "aggregate.csv")  # all three
    assert main(["plot", str(run)]) == 0
    over_seeds = " (mean, 95% CI over seeds)"
    assert curves == {f"agent lr_0.001{over_seeds}": [2.0, 2.0], "agent lr_0.01 (seed 0)": [5.0, 6.0]}
    assert len(bands) == 1  # lr_0.001's


def test_plot_of_a_sweep_averages_its_seeds_by_iteration_not_by_row(tmp_path, monkeypatch):
    """A member whose log lost rows (iterations 2 and 3 here) is paired with the others by its iteration
    column: the curve is drawn at the iterations every seed logged, each the mean of that iteration's returns."""
    import matplotlib.axes

    curves = {}
    plot = matplotlib.axes.Axes.plot
    monkeypatch.setattr(
        matplotlib.axes.Axes,
        "plot",
        lambda self, x, y, **k: curves.update({k["label"]: (list(x), list(y))}) or plot(self, x, y, **k),
    )
    run = tmp_path / "sweep"
    write_run(run / "seed_0-lr_0.001", ["1.0", "2.0", "3.0", "4.0", "5.0"])
    write_run(run / "seed_1-lr_0.001", ["10.0", "20.0", "30.0", "40.0", "50.0"])
    lost = write_run(run / "seed_2-lr_0.001", ["100.0", "200.0", "300.0", "400.0", "500.0"]) / "metrics.csv"
    lines = lost.read_text().splitlines()
    lost.write_text("\n".join(lines[:2] + lines[4:]) + "\n")  # iterations 1, 4, 5
    write_run(run / "seed_0-lr_0.01", ["7.0", "8.0", "9.0", "10.0", "11.0"])
    write_run(tmp_path / "mean", ["0.0"] * 5).joinpath("metrics.csv").rename(run / "aggregate.csv")
    assert main(["plot", str(run)]) == 0
    frames, returns = curves["agent lr_0.001 (mean, 95% CI over seeds)"]
    by_iteration = {1: (1.0, 10.0, 100.0), 4: (4.0, 40.0, 400.0), 5: (5.0, 50.0, 500.0)}  # written out by hand
    assert frames == [100 * i for i in by_iteration]
    assert returns == pytest.approx([sum(r) / 3 for r in by_iteration.values()])
    assert curves["agent lr_0.01 (seed 0)"] == ([100, 200, 300, 400, 500], [7.0, 8.0, 9.0, 10.0, 11.0])


def test_plot_of_a_sweep_whose_seeds_share_no_iteration_is_one_line(tmp_path, capsys):
    # It was an IndexError on the setting's empty curve.
    run = tmp_path / "sweep"
    write_run(run / "seed_0-lr_0.001", ["1.0", "2.0"])
    lost = write_run(run / "seed_1-lr_0.001", ["10.0", "20.0"]) / "metrics.csv"
    lost.write_text(lost.read_text().splitlines()[0] + "\n")  # the header only: every row lost
    write_run(tmp_path / "mean", ["0.0"] * 2).joinpath("metrics.csv").rename(run / "aggregate.csv")
    assert main(["plot", str(run)]) == 2
    says = f"marl plot: error: {run}: the seeds of setting lr_0.001 logged no iteration in common (their "
    assert capsys.readouterr().err.startswith(says)


@pytest.mark.parametrize("count", [12, 25])
def test_plot_gives_each_of_many_curves_its_own_colour(count, tmp_path, monkeypatch):
    """matplotlib's default cycle has 10 colours: the 11th curve took the first's, and two runs of an overlay
    of 12 read as one."""
    import matplotlib.axes
    import matplotlib.colors

    colours = []
    plot = matplotlib.axes.Axes.plot

    def recording(self, *args, **kwargs):
        lines = plot(self, *args, **kwargs)
        colours.append(lines[0].get_color())
        return lines

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", recording)
    legends = []
    legend = matplotlib.axes.Axes.legend
    monkeypatch.setattr(matplotlib.axes.Axes, "legend", lambda self, **k: legends.append(k) or legend(self, **k))
    runs = [str(write_run(tmp_path / f"run{i}", [str(i), str(i + 1)])) for i in range(count)]
    assert main(["plot", *runs, "--out", str(tmp_path / "all.png")]) == 0
    assert len(colours) == count and len({tuple(matplotlib.colors.to_rgba(c)) for c in colours}) == count
    assert legends[0]["bbox_to_anchor"][0] > 1  # beside the axes, not over the curves

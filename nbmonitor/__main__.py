"""The nbmonitor command line.

  nbmonitor demo          train a tiny model for 20 s with the monitor attached
  nbmonitor tail RUN      follow a run another process is writing, until it closes
  nbmonitor runs [DIR]    list the runs in a folder (default: runs)
  nbmonitor export RUN --to tensorboard|wandb|mlflow|trackio|parquet|csv [--out DIR]
                          hand a run (or every rank of a job) on to another tool
  nbmonitor top           the machine's GPUs and the runs being written, full screen
  nbmonitor ctl RUN pause|resume|stop|checkpoint|lr=VALUE
                          steer a running run from a shell (docs/steering.md)
  nbmonitor --version     print the installed version

Also runs as `python -m nbmonitor`. `nbmonitor COMMAND --help` describes each command.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO

from nbmonitor._version import __version__

# The demo's pace: a step every 1/DEMO_STEPS_PER_S seconds (the wait before each is its data
# phase, as a data loader's would be), so its step count, its ETA and its lr schedule are
# known before it starts, whatever the machine: a steady rate rather than an estimate timed on a
# machine whose load changes. A machine slower than this takes longer, for the same steps.
DEMO_STEPS_PER_S = 20


def demo(seconds: float, run_dir: str, interval: float) -> int:
    import torch

    import nbmonitor

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 1),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    true_w = torch.randn(32, 1)

    def train_step() -> torch.Tensor:
        x = torch.randn(64, 32)
        y = x @ true_w + 0.1 * torch.randn(64, 1)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    steps = max(1, math.ceil(seconds * DEMO_STEPS_PER_S))
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    with nbmonitor.attach(
        model, optimizer, total_steps=steps, run_dir=run_dir, name="demo", interval=interval
    ) as mon:
        start = time.monotonic()
        for step in range(steps):
            # Step i starts at i+1 intervals at the earliest: the last one ends past ``seconds``.
            wait = start + (step + 1) / DEMO_STEPS_PER_S - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            loss = train_step()
            scheduler.step()
            mon.log(loss=loss)
    history = mon.history()
    print(
        f"nbmonitor demo: {int(history['step'][-1])} steps in {seconds:g} s, final loss "
        f"{history['loss'][-1]:.4f}; run written to {mon.run_dir}"
    )
    return 0


def _positive(text: str) -> float:
    # ArgumentTypeError, never ValueError: argparse would name this function in its message
    # ("invalid _positive value").
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number, not {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a positive number, not {text}")
    return value


def _add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo",
        help="train a tiny model on synthetic data with the monitor attached",
        description=(
            "Train a small MLP on synthetic regression data for a fixed time with the monitor "
            f"attached, at a steady {DEMO_STEPS_PER_S} steps a second (so the step count, the "
            "ETA and the cosine lr schedule are known from the start): a status line is printed "
            "every few seconds, and the run is written to RUN_DIR (open it later with "
            "nbmonitor.open(path))."
        ),
    )
    p.add_argument(
        "--seconds",
        type=_positive,
        default=20.0,
        help=(
            f"how long to train, in seconds, at {DEMO_STEPS_PER_S} steps a second (a machine "
            "slower than that takes longer for the same steps; default: %(default)g)"
        ),
    )
    p.add_argument(
        "--run-dir",
        default="runs",
        help="directory the run is written into, as <timestamp>-demo/ (default: %(default)s)",
    )
    p.add_argument(
        "--interval",
        type=_positive,
        default=0.5,
        help="seconds between system samples and writes to disk (default: %(default)g)",
    )
    p.set_defaults(run=lambda args: demo(args.seconds, args.run_dir, args.interval))


def _say(message: str) -> None:
    """One line on stderr (what went wrong, or what the command waits for)."""
    from nbmonitor.runs.text import printable

    print(printable(" ".join(message.split()), limit=1000), file=sys.stderr, flush=True)


def _is_run(path: Path) -> bool:
    """Whether ``path`` holds a meta.json (of any kind: reading it says what is wrong)."""
    return os.path.lexists(path / "meta.json")


def _holds_run(path: Path) -> bool:
    """Whether ``path`` is a run (or job) folder or a folder with a run in it."""
    from nbmonitor.runs import list_runs

    if _is_run(path):
        return True
    try:
        return path.is_dir() and len(list_runs(path)) > 0
    except Exception:  # being made right now: the next look sees it
        return False


# How long a folder that exists but holds no run is looked at again before ``tail`` says so:
# a run folder being made has its meta.json a moment after the folder.
HOLDS_NO_RUN_GRACE_S = 1.0


def _wait_for(path: Path, wait: float, interval: float) -> bool:
    """Whether the run (or folder of runs) at ``path``, which does not exist yet, appeared
    within ``wait`` seconds."""
    from nbmonitor.runs.text import printable

    if _holds_run(path):
        return True
    print(
        f"nbmonitor tail: waiting for {printable(str(path))} to appear "
        f"(up to {wait:g} s; --wait sets how long)",
        flush=True,
    )
    return _poll(path, wait, interval)


def _poll(path: Path, wait: float, interval: float) -> bool:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        time.sleep(min(interval, 0.5, max(0.0, deadline - time.monotonic())))
        if _holds_run(path):
            return True
    return False


def _not_a_run(run: str, path: Path, interval: float) -> str | None:
    """Why ``path``, which exists, cannot be followed (a file, a folder with no run in it),
    or None when it can."""
    if not path.is_dir():
        if _is_run(path.parent):
            return f"'{run}' is a file of the run '{path.parent}'; pass that folder."
        return f"'{run}' is a file, not a run folder; pass the folder of one run (with meta.json)."
    if _holds_run(path) or _poll(path, HOLDS_NO_RUN_GRACE_S, interval):
        return None
    return (
        f"'{run}' holds no run (no meta.json in it or in its folders); pass the folder of one "
        "run, or a folder of runs."
    )


def tail(run: str, interval: float, wait: float, tui: bool = False) -> int:
    """Follow a run in the terminal (the newest run when RUN is a folder of runs)."""
    from nbmonitor.replay import follow_in_terminal
    from nbmonitor.runs import list_runs, open_run
    from nbmonitor.runs.layout import is_job
    from nbmonitor.runs.text import printable

    path = Path(run)
    if tui:  # the full-screen app says itself what is wrong with RUN
        from nbmonitor.machine.top import tail_tui

        if path.is_dir() and not _is_run(path) and len(table := list_runs(path)):
            path = Path(str(table[0]["path"]))
        return tail_tui(str(path), interval)
    if not path.exists() and not path.absolute().parent.is_dir():
        _say(
            f"nbmonitor tail: no run at '{run}', and its folder '{path.absolute().parent}' "
            "does not exist either; check the path."
        )
        return 2
    if os.path.lexists(path):  # there now: what it holds is known at once
        why = _not_a_run(run, path, interval)
        if why is not None:
            _say(f"nbmonitor tail: {why}")
            return 2
    elif not _wait_for(path, wait, interval):
        if path.is_dir():
            _say(f"nbmonitor tail: no run appeared in '{run}' within {wait:g} s; pass the "
                 "folder of one run, or --wait SECONDS to wait longer.")  # fmt: skip
            return 1
        _say(f"nbmonitor tail: '{run}' did not appear within {wait:g} s; check the path, or "
             "pass --wait SECONDS to wait longer.")  # fmt: skip
        return 1
    if path.is_dir() and not _is_run(path):
        table = list_runs(path)
        if not len(table):
            _say(f"nbmonitor tail: no runs in {path}; pass the folder of one run.")
            return 2
        path = Path(str(table[0]["path"]))
    steps = follow_in_terminal(path, interval)
    name = printable(path.name)
    if is_job(path):
        from nbmonitor.runs.job import JobFiles

        status = JobFiles(path).status
        if status == "killed":
            print(f"nbmonitor tail: {name}: {steps} steps; stopped following: every rank's "
                  "writer is gone or closed, and the job never closed (killed)")  # fmt: skip
            return 0
    else:
        status = open_run(path).status
    if status in ("closed", "degraded", "stopped"):
        print(f"nbmonitor tail: {name}: {steps} steps, the run {status}")
    elif status == "killed":
        print(f"nbmonitor tail: {name}: {steps} steps; stopped following: the writer is gone "
              "and the run was never closed (killed)")  # fmt: skip
    else:
        print(f"nbmonitor tail: {name}: {steps} steps; stopped following ({status})")
    return 0


def _add_tail(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "tail",
        help="follow a run another process is writing, until it closes",
        description=(
            "Print a status line for a run that another process (a script, a job on a "
            "cluster writing to a shared filesystem) is writing, reading only the new "
            "records each time, until the run closes or its writer is gone (Ctrl-C stops "
            "following). RUN is the folder of one run, or a folder of runs (then its newest "
            "run); a RUN that does not exist yet is waited for (--wait)."
        ),
    )
    p.add_argument("target", metavar="RUN", help="the run's folder, or a folder of runs")
    p.add_argument(
        "--interval",
        type=_positive,
        default=2.0,
        help="seconds between reads and status lines (default: %(default)g)",
    )
    p.add_argument(
        "--wait",
        type=_positive,
        default=60.0,
        help="seconds to wait for RUN to appear when it does not exist yet (default: %(default)g)",
    )
    p.add_argument(
        "--tui", action="store_true", help="the run's curves and alerts full screen (Textual)"
    )
    p.set_defaults(run=lambda args: tail(args.target, args.interval, args.wait, args.tui))


def runs(folder: str) -> int:
    from nbmonitor.runs import list_runs

    print(list_runs(folder))
    return 0


def _add_runs(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "runs",
        help="list the runs in a folder",
        description="List the runs in a folder, newest first: name, start, steps, status, "
        "final loss and backend. A run that cannot be read is a row saying why.",
    )
    p.add_argument("folder", nargs="?", default="runs", help="default: %(default)s")
    p.set_defaults(run=lambda args: runs(args.folder))


# Where --out goes for each target (trackio writes to TRACKIO_DIR, set in the environment;
# MLflow's is a file store's URI).
_OUT_OPTION = {"tensorboard": "log_dir", "parquet": "out", "csv": "out", "wandb": "dir"}


class _Bar:
    """A progress bar on stderr: ``[#####-----]  52%  3.1/6.0 MB``, redrawn at most every
    0.1 s."""

    def __init__(self, label: str) -> None:
        from nbmonitor.runs.text import StrippedStream, strip_controls

        self.label = strip_controls(label)  # a folder's name
        # Its own "\r" must reach the terminal: past the filter of what run folders hold.
        err = sys.stderr
        self.stream = err.raw if isinstance(err, StrippedStream) else err
        self.last = -1.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self.last < 0.1:
            return
        self.last = now
        frac = done / total if total > 0 else 1.0
        filled = int(frac * 30)
        self.stream.write(
            f"\r{self.label} [{'#' * filled}{'-' * (30 - filled)}] {frac:4.0%} "
            f"{done / 1e6:.1f}/{total / 1e6:.1f} MB"
        )
        self.stream.flush()

    def end(self) -> None:
        if self.last >= 0:
            self.stream.write("\n")
            self.stream.flush()


def export(run: str, to: str, out: str | None) -> int:
    """Hand the run (every rank of a job) on to ``to``; one line per run exported."""
    from pathlib import Path

    from nbmonitor.errors import RunDirError
    from nbmonitor.export import FROM_DISK, ExportError, export_run, exporter
    from nbmonitor.runs.reader import run_path

    try:
        exporter(to)  # an unknown target is the reason, before anything about --out
    except ValueError as exc:
        print(exc)
        return 1
    options: dict[str, object] = {}
    if out is not None and to in FROM_DISK:
        if to == "mlflow":
            options["tracking_uri"] = Path(out).resolve().as_uri()  # a file store there
        elif to in _OUT_OPTION:
            options[_OUT_OPTION[to]] = out
        else:
            print(
                f"nbmonitor export: --out does not apply to {to}: it writes where its "
                "TRACKIO_DIR says (default ~/.cache/huggingface/trackio); set that instead."
            )
            return 2
    bar = _Bar(f"{run_path(run).name} -> {to}")
    try:
        done = export_run(run, to, bar, **options)
    except (ExportError, RunDirError, OSError, ValueError) as exc:
        bar.end()
        text = str(exc)
        print(text if text.startswith("nbmonitor") else f"nbmonitor export: {text}")
        return 1
    bar.end()
    for item in done:
        print(f"nbmonitor export: {item.run.name} -> {item.target}: {item.where}")
    return 0


def _add_export(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "export",
        help="hand a run on to TensorBoard, W&B, MLflow, trackio, Parquet or CSV",
        description=(
            "Export a run as it is on disk now (finished, or still being written), or every "
            "rank of a job, to another tool. Needs that tool's extra, e.g. "
            'pip install "nbmonitor[tensorboard]"; torch is not needed.'
        ),
    )
    p.add_argument("target", metavar="RUN", help="the run's folder, or a job's")
    p.add_argument(
        "--to",
        required=True,
        metavar="TARGET",
        help="tensorboard, wandb, mlflow, trackio, parquet or csv",
    )
    p.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help=(
            "where to write: TensorBoard's log dir, the Parquet/CSV folder, W&B's dir, or "
            "an MLflow file store (default: inside the run folder; W&B's and MLflow's own)"
        ),
    )
    p.set_defaults(run=lambda args: export(args.target, args.to.lower(), args.out))


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """A warning as one line (the reader's RunDataWarning names file, line and why)."""
    _say(f"warning: {message}")


@contextlib.contextmanager
def _reading_output() -> Iterator[None]:
    """For the commands that print what run folders hold: control characters stripped from
    stdout and stderr, warnings one line each, errors one line and an exit status."""
    from nbmonitor.runs.text import stripped_output

    show = warnings.showwarning
    warnings.showwarning = _show_warning
    try:
        with stripped_output():
            yield
    finally:
        warnings.showwarning = show


def _add_top(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "top",
        help="the machine's GPUs and the runs being written, full screen",
        description=(
            "A full-screen view of every GPU (utilisation, memory, temperature, power, clocks, "
            "processes; sparklines coloured against the alert thresholds), the machine, and "
            "the runs being written under --runs with their step, loss, throughput, ETA and "
            "alerts (enter opens a run's curves). Keys: q quit, s save a snapshot, r reset "
            "the history, / filter, arrows move. Prints the tables once with --once or when "
            "the output is not a terminal. Needs the tui extra (Textual), but for --once."
        ),
    )
    p.add_argument(
        "--runs",
        default=None,
        help="folder of runs to follow (default: runs, when it exists; a folder named here must)",
    )
    p.add_argument(
        "--interval",
        type=_positive,
        default=1.0,
        help="seconds between samples and reads (default: %(default)g)",
    )
    p.add_argument("--once", action="store_true", help="print the tables once and exit")
    p.add_argument("--no-devices", action="store_true", help="runs only: do not sample GPUs")
    p.add_argument("--pcie", action="store_true", help="also PCIe throughput (~20 ms per GPU)")
    p.add_argument("--save-dir", default=".", help="where s saves snapshots (default: %(default)s)")

    def run(args: argparse.Namespace) -> int:
        from nbmonitor.machine.top import top

        if args.runs is not None and not Path(args.runs).is_dir():
            # Named, so wanted: not a line the full-screen app would draw over at once.
            what = "is not a folder" if os.path.lexists(args.runs) else "does not exist"
            _say(
                f"nbmonitor top: --runs '{args.runs}' {what}; name the folder your runs are "
                "written to (attach's run_dir), or leave --runs out for devices only."
            )
            return 2
        return top(
            args.runs if args.runs is not None else "runs",
            args.interval,
            once=args.once,
            devices=not args.no_devices,
            pcie=args.pcie,
            save_dir=args.save_dir,
        )

    p.set_defaults(run=run)


def _add_ctl(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "ctl",
        help="steer a running run: pause, resume, stop, checkpoint, lr=VALUE",
        description=(
            "Ask a run being trained (by you, on this machine or on a shared file system) to "
            "pause, resume, stop, save a checkpoint (checkpoint or checkpoint=PATH) or set "
            "its learning rate (lr=VALUE), at the end of its next step. The request is a "
            "file written into the run's control/ folder, which the run reads every sampling "
            "interval and accepts only from the user who runs it. A run that is not running "
            "is said in one line (exit status 1); a bad request exits with status 2. A "
            "torchrun job's folder steers every rank at one step, named ahead and printed. "
            "See docs/steering.md."
        ),
    )
    p.add_argument(
        "folder", metavar="RUN", help="the run's folder (mon.run_dir), or a job's (mon.job_dir)"
    )
    p.add_argument("request", help="pause | resume | stop | checkpoint[=PATH] | lr=VALUE")
    p.add_argument(
        "--wait",
        type=float,
        default=5.0,
        help="seconds to wait for the run to take the request (default: %(default)g)",
    )

    def run(args: argparse.Namespace) -> int:
        from nbmonitor.runs.control import ControlError
        from nbmonitor.runs.job_control import send_to

        try:
            said = send_to(args.folder, args.request, wait=max(0.0, args.wait))
            print(f"nbmonitor ctl: {said}")
        except ControlError as exc:
            _say(f"nbmonitor ctl: {exc}")
            return exc.status
        return 0

    p.set_defaults(run=run)


# One function per command: each adds its parser and sets `run` (args -> exit status).
COMMANDS: list[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]] = [
    _add_demo,
    _add_tail,
    _add_runs,
    _add_export,
    _add_top,
    _add_ctl,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nbmonitor",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"nbmonitor {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # demo trains; top and tail --tui own the screen (Textual draws it with escapes).
    if args.command in ("demo", "top") or getattr(args, "tui", False):
        status: int = args.run(args)
        return status
    from nbmonitor.errors import RunDirError

    with _reading_output():
        try:
            status = args.run(args)
        except RunDirError as exc:  # what was wrong with the folder, in one line
            _say(f"nbmonitor {args.command}: {str(exc).removeprefix('nbmonitor: ')}")
            return 2
        except KeyboardInterrupt:
            return 130
        except Exception as exc:  # never a traceback for a folder's content: one line
            _say(f"nbmonitor {args.command}: failed ({type(exc).__name__}: {exc})")
            return 1
    return status


if __name__ == "__main__":
    raise SystemExit(main())

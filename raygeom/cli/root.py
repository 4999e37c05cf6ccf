"""The raygeom command line."""

from __future__ import annotations

import errno
import os
import signal
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.errors import MarkupError
from rich.markup import escape

from raygeom.cli.consoles import LogConsole, output_width
from raygeom.cli.flags import PGA_OPTIONS, TEXT_GRID, GridSettings, checked, fail, grid_job, option
from raygeom.cli.helptext import keep_brackets
from raygeom.errors import RaygeomError
from raygeom.params import n_null_settings


class SafeConsole(LogConsole):
    """A last line of defence: text that is not valid rich markup (a path or model name with '[/x]' in it)
    prints as plain text instead of raising MarkupError after the work is done. User strings are
    escaped where they are printed; this catches any that are not."""

    def render_str(self, text, **kwargs):
        try:
            return super().render_str(text, **kwargs)
        except MarkupError:
            return super().render_str(text, **{**kwargs, "markup": False})


try:  # typer >= 0.20 carries its own copy of click
    from typer._click.exceptions import ClickException as UsageErrors
except ImportError:  # pragma: no cover - older typer on click itself
    from click.exceptions import ClickException as UsageErrors


class _Typer(typer.Typer):
    """A Typer that builds its click command tree once (again only when commands are added): Typer builds it, every
    command's parameters from its signature, at each call, 0.1-0.2 s here, and in-process callers call it often."""

    def click_command(self):
        key = (len(self.registered_commands), len(self.registered_groups))
        if getattr(self, "_built", (None, None))[0] != key:
            self._built = (key, typer.main.get_command(self))
        return self._built[1]

    def __call__(self, *args, **kwargs):
        return self.click_command()(*args, **kwargs)


app = _Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Measure how a language model organises its hidden-state geometry for prediction.",
)
console = SafeConsole(width=output_width())
errors = SafeConsole(stderr=True)

_fail = fail  # a refusal: one line, exit 2 (the other command modules use it too)


_local_ray = {"started": False}


def _prepare_ray(address: Optional[str]) -> None:
    """Before anything imports ray: loopback for a local cluster and for a loopback address alike."""
    from raygeom.engine.ray_env import prepare_ray_environment

    # Only a Ray this command starts is stopped at its end: one already running in this process (a caller's, or a test
    # session's) is not, and neither is anything after an earlier command of the same process.
    if address is None and not ("ray" in sys.modules and sys.modules["ray"].is_initialized()):
        _local_ray["started"] = True
    prepare_ray_environment(address)


def check_num_cpus(num_cpus: Optional[int]) -> None:
    if num_cpus is not None and num_cpus <= 0:
        raise RaygeomError(f"--num-cpus must be at least 1, got {num_cpus}")


def _run(job, address, num_cpus):
    from raygeom.jobs.run import run
    from raygeom.jobs.write import print_not_scored

    check_num_cpus(num_cpus)
    if job.train is not None or job.trajectory is not None:  # train, then sweep the checkpoints
        from raygeom.jobs.preflight import preflight
        from raygeom.jobs.trajectory import run_trajectory_job

        preflight(job, console, local=address is None)  # the other drivers call it themselves, before Ray starts
        _prepare_ray(address)
        return run_trajectory_job(job, console, address=address, num_cpus=num_cpus)
    _prepare_ray(address)
    outputs = run(job, console, address=address, num_cpus=num_cpus)
    if job.sweep is None:  # a sweep says them among its lines
        print_not_scored(errors, [row for rows in outputs.rows.values() for row in rows])
    return outputs


# Flags of `raygeom run` for parameters several analyses declare (k: pga, spectral, pc1, convergence, ...; seed: most):
# each overrides that parameter of every analysis the job runs that declares it (JobSpec.with_overrides). Their
# declarations (help, rules) are PGAParams', the fullest declaration of them.
SHARED_PARAMETER_FLAGS = {
    "k": "k",
    "ccr": "r",
    "z_half_width": "z_half_width",
    "z_rel_width": "z_rel_width",
    "n_null_cap": "n_null_cap",
    "n_null_decide": "n_null_decide",
    "null_chunks": "null_chunks",
    "seed": "seed",
}


def parameter_overrides(values: dict) -> dict:
    """The analyses' parameters given on `raygeom run`'s command line (:data:`SHARED_PARAMETER_FLAGS`)."""
    given = values["given"]
    chosen = {field: values[name] for name, field in SHARED_PARAMETER_FLAGS.items() if name in given}
    return {**chosen, **n_null_settings(values["n_null"] if "n_null" in given else None)}


@app.command()
@checked(grid=tuple(name for name in (*TEXT_GRID, *PGA_OPTIONS) if name != "job"))
def run(
    job_file: Path = typer.Argument(..., help="TOML job file, e.g. jobs/laptop.toml"),
    out: Optional[str] = option(GridSettings, "out", "-o", path=True, default=None, help="The store (default: the job's out)."),
    model: Optional[list[str]] = option(
        GridSettings,
        "model",
        "-m",
        many=True,
        default=None,
        help="Replace the job's models by these (repeatable; name@revision picks a revision).",
    ),
    revision: Optional[list[str]] = option(
        GridSettings, "revision", "-r", many=True, default=None, help="With --model: its revision(s)."
    ),
    given: frozenset = frozenset(),
    **grid,
):
    """Run a job file: extract every model and revision, then every analysis it names ([analyses.<name>]; Subspace
    PGA of every layer where it names none). A parameter flag (--k, --ccr, --n-null, --seed, ...) overrides that
    parameter of every analysis the job runs that declares it."""
    values = {**grid, "job": job_file, "out": out, "model": model, "revision": revision, "given": given}
    try:
        job = grid_job(job_file.stem, values).with_overrides(**parameter_overrides(values))
        _run(job, values["address"], values["num_cpus"])
    except RaygeomError as error:
        _fail(str(error))


# Commands of the other analyses live beside their orchestration; each module registers its own.
for _module in (
    "raygeom.cli.sweep",
    "raygeom.cli.train",
    "raygeom.cli.report",
    "raygeom.cli.analyses",
    "raygeom.cli.verify",
    "raygeom.cli.export",
    "raygeom.cli.explain",
):
    __import__(_module, fromlist=["register"]).register(app)
keep_brackets(app)  # help texts are rich markup to typer: [analyses.<name>] and [[models]] would vanish


_terminated: dict[str, int] = {}


def _exit_on_sigterm(signum, frame):
    # Ends the run as Ctrl-C does, so the finally blocks and _stop_local_ray run (the default action would leave
    # the local Ray's workers running). KeyboardInterrupt, because Ray's blocking calls (ray.get, ray.wait) turn
    # whatever a signal handler raises into a plain KeyboardInterrupt; the flag says it was SIGTERM.
    if _terminated:  # a second SIGTERM while cleaning up: the first one is already ending the run
        return
    _terminated["signum"] = signum
    raise KeyboardInterrupt


_said_interrupted: list[bool] = []
_whole_process = False  # run_as_process: this process ends when the command does (not a test calling main)


def _interrupted() -> None:
    if not _said_interrupted:  # main's `except SystemExit` meets the exit raised here from its own try block again
        _said_interrupted.append(True)
        errors.print("interrupted; finished units are kept, rerun to resume")
    sys.exit(128 + _terminated["signum"] if _terminated else 130)


def _refused() -> None:
    """A refusal (exit 2) leaves nothing behind: not even the store directory check_writable made for it."""
    tree = sys.modules.get("raygeom.store.tree")  # not imported: no store was made
    if tree is not None:
        tree.discard_unused_stores()


def _leave_ray_unshut() -> None:
    """An interrupted run ends without ``ray.shutdown``: a thread still inside Ray (a [train] run's fit) then meets a
    shut core worker, and Ray ends the whole process with status 1 ("accesses the Ray's worker after it is
    shutdown"). The local node's processes are stopped by the caller and the process ends through ``os._exit``, so
    nothing is left running. What Ray's C++ logs from here on is the noise of that stop ("Failed to push error to
    driver"), after the one line already printed, so stderr goes to /dev/null."""
    import atexit

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    if "ray" in sys.modules:
        atexit.unregister(sys.modules["ray"].shutdown)


def _stop_local_ray() -> None:
    """Stop the local Ray this process started, including the per-node agents that
    ``ray.shutdown`` leaves running for a while after the raylet is gone."""
    if not _local_ray["started"]:
        return
    _local_ray["started"] = False
    import psutil

    leftovers = psutil.Process().children(recursive=True)
    if _said_interrupted and _whole_process:
        _leave_ray_unshut()
    elif "ray" in sys.modules:
        sys.modules["ray"].shutdown()
    for process in leftovers:
        try:
            process.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(leftovers, timeout=5)
    for process in alive:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass


def _end_process(code) -> None:
    """Exit with ``code`` once Python's exit handlers (Ray's shutdown, temporary folders, logging) have run, but
    without the C++ static destructors that follow them: Arrow's global thread pool aborts there ("terminate called
    without an active exception", SIGABRT) when one of its workers has not yet parked, which happens under load
    after any Parquet read (apache/arrow#34314). Every result was written and flushed before this point."""
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # sys.exit("message") prints the message and exits 1, as Python does
        print(code, file=sys.stderr)
        status = 1
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe has nothing left to flush
            pass
    os._exit(status)


def run_as_process() -> None:
    """The console script, ``python cli.py`` and ``python -m raygeom.cli``: :func:`main`, then the process ends
    through _end_process with the status main chose. In-process callers (tests) call main, which raises SystemExit."""
    global _whole_process
    _whole_process = True
    try:
        main()
    except SystemExit as done:
        _end_process(done.code)
    _end_process(0)


def main() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        # Not standalone: a usage error (unknown option, a value click cannot parse) comes back here, so it is one line
        # like every other refusal instead of click's usage panel.
        code = app(standalone_mode=False)
        if code == 130 or (code and _terminated):  # typer turns Ctrl-C into exit code 130
            _interrupted()
        if code == 2:
            _refused()
        sys.exit(code if isinstance(code, int) else 0)
    except UsageErrors as error:
        command = f" (see {error.ctx.command_path} --help)" if getattr(error, "ctx", None) is not None else ""
        errors.print(f"[bold red]error:[/] {escape(error.format_message())}{escape(command)}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        _interrupted()
    except SystemExit as done:
        if done.code == 130 or _terminated:
            _interrupted()
        raise
    except RaygeomError as error:  # a command that let one through still gets one line
        errors.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False, soft_wrap=True)
        _refused()
        sys.exit(2)
    except OSError as error:
        if error.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        where = f" writing {error.filename}" if error.filename else ""
        errors.print(
            f"[bold red]error:[/] the disk is full{escape(where)}; finished units are kept, free space and rerun to resume",
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(2)
    finally:
        _stop_local_ray()


if __name__ == "__main__":
    main()

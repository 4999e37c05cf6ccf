"""`raygeom verify STORE`: every checksum and key in a store, including files no unit needs now; `raygeom gc STORE`:
free the activations no unit still needs (and, with --dequantised, the dequantised model copies)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from raygeom.errors import RaygeomError

console = Console()
errors = Console(stderr=True)


READ_TIMEOUT_ENV = "RAYGEOM_READ_TIMEOUT"
DEFAULT_READ_TIMEOUT_S = 120.0


def read_timeout() -> float:
    """Seconds one file's read may take in ``verify`` (default 120, or $RAYGEOM_READ_TIMEOUT)."""
    raw = os.environ.get(READ_TIMEOUT_ENV, "")
    try:
        seconds = float(raw) if raw else DEFAULT_READ_TIMEOUT_S
    except ValueError:
        seconds = float("nan")
    if not (seconds > 0 and math.isfinite(seconds)):
        raise RaygeomError(f"{READ_TIMEOUT_ENV} must be a positive number of seconds, got {raw!r}")
    return seconds


def _audit_within_limits(store: Path):
    """The audit on a thread of its own, so that this (main) thread only waits, in short steps: a SIGTERM or Ctrl-C is
    handled within a fraction of a second whatever the read is doing (a read inside a library's C++ wait runs no
    signal handler: ``verify`` once sat 612 s at 0 % CPU and ignored SIGTERM), and one file's read that takes longer
    than ``read_timeout()`` ends the command with one line naming the file. The thread is a daemon: a read that never
    returns is left behind when the process ends."""
    import threading
    import time

    from raygeom.store.audit import audit

    limit = read_timeout()
    current: list = [None, time.monotonic()]  # the file being read, since when
    outcome: dict = {}

    def watch(path: Path) -> None:
        current[:] = [path, time.monotonic()]

    def work() -> None:
        try:
            outcome["found"] = audit(store, watch)
        except BaseException as error:  # noqa: BLE001 - raised again on the main thread
            outcome["error"] = error

    thread = threading.Thread(target=work, name="raygeom-verify", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.1)
        path, since = current
        if thread.is_alive() and time.monotonic() - since > limit:
            what = f"reading {path}" if path is not None else "listing the store"
            raise RaygeomError(
                f"{what} took more than {limit:g} s (a hung filesystem?); nothing was changed. "
                f"Set ${READ_TIMEOUT_ENV} to wait longer"
            )
    if "error" in outcome:
        raise outcome["error"]
    return outcome["found"]


def free_dequantised(dry_run: bool) -> None:
    """Delete (or, dry run, list) every dequantised copy of a GGUF model in raygeom's cache, and say how much."""
    import shutil

    from raygeom.sources.models import cache_dir, dequantised_copies

    copies = dequantised_copies()
    verb = "would free" if dry_run else "freed"
    for folder, size in copies:
        if not dry_run:
            shutil.rmtree(folder)
        console.print(f"{verb} {size:,} bytes: {folder}", markup=False, highlight=False, soft_wrap=True)
    total = sum(size for _, size in copies)
    console.print(
        f"{verb} {total:,} bytes of {len(copies)} dequantised cop{'y' if len(copies) == 1 else 'ies'} in "
        f"{cache_dir() / 'dequantised'}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


def register(app: typer.Typer) -> None:
    """Add this module's command to the raygeom app."""

    @app.command()
    def verify(store: Path = typer.Argument(..., help="The store (a run's --out directory).")):
        """Check every stored file's checksum, and that every layer, unit and completion marker is the one its place
        names. Lists the damaged files (a rerun recomputes them) and exits 1 when there are any."""
        try:
            found = _audit_within_limits(store)
        except RaygeomError as error:
            errors.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        for _, reason in found.damaged:
            errors.print(f"[red]damaged:[/] {escape(reason)}", highlight=False, soft_wrap=True)
        console.print(
            f"{found.checked} files checked, {len(found.damaged)} damaged"
            + (f", {found.unrecorded} not written by the store (no checksum to check)" if found.unrecorded else ""),
            highlight=False,
        )
        if found.damaged:
            raise typer.Exit(1)

    @app.command()
    def gc(
        store: Optional[Path] = typer.Argument(None, help="The store (a run's --out directory)."),
        dry_run: bool = typer.Option(False, "--dry-run", help="List what would be freed; delete nothing."),
        dequantised: bool = typer.Option(
            False,
            "--dequantised",
            help="Also free the dequantised copies of the built-in GGUF models ($RAYGEOM_CACHE/dequantised, by "
            "default ~/.cache/raygeom/dequantised: 0.5 GB for SmolLM2, 1.1 GB for Gemma); the next load makes "
            "them again (20-60 s).",
        ),
    ):
        """Free the layer files of every extraction whose planned units are all stored (and of interrupted ones).
        Markers, per-sample tables and readouts stay, so rerunning those units computes nothing; a unit not run
        before extracts the layers again. Prints each extraction freed or kept, with why, and the total. With
        --dequantised (STORE may then be left out), the cached fp32 copies of GGUF models too."""
        if store is None and not dequantised:
            errors.print("[bold red]error:[/] give a STORE, --dequantised, or both", highlight=False, soft_wrap=True)
            raise typer.Exit(2)
        if dequantised:
            free_dequantised(dry_run)
        if store is None:
            return
        from raygeom.store.gc import collect

        try:
            verdicts = collect(store, dry_run=dry_run)
        except RaygeomError as error:
            errors.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        freed = [v for v in verdicts if v.freed]
        verb = "would free" if dry_run else "freed"
        for verdict in verdicts:
            what = f"{verb} {verdict.files} layer files, {verdict.bytes:,} bytes" if verdict.freed else "kept"
            console.print(f"{what}: {escape(verdict.label)}: {escape(verdict.reason)}", highlight=False, soft_wrap=True)
        console.print(
            f"{verb} {sum(v.files for v in freed)} layer files, {sum(v.bytes for v in freed):,} bytes, of "
            f"{len(freed)} extraction{'' if len(freed) == 1 else 's'}; kept {len(verdicts) - len(freed)}",
            highlight=False,
        )

"""The local Ray of a run ends with its driver, even a SIGKILLed one.

A driver killed with SIGKILL runs no exit handler: Ray's agents (DashboardAgent, RuntimeEnvAgent) outlived such a
run by 60-85 s here, and its workers by about 20 s (issue 41). So a local Ray's driver starts this watchdog: a small
process of its own session that keeps, twice a second, the list of the driver's descendants (pid and start time,
so a reused pid is never hit), and when the driver is gone kills whatever of that list is still there."""

from __future__ import annotations

import os
import subprocess
import sys

WATCH = r"""
import os, signal, sys, time
driver = int(sys.argv[1])
me = os.getpid()

def table():
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
                found[int(name)] = (int(fields[1]), fields[19])  # parent, start time
            except (OSError, IndexError, ValueError):
                pass
    return found

def descendants(found, root):
    children = {}
    for pid, (parent, _) in found.items():
        children.setdefault(parent, []).append(pid)
    out, todo = {}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child != me and child not in out:
                out[child] = found[child][1]
                todo.append(child)
    return out

known = {}
while True:
    found = table()
    if driver not in found:
        break
    known.update(descendants(found, driver))
    time.sleep(0.5)
for _ in range(3):  # what they start while being killed is killed too
    found = table()
    alive = {pid: start for pid, start in known.items() if pid in found and found[pid][1] == start}
    for pid in list(alive):
        alive.update(descendants(found, pid))
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    known = alive
    time.sleep(0.3)
"""


def watch_driver() -> subprocess.Popen | None:
    """Start the watchdog of this process's local Ray (Linux only: it reads /proc); None where it cannot run."""
    if not os.path.isdir("/proc/self"):
        return None
    try:
        return subprocess.Popen(
            [sys.executable, "-c", WATCH, str(os.getpid())],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
    except OSError:
        return None

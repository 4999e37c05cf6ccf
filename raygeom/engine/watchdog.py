"""The local Ray of a run ends with its driver, even a SIGKILLed one.

A driver killed with SIGKILL runs no exit handler: Ray's agents (DashboardAgent, RuntimeEnvAgent) outlived such a
run by 60-85 s here, and its workers by about 20 s (issue 41). So a local Ray's driver starts this watchdog: a small
process of its own session that keeps, five times a second, the list of the driver's descendants (pid and start time,
so a reused pid is never hit), and when the driver is gone kills whatever of that list is still there, and every
process with files open in that Ray's session folder (one the driver started after the last look)."""

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

def sessions_of(pid):
    # the Ray session folders a process has files open in (its logs): a Ray process renames its command line
    out = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if "/session_" in target:
                head, rest = target.split("/session_", 1)
                out.add(head + "/session_" + rest.split("/", 1)[0] + "/")
    except OSError:
        pass
    return out

known, sessions = {}, set()
while True:
    found = table()
    if driver not in found:
        break
    new = descendants(found, driver)
    for pid in new.keys() - known.keys():
        sessions |= sessions_of(pid)
    known.update(new)
    time.sleep(0.2)
# What the driver started after the last look (its parent, the driver, gone) is found by the session it writes in.
for pid, (_, start) in table().items():
    if pid != me and pid not in known and sessions and sessions_of(pid) & sessions:
        known[pid] = start
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

"""Open a local HTML file in headless Chromium and report what a person would see: JavaScript errors,
every network request, a probe expression's value and a screenshot.

Chromium is driven through the DevTools protocol over a pipe (``--remote-debugging-pipe``: JSON
messages separated by NUL bytes on file descriptors 3 and 4), so no websocket client or driver
package is needed. The flags are the ones this machine needs (see the README's "Headless browser").
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--hide-scrollbars",
    "--mute-audio",
]


@dataclass
class PageVisit:
    errors: list[str] = field(default_factory=list)  # uncaught exceptions, console.error, error log entries
    requests: list[str] = field(default_factory=list)  # every URL the page asked for
    probe: object = None
    after_click: object = None
    screenshot: bytes = b""


class _Pipe:
    def __init__(self, process: subprocess.Popen, write_fd: int, read_fd: int):
        self.process, self.write_fd, self.read_fd = process, write_fd, read_fd
        self.buffer = b""
        self.next_id = 0
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> int:
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.write_fd, json.dumps(message).encode() + b"\0")
        return self.next_id

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self.buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self.read_fd, 1 << 20)
            if not chunk:
                raise RuntimeError(f"Chromium closed the DevTools pipe (exit status {self.process.poll()})")
            self.buffer += chunk
        raw, _, self.buffer = self.buffer.partition(b"\0")
        return json.loads(raw)

    def call(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 60) -> dict:
        wanted = self.send(method, params, session)
        deadline = time.monotonic() + timeout
        while True:
            message = self._read_message(deadline)
            if message.get("id") == wanted:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            if "method" in message:
                self.events.append(message)

    def wait_event(self, method: str, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        for event in self.events:
            if event["method"] == method:
                return event
        while True:
            message = self._read_message(deadline)
            if "method" in message:
                self.events.append(message)
                if message["method"] == method:
                    return message


def visit(
    path: Path,
    probe: str = "null",
    click: str | None = None,
    after_click: str = "null",
    width: int = 1280,
    height: int = 2400,
    settle: float = 1.0,
    timeout: float = 120,
) -> PageVisit:
    """Load ``path`` (a local file) and return its errors, requests, ``probe`` (a JS expression) and a PNG.
    With ``click`` (a CSS selector), a real mouse click on that element's centre follows the probe, then
    ``after_click`` is evaluated."""
    profile = tempfile.mkdtemp(prefix="raygeom-chromium-")
    to_chrome_r, to_chrome_w = os.pipe()
    from_chrome_r, from_chrome_w = os.pipe()
    # Chromium reads commands on fd 3 and writes replies on fd 4.
    command = [
        CHROMIUM,
        *FLAGS,
        f"--user-data-dir={profile}",
        "--remote-debugging-pipe",
        f"--window-size={width},{height}",
        "about:blank",
    ]

    def child_fds():
        # Copy out of the way first (a pipe end may itself be fd 3 or 4), then make 3 and 4 survive exec.
        read_end, write_end = os.dup(to_chrome_r), os.dup(from_chrome_w)
        os.dup2(read_end, 3)
        os.dup2(write_end, 4)
        os.set_inheritable(3, True)
        os.set_inheritable(4, True)

    process = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=child_fds,
        close_fds=False,
        start_new_session=True,
    )
    os.close(to_chrome_r)
    os.close(from_chrome_w)
    pipe = _Pipe(process, to_chrome_w, from_chrome_r)
    result = PageVisit()
    try:
        target = pipe.call("Target.createTarget", {"url": "about:blank"}, timeout=timeout)["targetId"]
        session = pipe.call("Target.attachToTarget", {"targetId": target, "flatten": True}, timeout=timeout)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            pipe.call(f"{domain}.enable", session=session, timeout=timeout)
        pipe.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            session=session,
            timeout=timeout,
        )
        pipe.events.clear()
        pipe.call("Page.navigate", {"url": Path(path).resolve().as_uri()}, session=session, timeout=timeout)
        pipe.wait_event("Page.loadEventFired", timeout=timeout)
        time.sleep(settle)  # plots render right after load; let any late error arrive

        def evaluate(expression):
            reply = pipe.call(
                "Runtime.evaluate",
                {"expression": expression, "returnByValue": True, "awaitPromise": True},
                session=session,
                timeout=timeout,
            )
            return reply.get("result", {}).get("value")

        result.probe = evaluate(probe)
        if click:
            box = evaluate(
                f"(() => {{ const e = document.querySelector({json.dumps(click)});"
                " e.scrollIntoView({block: 'center'});"
                " const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
            )
            for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
                pipe.call(
                    "Input.dispatchMouseEvent",
                    {"type": kind, "x": box[0], "y": box[1], "button": "left", "clickCount": 1},
                    session=session,
                    timeout=timeout,
                )
            time.sleep(settle)
            result.after_click = evaluate(after_click)
            evaluate("window.scrollTo(0, 0)")
        shot = pipe.call("Page.captureScreenshot", {"format": "png"}, session=session, timeout=timeout)
        result.screenshot = base64.b64decode(shot["data"])
        for event in pipe.events:
            method, params = event["method"], event.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                result.errors.append(details.get("exception", {}).get("description") or details.get("text", "exception"))
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                result.errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                result.errors.append(params["entry"].get("text", ""))
            elif method == "Network.requestWillBeSent":
                result.requests.append(params["request"]["url"])
        try:
            pipe.call("Browser.close", timeout=10)
        except (RuntimeError, TimeoutError):
            pass
    finally:
        os.close(to_chrome_w)
        os.close(from_chrome_r)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(profile, ignore_errors=True)
    return result


def pixel_spread(png: bytes) -> tuple[float, int]:
    """(standard deviation of the grey levels, number of distinct colours) of a PNG: 0 and 1 for a blank page."""
    import io

    import numpy as np
    from PIL import Image

    image = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    colours = len(np.unique(image.reshape(-1, 3), axis=0))
    return float(image.mean(axis=2).std()), colours

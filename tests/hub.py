"""A Hugging Face hub on 127.0.0.1 for tests: the endpoints huggingface_hub's client uses to download.

It serves repos laid out as an HF cache folder (``raygeom.testing.write_tiny_pythia`` writes them): each ``refs/<name>``
is a branch, each ``snapshots/<commit>/`` its files. ``HF_ENDPOINT=hub.url`` points the real client here, so
``snapshot_download``, ``hf_hub_download``, ``model_info(revision=...)`` and ``list_repo_refs`` run the code paths they
run against the real hub:

- ``GET /api/models/{repo}/revision/{rev}`` (``?blobs=true``: sizes, git blob ids, LFS sha256s),
- ``GET /api/models/{repo}/refs``, ``GET /api/models/{repo}/tree/{rev}``,
- ``HEAD``/``GET /{repo}/resolve/{rev}/{file}`` with ``X-Repo-Commit``, ``ETag`` (git blob sha1), for ``*.safetensors``
  ``X-Linked-Etag`` (sha256) and ``X-Linked-Size``, ``Content-Length``, and ``Range`` requests (206).

Faults on demand (``hub.fault(...)``): status 500 for a file n times, the connection cut after x bytes, a stall, 404 for
a revision, corrupted bytes of the right size; ``hub.bandwidth`` limits the link all bodies share to that many bytes per second.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

LFS_PATTERNS = ("*.safetensors", "*.bin")


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Fault:
    """``kind``: 500 | cut | stall | corrupt | 404. ``file`` a glob of file names; ``revision`` a branch name (all when
    None). ``times``: how many GETs it hits (None: every one). ``after``: bytes sent before a cut or stall."""

    kind: str
    file: str = "*"
    revision: str | None = None
    times: int | None = None
    after: int = 0
    seconds: float = 0.0
    hits: int = 0

    def applies(self, revision: str, commit: str, file: str | None) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        if self.revision is not None and self.revision not in (revision, commit):
            return False
        return file is None or fnmatch.fnmatch(file, self.file)


class Repo:
    def __init__(self, repo_id: str, folder: Path):
        self.id, self.folder = repo_id, Path(folder)
        self.refs = {p.name: p.read_text().strip() for p in sorted((self.folder / "refs").iterdir())}
        self._files: dict[str, dict] = {}

    def files(self, commit: str) -> dict[str, dict]:
        """path -> {data, size, blob, sha256 (LFS files)} of one commit."""
        if commit not in self._files:
            root = self.folder / "snapshots" / commit
            entries = {}
            for path in sorted(p for p in root.rglob("*") if p.is_file()):
                data = path.read_bytes()
                name = path.relative_to(root).as_posix()
                lfs = any(fnmatch.fnmatch(name, pattern) for pattern in LFS_PATTERNS)
                entries[name] = {
                    "data": data,
                    "size": len(data),
                    "blob": git_blob_sha1(data),
                    "sha256": hashlib.sha256(data).hexdigest() if lfs else None,
                }
            self._files[commit] = entries
        return self._files[commit]

    def commit_of(self, revision: str) -> str | None:
        if revision in self.refs:
            return self.refs[revision]
        return revision if revision in self.refs.values() else None

    def name_of(self, commit: str) -> str:
        return next((name for name, c in self.refs.items() if c == commit), commit)


class LoopbackHub:
    """``with LoopbackHub() as hub: hub.add(folder, repo_id)``; ``hub.url`` for HF_ENDPOINT. Listens on 127.0.0.1 only."""

    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.faults: list[Fault] = []
        self.bandwidth: float | None = None  # bytes per second of the link all bodies share; None: unlimited
        self.link_free = 0.0  # monotonic time at which the link has sent everything queued so far
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status)
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="loopback-hub", daemon=True)

    def add(self, folder: Path, repo_id: str) -> Repo:
        self.repos[repo_id] = Repo(repo_id, folder)
        return self.repos[repo_id]

    def fault(self, kind: str, **rule) -> Fault:
        found = Fault(kind, **rule)
        with self.lock:
            self.faults.append(found)
        return found

    def clear(self) -> None:
        with self.lock:
            self.faults.clear()
            self.requests.clear()
        self.bandwidth = None

    def revision_bytes(self, repo_id: str, revision: str) -> int:
        repo = self.repos[repo_id]
        return sum(entry["size"] for entry in repo.files(repo.refs[revision]).values())

    def _take(self, kinds: tuple[str, ...], revision: str, commit: str, file: str | None) -> Fault | None:
        with self.lock:
            for rule in self.faults:
                if rule.kind in kinds and rule.applies(revision, commit, file):
                    rule.hits += 1
                    return rule
        return None

    def __enter__(self) -> "LoopbackHub":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def _handler(hub: LoopbackHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet
            pass

        def _reply(self, status: int, body: bytes = b"", headers: dict | None = None, head: bool = False) -> None:
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, str(value))
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)
            hub.requests.append((self.command, self.path, status))

        def _json(self, data, status: int = 200) -> None:
            self._reply(status, json.dumps(data).encode(), {"Content-Type": "application/json"})

        def _missing(self, code: str, message: str, head: bool = False, commit: str | None = None) -> None:
            headers = {"X-Error-Code": code, "X-Error-Message": message, "Content-Type": "application/json"}
            if commit:
                headers["X-Repo-Commit"] = commit
            self._reply(404, json.dumps({"error": message}).encode(), headers, head=head)

        def do_HEAD(self) -> None:
            self._resolve(head=True)

        def do_GET(self) -> None:
            path = unquote(urlparse(self.path).path)
            api = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/(revision|tree)/([^/]+)(?:/.*)?|/(refs))?", path)
            if api:
                repo = hub.repos.get(api[1])
                if repo is None:
                    return self._missing("RepoNotFound", f"Repository {api[1]} not found")
                if api[4] == "refs":
                    return self._json(
                        {
                            "branches": [{"name": n, "ref": f"refs/heads/{n}", "targetCommit": c} for n, c in repo.refs.items()],
                            "tags": [],
                            "converts": [],
                        }
                    )
                revision = api[3] or "main"
                commit = repo.commit_of(revision)
                if commit is None or hub._take(("404",), revision, commit or "", None):
                    return self._missing("RevisionNotFound", f"Invalid rev id: {revision}")
                files = repo.files(commit)
                if api[2] == "tree":
                    return self._json(
                        [
                            {
                                "type": "file",
                                "oid": f["blob"],
                                "size": f["size"],
                                "path": name,
                                **({"lfs": {"oid": f["sha256"], "size": f["size"], "pointerSize": 134}} if f["sha256"] else {}),
                            }
                            for name, f in files.items()
                        ]
                    )
                return self._json(
                    {
                        "id": repo.id,
                        "modelId": repo.id,
                        "sha": commit,
                        "private": False,
                        "siblings": [
                            {
                                "rfilename": name,
                                "size": f["size"],
                                "blobId": f["blob"],
                                **(
                                    {"lfs": {"sha256": f["sha256"], "size": f["size"], "pointerSize": 134}} if f["sha256"] else {}
                                ),
                            }
                            for name, f in files.items()
                        ],
                    }
                )
            self._resolve(head=False)

        def _resolve(self, head: bool) -> None:
            path = unquote(urlparse(self.path).path)
            match = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
            repo = hub.repos.get(match[1]) if match else None
            if repo is None:
                return self._missing("RepoNotFound", "Repository not found", head=head)
            revision, name = match[2], match[3]
            commit = repo.commit_of(revision)
            branch = repo.name_of(commit) if commit else revision
            if commit is None or hub._take(("404",), branch, commit, None):
                return self._missing("RevisionNotFound", f"Invalid rev id: {revision}", head=head)
            entry = repo.files(commit).get(name)
            if entry is None:
                return self._missing("EntryNotFound", f"{name} does not exist", head=head, commit=commit)
            headers = {
                "X-Repo-Commit": commit,
                "ETag": f'"{entry["blob"]}"',
                "Accept-Ranges": "bytes",
                "Content-Type": "application/octet-stream",
            }
            if entry["sha256"]:
                headers.update({"X-Linked-Etag": f'"{entry["sha256"]}"', "X-Linked-Size": entry["size"]})
            if head:
                self.send_response(200)
                for key, value in headers.items():
                    self.send_header(key, str(value))
                self.send_header("Content-Length", str(entry["size"]))
                self.end_headers()
                hub.requests.append(("HEAD", self.path, 200))
                return
            if hub._take(("500",), branch, commit, name):
                return self._reply(500, b'{"error": "Internal Error"}', {"Content-Type": "application/json"})
            data = entry["data"]
            if hub._take(("corrupt",), branch, commit, name):
                data = bytes(b ^ 0x5A for b in data[:64]) + data[64:]
            start = 0
            ranged = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", "") or "")
            if ranged:
                start = int(ranged[1])
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            body = data[start:]
            self.send_response(206 if ranged else 200)
            for key, value in headers.items():
                self.send_header(key, str(value))
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            hub.requests.append(("GET", self.path, 206 if ranged else 200))
            cut = hub._take(("cut",), branch, commit, name)
            stall = hub._take(("stall",), branch, commit, name)
            self._send(body, cut.after if cut else None, stall)

        def _send(self, body: bytes, cut_after: int | None, stall: Fault | None) -> None:
            sent, block = 0, 16384
            try:
                while sent < len(body):
                    if cut_after is not None and sent >= cut_after:
                        self.close_connection = True
                        self.connection.shutdown(2)
                        return
                    if stall is not None and sent >= stall.after:
                        time.sleep(stall.seconds)
                        stall = None
                    end = min(len(body), sent + block)
                    if cut_after is not None:
                        end = min(end, max(cut_after, sent + 1))
                    if hub.bandwidth:  # this block's turn on the shared link
                        with hub.lock:
                            hub.link_free = max(hub.link_free, time.monotonic()) + (end - sent) / hub.bandwidth
                            until = hub.link_free
                        time.sleep(max(0.0, until - time.monotonic()))
                    self.wfile.write(body[sent:end])
                    sent = end
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

    return Handler

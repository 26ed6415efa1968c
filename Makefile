PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Exit status 0 for an interpreter deepserve can run on (pyproject: requires-python >= 3.11).
PY_OK := import sys; sys.exit(sys.version_info < (3, 11))

# Empty when .venv holds a working Python >= 3.11 with pip. Anything else (no .venv, a
# half-made one, one left by an older Python whose pip failed, a dangling interpreter
# link) is rebuilt from scratch: re-running pip in it would only fail the same way.
VENV_BROKEN := $(shell $(PY) -c '$(PY_OK); import pip' >/dev/null 2>&1 || echo yes)

.PHONY: test demo demo-sim up lint typecheck typecheck-all bench setup clean venv compiled browser

$(STAMP): pyproject.toml $(if $(VENV_BROKEN),venv)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,postgres,bench,ray,parquet]'
	touch $(STAMP)

# The interpreter is checked before anything is created: one line, and no .venv left behind.
venv:
	$(if $(shell $(PYTHON) -c '$(PY_OK)' >/dev/null 2>&1 && echo ok),,$(error deepserve needs Python >= 3.11 but $(PYTHON) is $(or $(shell $(PYTHON) -V 2>/dev/null),not found): run make PYTHON=python3.11 (or newer)))
	@if [ -e $(VENV) ]; then echo "make: $(VENV) is broken or was made by another Python: rebuilding it"; fi
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)

# The compiled build (compiled.py): mypyc builds the hot modules into build/mypyc/, again
# whenever one of them changes (the step checks their hashes: a no-op when they are unchanged).
# If it cannot (no C compiler), one line says so and pure Python runs: same logs, slower.
# Then the bytecode of the package's own modules, as pip does for installed packages (an
# editable install gets none): under PYTHONDONTWRITEBYTECODE, which this project's machines
# set, every `deepserve` process compiled ~120 modules from source at start, ~0.25 s (measured).
compiled: $(STAMP)
	@$(PY) -c 'import deepserve.compiled as c; c.main()'
	@$(PY) -m compileall -q -j 0 -x '/(\.venv|build|runs|tests|\.git)/' .

setup: $(STAMP) compiled

# The compile (one core), lint and type check run side by side (and chromium's install, if
# needed); then the suite, on every core.
test: $(STAMP)
	$(MAKE) --no-print-directory -j2 compiled lint typecheck browser
	$(PY) -m pytest -rs -n auto

# The report's browser test (tests/replay/test_report_browser.py) drives Debian's chromium through
# its chromedriver. A machine without them gets them here where apt-get can install (root); anywhere
# else one line says so, and that test skips.
BROWSER_PKGS := chromium chromium-driver
browser:
	@if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "make: installing $(BROWSER_PKGS) (Debian) for the report's browser test"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(BROWSER_PKGS) >/dev/null) \
			|| echo "make: $(BROWSER_PKGS) could not be installed: the report's browser test will skip"; \
	else echo "make: chromium is not installed and apt-get cannot install it here (not root, or not Debian): the report's browser test will skip"; fi

lint: $(STAMP)
	$(PY) -m ruff check .

# mypy. `make test` checks the kernel, the hardware and FlowServe (~10 s); `make typecheck-all`
# the whole package, tests aside (~30-40 s: too long to add to every test run). Both are clean.
# mypy names modules after their directories, and a checkout is rarely named `deepserve`: it
# checks through a temporary directory holding a `deepserve` link to this one.
TYPED := core adapters/hardware actors/flowserve actors/ports
MYPY = d=$$(mktemp -d) && ln -s "$(CURDIR)" "$$d/deepserve" && cd "$$d" && \
	"$(CURDIR)/$(PY)" -m mypy --config-file "$(CURDIR)/pyproject.toml" --cache-dir "$$d/.mypy_cache" \
	--ignore-missing-imports $(1); s=$$?; rm -rf "$$d"; exit $$s
typecheck: $(STAMP)
	@$(call MYPY,$(addprefix deepserve/,$(TYPED)))
typecheck-all: $(STAMP)
	@$(call MYPY,--exclude '^deepserve/(\.venv|tests|runs|build)/' deepserve)

# The daemon's tour: deepserve up on a free port, a streamed chat completion, status, stop, replay verify.
demo: $(STAMP) compiled
	$(PY) -m deepserve.examples.daemon_tour

# The kernel's example scenario (the demo before the daemon).
demo-sim: $(STAMP) compiled
	$(VENV)/bin/deepserve sim example --seed 0  # writes runs/example-0.db
	$(VENV)/bin/deepserve replay verify runs/example-0.db

up: $(STAMP) compiled
	$(VENV)/bin/deepserve up

bench: $(STAMP) compiled
	$(VENV)/bin/deepserve bench kernel

clean:
	rm -rf $(VENV) build *.egg-info

VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test demo demo-sim up lint bench setup clean

$(PY):
	python3 -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,postgres,bench]'
	touch $(STAMP)

setup: $(STAMP)

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest

# The daemon's tour: deepserve up on a free port, a streamed chat completion, status, stop, replay verify.
demo: $(STAMP)
	$(PY) -m deepserve.examples.daemon_tour

# The kernel's example scenario (the demo before the daemon).
demo-sim: $(STAMP)
	$(VENV)/bin/deepserve sim example --seed 0 --log runs/example-0.db
	$(VENV)/bin/deepserve replay verify runs/example-0.db

up: $(STAMP)
	$(VENV)/bin/deepserve up

bench: $(STAMP)
	$(VENV)/bin/deepserve bench kernel

clean:
	rm -rf $(VENV) build *.egg-info

# gepo-xtuner: `make demo` and `make test` set up a local virtual environment on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_DIR ?= work_dirs/demo

.PHONY: demo test bench clean-venv

$(STAMP): setup.py
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "Python >= 3.10 required"'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e '.[dev]'
	touch $@

demo: $(STAMP)
	$(PY) tools/make_sample_rollouts.py $(DEMO_DIR)/sample_rollouts.jsonl
	$(PY) tools/analyze_rollouts.py $(DEMO_DIR)/sample_rollouts.jsonl --out $(DEMO_DIR)/analysis

test: $(STAMP)
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) tools/bench_advantage.py
	$(PY) benchmarks/bench_token_ops.py

clean-venv:
	rm -rf $(VENV)

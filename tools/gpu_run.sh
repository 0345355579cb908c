#!/usr/bin/env bash
# The GPU checks on a CUDA machine without network and without this project's venv
# (docs/gpu.md): installs the wheels of tools/prepare_gpu_bundle.py beside the machine's own
# python3, then runs one stage. Each stage fits in a 10-minute command:
#
#   tools/gpu_run.sh check      install, versions, the imports every stage needs (~1 min)
#   tools/gpu_run.sh tests      the `gpu` tests but LMDeploy's, then the figures
#   tools/gpu_run.sh lmdeploy   LMDeploy's server + PyTorch engine: generate (temperature 1
#                               and 0.7), logprobs vs the trainer, CUDA-IPC weight update,
#                               sleep/wake, one RL step; the CUDA-IPC path of the backend
#   tools/gpu_run.sh bench      benchmarks/bench_rl_step.py in bf16 on the GPU (0.5B Qwen2)
#   tools/gpu_run.sh all        tests, lmdeploy and bench in one go (a longer command)
#
# Environment: PY (default python3), GPU_BUNDLE (default .gpu_bundle), GPU_SITE (where the
# wheels go, default /tmp/site), GEPO_GPU_REPORT_DIR (report.jsonl of the figures and the
# logs, default work_dirs/gpu), GPU_TEST_ARGS (extra pytest arguments).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
PY=${PY:-python3}
BUNDLE=${GPU_BUNDLE:-.gpu_bundle}
SITE=${GPU_SITE:-/tmp/site}
REPORT=${GEPO_GPU_REPORT_DIR:-work_dirs/gpu}
read -r -a EXTRA <<< "${GPU_TEST_ARGS:-}"
export GEPO_GPU_REPORT_DIR=$REPORT PYTHONUNBUFFERED=1
mkdir -p "$REPORT"

install_bundle() {
    if [ ! -f "$SITE/.installed" ]; then
        ls "$BUNDLE"/*.whl >/dev/null 2>&1 || {
            echo "no wheels in $BUNDLE: run tools/prepare_gpu_bundle.py where pip works" >&2
            exit 2; }
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$SITE" "$BUNDLE"/*.whl || exit 2
        # xtuner 0.2.0 under transformers 5 needs this project's start-up hook, which a .pth
        # file runs; .pth files are read in site directories only, not in PYTHONPATH entries.
        # This one does nothing in a process without $SITE on its path.
        purelib=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        echo "import importlib.util as u; u.find_spec('_gepo_xtuner_transformers5') and" \
            "__import__('_gepo_xtuner_transformers5').install()" \
            > "$purelib/gepo_xtuner_transformers5.pth" ||
            echo "warning: cannot write $purelib: xtuner may not import under transformers 5"
        touch "$SITE/.installed"
    fi
    export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
}

check() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader ||
        echo "nvidia-smi: no NVIDIA driver here"
    "$PY" - <<'EOF'
import importlib, sys, time
import torch, transformers
device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none (no CUDA)'
print(f'python {sys.version.split()[0]} torch {torch.__version__} (cuda {torch.version.cuda}) '
      f'transformers {transformers.__version__} device {device}')
for name in ('gepo_xtuner', 'xtuner.tools.train', 'mmengine', 'lmdeploy.cli',
             'lmdeploy.serve.openai.api_server', 'lmdeploy.pytorch.engine.engine',
             'lmdeploy.pytorch.engine.model_agent', 'lmdeploy.pytorch.models.qwen2',
             'lmdeploy.pytorch.backends.cuda.op_backend'):
    t = time.perf_counter()
    module = importlib.import_module(name)
    version = getattr(sys.modules[name.split('.')[0]], '__version__', '')
    print(f'import {name} {version} ok ({time.perf_counter() - t:.1f}s)')
try:
    import flash_attn
    print(f'flash_attn {flash_attn.__version__}: packed passes use its varlen kernel')
except ImportError:
    print('flash_attn not installed: packed passes use SDPA per sequence')
EOF
}

# every test module that carries the `gpu` marker (as `make test-gpu` selects them)
gpu_tests() { grep -rl --include='test_*.py' 'pytest.mark.gpu' tests | sort; }

tests() {
    mapfile -t files < <(gpu_tests)
    "$PY" -m pytest -m gpu -rs -v "${files[@]}" -k 'not lmdeploy' "${EXTRA[@]}" \
        2>&1 | tee "$REPORT/tests.log"
    local status=${PIPESTATUS[0]}
    "$PY" tools/gpu_report.py "$REPORT"
    return "$status"
}

lmdeploy_tests() {
    mapfile -t files < <(gpu_tests)
    "$PY" -m pytest -m gpu -rs -v "${files[@]}" -k 'lmdeploy' "${EXTRA[@]}" \
        2>&1 | tee "$REPORT/lmdeploy.log"
    local status=${PIPESTATUS[0]}
    "$PY" tools/gpu_report.py "$REPORT"
    return "$status"
}

bench() {
    "$PY" benchmarks/bench_rl_step.py --device cuda --dtype bfloat16 --skip-trl --qwen2-0.5b \
        --responses 256 --median-length 256 --max-length 2048 --max-tokens 16384 \
        --prompt-lengths 30 120 --rounds 3 --rollout-tokens 128 \
        --work-dir "${TMPDIR:-/tmp}/bench_rl_step" 2>&1 | tee "$REPORT/bench.log"
    return "${PIPESTATUS[0]}"
}

stage=${1:-}
case "$stage" in
    check) install_bundle; check ;;
    tests) install_bundle; tests ;;
    lmdeploy) install_bundle; lmdeploy_tests ;;
    bench) install_bundle; bench ;;
    all) install_bundle; s=0; tests || s=1; lmdeploy_tests || s=1; bench || s=1; exit $s ;;
    *) echo "usage: tools/gpu_run.sh check|tests|lmdeploy|bench|all" >&2; exit 2 ;;
esac

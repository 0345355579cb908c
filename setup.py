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
    ],
    extras_require={
        'dev': ['pytest>=8', 'scipy>=1.10'],
    },
)

"""Adapters to other trainers' interfaces.

Nothing here is imported by ``import gepo_xtuner``: each adapter needs its trainer
installed (XTuner v1: :mod:`gepo_xtuner.integrations.xtuner_v1`) and is imported
by name by the configs that use it.
"""

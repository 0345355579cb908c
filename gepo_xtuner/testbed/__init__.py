"""The CPU testbed: what the demo, the smoke runs and the method comparison use, never training.

* :mod:`.synthetic_tasks`: the four-domain synthetic task mix (copy, add, sort, mul);
* :mod:`.tiny`, :mod:`.tiny_vl`: the character-level tiny Qwen2 and its warm start, a tiny
  Qwen2-VL with picture tasks;
* :mod:`.smoke`: smoke runs of any config on CPU (``tools/check_config.py --smoke-steps``);
* :mod:`.experiments`: the method-comparison harness's summaries and figures;
* :mod:`.sample_rollouts`: a deterministic rollout dump for ``make demo-analysis``;
* :mod:`.rl_step`: one RL step's trainer side outside a runner (a Qwen2 built from a config,
  a ragged workload, the loop's own passes), for ``benchmarks/bench_rl_step.py`` and the
  GPU checks;
* :mod:`.gpu`: what the GPU checks (``make test-gpu``) compare and report.

Nothing outside this package imports it (``tests/test_import.py`` checks), so
``import gepo_xtuner`` never loads a fixture.
"""

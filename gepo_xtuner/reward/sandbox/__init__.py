"""The code reward's sandbox: a room of its own, each file named for the side it runs on.

* :mod:`.trainer` (the trainer's side, trusted): :class:`Sandbox` starts and limits each
  run, chooses the containment level, reads the answers back;
  :mod:`.trainer_tests` reads the test programs before any run;
* inside the box, standard library only: :mod:`.harness` (the sandboxed process's start),
  :mod:`.limits` (kernel limits, privileges, Landlock), :mod:`.solution_side` (the
  process that runs the untrusted code), :mod:`.judge_side` (the test process of an
  assert run, which alone writes the verdict), :mod:`.wire` (values between them and back
  to the trainer, bounded) and :mod:`.syscall_filter` (the seccomp filter).

What each side may trust, per test form: docs/rewards.md, "What the grader trusts".
"""

from .trainer import (BOX_WORK_DIR, LEVELS, UID_BASE, UID_SLOTS, AssertTests, Sandbox,
                      SandboxError, SandboxResult, UnsupportedTestError, available_levels,
                      bwrap_executable, cgroup_support, namespaces_available, seccomp_support)

__all__ = ['BOX_WORK_DIR', 'LEVELS', 'UID_BASE', 'UID_SLOTS', 'AssertTests', 'Sandbox',
           'SandboxError', 'SandboxResult', 'UnsupportedTestError', 'available_levels',
           'bwrap_executable', 'cgroup_support', 'namespaces_available', 'seccomp_support']

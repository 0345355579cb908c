"""CodeReward: runs the completion's program against the record's tests in a sandbox."""

import json
import math
import re
from collections.abc import Mapping
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Literal

from ..registry import REWARDS
from .base import Reward
from .sandbox import Sandbox

__all__ = ['CodeReward', 'TestCase', 'extract_code', 'parse_tests']

_FENCE = re.compile(r'```([^\n`]*)\n(.*?)```', re.DOTALL)
_OPEN_PYTHON_FENCE = re.compile(r'```(?:python3?|py)[ \t]*\n', re.IGNORECASE)
_PYTHON_TAGS = ('python', 'python3', 'py')


def extract_code(completion: str) -> str:
    """The program in a completion: the last ```python block, else the last untagged
    block, else an unterminated trailing ```python block (a cut-off generation), else
    the whole completion.

    Example:
        >>> extract_code('Idea...\\n```python\\nprint(1)\\n```\\nBetter:\\n```python\\nprint(2)\\n```')
        'print(2)\\n'
        >>> extract_code('print(3)')
        'print(3)'
    """
    blocks = [(m.group(1).strip().lower(), m.group(2)) for m in _FENCE.finditer(completion)]
    for tags in (_PYTHON_TAGS, ('',)):
        tagged = [body for tag, body in blocks if tag in tags]
        if tagged:
            return tagged[-1]
    opened = list(_OPEN_PYTHON_FENCE.finditer(completion))
    if opened:
        return completion[opened[-1].end():]
    return completion


@dataclass(frozen=True)
class TestCase:
    """One test: stdin -> expected stdout, or a call with arguments -> expected value."""

    __test__ = False  # not a pytest class despite the name

    kind: Literal['stdin', 'call']
    stdin: str = ''
    expected: Any = None
    fn_name: str | None = None
    args: list = field(default_factory=list)


def _call_args(raw: Any, where: str) -> list:
    if isinstance(raw, list):
        return raw
    if isinstance(raw, str):  # LiveCodeBench: one JSON value per line
        try:
            return [json.loads(line) for line in raw.splitlines() if line.strip()]
        except ValueError as exc:
            raise ValueError(f'{where}: call arguments {raw[:80]!r} are not JSON lines') from exc
    raise TypeError(f'{where}: call arguments must be a list or JSON lines, got {type(raw)}')


def parse_tests(record: dict[str, Any]) -> list[TestCase]:
    """The record's ``tests`` as :class:`TestCase` objects.

    Accepted forms (a list of them, or one dict):

    * ``{"input": str, "output": str}``: stdin/stdout program;
    * ``{"fn_name": str, "inputs": [[args...], ...], "outputs": [value, ...]}``: call
      ``fn_name`` (a function or a ``Solution`` method) with each argument list;
    * LiveCodeBench functional tests ``{"input": "<JSON per line>", "output": "<JSON>",
      "testtype": "functional"}`` with the name in ``fn_name`` or
      ``metadata.func_name``.

    Raises:
        ValueError: no tests, or a test in none of these forms (says which one).
    """
    rid = record.get('id', '?')
    tests = record.get('tests')
    if isinstance(tests, Mapping):
        tests = [tests]
    if not tests or not isinstance(tests, list):
        raise ValueError(f"code record {rid!r} has no 'tests' (a non-empty list)")
    cases = []
    for i, test in enumerate(tests):
        where = f'code record {rid!r}, tests[{i}]'
        if not isinstance(test, Mapping):
            raise TypeError(f'{where}: expected a dict, got {type(test).__name__}')
        if 'fn_name' in test and 'inputs' in test:
            inputs, outputs = test['inputs'], test.get('outputs')
            if not isinstance(outputs, list) or len(inputs) != len(outputs):
                raise ValueError(f"{where}: 'inputs' and 'outputs' must be lists of equal length")
            cases += [TestCase('call', fn_name=test['fn_name'], args=_call_args(a, where),
                               expected=o) for a, o in zip(inputs, outputs)]
        elif 'input' in test and 'output' in test and test.get('testtype') == 'functional':
            fn_name = test.get('fn_name') or (record.get('metadata') or {}).get('func_name')
            if not fn_name:
                raise ValueError(f"{where}: functional test without 'fn_name' (or "
                                 "metadata.func_name)")
            expected = test['output']
            try:
                expected = json.loads(expected) if isinstance(expected, str) else expected
            except ValueError:
                pass  # a plain string result
            cases.append(TestCase('call', fn_name=fn_name, args=_call_args(test['input'], where),
                                  expected=expected))
        elif 'input' in test and 'output' in test:
            cases.append(TestCase('stdin', stdin=str(test['input']), expected=str(test['output'])))
        else:
            raise ValueError(f'{where}: expected {{"input", "output"}} or {{"fn_name", "inputs", '
                             f'"outputs"}}, got keys {sorted(test)}')
    return cases


def _number(token: str) -> float | None:
    try:
        return float(token)
    except ValueError:
        return None


def same_stdout(got: str, expected: str, float_tol: float | None = 1e-6) -> bool:
    """Output comparison: line by line, ignoring trailing spaces and blank lines at the ends.

    Failing that, lines match token by token where tokens with a decimal point or
    exponent compare as numbers within ``float_tol`` (absolute or relative).

    Example:
        >>> same_stdout('3 4  \\n\\n', '3 4')
        True
        >>> same_stdout('0.3333333\\n', '0.333333333')
        True
        >>> same_stdout('1000001\\n', '1000000')
        False
    """
    def lines(text: str) -> list[str]:
        return [line.rstrip() for line in text.strip('\n').rstrip().split('\n')]
    got_lines, exp_lines = lines(got), lines(expected)
    if got_lines == exp_lines:
        return True
    if float_tol is None or len(got_lines) != len(exp_lines):
        return False
    for g_line, e_line in zip(got_lines, exp_lines):
        g_tokens, e_tokens = g_line.split(), e_line.split()
        if len(g_tokens) != len(e_tokens):
            return False
        for g, e in zip(g_tokens, e_tokens):
            if g == e:
                continue
            if not any(c in g + e for c in '.eE'):
                return False
            gv, ev = _number(g), _number(e)
            if gv is None or ev is None or not math.isclose(gv, ev, rel_tol=float_tol,
                                                            abs_tol=float_tol):
                return False
    return True


def same_value(got: Any, expected: Any, float_tol: float | None = 1e-6) -> bool:
    """Return-value comparison after a JSON round trip (tuples are lists).

    Floats compare within ``float_tol``; booleans never equal numbers; an expected
    string that is JSON for a non-string result is decoded first.

    Example:
        >>> same_value([0, 1], [0, 1]), same_value(0.1 + 0.2, 0.3), same_value(True, 1)
        (True, True, False)
    """
    if isinstance(expected, str) and not isinstance(got, str):
        try:
            expected = json.loads(expected)
        except ValueError:
            return False
    if isinstance(got, bool) or isinstance(expected, bool):
        return type(got) is type(expected) and got == expected
    if isinstance(got, (int, float)) and isinstance(expected, (int, float)):
        if float_tol is None or (isinstance(got, int) and isinstance(expected, int)):
            return got == expected
        return math.isclose(got, expected, rel_tol=float_tol, abs_tol=float_tol)
    if isinstance(got, list) and isinstance(expected, list):
        return len(got) == len(expected) and all(
            same_value(g, e, float_tol) for g, e in zip(got, expected))
    if isinstance(got, dict) and isinstance(expected, dict):
        return got.keys() == expected.keys() and all(
            same_value(got[k], expected[k], float_tol) for k in got)
    return got == expected


@REWARDS.register_module()
class CodeReward(Reward):
    """Runs the completion's Python program against the record's tests.

    The program (:func:`extract_code`) runs once per test in a separate, limited
    process (:class:`~gepo_xtuner.reward.sandbox.Sandbox`; never in the trainer's
    process). A test passes if the run exits normally within the limits and its stdout
    (:func:`same_stdout`) or return value (:func:`same_value`) matches. A solution that
    times out, crashes or exceeds a limit fails that test (score, not error); only a
    sandbox failure (the process cannot start) raises, and the router counts it in
    ``reward/errors/<domain>``. The program sees no file of the host but the
    interpreter, and writes only to its own size-limited working directory, at the
    strongest containment level available (docs/rewards.md).

    Args:
        timeout_s: wall-clock limit per test in seconds (default 6; the CPU-time limit
            is its ceiling).
        memory_mb: address-space limit per test in MiB (default 1024).
        partial_credit: False (default): 1.0 if all tests pass, else 0.0, stopping at
            the first failure; True: the fraction of tests passed.
        max_workers: tests run in parallel processes (default 1).
        max_output_bytes: stdout / written-file limit per test (default 8 MiB).
        max_processes: RLIMIT_NPROC for the code (default 32; see the sandbox for when
            the kernel enforces it).
        isolation: the sandbox's containment level: ``'auto'`` (default: the strongest
            available here, reported once as ``reward/sandbox: <level>``), or one of
            ``'bwrap'``, ``'landlock'``, ``'namespaces'``, ``'audit_hook'`` (required).
        disk_mb: size limit of the code's working directory per test in MiB (default 32).
        min_containment: refuse to start below this level, e.g. ``'bwrap'`` for a
            cluster run (default None: any, with a warning below ``'landlock'``). The
            error says what to install.
        float_tol: tolerance for numbers with a decimal point or exponent in stdout and
            for float return values (default 1e-6; None: exact).

    Example:
        >>> reward = CodeReward(timeout_s=5)
        >>> record = {'tests': [{'input': '2 3\\n', 'output': '5\\n'},
        ...                     {'input': '10 -4\\n', 'output': '6\\n'}]}
        >>> reward('```python\\na, b = map(int, input().split())\\nprint(a + b)\\n```', record)
        1.0
        >>> reward('```python\\nprint(5)\\n```', record)
        0.0
    """

    required_fields = ('tests',)

    def __init__(self, timeout_s: float = 6.0, memory_mb: int = 1024,
                 partial_credit: bool = False, max_workers: int = 1,
                 max_output_bytes: int = 8 << 20, max_processes: int = 32,
                 isolation: Literal['auto', 'bwrap', 'landlock', 'namespaces',
                                    'audit_hook'] = 'auto',
                 float_tol: float | None = 1e-6, disk_mb: int = 32,
                 min_containment: Literal['bwrap', 'landlock', 'namespaces', 'audit_hook']
                 | None = None) -> None:
        if max_workers < 1:
            raise ValueError(f'max_workers must be >= 1, got {max_workers}')
        self.sandbox = Sandbox(timeout_s=timeout_s, memory_mb=memory_mb,
                               max_output_bytes=max_output_bytes, max_processes=max_processes,
                               isolation=isolation, disk_mb=disk_mb,
                               min_containment=min_containment)
        self.partial_credit = bool(partial_credit)
        self.max_workers = int(max_workers)
        self.float_tol = float_tol

    def passes(self, code: str, case: TestCase) -> bool:
        """Whether ``code`` passes one test (raises only on sandbox failure)."""
        if case.kind == 'stdin':
            result = self.sandbox.run(code, stdin=case.stdin)
            return result.status == 'ok' and same_stdout(result.stdout, case.expected,
                                                         self.float_tol)
        result = self.sandbox.run(code, fn_name=case.fn_name, args=case.args)
        return result.status == 'ok' and result.has_value and same_value(
            result.value, case.expected, self.float_tol)

    def __call__(self, completion: str, record: dict[str, Any]) -> float:
        cases = parse_tests(record)
        code = extract_code(completion)
        if not code.strip():
            return 0.0
        if self.max_workers == 1:
            passed = 0
            for case in cases:
                ok = self.passes(code, case)
                passed += ok
                if not ok and not self.partial_credit:
                    return 0.0
            return passed / len(cases)
        with ThreadPoolExecutor(self.max_workers) as pool:
            pending = {pool.submit(self.passes, code, case) for case in cases}
            passed = 0
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    ok = future.result()  # a sandbox failure raises here
                    passed += ok
                    if not ok and not self.partial_credit:
                        for other in pending:
                            other.cancel()  # not started yet: skipped
                        return 0.0
        return passed / len(cases)

    def parse_record(self, record: dict[str, Any]) -> None:
        parse_tests(record)

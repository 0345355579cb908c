"""CodeReward: runs the completion's program against the record's tests in a sandbox."""

import ast
import base64
import io
import json
import math
import pickle
import re
import zlib
from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Literal

from ..registry import REWARDS
from .base import Reward, Scored
from .sandbox import AssertTests, Sandbox
from .sandbox.trainer_tests import free_names, parse_python, unsupported_arguments

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
    """One test of a code record.

    * ``'stdin'``: the program reads ``stdin``; its stdout must match ``expected``
      (:func:`same_stdout`);
    * ``'call'``: ``fn_name(*args)`` for each of ``calls`` must return its expected value
      (JSON records: :func:`same_value`; literal asserts: Python ``==`` on builtin
      values, ``python_eq``);
    * ``'asserts'``: the program ``asserts`` (MBPP's ``test_list``, HumanEval's
      ``check``) must run to its end, every assert true, in a process of its own that
      calls the solution's ``names`` in the solution's process
      (:mod:`~gepo_xtuner.reward.sandbox.judge_side`); ``prelude`` (HumanEval's ``prompt``)
      runs before the tests in their process, and before a solution that does not
      define ``entry_point`` in the solution's.
    """

    __test__ = False  # not a pytest class despite the name

    kind: Literal['stdin', 'call', 'asserts']
    stdin: str = ''
    expected: Any = None
    fn_name: str | None = None
    args: list = field(default_factory=list)
    calls: tuple = ()          # call: ((fn_name, args, expected), ...) run in one process
    python_eq: bool = False    # call: compare as the benchmark's own assert does
    asserts: str = ''
    prelude: str = ''
    entry_point: str | None = None
    names: tuple = ()          # asserts: the solution's names the tests use


def _call_args(raw: Any, where: str) -> list:
    if isinstance(raw, list):
        return raw
    if isinstance(raw, str):  # LiveCodeBench: one JSON value per line
        try:
            return [json.loads(line) for line in raw.splitlines() if line.strip()]
        except ValueError as exc:
            raise ValueError(f'{where}: call arguments {raw[:80]!r} are not JSON lines') from exc
    raise TypeError(f'{where}: call arguments must be a list or JSON lines, got {type(raw)}')


def _literal_call(line: str) -> tuple[str, list, Any] | None:
    """``assert f(<literals>) == <literal>`` as (f, args, expected); else None."""
    try:
        tree = parse_python(line.strip())
    except SyntaxError:
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        return None
    test = tree.body[0].test
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Eq) and isinstance(test.left, ast.Call)
            and isinstance(test.left.func, ast.Name) and not test.left.keywords):
        return None
    try:
        args = [ast.literal_eval(a) for a in test.left.args]
        expected = ast.literal_eval(test.comparators[0])
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return test.left.func.id, args, expected


def _assert_tests(record: dict[str, Any], rid: Any, challenge: bool) -> list[TestCase] | None:
    """MBPP's and HumanEval's published fields as tests; None if neither is there."""
    if 'test_list' in record:  # MBPP: task_id, text, code, test_list, test_setup_code, ...
        where = f'code record {rid!r} (MBPP)'
        lines = record['test_list']
        if not isinstance(lines, list) or not lines or not all(isinstance(t, str) for t in lines):
            raise ValueError(f"{where}: 'test_list' must be a non-empty list of assert "
                             f'strings, got {lines!r:.80}')
        extra = record.get('challenge_test_list') or [] if challenge else []
        setup = record.get('test_setup_code') or ''
        imports = record.get('test_imports') or []  # the sanitized split's field
        if not isinstance(setup, str) or not isinstance(imports, list):
            raise ValueError(f"{where}: 'test_setup_code' must be a string and "
                             "'test_imports' a list of import lines")
        setup = '\n'.join([*map(str, imports), setup])
        lines = [*lines, *extra]
        calls = [_literal_call(line) for line in lines]
        if not setup.strip() and all(calls):
            # the expected values stay here; the sandbox only computes the calls
            return [TestCase('call', calls=tuple(calls), python_eq=True)]
        program = setup + '\n' + '\n'.join(lines) + '\n'
        try:
            parse_python(program)
        except SyntaxError as exc:
            raise ValueError(f'{where}: the tests do not parse: {exc}') from exc
        names = free_names(program, keep_builtins=_defined(record.get('code')))
        _refuse_unsupported(where, program, set(names))
        return [TestCase('asserts', asserts=program, names=names)]
    if 'test' in record and 'entry_point' in record:  # HumanEval
        where = f'code record {rid!r} (HumanEval)'
        test, entry = record['test'], record['entry_point']
        if not isinstance(test, str) or 'def check(' not in test:
            raise ValueError(f"{where}: 'test' must define check(candidate)")
        if not isinstance(entry, str) or not entry.isidentifier():
            raise ValueError(f"{where}: 'entry_point' must be a function name, got {entry!r}")
        program = f'{test}\n\ncheck({entry})\n'
        prompt = record.get('prompt')
        prompt = prompt if isinstance(prompt, str) else ''
        try:
            tree = parse_python(program)
            parse_python(prompt)
        except SyntaxError as exc:
            raise ValueError(f'{where}: the test or the prompt does not parse: {exc}') from exc
        names = free_names(program)
        params = {a.arg for n in tree.body if isinstance(n, ast.FunctionDef)
                  and n.name == 'check' for a in n.args.args[:1]}
        _refuse_unsupported(where, program, {*names, entry, *params})
        return [TestCase('asserts', asserts=program, entry_point=entry, prelude=prompt,
                         names=names)]
    return None


def _defined(code: Any) -> tuple[str, ...]:
    """Top-level functions and classes of a record's reference solution (MBPP's
    ``code``), so that one named like a builtin is still looked up in the solution."""
    try:
        tree = parse_python(code) if isinstance(code, str) else None
    except SyntaxError:
        return ()
    return tuple(n.name for n in getattr(tree, 'body', ()) if isinstance(
        n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))


def _refuse_unsupported(where: str, program: str, targets: set[str]) -> None:
    why = unsupported_arguments(program, targets)
    if why is not None:
        raise ValueError(f'{where}: cannot be scored safely: {why}')


class _StringOnly(pickle.Unpickler):
    """Unpickles a string and nothing else (no class, no function: no code runs)."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f'{module}.{name}: only a string is expected here')


def _livecodebench_cases(raw: Any, where: str) -> list:
    """LiveCodeBench's ``public_test_cases`` / ``private_test_cases``: a JSON list, or
    (the private ones) that JSON pickled as a string, zlib-compressed and base64-encoded."""
    if isinstance(raw, list):
        return raw
    if not isinstance(raw, str) or not raw.strip():
        return []
    try:
        cases = json.loads(raw)
    except ValueError:
        try:
            text = _StringOnly(io.BytesIO(zlib.decompress(base64.b64decode(raw)))).load()
            cases = json.loads(text) if isinstance(text, str) else None
        except (ValueError, zlib.error, pickle.UnpicklingError, EOFError) as exc:
            raise ValueError(f'{where}: neither JSON nor the compressed form: {exc}') from exc
    if not isinstance(cases, list):
        raise ValueError(f'{where}: expected a list of test cases')
    return cases


def _livecodebench_tests(record: dict[str, Any], rid: Any) -> list[dict] | None:
    """A LiveCodeBench (``code_generation_lite``) record's tests in the ``tests`` form;
    None if the record is not one."""
    if 'public_test_cases' not in record:
        return None
    where = f'code record {rid!r} (LiveCodeBench)'
    metadata = record.get('metadata') or {}
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata) if metadata.strip() else {}
        except ValueError as exc:
            raise ValueError(f"{where}: 'metadata' is not JSON: {exc}") from exc
    tests = [*_livecodebench_cases(record['public_test_cases'], f'{where}, public_test_cases'),
             *_livecodebench_cases(record.get('private_test_cases'),
                                   f'{where}, private_test_cases')]
    fn_name = metadata.get('func_name') if isinstance(metadata, dict) else None
    return [{**t, 'fn_name': fn_name} if isinstance(t, Mapping) and fn_name else t
            for t in tests]


def parse_tests(record: dict[str, Any], challenge: bool = False) -> list[TestCase]:
    """The record's tests as :class:`TestCase` objects.

    Published schemas, recognised by their fields:

    * MBPP (``test_list`` of assert strings, ``test_setup_code`` or the sanitized
      split's ``test_imports``, ``challenge_test_list`` with ``challenge=True``):
      asserts of the form
      ``assert f(<literals>) == <literal>`` become one call test whose expected values
      never enter the sandbox; any other form runs as an assert program;
    * HumanEval (``test`` defining ``check(candidate)``, ``entry_point``): an assert
      program ending in ``check(<entry_point>)``.

    Else ``tests``, in these forms (a list of them, or one dict):

    * ``{"input": str, "output": str}``: stdin/stdout program;
    * ``{"fn_name": str, "inputs": [[args...], ...], "outputs": [value, ...]}``: call
      ``fn_name`` (a function or a ``Solution`` method) with each argument list;
    * LiveCodeBench functional tests ``{"input": "<JSON per line>", "output": "<JSON>",
      "testtype": "functional"}`` with the name in ``fn_name`` or
      ``metadata.func_name``.

    LiveCodeBench records as published (``code_generation_lite``: ``public_test_cases``
    a JSON string, ``private_test_cases`` JSON or its compressed form, ``metadata`` a JSON
    string with ``func_name``) are read as they are: both lists of tests, in the forms
    above (``stdin`` or ``functional``).

    Raises:
        ValueError: no tests, or a test in none of these forms (says which one).
    """
    rid = record.get('id', record.get('task_id', record.get('question_id', '?')))
    published = _assert_tests(record, rid, challenge)
    if published is not None:
        return published
    tests = _livecodebench_tests(record, rid)
    tests = record.get('tests') if tests is None else tests
    if isinstance(tests, Mapping):
        tests = [tests]
    if not tests or not isinstance(tests, list):
        raise ValueError(f"code record {rid!r} has no 'tests' (a non-empty list), no "
                         "'test_list' (MBPP) and no 'test' + 'entry_point' (HumanEval)")
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


_INT = re.compile(r'[+-]?\d+', re.ASCII)  # '٣' is not the token '3'
_FLOAT_WORDS = frozenset({'inf', '+inf', '-inf', 'infinity', '+infinity', '-infinity', 'nan'})


def _float_token(token: str) -> float | None:
    """The value of a token written as a float (``0.5``, ``1e-3``, ``inf``); None for
    an integer or a word."""
    if _INT.fullmatch(token):
        return None
    if not (any(c in token for c in '.eE') or token.lower() in _FLOAT_WORDS):
        return None
    try:
        return float(token)
    except ValueError:
        return None


def _int_digits(token: str) -> str:
    """An integer token in one canonical spelling (sign, no leading zeros; ``-0`` is
    ``0``), compared as text: no conversion, so no digit limit and linear time."""
    sign = '-' if token[0] == '-' else ''
    digits = token.lstrip('+-').lstrip('0') or '0'
    return ('' if digits == '0' else sign) + digits


def _same_token(got: str, expected: str, float_tol: float | None) -> bool:
    if got == expected:
        return True
    if _INT.fullmatch(expected):  # an integer matches only the same integer, written as one
        return _INT.fullmatch(got) is not None and _int_digits(got) == _int_digits(expected)
    want = _float_token(expected)
    if want is None or float_tol is None:
        return False
    try:
        value = float(got)
    except ValueError:
        return False
    if math.isnan(want) or math.isnan(value):
        return math.isnan(want) and math.isnan(value)
    return math.isclose(value, want, rel_tol=float_tol, abs_tol=float_tol)


def same_stdout(got: str, expected: str, float_tol: float | None = 1e-6) -> bool:
    """Output comparison: line by line, ignoring trailing spaces and blank lines at the ends.

    Failing that, token by token: an expected integer matches only the same integer
    (``+7`` and ``007`` are 7; ``7.0`` and ``7e0`` are not); only where the expected
    token is written as a float (``.``, an exponent, ``inf``/``nan``) does any number
    within ``float_tol`` (absolute or relative) match; words match exactly.

    Example:
        >>> same_stdout('3 4  \\n\\n', '3 4')
        True
        >>> same_stdout('0.3333333\\n', '0.333333333')
        True
        >>> same_stdout('1000000.0\\n', '1000001'), same_stdout('5.0', '5')
        (False, False)
    """
    def lines(text: str) -> list[str]:
        return [line.rstrip() for line in text.strip('\n').rstrip().split('\n')]
    got_lines, exp_lines = lines(got), lines(expected)
    if got_lines == exp_lines:
        return True
    if len(got_lines) != len(exp_lines):
        return False
    for g_line, e_line in zip(got_lines, exp_lines):
        g_tokens, e_tokens = g_line.split(), e_line.split()
        if len(g_tokens) != len(e_tokens) or not all(
                _same_token(g, e, float_tol) for g, e in zip(g_tokens, e_tokens)):
            return False
    return True


def same_value(got: Any, expected: Any, float_tol: float | None = 1e-6,
               tuple_as_list: bool = False) -> bool:
    """Typed return-value comparison for JSON test records.

    ``got`` is the function's value rebuilt from builtin types (tuples stay tuples,
    dict keys keep their types); ``expected`` comes from JSON. A bool matches only a
    bool, an int only an int, a string only a string, None only None, a list only a list
    (a tuple too with ``tuple_as_list``), an object only a dict with the same string
    keys; a float matches an int or float within ``float_tol``.

    Example:
        >>> same_value([0, 1], [0, 1]), same_value(0.1 + 0.2, 0.3), same_value(True, 1)
        (True, True, False)
        >>> same_value(5, '5'), same_value((0, 1), [0, 1]), same_value({1: 2}, {'1': 2})
        (False, False, False)
    """
    if isinstance(expected, bool) or expected is None or isinstance(expected, str):
        return type(got) is type(expected) and got == expected
    if type(expected) is int:
        return type(got) is int and got == expected
    if type(expected) is float:
        if type(got) not in (int, float):
            return False
        if float_tol is None:
            return got == expected
        try:
            got = float(got)
        except OverflowError:  # an int beyond any float: never within a tolerance
            return False
        if math.isnan(expected) or math.isnan(got):
            return math.isnan(expected) and math.isnan(got)
        return math.isclose(got, expected, rel_tol=float_tol, abs_tol=float_tol)
    if isinstance(expected, list):
        if not (type(got) is list or (tuple_as_list and type(got) is tuple)):
            return False
        return len(got) == len(expected) and all(
            same_value(g, e, float_tol, tuple_as_list) for g, e in zip(got, expected))
    if isinstance(expected, dict):
        return (type(got) is dict and got.keys() == expected.keys() and all(
            same_value(got[k], expected[k], float_tol, tuple_as_list) for k in got))
    return False


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
        max_workers: tests of one response run in parallel processes (default 1).
        batch_workers: responses of one batch (:meth:`score_batch`, the RL loop's call for
            all of a step's code responses) scored in up to this many threads (default 4;
            1: one after another). Each run is a sandboxed process that the thread waits
            on, so a batch takes about ``1 / batch_workers`` of its sequential wall time
            where runs are short (about 0.2 s each, little CPU); the scores are the same.
        max_output_bytes: stdout / written-file limit per test (default 8 MiB).
        max_processes: RLIMIT_NPROC for the code (default 32; see the sandbox for when
            the kernel enforces it).
        isolation: the sandbox's containment level: ``'auto'`` (default: the strongest
            available here, reported once as ``reward/sandbox: <level>``), or one of
            ``'isolated'``, ``'contained'``, ``'unsafe_files'``, ``'unsafe'`` (required).
        disk_mb: size limit of the code's working directory per test in MiB (default 32).
        min_containment: refuse to start below this level, e.g. ``'contained'`` for a
            cluster run (default None: any, with a warning below ``'contained'``). The
            error says what to install.
        float_tol: tolerance where the expected stdout token or return value is a float
            (default 1e-6; None: exact). Integers, strings and types always match
            exactly (docs/rewards.md, "Comparison rules").
        tuple_as_list: JSON call tests: a returned tuple matches an expected list
            (LiveCodeBench's rule; default False: a tuple is not a list).
        challenge_tests: MBPP records: also run ``challenge_test_list`` (default False,
            as MBPP's published evaluation).

    Example:
        >>> reward = CodeReward(timeout_s=5)
        >>> record = {'tests': [{'input': '2 3\\n', 'output': '5\\n'},
        ...                     {'input': '10 -4\\n', 'output': '6\\n'}]}
        >>> reward('```python\\na, b = map(int, input().split())\\nprint(a + b)\\n```', record)
        1.0
        >>> reward('```python\\nprint(5)\\n```', record)
        0.0
    """

    #: a run whose answers broke their format or bounds: a wrong answer, counted apart
    outcomes = ('invalid_output',)

    def __init__(self, timeout_s: float = 6.0, memory_mb: int = 1024,
                 partial_credit: bool = False, max_workers: int = 1, batch_workers: int = 4,
                 max_output_bytes: int = 8 << 20, max_processes: int = 32,
                 isolation: Literal['auto', 'isolated', 'contained', 'unsafe_files',
                                    'unsafe'] = 'auto',
                 float_tol: float | None = 1e-6, disk_mb: int = 32,
                 min_containment: Literal['isolated', 'contained', 'unsafe_files', 'unsafe']
                 | None = None, tuple_as_list: bool = False,
                 challenge_tests: bool = False) -> None:
        for name, value in (('max_workers', max_workers), ('batch_workers', batch_workers)):
            if int(value) != value or value < 1:
                raise ValueError(f'CodeReward: {name} must be an integer >= 1, got {value!r}')
        self.sandbox = Sandbox(timeout_s=timeout_s, memory_mb=memory_mb,
                               max_output_bytes=max_output_bytes, max_processes=max_processes,
                               isolation=isolation, disk_mb=disk_mb,
                               min_containment=min_containment)
        self.partial_credit = bool(partial_credit)
        self.max_workers = int(max_workers)
        self.batch_workers = int(batch_workers)
        self.float_tol = float_tol
        self.tuple_as_list = bool(tuple_as_list)
        self.challenge_tests = bool(challenge_tests)

    def passes(self, code: str, case: TestCase, statuses: list[str] | None = None) -> bool:
        """Whether ``code`` passes one test (raises only on sandbox failure); the run's
        status is appended to ``statuses`` when given."""
        result = self._run(code, case)
        if statuses is not None:
            statuses.append(result.status)
        if result.status != 'ok':
            return False
        if case.kind == 'stdin':
            return same_stdout(result.stdout, case.expected, self.float_tol)
        if case.kind == 'asserts':
            return result.has_value
        if case.calls:
            return result.has_value and all(
                self._same(got, expected, case) for got, (_, _, expected)
                in zip(result.value, case.calls))
        return result.has_value and self._same(result.value, case.expected, case)

    def _run(self, code: str, case: TestCase) -> Any:
        """One sandbox run of ``code`` against ``case``."""
        if case.kind == 'stdin':
            return self.sandbox.run(code, stdin=case.stdin)
        if case.kind == 'asserts':
            if case.entry_point and not re.search(
                    rf'^\s*(async\s+)?def\s+{re.escape(case.entry_point)}\s*\(', code, re.M):
                code = case.prelude + code  # HumanEval: the completion is the function body
            return self.sandbox.run(code, asserts=AssertTests(
                case.asserts, case.prelude, case.entry_point, case.names))
        if case.calls:
            return self.sandbox.run(code, calls=[(f, a) for f, a, _ in case.calls])
        return self.sandbox.run(code, fn_name=case.fn_name, args=case.args)

    def _same(self, got: Any, expected: Any, case: TestCase) -> bool:
        if case.python_eq:  # both builtin data: the benchmark's own ``==``, unfakeable
            try:
                return bool(got == expected)
            except Exception:  # noqa: BLE001  (e.g. comparing incomparable builtins)
                return False
        return same_value(got, expected, self.float_tol, self.tuple_as_list)

    def __call__(self, completion: str, record: dict[str, Any]) -> float:
        """The share of the record's tests passed (1/0 without partial credit), as
        :class:`~gepo_xtuner.reward.base.Scored` with outcome ``'invalid_output'`` when a
        run's answers broke their format or bounds (``reward/invalid_output/<domain>``)."""
        statuses: list[str] = []
        value = self._score(extract_code(completion), parse_tests(record, self.challenge_tests),
                            statuses)
        return Scored(value, 'invalid_output' if 'invalid_output' in statuses else None)

    def score_batch(self, completions: Sequence[str], records: Sequence[dict[str, Any]]
                    ) -> list[float]:
        """Rewards of N responses (``completions[i]`` answers ``records[i]``), each as
        :meth:`__call__` scores it, in up to ``batch_workers`` threads; in order.

        Raises:
            Whatever scoring a response raised (a sandbox failure), once the batch's
            other runs have ended; the router then scores the batch one by one, so the
            error is counted for its own response only.
        """
        if self.batch_workers == 1 or len(completions) < 2:
            return [self(c, r) for c, r in zip(completions, records, strict=True)]
        if len(completions) != len(records):
            raise ValueError(f'{len(completions)} completions for {len(records)} records')
        with ThreadPoolExecutor(min(self.batch_workers, len(completions))) as pool:
            return list(pool.map(self, completions, records))

    def _score(self, code: str, cases: list[TestCase], statuses: list[str]) -> float:
        if not code.strip():
            return 0.0
        if self.max_workers == 1:
            passed = 0
            for case in cases:
                ok = self.passes(code, case, statuses)
                passed += ok
                if not ok and not self.partial_credit:
                    return 0.0
            return passed / len(cases)
        with ThreadPoolExecutor(self.max_workers) as pool:
            pending = {pool.submit(self.passes, code, case, statuses) for case in cases}
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
        parse_tests(record, self.challenge_tests)

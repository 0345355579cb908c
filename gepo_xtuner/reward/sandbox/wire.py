"""The wire between the sandbox's processes, and back to the trainer: values as typed JSON.

Both ends of the pipe of an assert run (:mod:`.solution_side`, :mod:`.judge_side`) and the
trainer reading the answers of a call-mode run (:mod:`.trainer`) encode and decode with
these functions and the same bounds: at most :data:`_MAX_DEPTH` levels of nesting, at most
:data:`_MAX_ITEMS` values, no set or dict with more than :data:`MAX_EQUAL_HASHES` keys of
one hash. Decoding raises ``ValueError`` and nothing else, so whatever the solution writes
is a wrong answer where it is read, never an exception (docs/rewards.md, "What the grader
trusts"). Standard library only (loaded by :mod:`.harness`, ``python -I -S``).
"""

import json
import os

__all__ = ['Channel', 'MAX_EQUAL_HASHES', 'MAX_MESSAGE_BYTES', 'decode_value', 'encode_value']

#: Longest message accepted on the pipe (a return value of up to this many bytes of JSON).
MAX_MESSAGE_BYTES = 64 << 20
_MAX_ITEMS = 1 << 20
_MAX_DEPTH = 100


class Channel:
    """One JSON object per line over a pair of pipe descriptors.

    Args:
        read_fd: descriptor to read messages from.
        write_fd: descriptor to write messages to.
    """

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self._in = os.fdopen(read_fd, 'rb', buffering=1 << 16)
        self._out = write_fd

    def send(self, message: dict) -> None:
        data = (json.dumps(message, separators=(',', ':')) + '\n').encode()
        view = memoryview(data)
        while view:
            view = view[os.write(self._out, view):]

    @property
    def write_fd(self) -> int:
        """The descriptor messages are written to (the caller's to close)."""
        return self._out

    def close(self) -> None:
        """Closes the reading end (the writing descriptor is the caller's)."""
        self._in.close()

    def recv(self) -> dict:
        """The next message.

        Raises:
            EOFError: the other side closed its end.
            ValueError: a line that is too long or not a JSON object.
        """
        line = self._in.readline(MAX_MESSAGE_BYTES + 1)
        if not line:
            raise EOFError('the pipe was closed')
        if not line.endswith(b'\n'):
            raise ValueError('a message longer than the limit, or cut off')
        message = json.loads(line)
        if type(message) is not dict:
            raise ValueError('a message that is not a JSON object')
        return message


def _encode(value: object, ref) -> object:
    """Builtin data as typed JSON (tags as ``encode_value``); ``ref(v)`` for anything
    else: the solution side registers the object, the test side refuses or passes a
    proxy's id."""
    budget = [_MAX_ITEMS]

    def enc(v: object, depth: int) -> object:
        budget[0] -= 1
        if budget[0] < 0 or depth > _MAX_DEPTH:
            raise ValueError('a value too large or too deeply nested to pass between the '
                             'solution and the tests')
        t = type(v)
        if t in (type(None), bool, int, float, str):
            return v
        if t is list:
            return [enc(x, depth + 1) for x in v]
        if t is tuple:
            return {'__tuple__': [enc(x, depth + 1) for x in v]}
        if t is dict:
            return {'__dict__': [[enc(k, depth + 1), enc(x, depth + 1)] for k, x in v.items()]}
        if t in (set, frozenset):
            return {f'__{t.__name__}__': [enc(x, depth + 1) for x in v]}
        if t is bytes:
            return {'__bytes__': v.hex()}
        if t is complex:
            return {'__complex__': [v.real, v.imag]}
        return {'__ref__': ref(v)}
    return enc(value, 0)


#: Most values of equal hash a decoded set or dict may hold: more is refused (a set of
#: ints sharing one hash takes quadratic time to build, 18 s for 24,000 of them).
MAX_EQUAL_HASHES = 64


def _no_collisions(items: list) -> None:
    """Refuses keys of which too many share one hash (built in linear time or not at all).

    Raises:
        ValueError: more than :data:`MAX_EQUAL_HASHES` items share a hash, or an item is
            unhashable.
    """
    if len(items) <= MAX_EQUAL_HASHES:
        return
    counts: dict[int, int] = {}
    for item in items:
        h = hash(item)  # TypeError for an unhashable item: caught by the caller
        counts[h] = counts.get(h, 0) + 1  # the hashes themselves are ints of distinct value
        if counts[h] > MAX_EQUAL_HASHES:
            raise ValueError(f'more than {MAX_EQUAL_HASHES} items of a set or dict share a '
                             'hash (refused: they would take quadratic time to build)')


def _decode(data: object, ref=None) -> object:
    """The inverse of :func:`_encode`; ``ref(id)`` gives the object of a ``__ref__`` (None:
    a reference is refused).

    Bounded like :func:`_encode`: depth at most :data:`_MAX_DEPTH` (the same limit),
    at most :data:`_MAX_ITEMS` values in all, no set or dict with more than
    :data:`MAX_EQUAL_HASHES` keys of one hash. Anything else raises ``ValueError``, and
    only that: every other failure (a malformed tag body, an unhashable key, an integer
    too long for ``str``) is turned into one, so a caller that treats ``ValueError`` as a
    wrong answer never meets another exception from the data.

    Raises:
        ValueError: data that :func:`_encode` does not produce, or outside the bounds.
    """
    budget = [_MAX_ITEMS]

    def dec(d: object, depth: int) -> object:
        budget[0] -= 1
        if budget[0] < 0 or depth > _MAX_DEPTH:
            raise ValueError('a value too large or too deeply nested')
        t = type(d)
        if t in (type(None), bool, int, float, str):
            return d
        if t is list:
            return [dec(x, depth + 1) for x in d]
        if t is not dict or len(d) != 1:
            raise ValueError(f'not a value: {t.__name__}')
        (tag, body), = d.items()
        if tag == '__ref__':
            if type(body) is not int or ref is None:
                raise ValueError('a reference where none is expected')
            return ref(body)
        if tag == '__bytes__':
            if type(body) is not str:
                raise ValueError('bytes that are not hex text')
            return bytes.fromhex(body)
        if tag == '__complex__':
            if type(body) is not list or len(body) != 2 or any(
                    type(x) is not float for x in body):
                raise ValueError('a complex number that is not two floats')
            return complex(*body)
        if type(body) is not list:
            raise ValueError(f'{tag} without a list')
        if tag == '__tuple__':
            return tuple(dec(x, depth + 1) for x in body)
        if tag in ('__set__', '__frozenset__'):
            items = [dec(x, depth + 1) for x in body]
            _no_collisions(items)
            return set(items) if tag == '__set__' else frozenset(items)
        if tag == '__dict__':
            pairs = []
            for pair in body:
                if type(pair) is not list or len(pair) != 2:
                    raise ValueError('a dict item that is not a pair')
                pairs.append((dec(pair[0], depth + 1), dec(pair[1], depth + 1)))
            _no_collisions([k for k, _ in pairs])
            return dict(pairs)
        raise ValueError(f'unknown tag {tag!r}')
    try:
        return dec(data, 0)
    except (TypeError, RecursionError, MemoryError, OverflowError) as exc:
        raise ValueError(f'a value that cannot be rebuilt: {type(exc).__name__}: {exc}') from None


def decode_value(data: object) -> object:
    """A value that left the sandbox as typed JSON, rebuilt from builtin types only (run
    by the trusted parent: no references, the bounds of :func:`_decode`).

    Raises:
        ValueError: anything but what the harness's ``encode_value`` writes.
    """
    return _decode(data)


#: Containers whose in-place changes of a call's arguments travel back to the caller.
_MUTABLE = (list, dict, set)


def encode_value(value: object) -> object:
    """A JSON-ready, typed copy of a return value made only of builtin types (call mode).

    ``int``/``float``/``bool``/``str``/``None`` stay JSON values (JSON keeps ints and
    floats apart); lists stay lists; tuples, sets, frozensets, dicts (as key/value
    pairs, so non-string keys survive), bytes and complex numbers are tagged objects
    ``{"__tuple__": [...]}`` etc., within :func:`_encode`'s bounds (``ValueError``
    beyond them). Anything else (a class of the code's own, a subclass of a builtin)
    raises ``TypeError``: such an object could compare equal to anything.
    """
    def refuse(v: object) -> int:
        t = type(v)
        raise TypeError(f'a value of type {t.__module__}.{t.__qualname__} cannot be compared '
                        'safely (only builtin types: numbers, str, bytes, None, list, tuple, '
                        'set, frozenset, dict)')
    return _encode(value, refuse)

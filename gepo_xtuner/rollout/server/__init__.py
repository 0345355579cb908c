"""What any rollout backend that talks to inference servers over HTTP needs, whatever the server.

* :mod:`.backend`: :class:`ServerRolloutBackend`, the base an engine's backend subclasses:
  server addresses and launch settings with their checks, rank 0's launch-or-attach,
  the readiness check, the weight-push round, abort, and errors that say what to do;
* :mod:`.process`: :class:`ServerProcess`, a server subprocess (start, health wait,
  stop, log) whose command each engine fills in;
* :mod:`.weights`: the trainer's weights under checkpoint names, in buckets, or as
  checkpoint directories a server loads;
* :mod:`.http`: :class:`HTTPPool`, one server's pooled, thread-safe JSON client with
  retries and bounded concurrency;
* :mod:`.pool`: :class:`ServerPool`, several servers with least-outstanding dispatch,
  failover (a failed request is re-sent once to another server), health probes and rejoin;
* :mod:`.probe`: the push check, a server's logprobs of a fixed probe sequence after a
  push against the trainer's (and against its own answer before the push).

:mod:`gepo_xtuner.rollout.lmdeploy` and :mod:`gepo_xtuner.rollout.vllm` are built on
these and import nothing from each other; a backend for another server subclasses
:class:`ServerRolloutBackend` and :class:`ServerProcess` and writes only its protocol
(``tests/test_rollout/openai_completions_backend.py`` is one, for an OpenAI-compatible
``/v1/completions`` server).
"""

from .backend import ServerBackendError, ServerRolloutBackend
from .http import HTTPPool, ServerRequestError
from .pool import NoServerError, Server, ServerPool
from .process import ServerProcess

__all__ = ['HTTPPool', 'NoServerError', 'Server', 'ServerBackendError', 'ServerPool',
           'ServerProcess', 'ServerRequestError', 'ServerRolloutBackend']

"""What any rollout backend that talks to inference servers over HTTP needs, whatever the server.

* :mod:`.http`: :class:`HTTPPool`, one server's pooled, thread-safe JSON client with
  retries and bounded concurrency;
* :mod:`.pool`: :class:`ServerPool`, several servers with least-outstanding dispatch,
  failover (a failed request is re-sent once to another server), health probes and rejoin.

:mod:`gepo_xtuner.rollout.lmdeploy` builds LMDeploy's backend on these; a backend for
another server (SGLang, vLLM) would reuse both and write only its protocol.
"""

from .http import HTTPPool, ServerRequestError
from .pool import NoServerError, Server, ServerPool

__all__ = ['HTTPPool', 'NoServerError', 'Server', 'ServerPool', 'ServerRequestError']

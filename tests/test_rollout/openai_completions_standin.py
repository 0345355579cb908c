"""A stand-in for an OpenAI-compatible completions server: no model runs, answers are a
deterministic function of the request. Standard library only, so it starts in a blink.

    python openai_completions_standin.py MODEL_DIR --host 127.0.0.1 --port 8000 \
        [--ready-after 0.3] [--fail-at-start]

* ``GET /health``: 503 for the first ``--ready-after`` seconds (a server loading its
  model), then 200.
* ``POST /v1/completions`` with ``prompt`` as token ids, ``n``, ``max_tokens``,
  ``stop_token_ids``, ``logprobs`` and ``return_token_ids``: ``n`` choices with
  ``token_ids``, ``logprobs.token_logprobs`` and ``finish_reason``. Token ``k`` of choice
  ``j`` is ``(sum(prompt) + 7 j + 3 k + 1 + reloads) % vocab_size`` (``vocab_size`` of
  ``MODEL_DIR/config.json``); a stop token ends the choice and is kept.
* ``POST /reload`` with ``{"path": DIR}``: loads nothing, but refuses (HTTP 400) a
  directory without ``config.json`` and a ``*.safetensors`` file; records the path.
* ``GET /reloads``: the recorded paths, in order.

``--fail-at-start`` prints a traceback, then 60 lines of shutdown chatter, and exits 1,
as a server whose model does not load.
"""

import argparse
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def make_handler(vocab: int, ready_at: float) -> type[BaseHTTPRequestHandler]:
    reloads: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # keep the log for errors
            pass

        def _send(self, status: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header('Content-Type', 'application/json')
            self.send_header('Content-Length', str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802  (http.server's name)
            if self.path == '/health':
                ready = time.monotonic() >= ready_at
                self._send(200 if ready else 503, {'ready': ready})
            elif self.path == '/reloads':
                self._send(200, reloads)
            else:
                self._send(404, {'error': f'no route {self.path}'})

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers['Content-Length'] or 0)) or b'{}')
            if self.path == '/v1/completions':
                self._send(200, {'choices': [self._choice(body, j) for j in range(body['n'])]})
            elif self.path == '/reload':
                path = Path(body.get('path', ''))
                if not (path / 'config.json').is_file() or not list(path.glob('*.safetensors')):
                    self._send(400, {'error': f'{path} holds no model'})
                    return
                reloads.append(str(path))
                self._send(200, {'reloaded': str(path)})
            else:
                self._send(404, {'error': f'no route {self.path}'})

        def _choice(self, body: dict, j: int) -> dict:
            start = sum(body['prompt']) + 7 * j + 1 + len(reloads)
            stops = set(body.get('stop_token_ids') or [])
            ids, reason = [], 'length'
            for k in range(body['max_tokens']):
                ids.append((start + 3 * k) % vocab)
                if ids[-1] in stops:
                    reason = 'stop'
                    break
            return {'index': j, 'token_ids': ids, 'finish_reason': reason,
                    'logprobs': {'token_logprobs': [-0.25 - 0.01 * k for k in range(len(ids))]}}

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument('model')
    parser.add_argument('--host', default='127.0.0.1')
    parser.add_argument('--port', type=int, default=8000)
    parser.add_argument('--ready-after', type=float, default=0.3)
    parser.add_argument('--fail-at-start', action='store_true')
    args = parser.parse_args()
    if args.fail_at_start:
        print('loading the model ...\nTraceback (most recent call last):\n  File "load.py"\n'
              f'ValueError: {args.model} is no model', flush=True)
        print('\n'.join(f'shutting down worker {i}' for i in range(60)), flush=True)
        sys.exit(1)
    vocab = int(json.loads((Path(args.model) / 'config.json').read_text())['vocab_size'])
    server = ThreadingHTTPServer((args.host, args.port),
                                 make_handler(vocab, time.monotonic() + args.ready_after))
    print(f'stand-in serving on {args.host}:{args.port}', flush=True)
    server.serve_forever()


if __name__ == '__main__':
    main()

"""``memento serve``: an exported selector over HTTP (FastAPI + uvicorn; the 'serve' extra)."""

from __future__ import annotations

import argparse
from typing import Any

from memento.cli.options import (
    add_command,
    add_device,
    add_learn_flag,
    add_listen_options,
    add_seed,
    add_selector_dir,
    add_token_file,
    set_torch_threads,
)
from memento.config import MAX_BATCH, MAX_SEED, MAX_THREADS
from memento.errors import ConfigError
from memento.flags import check_count, check_device, config_option, config_switch, given_fields, option_value
from memento.serve.app import ServeConfig, check_host, require_extra, resolve_token, serve
from memento.serve.common import MAX_SERVE_WORKERS

DESCRIPTION = """\
Serve an exported selector (a directory written by `memento export`) over HTTP with FastAPI and
uvicorn. Needs the 'serve' extra: pip install -e '.[serve]' (in a clone of memento).

endpoints (JSON; every /v1 endpoint needs the header 'Authorization: Bearer TOKEN'):
  POST /v1/select     {"query": TEXT | "embedding": [floats], "k": 4, "mode": "sample"|"greedy", "env": null,
                       "scope": {"user"?, "agent"?, "session"?}, "filter": {"topic": {"in": ["geo"]}, ...},
                       "include_global": false}
                      -> {"selection_id", "cases": [{"id", "state", "action", "reward", "prob", "score",
                          "similarity", "meta"?, "user"?, ...}, ...], ...}
  POST /v1/search     {"query" | "embedding", "k": 10, "env", "scope", "filter", "include_global"}
                      -> {"cases": [{..., "similarity"}]}  (the nearest cases by cosine: nothing recorded)
  POST /v1/feedback   {"selection_id": ID, "reward": 0..1}  (answered once committed to disk)
  POST /v1/cases      {"state", "action", "reward", "env"?, "meta"?, "user"?, "agent"?, "session"?} -> {"id"}
                      (mem0's user_id/agent_id/run_id too; answered once committed)
  GET  /v1/cases      ?user=&agent=&session=&env=&filter=JSON&include_global=&limit=100&offset=0 -> {"cases"}
  GET  /v1/cases/count  ?user=&agent=&session=&env=&filter=JSON&include_global= -> {"count"}
  DELETE /v1/cases    ?user=&agent=&session=&env=&filter=JSON (a scope or filter, or all=true)
                      -> {"deleted", "replay_slots_masked"}
  GET  /v1/cases/ID   the case, with version, created, updated (404 when unknown, deleted or replaced)
  GET  /v1/cases/ID/history  its add, update, replace, delete and feedback events, oldest first
  PATCH /v1/cases/ID  {"action"?, "reward"?, "meta"?} -> the case changed in place (same id, version + 1)
  PUT  /v1/cases/ID   {"state", "action", "reward", "env"?, "meta"?, "user"?, ...} -> {"id": NEW, "replaced": ID}
                      (the old case is deleted; its owner and meta are kept unless given; answered once committed)
  DELETE /v1/cases/ID -> {"id", "deleted": true, ...}  (never selected or read again; answered once committed)
  GET  /v1/stats      selector counts and server counters
  GET  /healthz       liveness, no auth: 200 as soon as the server answers
  GET  /readyz        readiness, no auth: 503 until the warm-up select (encoder, index and Q-network loaded
                      and run; nothing recorded) returned, then 200; --no-warmup: 200 at once
  GET  /openapi.json (the spec, no auth); GET /docs (Swagger UI) only with --no-auth;
  the inspector at /inspect takes the same token
Invalid requests get 422 naming the field (an unknown body key or query parameter too); a JSON body that is not
UTF-8 gets 415; bodies over --max-body-bytes get 413. A scope or filter that matches
no case gives an empty list (filters: docs/formats.md, "Scopes and metadata filters").

logging: with -v, one line per request on the logger memento.serve.access: METHOD PATH STATUS DURATION ms
(no log line shows a token: ?token= is logged as ?token=<redacted>).

auth: the bearer token is read from --token-file FILE, else from the environment variable
MEMENTO_SERVE_TOKEN (at least 16 characters, e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))').
--no-auth serves without a token and is refused unless --host is a loopback address.

Selects run in parallel; one writer thread records feedback and new cases (and, with --learn, makes
the learner's updates), alone while it writes. Query texts of concurrent selects are encoded together
in one forward pass (--batch-max-texts, --batch-wait-ms). The artifact is checkpointed atomically
every --save-every-s seconds or --save-every-n writes.
--workers N runs N processes on the one port: this one (the learner: writes, learning, checkpoints)
and N-1 read-only workers that answer selects and reads and forward feedback and new cases to it;
the learner publishes its Q-network to them at most every --publish-every-s seconds.
SIGTERM or Ctrl-C stops accepting connections, finishes the requests in flight, drains the writes,
saves, and exits 0. Once listening, one line 'memento serve: DIR on http://HOST:PORT ...' is printed."""


def add_parser(commands: Any) -> None:
    serve = add_command(commands, "serve", "serve an exported selector over HTTP (FastAPI + uvicorn)", DESCRIPTION)
    add_selector_dir(serve)
    add_listen_options(serve, port=8080, loopback_note=", loopback")
    auth = serve.add_mutually_exclusive_group()
    add_token_file(auth, "file holding the bearer token (default: the MEMENTO_SERVE_TOKEN environment variable)")
    auth.add_argument("--no-auth", action="store_true",
                      help="serve without a token (only allowed when --host is loopback)")
    add_learn_flag(serve, "keep learning from feedback (soft-Q updates in the writer thread); default: record "
                          "feedback only")
    config_option(serve, ServeConfig, "save_every_s", metavar="S")
    config_option(serve, ServeConfig, "save_every_n", metavar="N")
    add_device(serve, "torch device of the Q-network and encoder, e.g. cpu, cuda, cuda:1 (default: cpu)")
    config_option(serve, ServeConfig, "max_body_bytes", metavar="B")
    add_seed(serve, "seed of the sampling RNG (default: 0)")
    config_option(serve, ServeConfig, "threads", metavar="N")
    config_option(serve, ServeConfig, "batch_max_texts", metavar="N")
    config_option(serve, ServeConfig, "batch_wait_ms", metavar="MS")
    config_option(serve, ServeConfig, "workers", metavar="N")
    config_option(serve, ServeConfig, "publish_every_s", metavar="S")
    config_switch(serve, ServeConfig, "warmup")


_SERVE_FIELDS = ("save_every_s", "save_every_n", "max_body_bytes", "threads", "batch_max_texts", "batch_wait_ms",
                 "workers", "publish_every_s", "warmup")
"""The ServeConfig fields ``memento serve`` sets from its flags."""


def run(args: argparse.Namespace) -> int:
    require_extra("serve")  # before anything is loaded: a missing extra is one line
    check_host(args.host, no_auth=args.no_auth)
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port {args.port}: must be in [0, 65535]")
    token = resolve_token(token_file=args.token_file, no_auth=args.no_auth)
    threads, workers = option_value(args, ServeConfig, "threads"), option_value(args, ServeConfig, "workers")
    check_count("--threads", threads, 0, MAX_THREADS)
    check_count("--workers", workers, 1, MAX_SERVE_WORKERS)
    check_count("--batch-max-texts", option_value(args, ServeConfig, "batch_max_texts"), 0, MAX_BATCH)
    check_count("--seed", args.seed, 0, MAX_SEED)
    check_device(args.device)
    set_torch_threads(threads)
    config = ServeConfig(**given_fields(args, ServeConfig, _SERVE_FIELDS))

    def ready(host: str, port: int) -> None:
        shown = f"[{host}]" if ":" in host else host
        workers = f"; workers: {config.workers}" if config.workers > 1 else ""
        print(f"memento serve: {args.dir} on http://{shown}:{port} (auth: {'bearer token' if token else 'none'}; "
              f"learn: {'on' if args.learn else 'off'}{workers}); SIGTERM or Ctrl-C saves and stops", flush=True)

    # uvicorn's own access line is off: memento.serve.access logs each request (with its duration) at -v
    return serve(args.dir, host=args.host, port=args.port, token=token, no_auth=args.no_auth, learn=args.learn,
                 device=args.device, config=config, seed=args.seed,
                 log_level="info" if args.verbose else "warning", access_log=False, on_ready=ready)

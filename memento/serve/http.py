"""The FastAPI layer of ``memento serve`` (imported only through ``memento.serve.app.create_app``).

This module imports FastAPI at module level; ``memento.serve.app`` imports it lazily, so the core
package never needs the ``serve`` extra. What it shares with ``memento.serve.app`` (the config, the
writer, the request helpers) comes from ``memento.serve.common``, never from ``memento.serve.app``,
which imports this module. The request bodies come from :mod:`memento.serve.schema` (built per app: their
limits come from the ServeConfig). No ``from __future__ import annotations`` here: FastAPI reads the endpoint
annotations as objects.
"""

import asyncio
import contextlib
import logging
import os
import time
from typing import Annotated, Any
from urllib.parse import quote

import numpy as np
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel

from memento.errors import DataFormatError, DimensionError, MementoError, UnknownCaseError
from memento.io import parse_json
from memento.selector.batching import BatcherClosedError
from memento.serve.common import (
    LearnerLink,
    ServeConfig,
    ServerUnavailableError,
    Writer,
    case_record,
    json_safe,
    redact,
    thread_limiter,
    token_matches,
)
from memento.serve.schema import OWNER_ARGS, owner_scope, request_models, unknown_message, update_model
from memento.types import check_id

logger = logging.getLogger("memento.serve.app")
access_logger = logging.getLogger("memento.serve.access")
"""One INFO line per request: ``METHOD PATH?QUERY STATUS DURATION ms`` (``?token=`` redacted); shown with -v."""

WARMUP_QUERY = "memento warm-up query"
"""The text of the start-up select that loads and runs the encoder and the Q-network (not recorded)."""


class _Problem(Exception):
    """An error answered as ``{"detail": ...}`` with a status (and the field for 422)."""

    def __init__(self, status: int, message: str, *, field: str | None = None,
                 headers: dict[str, str] | None = None, where: str = "body"):
        super().__init__(message)
        self.status, self.message, self.field, self.headers, self.where = status, message, field, headers, where

    def response(self) -> JSONResponse:
        if self.status == 422:  # the same shape as FastAPI's own validation errors
            loc = [self.where] if self.field is None else [self.where, self.field]
            detail: Any = [{"loc": loc, "msg": self.message, "type": "value_error"}]
        else:
            detail = self.message
        return JSONResponse({"detail": detail}, status_code=self.status, headers=self.headers)


def _problem_from(error: BaseException, *, field: str | None = None, where: str = "body") -> _Problem:
    """The HTTP answer to an error the selector or the writer raised (a 422 points at ``where``: the body or the
    query)."""
    if isinstance(error, (ServerUnavailableError, BatcherClosedError)):
        return _Problem(503, str(error), headers={"Retry-After": "1"})
    if isinstance(error, KeyError):  # UnknownSelectionError, UnknownCaseError
        message = str(error.args[0]) if error.args else str(error)
        return _Problem(404, message)
    if isinstance(error, DimensionError):
        return _Problem(422, str(error), field=field or "embedding")
    if isinstance(error, (DataFormatError, ValueError)):
        return _Problem(422, str(error), field=field, where=where)
    if isinstance(error, MementoError):
        return _Problem(400, str(error))
    raise error


def _not_utf8(body: bytes, content_type: str | None) -> str | None:
    """Why a JSON request body is not UTF-8 JSON text (RFC 8259), or None. Python's ``json.loads`` reads UTF-16 and
    UTF-32 bytes too (and FastAPI uses it), so they are refused here: a byte order mark, a NUL byte (no UTF-8 JSON
    text holds one), bytes that are not UTF-8, or a ``charset`` other than UTF-8."""
    if content_type is not None:
        media, _, params = content_type.partition(";")
        media = media.strip().lower()
        if media != "application/json" and not media.endswith("+json"):
            return None
        for param in params.split(";"):
            name, _, value = param.partition("=")
            if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in ("utf-8", "utf8"):
                return f"charset={value.strip()[:20]}"
    if body.startswith((b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff")):
        return "it starts with a byte order mark"
    if b"\x00" in body:
        return "it holds NUL bytes (UTF-16 or UTF-32?)"
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as error:
        return f"byte {error.start} is not UTF-8"
    return None


def _query_names(route: Any) -> frozenset[str]:
    """The query parameters a route takes (its own and its dependencies'), read once per route."""
    names = getattr(route, "_memento_query_names", None)
    if names is None:
        found: set[str] = set()
        todo = [route.dependant]
        while todo:
            dependant = todo.pop()
            found.update(param.alias for param in dependant.query_params)
            todo.extend(dependant.dependencies)
        names = route._memento_query_names = frozenset(found)
    return names  # type: ignore[no-any-return]


def _known_query(request: Request) -> None:
    """Every endpoint's query parameters: one it does not take is a 422 (``?user_id=alice`` on an endpoint without
    that parameter once listed every tenant's cases), and so is one given twice (which value would count?)."""
    route = request.scope.get("route")
    if route is None or not hasattr(route, "dependant"):
        return
    takes = _query_names(route)
    seen: set[str] = set()
    for name, _ in request.query_params.multi_items():
        if name not in takes:
            listed = ", ".join(sorted(takes)) or "none"
            raise _Problem(422, f"{unknown_message(name, 'query parameter')}; {request.url.path} takes {listed}",
                           field=name, where="query")
        if name in seen:
            raise _Problem(422, f"query parameter {name!r} is given twice", field=name, where="query")
        seen.add(name)


class _BodyLimit:
    """Refuse request bodies over ``max_bytes`` with 413, before anything parses them, and JSON bodies that are not
    UTF-8 with 415 (:func:`_not_utf8`).

    The Content-Length header is checked first; a body without one (chunked) is read up to the
    limit and replayed to the app.
    """

    def __init__(self, app: Any, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def _too_large(self, scope: Any, receive: Any, send: Any) -> None:
        response = JSONResponse({"detail": f"request body larger than {self.max_bytes} bytes"}, status_code=413,
                                headers={"Connection": "close"})
        await response(scope, receive, send)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            await self._too_large(scope, receive, send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                await self._too_large(scope, receive, send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        kind = headers.get(b"content-type")
        problem = _not_utf8(b"".join(chunks), None if kind is None else kind.decode("latin-1")) if size else None
        if problem is not None:
            response = JSONResponse({"detail": f"the request body is not UTF-8 JSON: {problem}"}, status_code=415)
            await response(scope, receive, send)
            return
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class _AccessLog:
    """Log each HTTP request once it is answered: method, path and query (``?token=`` values redacted), status
    and duration in ms, on :data:`access_logger` at INFO (``memento -v serve`` shows them)."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not access_logger.isEnabledFor(logging.INFO):
            await self.app(scope, receive, send)
            return
        started, status = time.perf_counter(), 0

        async def sending(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            query = scope.get("query_string") or b""
            target = scope.get("path", "") + ("?" + query.decode("latin-1") if query else "")
            if len(target) > 200:
                target = target[:200] + f"... ({len(target)} characters)"
            access_logger.info("%s %s %d %.1f ms", scope.get("method", "?"), redact(target), status or 500,
                               (time.perf_counter() - started) * 1000.0)


class _Endpoints:
    """What the endpoints of one app share: the selector, its writer (or a worker's link to the learner), the
    encode batcher, the token and the counters /v1/stats reports."""

    def __init__(self, selector: Any, *, token: str | None, config: ServeConfig, writer: Writer | None,
                 link: LearnerLink | None, process: dict[str, Any] | None) -> None:
        self.selector, self.token, self.config, self.link = selector, token, config, link
        self.process = link.process if link is not None else process
        self.writer, self.batcher = writer, None
        self.owned = writer is None and link is None
        self.batching = bool(config.batch_max_texts) and callable(getattr(selector, "batch_encoding", None))
        self.started = time.time()
        self.limit_threads = thread_limiter(config.threads)
        self.ready = False
        self.warmup_error: str | None = None
        self._warming: asyncio.Future[Any] | None = None

    def warm_up(self) -> None:
        """One untracked greedy select (nothing is written): loads and runs the encoder, the index and the
        Q-network, so that the first real select is not the slow one; then ``/readyz`` answers 200. A failure
        (an empty bank) is logged and reported by ``/readyz``, which still turns ready: the parts loaded."""
        t0 = time.perf_counter()
        try:
            self.limit_threads()
            self.selector.select(WARMUP_QUERY, k=1, mode="greedy", track=False)
        except Exception as error:  # noqa: BLE001 - reported, never fatal: the server answers real requests
            self.warmup_error = str(error)[:200]
            logger.warning("warm-up select failed (%s); ready anyway", self.warmup_error)
        else:
            logger.info("warm-up select answered in %.2f s: ready", time.perf_counter() - t0)
        self.ready = True

    @contextlib.asynccontextmanager
    async def lifespan(self, app: FastAPI) -> Any:
        if self.batching:  # concurrent texts share forward passes (selects, and new cases the writer encodes)
            self.batcher = self.selector.batch_encoding(self.config.batch_max_texts, self.config.batch_wait_ms)
        if self.owned:
            self.writer = Writer(self.selector, self.config).start()
        loop = asyncio.get_running_loop()
        if self.config.warmup:  # in the background: /healthz answers at once, /readyz once it is done
            self._warming = loop.run_in_executor(None, self.warm_up)
        else:
            self.ready = True
        try:
            yield
        finally:
            if self._warming is not None:
                with contextlib.suppress(Exception):
                    await self._warming
            try:
                if self.owned:  # drain the queue and save, off the event loop
                    await loop.run_in_executor(None, self.writer.stop)
            finally:
                if self.batching:  # back to encoding in the calling thread, for writes queued in a given writer
                    await loop.run_in_executor(None, self.selector.batch_encoding, None)

    def authorize(self, request: Request) -> None:
        if self.token is not None and not token_matches(request.headers.get("authorization"), self.token):
            raise _Problem(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})

    async def write(self, submit: Any, field: str | None = None) -> Any:
        """Run ``submit(writer)`` on the writer thread; errors become problems."""
        try:
            if self.writer is None:
                raise _Problem(503, "the server is not ready", headers={"Retry-After": "1"})
            return await asyncio.wrap_future(submit(self.writer))
        except _Problem:
            raise
        except Exception as error:  # noqa: BLE001 - mapped to 4xx/5xx, re-raised when unexpected
            raise _problem_from(error, field=field) from None

    async def forward(self, request: Request, method: str, path: str) -> Any:
        """A write, validated here, answered by the learner (status and body as it sent them)."""
        link = self.link
        assert link is not None
        raw = await request.body()
        status, headers, content = await asyncio.get_running_loop().run_in_executor(
            None, link.forward, method, path, raw, request.headers.get("authorization"))
        if 200 <= status < 300:
            await asyncio.get_running_loop().run_in_executor(None, link.sync)  # a new case is selectable here now
        kept = {name: headers[name] for name in ("retry-after", "www-authenticate") if name in headers}
        return Response(content, status_code=status, headers=kept,
                        media_type=headers.get("content-type", "application/json"))

    async def forward_case(self, request: Request, method: str, case_id: str) -> Any:
        """:meth:`forward` of a write to ``/v1/cases/{case_id}``."""
        return await self.forward(request, method, f"/v1/cases/{quote(case_id, safe='')}")

    def stats(self) -> dict[str, Any]:
        w = self.writer
        server = {"uptime_s": time.time() - self.started, "auth": self.token is not None,
                  "max_body_bytes": self.config.max_body_bytes, **(w.stats() if w is not None else {})}
        if self.batcher is not None:
            server["encode_batching"] = self.batcher.stats()
        if self.process is not None:
            server["process"] = {**self.process, "pid": os.getpid()}
        if self.link is not None:
            server["forwarding"] = self.link.stats()
        return json_safe({**self.selector.stats(), "server": server})


def build_app(selector: Any, *, token: str | None, config: ServeConfig, writer: Writer | None,
              link: LearnerLink | None = None, process: dict[str, Any] | None = None) -> FastAPI:
    """The app; with ``link`` (a worker process of ``memento serve --workers``) there is no writer: feedback and
    new cases are forwarded to the learner, whose answer is returned as it came, and each select first lets
    the selector follow the learner (``link.sync()``). ``process`` is reported by /v1/stats."""
    from memento._version import __version__
    from memento.serve.inspector import Inspector, inspect_app  # the HTML inspector, behind the same token

    ends = _Endpoints(selector, token=token, config=config, writer=writer, link=link, process=process)
    # /docs (Swagger UI: scripts from a CDN, a form that takes the token) only without auth; the spec stays public
    app = FastAPI(title="memento selector", version=__version__, lifespan=ends.lifespan, redoc_url=None,
                  dependencies=[Depends(_known_query)],
                  docs_url="/docs" if token is None else None,
                  description="Choose past cases for a frozen LLM with a trained soft-Q selector; report outcomes "
                              "to keep it learning. Every /v1 endpoint needs `Authorization: Bearer TOKEN` "
                              "unless the server runs with --no-auth.")
    app.add_middleware(_BodyLimit, max_bytes=config.max_body_bytes)
    app.add_middleware(_AccessLog)  # added last: outermost, so a 413 is logged too
    bearer = HTTPBearer(auto_error=False, description="the server's token ($MEMENTO_SERVE_TOKEN or --token-file)")

    def authorize(request: Request, _: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> None:
        ends.authorize(request)

    @app.exception_handler(_Problem)
    async def _problem(request: Request, error: _Problem) -> JSONResponse:
        return error.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        # FastAPI's shape, without echoing the input back (it may be large, or NaN, which JSON cannot carry)
        path = request.url.path
        takes = "scope" if path in ("/v1/select", "/v1/search") else "owner" if path.startswith("/v1/cases") else ""
        detail = [{"loc": list(e.get("loc", ())), "type": str(e.get("type", "")),
                   "msg": (unknown_message(str(e["loc"][-1]), "field", takes=takes)
                           if e.get("type") == "extra_forbidden" and e.get("loc") else str(e.get("msg", "")))}
                  for e in error.errors()]
        return JSONResponse({"detail": detail}, status_code=422)

    @app.get("/healthz", tags=["meta"], summary="liveness (no auth)")
    def healthz() -> dict[str, Any]:
        return {"status": "ok", "version": __version__}

    @app.get("/readyz", tags=["meta"], summary="readiness (no auth): 200 once a warm-up select was answered")
    def readyz() -> JSONResponse:
        if not ends.ready:
            return JSONResponse({"status": "warming up", "version": __version__}, status_code=503,
                                headers={"Retry-After": "1"})
        body: dict[str, Any] = {"status": "ready", "version": __version__}
        if ends.warmup_error is not None:
            body["warmup_error"] = ends.warmup_error
        return JSONResponse(body)

    auth = [Depends(authorize)]
    models = request_models(config)  # the schema the MCP tools validate through too
    _selector_routes(app, ends, auth, models.select, models.feedback)
    _search_routes(app, ends, auth, models.search)
    _lifecycle_routes(app, ends, auth, update_model(config))  # before /v1/cases/{case_id}: /v1/cases/count is a route
    _case_routes(app, ends, auth, models.case)

    @app.get("/v1/stats", dependencies=auth, tags=["meta"], summary="selector counts and server counters")
    def stats() -> dict[str, Any]:
        return ends.stats()

    app.mount("/inspect", inspect_app(Inspector.for_selector(selector), token=token))
    return app


def _selector_routes(app: FastAPI, ends: _Endpoints, auth: list[Any], SelectRequest: type[BaseModel],
                     FeedbackRequest: type[BaseModel]) -> None:
    """POST /v1/select and /v1/feedback."""
    selector, link = ends.selector, ends.link

    @app.post("/v1/select", dependencies=auth, tags=["selector"], summary="choose k cases for a task")
    def select(request_body: SelectRequest) -> dict[str, Any]:  # type: ignore[valid-type]
        body: Any = request_body  # a model class made per app: mypy cannot see its fields
        query: Any = body.query if body.query is not None else np.asarray(body.embedding, dtype=np.float64)
        ends.limit_threads()
        if link is not None:  # the learner's newest weights and cases (cheap when nothing changed)
            link.sync()
        try:
            result = selector.select(query, k=body.k, mode=body.mode, env=body.env, scope=body.scope,
                                     filter=body.filter, include_global=body.include_global)
        except Exception as error:  # noqa: BLE001
            raise _problem_from(error, field="embedding" if body.query is None else "query") from None
        # rendered here: FastAPI's own response validation and serialisation would cost more than the select
        return JSONResponse(json_safe(result.to_dict()))  # type: ignore[return-value]

    @app.post("/v1/feedback", dependencies=auth, tags=["selector"],
              summary="record the reward of a selection (answered once committed)")
    async def feedback(request_body: FeedbackRequest, request: Request) -> dict[str, Any]:  # type: ignore[valid-type]
        body: Any = request_body
        if link is not None:
            return await ends.forward(request, "POST", "/v1/feedback")  # type: ignore[no-any-return]
        result = await ends.write(lambda w: w.submit_feedback(body.selection_id, body.reward), field="reward")
        return json_safe(result)


def _search_routes(app: FastAPI, ends: _Endpoints, auth: list[Any], SearchRequest: type[BaseModel]) -> None:
    """POST /v1/search and GET /v1/cases: plain retrieval beside the policy (nothing recorded)."""
    selector, link = ends.selector, ends.link

    @app.post("/v1/search", dependencies=auth, tags=["cases"],
              summary="the k cases nearest to a task by cosine, in a scope and filter (no policy, nothing recorded)")
    def search(request_body: SearchRequest) -> dict[str, Any]:  # type: ignore[valid-type]
        body: Any = request_body
        query: Any = body.query if body.query is not None else np.asarray(body.embedding, dtype=np.float64)
        ends.limit_threads()
        if link is not None:
            link.sync()
        try:
            found = selector.search_cases(query, k=body.k, env=body.env, scope=body.scope, filter=body.filter,
                                          include_global=body.include_global)
        except Exception as error:  # noqa: BLE001
            raise _problem_from(error, field="embedding" if body.query is None else "query") from None
        return JSONResponse(json_safe({"cases": [{**case.to_json(), "similarity": similarity}  # type: ignore[return-value]
                                                 for case, similarity in found]}))

    @app.get("/v1/cases", dependencies=auth, tags=["cases"],
             summary="list cases (position order, deleted ones left out) of an env, scope and metadata filter")
    def list_cases(env: str | None = None, user: str | None = None, agent: str | None = None,
                   session: str | None = None, user_id: str | None = None, agent_id: str | None = None,
                   run_id: str | None = None, include_global: bool = False, filter: str | None = None,
                   limit: int = 100, offset: int = 0) -> dict[str, Any]:
        """The scope is ``user``, ``agent``, ``session`` (or mem0's ``user_id``, ``agent_id``, ``run_id``);
        ``include_global=true`` adds the cases without any owner; ``filter`` is the filter's JSON text
        (URL-encoded), e.g. ``filter={"topic":"geo"}``. An unknown parameter is a 422, not ignored."""
        if link is not None:
            link.sync()
        scope, where = _where_query(env, (user, agent, session, user_id, agent_id, run_id), filter)
        try:
            cases = selector.list_cases(env=env, scope=scope, filter=where, limit=limit, offset=offset,
                                        include_global=include_global)
        except Exception as error:  # noqa: BLE001
            raise _problem_from(error, where="query") from None
        return json_safe({"cases": [case.to_json() for case in cases], "offset": offset, "limit": limit})


def _case_routes(app: FastAPI, ends: _Endpoints, auth: list[Any], CaseRequest: type[BaseModel]) -> None:
    """POST /v1/cases, DELETE, PUT and GET /v1/cases/{case_id}."""
    selector, link = ends.selector, ends.link

    @app.post("/v1/cases", dependencies=auth, tags=["cases"], summary="add a case (answered once committed)")
    async def add_case(request_body: CaseRequest, request: Request) -> dict[str, Any]:  # type: ignore[valid-type]
        body: Any = request_body
        if link is not None:
            return await ends.forward(request, "POST", "/v1/cases")  # type: ignore[no-any-return]
        embedding = None if body.embedding is None else np.asarray(body.embedding, dtype=np.float64)
        case_id = await ends.write(lambda w: w.submit_case(body.state, body.action, body.reward, env=body.env,
                                                           meta=body.meta, embedding=embedding,
                                                           scope=body.scope()))
        return {"id": case_id}

    @app.delete("/v1/cases/{case_id}", dependencies=auth, tags=["cases"],
                summary="delete a case: never selected again (answered once committed and checkpointed)")
    async def delete_case(case_id: str, request: Request) -> dict[str, Any]:
        if link is not None:
            return await ends.forward_case(request, "DELETE", case_id)
        return json_safe(await ends.write(lambda w: w.submit_delete(case_id)))

    @app.put("/v1/cases/{case_id}", dependencies=auth, tags=["cases"],
             summary="replace a case by a new one (a new id; the old one is deleted; answered once committed); the "
                     "new case keeps the old one's user/agent/session and meta unless given")
    async def replace_case(case_id: str, request_body: CaseRequest, request: Request  # type: ignore[valid-type]
                           ) -> dict[str, Any]:
        body: Any = request_body
        if link is not None:
            return await ends.forward_case(request, "PUT", case_id)
        embedding = None if body.embedding is None else np.asarray(body.embedding, dtype=np.float64)
        new_id = await ends.write(lambda w: w.submit_replace(case_id, body.state, body.action, body.reward,
                                                             env=body.env, meta=body.meta, embedding=embedding,
                                                             scope=body.scope() or None))  # none: the old case's
        return {"id": new_id, "replaced": case_id}

    @app.get("/v1/cases/{case_id}", dependencies=auth, tags=["cases"],
             summary="one case by id, with its version (404 when unknown, deleted or replaced)")
    def get_case(case_id: str) -> dict[str, Any]:
        try:
            case = selector.get_case(case_id)
        except (UnknownCaseError, KeyError) as error:
            raise _problem_from(error) from None
        return json_safe(case_record(case))


def _where_query(env: str | None, owners: tuple[str | None, ...],
                 filter: str | None) -> tuple[dict[str, str] | None, Any]:
    """The scope and the filter of a query string as ``GET /v1/cases`` takes them: ``owners`` the values of
    :data:`~memento.serve.schema.OWNER_ARGS` (``user``, ``agent``, ``session`` and mem0's names), ``filter`` JSON
    text; a bad value is a 422 naming its parameter."""
    named = dict(zip(OWNER_ARGS, owners))
    for name, value in (("env", env), *named.items()):
        if value is not None:
            try:
                check_id(value, name)
            except DataFormatError as error:
                raise _problem_from(error, field=name, where="query") from None
    try:
        where = None if filter is None else parse_json(filter, where="filter", error=DataFormatError)
        return owner_scope(named), where
    except Exception as error:  # noqa: BLE001
        raise _problem_from(error, where="query") from None


def _lifecycle_routes(app: FastAPI, ends: _Endpoints, auth: list[Any], UpdateRequest: type[BaseModel]) -> None:
    """PATCH /v1/cases/{case_id}, GET /v1/cases/{case_id}/history, GET /v1/cases/count and DELETE /v1/cases."""
    selector, link = ends.selector, ends.link

    @app.get("/v1/cases/count", dependencies=auth, tags=["cases"],
             summary="how many live cases there are of an env, scope and metadata filter")
    def count_cases(env: str | None = None, user: str | None = None, agent: str | None = None,
                    session: str | None = None, user_id: str | None = None, agent_id: str | None = None,
                    run_id: str | None = None, include_global: bool = False,
                    filter: str | None = None) -> dict[str, Any]:
        """The scope, ``include_global`` and ``filter`` as ``GET /v1/cases`` takes them."""
        if link is not None:
            link.sync()
        scope, where = _where_query(env, (user, agent, session, user_id, agent_id, run_id), filter)
        try:
            return {"count": int(selector.count(env=env, scope=scope, filter=where, include_global=include_global))}
        except Exception as error:  # noqa: BLE001
            raise _problem_from(error, where="query") from None

    @app.delete("/v1/cases", dependencies=auth, tags=["cases"],
                summary="delete every case of a scope or metadata filter (one of them, or all=true, is required; "
                        "answered once committed and checkpointed)")
    async def delete_all_cases(request: Request, env: str | None = None, user: str | None = None,
                               agent: str | None = None, session: str | None = None, user_id: str | None = None,
                               agent_id: str | None = None, run_id: str | None = None, filter: str | None = None,
                               all: bool = False) -> dict[str, Any]:
        """The scope and ``filter`` as ``GET /v1/cases`` takes them (not ``include_global``: a delete names whose
        cases go)."""
        scope, where = _where_query(env, (user, agent, session, user_id, agent_id, run_id), filter)
        if link is not None:
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            return await ends.forward(request, "DELETE", target)  # type: ignore[no-any-return]
        return json_safe(await ends.write(lambda w: w.submit_delete_all(env=env, scope=scope, filter=where, all=all)))

    @app.patch("/v1/cases/{case_id}", dependencies=auth, tags=["cases"],
               summary="change a case's action, reward or meta in place (same id, version + 1; answered once "
                       "committed)")
    async def update_case(case_id: str, request_body: UpdateRequest, request: Request  # type: ignore[valid-type]
                          ) -> dict[str, Any]:
        body: Any = request_body
        if link is not None:
            return await ends.forward_case(request, "PATCH", case_id)
        case = await ends.write(lambda w: w.submit_update(case_id, action=body.action, reward=body.reward,
                                                          meta=body.meta, state=body.state))
        return json_safe(case_record(case))

    @app.get("/v1/cases/{case_id}/history", dependencies=auth, tags=["cases"],
             summary="a case's events, oldest first: add, update, replace, delete, feedback")
    def case_history(case_id: str) -> dict[str, Any]:
        if link is not None:
            link.sync()
        try:
            events = selector.history(case_id)
        except Exception as error:  # noqa: BLE001
            raise _problem_from(error) from None
        return json_safe({"id": case_id, "events": [event.to_json() for event in events]})

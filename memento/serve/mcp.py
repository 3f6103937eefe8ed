"""``memento mcp DIR``: the selector as MCP tools over stdio (official Python SDK, the ``mcp`` extra).

Tools (:data:`TOOLS_HELP`, which ``memento mcp --help`` prints):

- ``select_cases(task, k=4, scope?, filter?, env?, include_global=false)``: choose ``k`` past cases for a task;
  returns the cases (state, action, reward, probability, ``score`` = the Q-network's logit, ``similarity`` = the
  cosine, scope, meta) and a ``selection_id``;
- ``record_outcome(selection_id, reward)``: the reward in [0, 1] of what the agent did with them;
- ``add_case(state, action, reward, user?, agent?, session?, meta?, env?)``: store a new case (``user_id``,
  ``agent_id``, ``run_id``: mem0's names of the scope fields); returns its id (the content already stored with
  other meta: that case's meta is updated in place, same id);
- ``update_case(case_id, action?, reward?, meta?)``: change a case in place (same id, its version + 1; a new state
  is refused: it needs a new case);
- ``delete_case(case_id)``: forget a stale or wrong case: it is never selected or read again;
- ``delete_all_cases(scope?, filter?, env?, all=false)``: forget every case of a scope or filter (one of them, or
  ``all``, is required);
- ``count_cases(scope?, filter?, env?, include_global=false)``: how many cases a scope or filter holds;
- ``case_history(case_id)``: a case's events, oldest first (add, update, replace, delete, feedback);
- ``search_cases(query, k=10, scope?, filter?, env?, include_global=false)``: the ``k`` nearest cases by cosine,
  each with its ``similarity`` (a plain search: no policy, nothing recorded);
- ``list_cases(scope?, filter?, env?, limit=100, offset=0, include_global=false)``: the stored cases, in position
  order;
- ``get_case(case_id)``: one stored case, with its version (a deleted or replaced case is a tool error).

A ``scope`` is ``{"user"?, "agent"?, "session"?}`` (or mem0's ``user_id``, ``agent_id``, ``run_id``; ids, never
null): only the cases of that scope, and with ``include_global`` the cases without any owner as well. A
``filter`` (``{"topic": "geo"}``, ``{"level": {"gte": 2, "lt": 5}}``, ``{"user": "alice"}``, ``{"created":
{"gte": "2024-05-01"}}``, ``{"AND": [...]}``, ``{"OR": [...]}``, ``{"NOT": {...}}``; see
:mod:`memento.bank.where`) that matches nothing gives no cases, not an error. An argument a tool does not take
is refused (a tool error naming it), never ignored: ``list_cases(user="alice")`` is an error, not every tenant's
cases.

Writes go through the same single :class:`~memento.serve.app.Writer` as the HTTP service: a tool
answers after the selector committed the write, checkpoints are periodic, and the queue is drained
and saved when the client closes the connection (or sends SIGTERM/SIGINT). The SDK is imported only
when a server is built.

The tools' arguments have the strict types of the HTTP request bodies (:mod:`memento.serve.schema`, same
limits): ``"k": true``, ``"k": "4"`` or ``"reward": true`` are refused as over HTTP, and so is an argument the
tool does not take (the SDK's argument models ignore one: :func:`_strict_tool` forbids it). No ``from __future__ import
annotations``: the tools' annotations carry per-server limits and the SDK reads them as objects.
"""

import contextlib
import logging
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from memento.serve.app import ServeConfig, Writer, require_extra, thread_limiter
from memento.serve.common import case_record, json_safe

__all__ = ["TOOLS_HELP", "build_mcp_server", "run_mcp"]

_TAKES = {"select_cases": "scope", "search_cases": "scope", "list_cases": "scope", "add_case": "owner",
          "count_cases": "scope", "delete_all_cases": "scope"}
"""What a tool takes of a scope (the hint its unknown-argument errors give)."""

logger = logging.getLogger(__name__)

_INSTRUCTIONS = """\
A case selector trained to pick the past cases (task, what was done, reward) that help this agent's LLM.
Call select_cases with the task before solving it and put the returned cases in the prompt; after the
task, call record_outcome with the selection_id and a reward in [0, 1] (1 = success) so the selector
learns. add_case stores a new experience (optionally scoped: user, agent, session; with meta); update_case changes
one in place (action, reward, meta); delete_case forgets a stale or wrong one (by its id), delete_all_cases every
case of a scope or filter. search_cases, list_cases, count_cases, get_case and case_history read the stored cases
without recording anything. select_cases, search_cases, list_cases, count_cases and delete_all_cases take an optional
scope {"user", "agent", "session"} (ids; mem0's user_id, agent_id, run_id too), and a filter ({"topic": "geo"},
{"level": {"gte": 2}}, {"user": "alice"}, {"created": {"gte": "2024-05-01"}}, {"AND": [...]}, {"OR": [...]},
{"NOT": {...}}); all but delete_all_cases take include_global=true to add the cases without any owner. Unknown
arguments are refused."""

TOOLS_HELP = """\
tools (scope: {"user"?, "agent"?, "session"?} or mem0's user_id/agent_id/run_id, ids; include_global: the cases
without any owner too; filter: e.g. {"topic": "geo"}, {"level": {"gte": 2, "lt": 5}}, {"user": "alice"},
{"created": {"gte": "2024-05-01"}}, {"AND": [...]}, {"OR": [...]}, {"NOT": {...}}; one that matches nothing gives no
cases; an unknown argument is an error):
  select_cases(task, k=4, scope?, filter?, env?, include_global?)
                                       choose k past cases for the task -> {selection_id, cases: [{id, state,
                                       action, reward, prob, score (Q logit), similarity (cosine), ...}]}
  record_outcome(selection_id, reward) the reward in [0, 1] of the task solved with them (committed when answered)
  add_case(state, action, reward, user?, agent?, session?, meta?, env?)
                                       store a new case (scoped when user/agent/session, or mem0's
                                       user_id/agent_id/run_id, is given) -> {id}
  update_case(case_id, action?, reward?, meta?)
                                       change a case in place (same id, version + 1) -> the case
  delete_case(case_id)                 forget a stored case: never selected or read again -> {id, deleted, ...}
  delete_all_cases(scope?, filter?, env?, all=false)
                                       forget the cases of a scope or filter (one is required, or all=true)
                                       -> {deleted, replay_slots_masked}
  count_cases(scope?, filter?, env?, include_global?)
                                       how many cases -> {count}
  case_history(case_id)                a case's events, oldest first -> {id, events: [{event, time, ...}]}
  search_cases(query, k=10, scope?, filter?, env?, include_global?)
                                       the k nearest cases by cosine, no policy, nothing recorded
                                       -> {cases: [{id, state, action, reward, similarity, ...}]}
  list_cases(scope?, filter?, env?, limit=100, offset=0, include_global?)
                                       stored cases in position order -> {cases, limit, offset}
  get_case(case_id)                    one stored case -> {id, state, action, reward, version, user?, meta?, ...}"""


def build_mcp_server(selector: Any, writer: Writer, *, config: ServeConfig | None = None) -> Any:
    """An ``MCPServer`` with the eleven tools (:data:`TOOLS_HELP`), backed by ``selector`` (writes through ``writer``).

    The tools' arguments are validated with the strict field types of the HTTP request bodies
    (:mod:`memento.serve.schema`, the same ``config`` limits): a bad argument is a tool error of one line naming
    the field, and nothing is recorded. The tools come in three families, registered in this order:
    :func:`_selection_tools`, :func:`_write_tools`, :func:`_read_tools`."""
    require_extra("mcp")
    from memento._version import __version__
    from memento.serve.schema import fields

    config = config or ServeConfig()
    f = fields(config)
    limit_threads = thread_limiter(config.threads)  # tools run in the SDK's worker threads
    functions = (*_selection_tools(selector, writer, f, limit_threads), *_write_tools(writer, f),
                 *_read_tools(selector, f, limit_threads))
    tools = [_strict_tool(fn) for fn in functions]
    return _server_class()(name="memento", version=__version__, instructions=_INSTRUCTIONS, log_level="WARNING",
                           tools=tools)


def _fail(error: Exception) -> Exception:
    """The SDK's ``ToolError`` for an error a tool met: its message in one line (a ``KeyError``'s without quotes)."""
    from mcp.server.mcpserver.exceptions import ToolError

    if isinstance(error, KeyError) and error.args:
        return ToolError(str(error.args[0]))
    return ToolError(str(error))


def _selection_tools(selector: Any, writer: Writer, f: Any, limit_threads: Callable[[], None]
                     ) -> tuple[Callable[..., Any], ...]:
    """``select_cases`` and ``record_outcome``: the policy's choice and the reward it learns from. ``f`` holds the
    argument types (:func:`memento.serve.schema.fields`)."""

    def select_cases(task: f.text, k: f.k = 4, scope: f.scope | None = None, filter: f.filter | None = None,
                     env: f.env | None = None, include_global: f.include_global = False) -> dict[str, Any]:
        """Choose k past cases to show the LLM for this task, among those of scope ({"user", "agent", "session"};
        with include_global, the cases without any owner too) that match filter ({"topic": "geo"},
        {"level": {"gte": 2}}, {"user": "alice"}, {"AND": [...]}, {"OR": [...]}, {"NOT": {...}}).
        Returns selection_id (pass it to record_outcome), and cases: [{id, state, action, reward, env, prob,
        score (the Q-network's logit), similarity (cosine), user?, agent?, session?, meta?}] in the order chosen."""
        limit_threads()
        try:
            return json_safe(selector.select(task, k=k, mode="sample", env=env, scope=scope, filter=filter,
                                             include_global=include_global).to_dict())
        except Exception as error:  # noqa: BLE001 - every selector error is the caller's to read
            raise _fail(error) from None

    def record_outcome(selection_id: f.selection_id, reward: f.reward) -> dict[str, Any]:
        """Report how the task went with the cases of a selection: reward in [0, 1] (1 = success).
        Returns once the outcome is durably recorded."""
        try:
            return json_safe(writer.submit_feedback(selection_id, reward).result())
        except Exception as error:  # noqa: BLE001
            raise _fail(error) from None

    return select_cases, record_outcome


def _write_tools(writer: Writer, f: Any) -> tuple[Callable[..., Any], ...]:
    """``add_case``, ``update_case``, ``delete_case`` and ``delete_all_cases``: the writes, each answered once
    ``writer`` committed it."""
    from pydantic import Strict

    from memento.serve.schema import OWNER_ARGS, owner_scope

    def add_case(state: f.text, action: f.text, reward: f.reward, user: f.owner = None, agent: f.owner = None,
                 session: f.owner = None, meta: f.meta | None = None, env: f.env | None = None,
                 user_id: f.owner = None, agent_id: f.owner = None, run_id: f.owner = None) -> dict[str, Any]:
        """Store a new case (the task, what was done, its reward in [0, 1]), optionally scoped (user, agent,
        session: whose case it is; or mem0's user_id, agent_id, run_id) and with meta (a JSON object that filters
        match). Returns {"id": the case id}."""
        try:
            scope = owner_scope(dict(zip(OWNER_ARGS, (user, agent, session, user_id, agent_id, run_id))))
            return {"id": writer.submit_case(state, action, reward, env=env, meta=meta, scope=scope).result()}
        except Exception as error:  # noqa: BLE001
            raise _fail(error) from None

    def update_case(case_id: f.case_id, action: f.text | None = None, reward: f.reward | None = None,
                    meta: f.meta | None = None, state: f.text | None = None) -> dict[str, Any]:
        """Change a stored case in place: its action, reward in [0, 1] and/or meta (replaced whole). The id stays;
        its version goes up by one. The state cannot change (that is a new case: delete this one and add it).
        Returns the case as stored now, once committed."""
        try:
            case = writer.submit_update(case_id, action=action, reward=reward, meta=meta, state=state).result()
            return json_safe(case_record(case))
        except Exception as error:  # noqa: BLE001
            raise _fail(error) from None

    def delete_case(case_id: f.case_id) -> dict[str, Any]:
        """Forget a stored case (stale or wrong): it is never selected again. Returns {"id", "deleted": true,
        "replay_slots_masked"} once the deletion is committed."""
        try:
            return json_safe(writer.submit_delete(case_id).result())
        except Exception as error:  # noqa: BLE001
            raise _fail(error) from None

    def delete_all_cases(scope: f.scope | None = None, filter: f.filter | None = None, env: f.env | None = None,
                         all: Annotated[bool, Strict()] = False) -> dict[str, Any]:
        """Forget every stored case of scope ({"user", "agent", "session"}) whose meta match filter (and of env):
        never selected or read again. A scope or a filter is required (all=true deletes without one). Returns
        {deleted, replay_slots_masked} once committed."""
        try:
            return json_safe(writer.submit_delete_all(env=env, scope=scope, filter=filter, all=all).result())
        except Exception as error:  # noqa: BLE001
            raise _fail(error) from None

    return add_case, update_case, delete_case, delete_all_cases


def _read_tools(selector: Any, f: Any, limit_threads: Callable[[], None]) -> tuple[Callable[..., Any], ...]:
    """``search_cases``, ``list_cases``, ``count_cases``, ``get_case`` and ``case_history``: reads of the stored
    cases that record nothing."""
    from pydantic import Field, Strict

    Limit = Annotated[int, Strict(), Field(ge=1, le=10_000)]
    Offset = Annotated[int, Strict(), Field(ge=0, le=2 ** 62)]

    def search_cases(query: f.text, k: f.k = 10, scope: f.scope | None = None, filter: f.filter | None = None,
                     env: f.env | None = None, include_global: f.include_global = False) -> dict[str, Any]:
        """The k stored cases nearest to the query by cosine, among those of scope (with include_global, the cases
        without any owner too) that match filter (a plain search: no policy, nothing recorded). Returns cases:
        [{id, state, action, reward, similarity, user?, agent?, session?, meta?}], the most similar first."""
        limit_threads()
        try:
            found = selector.search_cases(query, k=k, env=env, scope=scope, filter=filter,
                                          include_global=include_global)
            return json_safe({"cases": [{**case.to_json(), "similarity": similarity} for case, similarity in found]})
        except Exception as error:  # noqa: BLE001
            raise _fail(error) from None

    def list_cases(scope: f.scope | None = None, filter: f.filter | None = None, env: f.env | None = None,
                   limit: Limit = 100, offset: Offset = 0, include_global: f.include_global = False) -> dict[str, Any]:
        """The stored cases of scope (with include_global, the cases without any owner too) that match filter, in
        position order (deleted ones left out), from the offset-th match, at most limit (1..10000). Returns
        {cases: [...], limit, offset}."""
        try:
            cases = selector.list_cases(env=env, scope=scope, filter=filter, limit=limit, offset=offset,
                                        include_global=include_global)
            return json_safe({"cases": [case.to_json() for case in cases], "limit": limit, "offset": offset})
        except Exception as error:  # noqa: BLE001
            raise _fail(error) from None

    def count_cases(scope: f.scope | None = None, filter: f.filter | None = None, env: f.env | None = None,
                    include_global: f.include_global = False) -> dict[str, Any]:
        """How many stored cases there are of scope (with include_global, the cases without any owner too) that
        match filter (all of them when neither is given). Returns {count}."""
        try:
            return {"count": int(selector.count(env=env, scope=scope, filter=filter, include_global=include_global))}
        except Exception as error:  # noqa: BLE001
            raise _fail(error) from None

    def get_case(case_id: f.case_id) -> dict[str, Any]:
        """One stored case by id: {id, state, action, reward, kind, version, created, updated, env?, user?, agent?,
        session?, meta?}. A deleted or replaced case is an error."""
        try:
            return json_safe(case_record(selector.get_case(case_id)))
        except Exception as error:  # noqa: BLE001
            raise _fail(error) from None

    def case_history(case_id: f.case_id) -> dict[str, Any]:
        """A case's events, oldest first: add, update (fields, old and new values), replace, delete, feedback (the
        reward reported on a selection that showed it). A deleted case's events keep only their kind, time and
        field names. Returns {id, events: [{event, time, version?, fields?, old?, new?, ...}]}."""
        try:
            return json_safe({"id": case_id, "events": [event.to_json() for event in selector.history(case_id)]})
        except Exception as error:  # noqa: BLE001
            raise _fail(error) from None

    return search_cases, list_cases, count_cases, get_case, case_history


def _strict_tool(fn: Any) -> Any:
    """The SDK's tool for ``fn``, with an argument model that refuses an argument ``fn`` does not take (the SDK's
    model ignores one: ``list_cases(user="alice")`` listed every tenant's cases); the schema it publishes says so
    (``additionalProperties: false``)."""
    from mcp.server.mcpserver.tools import Tool
    from pydantic import ConfigDict

    tool = Tool.from_function(fn)
    loose = tool.fn_metadata.arg_model

    class StrictArguments(loose):  # type: ignore[misc, valid-type]
        model_config = ConfigDict(extra="forbid")

    StrictArguments.__name__ = StrictArguments.__qualname__ = loose.__name__
    metadata = tool.fn_metadata.model_copy(update={"arg_model": StrictArguments})
    return tool.model_copy(update={"fn_metadata": metadata,
                                   "parameters": StrictArguments.model_json_schema(by_alias=True)})


def _server_class() -> type:
    """``MCPServer`` with two answers the SDK does not give: a tool call whose arguments fail validation is
    refused in one line naming the field (the SDK's text spans several lines and names its internal model),
    and over stdio a line that is not a JSON-RPC message is answered with a JSON-RPC error (-32700 parse
    error for what is not JSON, -32600 invalid request for the rest, ``"id": null``) instead of being dropped."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
    from mcp.server.stdio import stdio_server
    from pydantic import ValidationError

    from memento.serve.schema import error_line

    answer_malformed = _answer_malformed_class()

    class StrictMCPServer(MCPServer):  # type: ignore[misc]
        async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
            try:
                return await super().call_tool(name, arguments, context)
            except ToolError as error:
                cause = error.__cause__
                if isinstance(error, UnexpectedToolError) or not isinstance(cause, ValidationError):
                    raise
                raise ToolError(f"{name}: invalid arguments: "
                                f"{error_line(cause, takes=_TAKES.get(name, ''))}") from cause

        async def run_stdio_async(self) -> None:
            async with stdio_server() as (read_stream, write_stream):
                low = self._lowlevel_server  # as the SDK's own in-memory client reaches it
                await low.run(answer_malformed(read_stream, write_stream), write_stream,
                              low.create_initialization_options())

    return StrictMCPServer


def _answer_malformed_class() -> type:
    """The stdio read stream's wrapper that answers a malformed JSON-RPC line (for :func:`_server_class`)."""
    import mcp_types
    from mcp.shared.message import SessionMessage
    from pydantic import ValidationError

    class _AnswerMalformed:
        """The stdio transport's read stream, less its malformed lines, each answered on the write stream."""

        def __init__(self, inner: Any, write: Any) -> None:
            self.inner, self.write = inner, write

        @property
        def last_context(self) -> Any:
            return getattr(self.inner, "last_context", None)

        async def receive(self) -> Any:
            while isinstance(item := await self.inner.receive(), Exception):
                await self.answer(item)
            return item

        def __aiter__(self) -> Any:
            return self

        async def __anext__(self) -> Any:  # the inner stream's end (StopAsyncIteration) passes through
            while isinstance(item := await self.inner.__anext__(), Exception):
                await self.answer(item)
            return item

        async def answer(self, item: Exception) -> None:
            if not isinstance(item, ValidationError):
                logger.warning("the stdio transport failed to read a message: %r", item)
                return
            parse = any(e.get("type") == "json_invalid" for e in item.errors())
            code, message = ((mcp_types.PARSE_ERROR, "Parse error") if parse
                             else (mcp_types.INVALID_REQUEST, "Invalid Request"))
            logger.info("answered a malformed JSON-RPC line with %d %s", code, message)
            error = mcp_types.ErrorData(code=code, message=message)
            await self.write.send(SessionMessage(mcp_types.JSONRPCError(jsonrpc="2.0", id=None, error=error)))

        async def aclose(self) -> None:
            await self.inner.aclose()

        async def __aenter__(self) -> Any:
            await self.inner.__aenter__()
            return self

        async def __aexit__(self, *exc: Any) -> Any:
            return await self.inner.__aexit__(*exc)

    return _AnswerMalformed


def run_mcp(path: str | Path, *, learn: bool = False, device: str | None = None, seed: int = 0,
            config: ServeConfig | None = None) -> int:
    """Load the selector at ``path`` and serve the tools over stdio until the client disconnects."""
    require_extra("mcp")
    from memento.selector.runtime import Selector

    config = config or ServeConfig()
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the protocol: nothing else may write there
        selector = Selector.load(path, device, learn=learn, seed=seed)
    writer = Writer(selector, config).start()
    stopping = threading.Event()

    def on_sigterm(signum: int, frame: Any) -> None:
        # SDK clients close stdin, wait 2 s, then SIGTERM the server: while it is already draining and
        # saving, let it finish (every acknowledged write is committed anyway); before that, stop cleanly
        if not stopping.is_set():
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_sigterm) if threading.current_thread() is threading.main_thread() \
        else None
    try:
        server = build_mcp_server(selector, writer, config=config)
        server.run("stdio")
    except KeyboardInterrupt:
        logger.info("interrupted: saving and stopping")
    finally:
        stopping.set()
        try:
            writer.stop()
            selector.close()
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
    return 0

"""``memento mcp DIR``: the selector as MCP tools over stdio (official Python SDK, the ``mcp`` extra).

Tools:

- ``select_cases(task, k=4)``: choose ``k`` past cases for a task; returns the cases (state, action,
  reward, probability) and a ``selection_id``;
- ``record_outcome(selection_id, reward)``: the reward in [0, 1] of what the agent did with them;
- ``add_case(state, action, reward)``: store a new case; returns its id;
- ``delete_case(case_id)``: forget a stale or wrong case: it is never selected again.

Writes go through the same single :class:`~memento.serve.app.Writer` as the HTTP service: a tool
answers after the selector committed the write, checkpoints are periodic, and the queue is drained
and saved when the client closes the connection (or sends SIGTERM/SIGINT). The SDK is imported only
when a server is built.

No ``from __future__ import annotations``: the tools' annotations carry per-server limits and the
SDK reads them as objects.
"""

import contextlib
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Annotated, Any

from memento.serve.app import ServeConfig, Writer, _json_safe, require_extra, thread_limiter

__all__ = ["build_mcp_server", "run_mcp"]

logger = logging.getLogger(__name__)

_INSTRUCTIONS = """\
A case selector trained to pick the past cases (task, what was done, reward) that help this agent's LLM.
Call select_cases with the task before solving it and put the returned cases in the prompt; after the
task, call record_outcome with the selection_id and a reward in [0, 1] (1 = success) so the selector
learns. add_case stores a new experience; delete_case forgets a stale or wrong one (by its id)."""


def build_mcp_server(selector: Any, writer: Writer, *, config: ServeConfig | None = None) -> Any:
    """An ``MCPServer`` with the four tools, backed by ``selector`` (writes through ``writer``)."""
    require_extra("mcp")
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from pydantic import Field

    from memento._version import __version__

    config = config or ServeConfig()
    server = MCPServer(name="memento", version=__version__, instructions=_INSTRUCTIONS, log_level="WARNING")

    def fail(error: Exception) -> ToolError:
        if isinstance(error, KeyError) and error.args:
            return ToolError(str(error.args[0]))
        return ToolError(str(error))

    Text = Annotated[str, Field(min_length=1, max_length=config.max_text_chars)]
    limit_threads = thread_limiter(config.threads)  # tools run in the SDK's worker threads

    def select_cases(task: Text, k: Annotated[int, Field(ge=1, le=config.max_k)] = 4) -> dict[str, Any]:
        """Choose k past cases to show the LLM for this task. Returns selection_id (pass it to
        record_outcome), and cases: [{id, state, action, reward, env, prob}] in the order chosen."""
        limit_threads()
        try:
            return _json_safe(selector.select(task, k=k, mode="sample").to_dict())
        except Exception as error:  # noqa: BLE001 - every selector error is the caller's to read
            raise fail(error) from None

    def record_outcome(selection_id: Annotated[str, Field(min_length=1, max_length=128)],
                       reward: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]) -> dict[str, Any]:
        """Report how the task went with the cases of a selection: reward in [0, 1] (1 = success).
        Returns once the outcome is durably recorded."""
        try:
            return _json_safe(writer.submit_feedback(selection_id, reward).result())
        except Exception as error:  # noqa: BLE001
            raise fail(error) from None

    def add_case(state: Text, action: Text,
                 reward: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]) -> dict[str, Any]:
        """Store a new case (the task, what was done, its reward in [0, 1]). Returns {"id": the case id}."""
        try:
            return {"id": writer.submit_case(state, action, reward).result()}
        except Exception as error:  # noqa: BLE001
            raise fail(error) from None

    def delete_case(case_id: Annotated[str, Field(min_length=1, max_length=config.max_text_chars)]
                    ) -> dict[str, Any]:
        """Forget a stored case (stale or wrong): it is never selected again. Returns {"id", "deleted": true,
        "replay_slots_masked"} once the deletion is committed."""
        try:
            return _json_safe(writer.submit_delete(case_id).result())
        except Exception as error:  # noqa: BLE001
            raise fail(error) from None

    for fn in (select_cases, record_outcome, add_case, delete_case):
        server.add_tool(fn)
    return server


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

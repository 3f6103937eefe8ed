"""The request schema of both transports of a selector: the HTTP bodies of ``memento serve`` and the MCP tools'
arguments of ``memento mcp`` validate through the same strict field types, with the same limits (a
:class:`~memento.serve.common.ServeConfig`'s ``max_k``, ``max_text_chars`` and ``max_embedding_dim``).

Strict: a JSON number is never read from a string or a bool (``"k": true``, ``"k": "4"`` and ``"reward": true`` are
refused, not taken as 1, 4 and 1.0); an integer is accepted where a float is expected; a reward is a finite
number in [0, 1]. The ranges are :mod:`memento.types`' (``check_reward``, ``check_text``, ``check_id``), the same
as the library's, the JSONL readers' and the CLI's: a blank or NUL text, an id with a control character, a reward of
-1 or 1e308 get the same verdict everywhere (a text's length is further bounded by ``max_text_chars``). Each type
carries ``Strict()`` itself, so it stays strict inside a model that is not (the MCP SDK builds the tools' argument
models from their signatures).

Nothing unknown passes: a body key, a tool argument or (:mod:`memento.serve.http`) a query parameter that the
endpoint or tool does not take is refused, never ignored, and a scope field's value is an id, never ``null`` (a
``{"user": null}`` scope meant every user's cases; a ``"user": null`` case, a case for everyone). mem0's
``user_id``, ``agent_id`` and ``run_id`` are aliases of ``user``, ``agent`` and ``session`` wherever a scope is
given (both with different values is an error). ``include_global`` beside a scope also takes the cases without any
owner (:mod:`memento.bank.where`).

Imported only by :mod:`memento.serve.http` and :mod:`memento.serve.mcp` (pydantic comes with both extras). No
``from __future__ import annotations``: the models are built per config and pydantic reads their annotations as
objects.
"""

import dataclasses
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    model_validator,
)

from memento.bank.where import SCOPE_ALIASES, as_scope, parse_filter
from memento.serve.common import ServeConfig
from memento.types import MAX_ID_CHARS, SCOPE_FIELDS, check_id, check_reward, check_text, json_value_problem

__all__ = ["OWNER_ARGS", "Fields", "RequestModels", "error_line", "fields", "owner_scope", "request_models",
           "unknown_message", "update_model"]

OWNER_ARGS = (*SCOPE_FIELDS, *SCOPE_ALIASES)
"""The arguments that say whose a new case is: ``user``, ``agent``, ``session`` and mem0's names for them."""

ENV_CHARS = MAX_ID_CHARS
SELECTION_ID_CHARS = MAX_ID_CHARS


def _json_value(value: Any) -> Any:
    """A string or object that can be stored and sent back as UTF-8 JSON (no lone surrogate, no NaN, no
    nesting deeper than 100 levels)."""
    problem = json_value_problem(value, finite=True)
    if problem is not None:
        raise ValueError(problem)
    return value


@dataclasses.dataclass(frozen=True)
class Fields:
    """The strict field types of one config's requests (``Annotated`` types, for models and tool signatures)."""

    text: Any  # a query, state or action: check_text, at most max_text_chars characters
    env: Any  # check_id: 1 to 256 characters
    k: Any  # an int in [1, max_k]
    reward: Any  # check_reward: a finite real number in [0, 1]
    selection_id: Any  # check_id: 1 to 256 characters
    case_id: Any  # check_id: 1 to 256 characters
    embedding: Any  # 1 to max_embedding_dim finite numbers
    meta: Any  # a JSON object
    scope: Any  # {"user"?, "agent"?, "session"?} or mem0's names: ids, never null (memento.bank.where.as_scope)
    filter: Any  # a filter (memento.bank.where.parse_filter): meta keys, scope fields, created; operators, AND/OR/NOT
    owner: Any  # a new case's user/agent/session: an id; null refused (leave it out for a case without an owner)
    include_global: Any  # a bool: beside a scope, the cases without any owner too


def fields(config: ServeConfig) -> Fields:
    """The field types under ``config``'s limits."""
    def text(max_length: int) -> Any:
        return Annotated[str, Strict(), Field(min_length=1, max_length=max_length),
                         AfterValidator(lambda v: check_text(v, "text", max_chars=max_length))]

    def ident() -> Any:
        return Annotated[str, Strict(), Field(min_length=1, max_length=MAX_ID_CHARS),
                         AfterValidator(lambda v: check_id(v, "id"))]

    Finite = Annotated[float, Strict(), Field(allow_inf_nan=False)]
    return Fields(
        text=text(config.max_text_chars),
        env=ident(),
        k=Annotated[int, Strict(), Field(ge=1, le=config.max_k)],
        reward=Annotated[float, Strict(), Field(ge=0.0, le=1.0, allow_inf_nan=False),
                         AfterValidator(lambda v: check_reward(v, "reward"))],
        selection_id=ident(),
        case_id=ident(),
        embedding=Annotated[list[Finite], Strict(), Field(min_length=1, max_length=config.max_embedding_dim)],
        meta=Annotated[dict[str, Any], Strict(), AfterValidator(_json_value)],
        scope=Annotated[dict[str, Any], Strict(), AfterValidator(_scope)],
        filter=Annotated[dict[str, Any], Strict(), AfterValidator(_filter)],
        owner=Annotated[str, BeforeValidator(_not_null), Strict(), Field(min_length=1, max_length=MAX_ID_CHARS),
                        AfterValidator(lambda v: check_id(v, "id"))],
        include_global=Annotated[bool, Strict()],
    )


def _not_null(value: Any) -> Any:
    if value is None:
        raise ValueError("a scope field's value is an id, not null (leave it out for a case without an owner)")
    return value


def owner_scope(given: dict[str, Any]) -> dict[str, str] | None:
    """The scope of a new case from its owner arguments (:data:`OWNER_ARGS`, those given), mem0's names mapped to
    ours; a name and its alias that differ raise ``DataFormatError``."""
    scope = as_scope({name: value for name, value in given.items() if value is not None})
    return None if scope is None else scope.to_json()


def unknown_message(name: str, what: str = "argument", *, takes: str = "") -> str:
    """Why an unknown body key, tool argument or query parameter ``name`` is refused, with a hint where a request
    that ``takes`` a ``"scope"`` got a scope field, or one that takes an ``"owner"`` (a new case's user, agent,
    session) got a scope."""
    hint = ""
    if takes == "scope" and name in OWNER_ARGS:
        hint = f'; a scope goes in scope, e.g. scope={{"{SCOPE_ALIASES.get(name, name)}": ...}}'
    elif takes == "owner" and name == "scope":
        hint = "; a new case's owner is given as user, agent, session (or user_id, agent_id, run_id)"
    return f"unknown {what} {name!r}{hint}"


def _scope(value: dict[str, Any]) -> dict[str, Any]:
    """A scope object, checked (unknown fields, non-id values refused); kept as JSON for the selector."""
    as_scope(value)
    return value


def _filter(value: dict[str, Any]) -> dict[str, Any]:
    """A metadata filter, parsed once to check it (its one-line error becomes the 422's)."""
    parse_filter(value)
    return value


@dataclasses.dataclass(frozen=True)
class RequestModels:
    """The HTTP request bodies of one config."""

    select: type[BaseModel]
    feedback: type[BaseModel]
    case: type[BaseModel]
    search: type[BaseModel]


def request_models(config: ServeConfig) -> RequestModels:
    """The request bodies, built from :func:`fields` (unknown keys are refused)."""
    f = fields(config)

    class SelectRequest(BaseModel):
        """Choose ``k`` cases for a task, given as text (``query``) or as a state embedding."""

        model_config = ConfigDict(extra="forbid", strict=True)
        query: f.text | None = Field(None, description="the task text (encoded with the artifact's encoder)")
        embedding: f.embedding | None = Field(None, description="a state embedding of the artifact's dim")
        k: f.k = Field(4, description="cases to select")
        mode: Literal["sample", "greedy"] = Field("sample", description="sample from the policy or take its argmax")
        env: f.env | None = Field(None, description="only cases of this env")
        scope: f.scope | None = Field(None, description='only cases of this scope: {"user", "agent", "session"} '
                                                        "(or mem0's user_id, agent_id, run_id); ids, never null")
        filter: f.filter | None = Field(None, description='only cases that match, e.g. {"topic": "geo"}, '
                                                          '{"level": {"gte": 2, "lt": 5}}, {"user": "alice"}, '
                                                          '{"created": {"gte": "2024-05-01"}}, {"NOT": {...}}, '
                                                          '{"OR": [...]}')
        include_global: f.include_global = Field(False, description="beside a scope, the cases without any owner "
                                                                    "(no user, agent, session) too")

        @model_validator(mode="after")
        def _one_query(self) -> "SelectRequest":
            if (self.query is None) == (self.embedding is None):
                raise ValueError("give exactly one of 'query' (text) or 'embedding' (list of floats)")
            return self

    class FeedbackRequest(BaseModel):
        """The reward of the outcome of an earlier selection."""

        model_config = ConfigDict(extra="forbid", strict=True)
        selection_id: f.selection_id = Field(description="from the /v1/select answer")
        reward: f.reward = Field(description="in [0, 1]")

    class CaseRequest(BaseModel):
        """A new case for the bank."""

        model_config = ConfigDict(extra="forbid", strict=True)
        state: f.text = Field(description="the task")
        action: f.text = Field(description="what was done (answer, plan, tip)")
        reward: f.reward = Field(description="its reward, in [0, 1]")
        env: f.env | None = None
        meta: f.meta | None = None
        embedding: f.embedding | None = Field(None,
                                              description="the state's embedding (default: the server encodes it)")
        user: f.owner = Field(None, description="scope: whose case it is (left out: no owner; never null)")
        agent: f.owner = Field(None, description="scope: which agent's")
        session: f.owner = Field(None, description="scope: which session's")
        user_id: f.owner = Field(None, description="mem0's name of user")
        agent_id: f.owner = Field(None, description="mem0's name of agent")
        run_id: f.owner = Field(None, description="mem0's name of session")

        @model_validator(mode="after")
        def _one_owner(self) -> "CaseRequest":
            self.scope()  # a name and its alias that differ: refused here, before the writer sees it
            return self

        def scope(self) -> dict[str, str] | None:
            return owner_scope({name: getattr(self, name) for name in OWNER_ARGS})

    class SearchRequest(SelectRequest):
        """The ``k`` cases nearest to a task by cosine (no policy, nothing recorded), in a scope and filter."""

        k: f.k = Field(10, description="cases to return")
        mode: Literal["greedy"] = Field("greedy", description="(always greedy: a plain search)")

    return RequestModels(SelectRequest, FeedbackRequest, CaseRequest, SearchRequest)


def error_line(error: ValidationError, *, takes: str = "") -> str:
    """The problems of a validation error on one line, each naming its field (never echoing the input); an unknown
    key is named as such (:func:`unknown_message`)."""
    problems = []
    for e in error.errors():
        loc = ".".join(str(part) for part in e.get("loc", ()))
        msg = " ".join(str(e.get("msg", "")).split())
        if e.get("type") == "extra_forbidden" and e.get("loc"):
            msg = unknown_message(str(e["loc"][-1]), takes=takes)
        problems.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(problems)


def update_model(config: ServeConfig) -> type[BaseModel]:
    """The body of ``PATCH /v1/cases/{id}`` (an update in place, ``Selector.update_case``) under ``config``'s
    limits: at least one of ``action``, ``reward``, ``meta``; a ``state`` that differs from the stored one is
    refused by the selector (a new state needs a new vector: ``PUT`` replaces the case)."""
    f = fields(config)

    class UpdateRequest(BaseModel):
        """New values for a stored case's action, reward and/or meta (same id; its version goes up by one)."""

        model_config = ConfigDict(extra="forbid", strict=True)
        action: f.text | None = Field(None, description="the new action (answer, plan, tip)")
        reward: f.reward | None = Field(None, description="the new reward, in [0, 1]")
        meta: f.meta | None = Field(None, description="the new meta (replaces the stored meta whole)")
        state: f.text | None = Field(None, description="only the stored state (a new state: PUT replaces the case)")

        @model_validator(mode="after")
        def _something(self) -> "UpdateRequest":
            if self.action is None and self.reward is None and self.meta is None and self.state is None:
                raise ValueError("give at least one of 'action', 'reward' or 'meta'")
            return self

    return UpdateRequest

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

Imported only by :mod:`memento.serve.http` and :mod:`memento.serve.mcp` (pydantic comes with both extras). No
``from __future__ import annotations``: the models are built per config and pydantic reads their annotations as
objects.
"""

import dataclasses
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict, ValidationError, model_validator

from memento.memory.where import as_scope, parse_filter
from memento.serve.common import ServeConfig
from memento.types import MAX_ID_CHARS, check_id, check_reward, check_text, json_value_problem

__all__ = ["Fields", "RequestModels", "error_line", "fields", "request_models"]

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
    scope: Any  # {"user"?, "agent"?, "session"?}: ids (memento.memory.where.as_scope)
    filter: Any  # a metadata filter (memento.memory.where.parse_filter): equality, {"in": [...]}, AND/OR


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
    )


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
        scope: f.scope | None = Field(None, description='only cases of this scope: {"user", "agent", "session"}')
        filter: f.filter | None = Field(None, description='only cases whose meta match, e.g. {"topic": "geo"}, '
                                                          '{"topic": {"in": ["geo", "sci"]}}, {"OR": [...]}')

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
        user: f.env | None = Field(None, description="scope: whose case it is")
        agent: f.env | None = Field(None, description="scope: which agent's")
        session: f.env | None = Field(None, description="scope: which session's")

        def scope(self) -> dict[str, Any]:
            return {name: getattr(self, name) for name in ("user", "agent", "session")
                    if getattr(self, name) is not None}

    class SearchRequest(SelectRequest):
        """The ``k`` cases nearest to a task by cosine (no policy, nothing recorded), in a scope and filter."""

        k: f.k = Field(10, description="cases to return")
        mode: Literal["greedy"] = Field("greedy", description="(always greedy: a plain search)")

    return RequestModels(SelectRequest, FeedbackRequest, CaseRequest, SearchRequest)


def error_line(error: ValidationError) -> str:
    """The problems of a validation error on one line, each naming its field (never echoing the input)."""
    problems = []
    for e in error.errors():
        loc = ".".join(str(part) for part in e.get("loc", ()))
        msg = " ".join(str(e.get("msg", "")).split())
        problems.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(problems)

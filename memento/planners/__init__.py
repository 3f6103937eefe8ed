"""Frozen LLM planners behind one protocol (``memento.planners.base.Planner``).

- :class:`HFPlanner`: any local transformers causal LM; ``HFPlanner.default()`` is the bundled
  Gemma 3 270M base model (converted once from its GGUF package into the cache directory);
- :class:`OpenAICompatPlanner`: any OpenAI-compatible server (vLLM, Ollama, llama.cpp, OpenAI);
- :class:`CallablePlanner`: any function or agent;
- :class:`PromptConfig`, :func:`render_prompt` and :func:`render_answer`: the prompt templates they share;
- :class:`ScoringPlanner` and :class:`AnswerScore`: scoring an answer's log-likelihood without
  generating (``HFPlanner`` and ``OpenAICompatPlanner`` score; see ``memento.planners.base``);
- :class:`PlannerSpec`, :func:`parse_planner_spec`, :func:`build_planner`: the CLI's ``--planner`` values
  (``openai:MODEL@URL?mode=completions&max_tokens=...``: the OpenAI planner's options in a query string).

Importing this package loads neither torch nor transformers; ``HFPlanner`` does when built.
"""

from memento.planners.base import AnswerScore, CallablePlanner, Planner, PlannerError, PlanOutput, ScoringPlanner
from memento.planners.hf import HFPlanner, HFPlannerConfig, default_planner_path
from memento.planners.openai_compat import OpenAICompatConfig, OpenAICompatPlanner
from memento.planners.prompts import PromptConfig, render_answer, render_messages, render_prompt
from memento.planners.spec import PlannerSpec, build_planner, check_planner_spec, parse_planner_spec

__all__ = [
    "AnswerScore",
    "CallablePlanner",
    "HFPlanner",
    "HFPlannerConfig",
    "OpenAICompatConfig",
    "OpenAICompatPlanner",
    "PlanOutput",
    "Planner",
    "PlannerError",
    "PlannerSpec",
    "PromptConfig",
    "ScoringPlanner",
    "build_planner",
    "check_planner_spec",
    "default_planner_path",
    "parse_planner_spec",
    "render_answer",
    "render_messages",
    "render_prompt",
]

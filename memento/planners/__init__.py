"""Frozen LLM planners behind one protocol (``memento.planners.base.Planner``)."""

from memento.planners.base import CallablePlanner, PlanOutput, Planner, PlannerError

__all__ = ["CallablePlanner", "PlanOutput", "Planner", "PlannerError"]

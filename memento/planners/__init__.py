"""Frozen LLM planners behind one protocol (``memento.planners.base.Planner``)."""

from memento.planners.base import CallablePlanner, Planner, PlannerError, PlanOutput

__all__ = ["CallablePlanner", "PlanOutput", "Planner", "PlannerError"]

"""Spec -> plan -> backend: the plan IR, its passes, and the DALI emitter."""

from feedfast.compile.plan import Plan, build_plan

__all__ = ["Plan", "build_plan"]

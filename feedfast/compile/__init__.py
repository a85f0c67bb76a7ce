"""Spec -> plan -> backend: the plan IR, its passes, and the DALI emitter."""

from feedfast.compile.build import build_plan
from feedfast.compile.plan import Plan

__all__ = ["Plan", "build_plan"]

"""Declarative pipeline specs: typed objects, loading, validation and overrides."""

from feedfast.spec.load import load_spec
from feedfast.spec.model import Component, FieldPipeline, OpCall, Spec

__all__ = ["Component", "FieldPipeline", "OpCall", "Spec", "load_spec"]

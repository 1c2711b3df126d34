"""Lowering: IR to the flat tables the core runs on (tables.py), and grammars assembled from
modules lowered once (linking.py)."""

from .linking import Module, link, link_frame
from .tables import MAX_RESUMES, LoweredGrammar, byte_classes, lower

__all__ = ["MAX_RESUMES", "LoweredGrammar", "Module", "byte_classes", "link", "link_frame", "lower"]

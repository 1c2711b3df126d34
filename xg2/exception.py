"""xgrammar's exception names, so that an engine's ``except`` clauses written against
``xgrammar.exception`` catch xg2's errors too.

xgrammar raises RuntimeError subclasses; xg2's typed errors (``xg2.errors``) keep their JSON
pointers and line/column positions and subclass these: a malformed structural tag is an
InvalidStructuralTagError, schema or tag text that is not JSON an InvalidJSONError, a blob that
does not load a DeserializeFormatError (DeserializeVersionError when another version wrote it).
"""

from __future__ import annotations


class InvalidJSONError(RuntimeError):
    """Text that should be JSON (a schema, a structural tag, a serialized object) does not parse."""


class InvalidStructuralTagError(RuntimeError):
    """A structural tag that parses as JSON but is not a valid tag."""


class DeserializeFormatError(RuntimeError):
    """Serialized bytes or JSON that are not what the reader expects: malformed, truncated,
    corrupted or of another kind."""


class DeserializeVersionError(RuntimeError):
    """Serialized data written by another format or engine version."""


__all__ = ["DeserializeFormatError", "DeserializeVersionError", "InvalidJSONError", "InvalidStructuralTagError"]

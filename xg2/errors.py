"""Typed errors: every bad input a tenant can send maps to one of these, never to a crash."""

from __future__ import annotations

from .exception import InvalidJSONError, InvalidStructuralTagError


class XG2Error(RuntimeError):
    """Base class of every error xg2 raises on purpose. A RuntimeError because xgrammar's errors
    are: an engine's ``except RuntimeError`` around a compile catches ours too. Most are also
    ValueErrors (bad input), as Python code expects of a refused argument."""


class GrammarError(XG2Error, ValueError):
    """A grammar is malformed; `line` and `column` (1-based) point at the offending text when known."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None):
        self.message = message
        self.line = line
        self.column = column
        where = f" at line {line}, column {column}" if line is not None else ""
        super().__init__(f"{message}{where}")


class GrammarLimitError(GrammarError):
    """A grammar exceeds a resource limit (size, repetition bound, nesting depth, compile budget).
    Where the input was a JSON document (a schema, a structural tag), `pointer` is the JSON pointer
    of the element at the limit; in EBNF, `line` and `column` say where."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None, *,
                 pointer: str | None = None):
        super().__init__(message if pointer is None else f"{message} (at {pointer or '/'})", line, column)
        self.message = message
        self.pointer = pointer


class RegexError(GrammarError):
    """A regex uses a construct with no regular-language meaning (backreference, lookaround, word
    boundary, inline flags, ...) or is malformed; `line` is 1 and `column` the 1-based code-point
    position of the offending construct in the pattern."""


class TokenizerError(XG2Error, ValueError):
    """A vocabulary or tokenizer could not be read."""


class SchemaError(XG2Error, ValueError):
    """A JSON Schema is malformed or uses a keyword that cannot be enforced; `pointer` is the JSON
    pointer (RFC 6901) of the offending schema element."""

    def __init__(self, message: str, pointer: str = ""):
        self.message = message
        self.pointer = pointer
        super().__init__(f"{message} (at {pointer or '/'})")


class StructuralTagError(XG2Error, ValueError, InvalidStructuralTagError):
    """A structural tag is malformed; `pointer` is the JSON pointer (RFC 6901) of the element at
    fault within the tag."""

    def __init__(self, message: str, pointer: str = ""):
        self.message = message
        self.pointer = pointer
        super().__init__(f"{message} (at {pointer or '/'})")


class SchemaJSONError(SchemaError, InvalidJSONError):
    """A schema given as text that is not JSON (xgrammar's InvalidJSONError)."""


class StructuralTagJSONError(StructuralTagError, InvalidJSONError):
    """A structural tag given as text that is not JSON (xgrammar's InvalidJSONError)."""


class ModelFormatError(XG2Error, ValueError):
    """A model tool-call format request (tools, tool choice, options) is invalid; `pointer` is the
    JSON pointer of the bad argument (e.g. ``/tools/2/function/name``, ``/tool_choice``)."""

    def __init__(self, message: str, pointer: str = ""):
        self.message = message
        self.pointer = pointer
        super().__init__(f"{message} (at {pointer or '/'})")


class SchemaWarning(UserWarning):
    """In lenient mode, a JSON Schema keyword that could not be enforced and was relaxed instead."""


class UsageError(XG2Error, ValueError, RuntimeError):
    """An engine call that xgrammar refuses too: a bitmask or logits of the wrong shape, dtype, device
    or layout, a row index or rollback count out of range, a mask asked for after the stop token.
    xgrammar raises ValueError for some of these checks and RuntimeError for others; this is both, so
    an engine written against either catches it."""


class SpecError(XG2Error, ValueError):
    """A runtime request (a session spec) is malformed; `pointer` is the JSON pointer of the field
    at fault within it (``/grammar/schema``, ``/options/max_rollback_tokens``)."""

    def __init__(self, message: str, pointer: str = ""):
        self.message = message
        self.pointer = pointer
        super().__init__(f"{message} (at {pointer or '/'})")


class QuotaError(XG2Error, RuntimeError):
    """A tenant is at one of its limits (open sessions); nothing was opened."""


class SessionError(XG2Error, LookupError):
    """A session that is not open: closed, reaped after its idle timeout, or not the caller's."""


class SessionLostError(SessionError):
    """A session whose mask service replica stopped: its matcher state lived in that process and
    went with it, so it cannot be stepped, forked or rolled back anywhere. `session_ids` names the
    lost sessions the call named; the other replicas' sessions are untouched, so an engine opens
    these again (on any replica) and goes on."""

    def __init__(self, message: str, session_ids: list[str] | tuple[str, ...] = ()):
        self.message = message
        self.session_ids = list(session_ids)
        super().__init__(message)

    def __reduce__(self):       # the ids travel with it across processes (Ray pickles errors)
        return type(self), (self.message, self.session_ids)


class FillTimeoutError(XG2Error):
    """A next-token mask needed a mask entry whose build (or a parse step, when a token was
    accepted) ran past the fill budget (`GrammarCompiler(fill_timeout_ms=...)`): the grammar is
    too costly at this parse state. The session cannot go on constrained; end it. In a batch only
    the positions in `rows` failed (in a fill, their bitmask rows are all zeros): every other row
    was written, every other token taken; a batch accept's flags for all positions are `accepted`."""

    def __init__(self, rows: list[int], accepted: list[bool] | None = None):
        self.rows = list(rows)
        self.accepted = accepted
        super().__init__(f"a mask or a parse step took longer than the fill budget (batch positions {self.rows}); "
                         "the grammar is too costly at this state: end these sessions")

    def __reduce__(self):       # pickled across processes (Ray) with its rows, not its message
        return (type(self), (self.rows, self.accepted))


class AccessError(XG2Error, PermissionError):
    """A caller of a service with API keys named no key it knows (the mask service with keys: its
    calls name the caller's key, and the host answers as the key's tenant)."""


class StepTimeoutError(XG2Error, TimeoutError):
    """A call to the mask service got no answer within the client's `timeout_s`. For a step, the
    state of the sessions it named is unknown (the host may have taken the tokens): close them
    and open them again. `session_ids` names them."""

    def __init__(self, message: str, session_ids: list[str] | tuple[str, ...] = ()):
        self.session_ids = list(session_ids)
        super().__init__(message)

    def __reduce__(self):
        return (type(self), (str(self), self.session_ids))

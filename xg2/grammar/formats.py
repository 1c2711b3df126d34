"""JSON Schema ``format`` values as regexes over decoded string values.

Each format is written once, as a full-match regex in the dialect :mod:`xg2.grammar.regex` accepts
(and, so that tests can cross-check them, one Python's ``re`` reads the same way under ``re.ASCII``).
Regexes are assembled from named parts that mirror the ABNF of the defining RFC, so each piece can
be checked against its source. The JSON Schema front-end wraps the expression with
:func:`xg2.grammar.json_string.json_string_body` to constrain the JSON text.

The default mode promises never to accept an invalid document, and `jsonschema`'s format checkers
are the judge, so every language here lies within what they accept (the tests compare them on
samples drawn from these automata). Exact where a regular language can be, narrower where not:

* ``date``/``date-time``/``time``: days exact per month, Feb 29 only in leap years (the Gregorian
  rule is regular over four-digit years); no year 0000 and no leap second (``:60``), which RFC 3339
  allows (at 23:59 UTC) but the checker (Python dates, rfc3339-validator) rejects.
* ``email``: RFC 5321 ``Mailbox`` without comments or folding white space: a dot-atom or
  quoted-string local part, and a domain of hostname labels or an address literal ``[1.2.3.4]`` /
  ``[IPv6:...]``. Length limits (64-octet local part, 254 in all) are not checked.
* ``hostname``: RFC 1123 labels of letters, digits and inner hyphens, none with ``--`` as its
  third and fourth characters (so no ``xn--`` A-label: Punycode is not regular), within the
  253-character limit by tiers of label count and length (`_HOST_TIERS`).
* ``idn-hostname``: as ``hostname`` for ASCII labels; labels of a safe set of lowercase non-ASCII
  letters limited in length so that their A-label fits (see `_IDN_LETTER`).
* ``idn-email``: any non-ASCII code point other than white space and the IDNA dots in domain
  labels, any in the local part (the checker only looks for an ``@``).
* ``uri``/``uri-reference``/``iri``/``iri-reference``: the RFC 3986 / RFC 3987 ABNF exactly
  (``iprivate`` in queries only), without scheme-specific rules; IRIs within the BMP.
* ``uri-template``: RFC 6570 level 4 syntax without the reserved operators.
* ``regex``: ECMA-262 pattern syntax that Python's ``re`` also compiles, with groups nested up to
  `REGEX_FORMAT_DEPTH` deep (balanced parentheses are not regular) and no backreference.
"""

from __future__ import annotations

import functools

from xg2.grammar.ir import Expr
from xg2.grammar.regex import regex_to_expr

__all__ = ["FORMAT_PATTERNS", "format_expr", "format_pattern"]

# --- date and time (RFC 3339 section 5.6) -------------------------------------------------------

_DIGIT = "[0-9]"
_MONTH_DAY = (
    "(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"  # 31-day months
    "|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"  # 30-day months
    "|02-(?:0[1-9]|1[0-9]|2[0-8]))"  # February, Feb 29 below
)
# Leap years: divisible by 4 but not by 100 (two last digits), or divisible by 400 (two first).
# Year 0000 is out: RFC 3339 allows it, but Python's dates (which `jsonschema` judges by) start at 1.
_YEAR = "(?:[0-9]{3}[1-9]|[0-9]{2}[1-9]0|[0-9][1-9]00|[1-9]000)"
_LEAP_YEAR = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_FULL_DATE = f"(?:{_YEAR}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)"

_HOUR = "(?:[01][0-9]|2[0-3])"
_MINUTE = "[0-5][0-9]"
_SECFRAC = r"(?:\.[0-9]+)?"
_OFFSET = "(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
# No leap second: RFC 3339 allows second 60 when the time in UTC is 23:59, but `jsonschema`'s
# checker (rfc3339-validator) rejects second 60 everywhere, and the default mode never accepts what
# it rejects.
_FULL_TIME = f"{_HOUR}:{_MINUTE}:{_MINUTE}{_SECFRAC}{_OFFSET}"
_DATE_TIME = f"{_FULL_DATE}[Tt]{_FULL_TIME}"

# --- duration (JSON Schema draft 2019-09 appendix A, from ISO 8601) -------------------------------

_DUR_TIME = r"T(?:[0-9]+H(?:[0-9]+M(?:[0-9]+S)?)?|[0-9]+M(?:[0-9]+S)?|[0-9]+S)"
_DUR_DATE = rf"(?:[0-9]+D|[0-9]+M(?:[0-9]+D)?|[0-9]+Y(?:[0-9]+M(?:[0-9]+D)?)?)(?:{_DUR_TIME})?"
_DURATION = rf"P(?:{_DUR_DATE}|{_DUR_TIME}|[0-9]+W)"

# --- IP addresses (RFC 2673 dotted quad without leading zeros; RFC 4291 section 2.2) ------------

_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_IPV4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
_H16 = "[0-9A-Fa-f]{1,4}"
_LS32 = f"(?:{_H16}:{_H16}|{_IPV4})"


def _ipv6() -> str:
    """RFC 3986's IPv6address: the nine shapes of where `::` compresses zero groups (if at all)."""
    forms = [f"(?:{_H16}:){{6}}{_LS32}"]
    for k in range(1, 9):
        head = "" if k == 1 else f"(?:(?:{_H16}:){{0,{k - 2}}}{_H16})?"
        if k <= 6:
            tail = f"(?:{_H16}:){{{6 - k}}}{_LS32}"
        else:
            tail = _H16 if k == 7 else ""
        forms.append(f"{head}::{tail}")
    return "(?:" + "|".join(forms) + ")"


_IPV6 = _ipv6()

# --- host names and e-mail (RFC 1123 section 2.1, RFC 5321 section 4.1.2, RFC 6531) -------------

# E-mail domains: RFC 1123 labels of 1-63 characters (the 253-character total unchecked, as the
# e-mail formats' other length limits; `jsonschema` only looks for an `@` in them).
_LABEL = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = rf"{_LABEL}(?:\.{_LABEL})*"
# Non-ASCII code points allowed in internationalised labels: not white space, not a dot variant.
_U_NONASCII = r"\xa1-\u167f\u1681-\u1fff\u200c-\u2027\u202a-\u202e\u2030-\u205e\u2060-\u2fff" \
              r"\u3001\u3003-\ufefe\uff00-\uff0d\uff0f-\uff60\uff62-\U0010ffff"
_U_NA = f"[{_U_NONASCII}]"
_U_LABEL = (f"(?:{_LABEL}|(?:[A-Za-z0-9][A-Za-z0-9-]*)?{_U_NA}"
            f"(?:[A-Za-z0-9{_U_NONASCII}-]*[A-Za-z0-9{_U_NONASCII}])?)")
_IDN_DOMAIN = rf"{_U_LABEL}(?:[.\u3002\uff0e\uff61]{_U_LABEL})*"


def _ldh_label(letter: str, longest: int) -> str:
    """A label of 1..`longest` characters of `letter` and inner hyphens, never `--` as its third
    and fourth characters: RFC 5891 reserves those (`xn--` A-labels among them) and the IDNA
    checker rejects them. Valid A-labels go too, since Punycode is not a regular language."""
    ldh = f"[{letter}-]"
    return (f"[{letter}](?:[{letter}]|{ldh}[{letter}]|{ldh}{ldh}[{letter}]"
            f"|{ldh}(?:[{letter}]{ldh}|-[{letter}]){ldh}{{0,{longest - 5}}}[{letter}])?")


#: (most labels, longest label) tiers whose names all fit the 253-character limit of RFC 1034 (as
#: `jsonschema`'s checkers count it). Exact is a product of two counters, about 14,000 automaton
#: states; these tiers keep every name of up to 3 labels of up to 63 characters, 4 of 62, 8 of 30
#: and 16 of 14, and cost about 1,400 states.
_HOST_TIERS = ((3, 63), (4, 62), (8, 30), (16, 14))
assert all(n * (longest + 1) - 1 <= 253 for n, longest in _HOST_TIERS)


def _host(label, dot: str) -> str:
    """Names of `label(longest)` labels by the tiers: each tier starts past the last one's count."""
    alts, first = [], 1
    for n, longest in _HOST_TIERS:
        alts.append(f"{label(longest)}(?:{dot}{label(longest)}){{{first - 1},{n - 1}}}")
        first = n + 1
    return "(?:" + "|".join(alts) + ")"


_HOST = _host(lambda n: _ldh_label("A-Za-z0-9", n), r"\.")

# IDNA 2008 (what `jsonschema`'s idn-hostname checker, the `idna` package, applies): a label of
# non-ASCII letters must be lowercase, NFC, PVALID, need no context or bidi rule, and fit 63
# characters as an A-label. The letters below pass all of that whatever their neighbours are
# (lowercase Latin-1, Greek and Cyrillic, kana, CJK ideographs, Hangul syllables: no combining
# mark, nothing that composes, all left-to-right). The A-label length is arithmetic on the code
# points, so a label with them is cut short instead: Punycode writes a delta d in at most
# log10(d) + 2 digits, and k deltas sum to at most (0xD7A3 - 128) * n + k * (n + 1) in a label of
# n code points, which bounds the A-label to 58 characters for n = 8, 25 for n = 3 and 11 for
# n = 1, within each tier's longest label.
_IDN_LETTER = (r"a-z0-9\u00df-\u00f6\u00f8-\u00ff\u03ac-\u03ce\u0430-\u045f\u3041-\u3096\u309d-\u309e"
               r"\u30a1-\u30fa\u30fc-\u30fe\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7a3")
_IDN_LONGEST = {63: 8, 62: 8, 30: 3, 14: 1}


def _idn_label(longest: int) -> str:
    n = _IDN_LONGEST[longest]
    u_label = f"[{_IDN_LETTER}]" if n == 1 else (f"[{_IDN_LETTER}](?:[{_IDN_LETTER}]|[{_IDN_LETTER}-][{_IDN_LETTER}])?"
                                                  if n == 3 else _ldh_label(_IDN_LETTER, n))
    return f"(?:{_ldh_label('A-Za-z0-9', longest)}|{u_label})"


_IDN_HOSTNAME = _host(_idn_label, "[.\u3002\uff0e\uff61]")

_ATEXT = r"A-Za-z0-9!#$%&'*+/=?^_`{|}~\-"
_QUOTED_LOCAL = r'"(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\[\x20-\x7e])*"'
_ADDRESS_LITERAL = rf"\[(?:{_IPV4}|IPv6:{_IPV6})\]"
_EMAIL = rf"(?:[{_ATEXT}]+(?:\.[{_ATEXT}]+)*|{_QUOTED_LOCAL})@(?:{_HOSTNAME}|{_ADDRESS_LITERAL})"
_IDN_ATEXT = _ATEXT + r"\x80-\U0010ffff"
_IDN_EMAIL = (rf"(?:[{_IDN_ATEXT}]+(?:\.[{_IDN_ATEXT}]+)*|{_QUOTED_LOCAL})"
              rf"@(?:{_IDN_DOMAIN}|{_ADDRESS_LITERAL})")

# --- URIs and IRIs (RFC 3986 section 3 and appendix A; RFC 3987 section 2.2) --------------------

_UCSCHAR = (r"\xa0-\ud7ff\uf900-\ufdcf\ufdf0-\uffef"
            + "".join(rf"\U000{p:X}0000-\U000{p:X}FFFD" for p in range(1, 14))
            + r"\U000E1000-\U000EFFFD")
_IPRIVATE = r"\ue000-\uf8ff\U000F0000-\U000FFFFD\U00100000-\U0010FFFD"
# IRIs keep to the Basic Multilingual Plane: `jsonschema`'s iri checker (rfc3987-syntax) refuses
# the `ucschar` and `iprivate` code points past it.
_IRI_UCSCHAR = r"\xa0-\ud7ff\uf900-\ufdcf\ufdf0-\uffef"
_IRI_IPRIVATE = r"\ue000-\uf8ff"
_PCT = "%[0-9A-Fa-f]{2}"
_SUB_DELIMS = "!$&'()*+,;="


def _uri_patterns(iri: bool) -> tuple[str, str]:
    """(absolute URI, URI reference), or their IRI forms: the same ABNF with `ucschar` allowed
    wherever `unreserved` is and `iprivate` in queries."""
    unreserved = r"A-Za-z0-9._~\-" + (_IRI_UCSCHAR if iri else "")
    pchar = f"(?:[{unreserved}{_SUB_DELIMS}:@]|{_PCT})"
    userinfo = f"(?:[{unreserved}{_SUB_DELIMS}:]|{_PCT})*"
    ipvfuture = rf"[vV][0-9A-Fa-f]+\.[A-Za-z0-9._~\-{_SUB_DELIMS}:]+"
    reg_name = f"(?:[{unreserved}{_SUB_DELIMS}]|{_PCT})*"  # also covers IPv4address
    host = rf"(?:\[(?:{_IPV6}|{ipvfuture})\]|{reg_name})"
    authority = f"(?:{userinfo}@)?{host}(?::[0-9]*)?"
    segment = f"{pchar}*"
    path_abempty = f"(?:/{segment})*"
    path_absolute = f"/(?:{pchar}+(?:/{segment})*)?"
    path_rootless = f"{pchar}+(?:/{segment})*"
    path_noscheme = f"(?:[{unreserved}{_SUB_DELIMS}@]|{_PCT})+(?:/{segment})*"
    query = f"(?:{pchar}|[/?{_IRI_IPRIVATE if iri else ''}])*"
    fragment = f"(?:{pchar}|[/?])*"
    tail = rf"(?:\?{query})?(?:#{fragment})?"
    absolute = f"[A-Za-z][A-Za-z0-9+.\\-]*:(?://{authority}{path_abempty}|{path_absolute}|{path_rootless})?{tail}"
    relative = f"(?://{authority}{path_abempty}|{path_absolute}|{path_noscheme})?{tail}"
    return absolute, f"(?:{absolute}|{relative})"


_URI, _URI_REFERENCE = _uri_patterns(iri=False)
_IRI, _IRI_REFERENCE = _uri_patterns(iri=True)

# RFC 6570 section 2: literals and {op varspec,...} expressions with prefix (:n) / explode (*).
_TEMPLATE_LITERAL = (r"(?:[\x21\x23\x24\x26\x28-\x3b\x3d\x3f-\x5b\x5d\x5f\x61-\x7a\x7e"
                     f"{_UCSCHAR}{_IPRIVATE}]|{_PCT})")
# Neither the operators RFC 6570 reserves for extensions (`= , ! @ |`) nor percent-encoded variable
# names: `jsonschema`'s checker (the uri-template package) rejects them.
_VARCHAR = "[A-Za-z0-9_]"
# Prefixes under 1000, as the checker allows (RFC 6570: under 10000).
_VARSPEC = rf"{_VARCHAR}(?:\.?{_VARCHAR})*(?::[1-9][0-9]{{0,2}}|\*)?"
_URI_TEMPLATE = rf"(?:{_TEMPLATE_LITERAL}|\{{[+#./;?&]?{_VARSPEC}(?:,{_VARSPEC})*\}})*"

# --- pointers (RFC 6901; draft-bhutton-relative-json-pointer-00) ---------------------------------

_JSON_POINTER = "(?:/(?:[^/~]|~[01])*)*"
# The index manipulation of the newer drafts (`0+1`) is out, and so is a zero before another digit
# (`100`): `jsonschema`'s checker rejects both.
_RELATIVE_JSON_POINTER = f"(?:0|[1-9]+0?)(?:#|{_JSON_POINTER})"

# --- regex (ECMA-262 pattern syntax in Unicode mode, as Python's `re` also reads it) -------------

#: Group nesting depth the `regex` format allows: balanced parentheses are not a regular language,
#: parentheses nested to a bounded depth are.
REGEX_FORMAT_DEPTH = 3


def _ordered_ranges(first: str, last: str) -> str:
    """`x-y` for every x <= y from `first` to `last`: a class range that is not reversed."""
    return "|".join(f"{chr(c)}-[{chr(c)}-{last}]" for c in range(ord(first), ord(last) + 1))


_RX_HEX = r"\\x[0-9A-Fa-f]{2}"
_RX_U = r"\\u(?:[0-9A-Ca-c][0-9A-Fa-f]{3}|[Dd][0-7][0-9A-Fa-f]{2}|[EFef][0-9A-Fa-f]{3})"  # no surrogate
_RX_ESCAPE = rf"(?:\\[\\^$.*+?()[\]{{}}|/fnrtvdDsSwW]|{_RX_HEX}|{_RX_U})"
# A literal outside classes: not a syntax character (ECMAScript's Unicode mode refuses a lone `]`,
# `{` or `}`, which Python reads as literals).
_RX_LITERAL = r"[^\\^$.*+?()[\]{}|]"
# In a class: no `[` (Python warns of a nested set), no `-` but escaped or in an ordered range of
# digits or same-case letters, no `&`, `~` or `|` (Python warns of set operations when doubled).
_RX_RANGE = f"(?:{_ordered_ranges('0', '9')}|{_ordered_ranges('a', 'z')}|{_ordered_ranges('A', 'Z')})"
_RX_CLASS_REST = rf"(?:{_RX_RANGE}|[^\\\][\-&~|]|{_RX_ESCAPE}|\\[b\-])"
_RX_CLASS_FIRST = rf"(?:{_RX_RANGE}|[^\\\][\-&~|^]|{_RX_ESCAPE}|\\[b\-])"
# At least one item (`[]` and `[^]` are ECMAScript, errors for Python); a first `^` only negates;
# a bare `-` first or last (not both: Python warns of `--`).
_RX_CLASS = (rf"\[(?:\^?-{_RX_CLASS_REST}*|(?:\^{_RX_CLASS_REST}|{_RX_CLASS_FIRST}){_RX_CLASS_REST}*-?)\]")
# `{n,m}` only where n <= m is evident: n of one digit; Python caps counts, so four digits at most.
_RX_QUANTIFIER = (r"(?:[*+?]|\{(?:(?:0|[1-9][0-9]{0,3}),?|"
                  + "|".join(f"{d},[{d}-9]" for d in range(10)) + r"|[0-9],[1-9][0-9]{1,3})\})\??")


def _regex_syntax(depth: int) -> str:
    """Patterns both dialects accept, groups nested up to `depth`: atoms with at most one
    quantifier (and its lazy `?`), assertions (`^ $ \\b \\B`, lookaheads) unquantified, as Unicode
    mode requires; no backreference, named group, lookbehind (Python's must be fixed-width), inline
    flag or Python-only escape. Lookaheads only outside groups: an automaton that had to remember,
    per open group, whether a quantifier may follow its `)` would double in size with each level."""
    alternation = ""
    for level in range(depth + 1):
        groups = rf"|\((?:\?:)?{alternation}\)" if level else ""
        lookahead = rf"|\(\?[=!]{alternation}\)" if level == depth > 0 else ""
        term = rf"(?:(?:\.|{_RX_LITERAL}|{_RX_ESCAPE}|{_RX_CLASS}{groups})(?:{_RX_QUANTIFIER})?|[\^$]|\\[bB]{lookahead})"
        alternation = f"(?:{term}|\\|)*"  # terms and bars in any order: each level holds the last once
    return alternation


_REGEX = _regex_syntax(REGEX_FORMAT_DEPTH)

FORMAT_PATTERNS: dict[str, str] = {
    "date": _FULL_DATE,
    "time": _FULL_TIME,
    "date-time": _DATE_TIME,
    "duration": _DURATION,
    "email": _EMAIL,
    "idn-email": _IDN_EMAIL,
    "hostname": _HOST,
    "idn-hostname": _IDN_HOSTNAME,
    "ipv4": _IPV4,
    "ipv6": _IPV6,
    "uri": _URI,
    "uri-reference": _URI_REFERENCE,
    "iri": _IRI,
    "iri-reference": _IRI_REFERENCE,
    "uri-template": _URI_TEMPLATE,
    "uuid": "[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}",
    "json-pointer": _JSON_POINTER,
    "relative-json-pointer": _RELATIVE_JSON_POINTER,
    "regex": _REGEX,
}
"""Format name -> full-match regex over the decoded string value."""


def format_pattern(name: str) -> str:
    """The full-match regex of format `name`; ValueError for a format not in FORMAT_PATTERNS."""
    try:
        return FORMAT_PATTERNS[name]
    except KeyError:
        raise ValueError(f"unknown string format {name!r}") from None


@functools.cache
def format_expr(name: str) -> Expr | None:
    """The IR expression (over decoded characters) of format `name`, or None when the format is
    unknown, so the caller decides whether an unknown format is an error or an annotation."""
    pattern = FORMAT_PATTERNS.get(name)
    return None if pattern is None else regex_to_expr(pattern)

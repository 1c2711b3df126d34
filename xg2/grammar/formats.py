"""JSON Schema ``format`` values as regexes over decoded string values.

Each format is written once, as a full-match regex in the dialect :mod:`xg2.grammar.regex` accepts
(and, so that tests can cross-check them, one Python's ``re`` reads the same way under ``re.ASCII``).
Regexes are assembled from named parts that mirror the ABNF of the defining RFC, so each piece can
be checked against its source. The JSON Schema front-end wraps the expression with
:func:`xg2.grammar.json_string.json_string_body` to constrain the JSON text.

Exact where a regular language can be exact, with these documented approximations:

* ``date``/``date-time``: days are exact per month, including Feb 29 only in leap years (the
  Gregorian rule is regular over four-digit years). A leap second (``:60``) is exact for UTC
  offsets (``Z``, ``+00:00``, ``-00:00``: only at 23:59); with another offset any hour and minute
  is accepted, since pinning it to 23:59 UTC needs arithmetic over the offset that would cost
  thousands of automaton states.
* ``email``: RFC 5321 ``Mailbox`` without comments or folding white space: a dot-atom or
  quoted-string local part, and a domain of hostname labels or an address literal ``[1.2.3.4]`` /
  ``[IPv6:...]``. Length limits (64-octet local part, 254 in all) are not checked.
* ``hostname``: RFC 1123 labels of 1-63 letters, digits and inner hyphens, dot-separated; the
  253-character total is not checked, nor are A-labels (``xn--``) decoded.
* ``idn-hostname``/``idn-email``: as above, with any non-ASCII code point other than white space
  and the IDNA dot variants allowed in labels (and any non-ASCII in the local part); a label with
  non-ASCII characters has no length bound (the limit is on its punycode form); the IDNA 2008
  code-point, bidi and context rules are not checked.
* ``uri``/``uri-reference``/``iri``/``iri-reference``: the RFC 3986 / RFC 3987 ABNF exactly
  (``iprivate`` in queries only), without scheme-specific rules.
* ``uri-template``: RFC 6570 level 4 syntax (operators, explode and prefix modifiers).
* ``regex``: any string (whether it is a valid ECMA-262 regex is not a regular property).
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
_LEAP_YEAR = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)"
_FULL_DATE = f"(?:[0-9]{{4}}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)"

_HOUR = "(?:[01][0-9]|2[0-3])"
_MINUTE = "[0-5][0-9]"
_SECFRAC = r"(?:\.[0-9]+)?"
_UTC = "(?:[Zz]|[+-]00:00)"
_NONZERO_OFFSET = "[+-](?:(?:0[1-9]|1[0-9]|2[0-3]):[0-5][0-9]|00:(?:0[1-9]|[1-5][0-9]))"
_FULL_TIME = (
    f"(?:{_HOUR}:{_MINUTE}:{_MINUTE}{_SECFRAC}(?:{_UTC}|{_NONZERO_OFFSET})"  # ordinary seconds
    f"|23:59:60{_SECFRAC}{_UTC}"  # a leap second, exact in UTC
    f"|{_HOUR}:{_MINUTE}:60{_SECFRAC}{_NONZERO_OFFSET})"  # a leap second elsewhere (approximate)
)
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

_LABEL = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = rf"{_LABEL}(?:\.{_LABEL})*"
# Non-ASCII code points allowed in internationalised labels: not white space, not a dot variant.
_U_NONASCII = r"\xa1-\u167f\u1681-\u1fff\u200c-\u2027\u202a-\u202e\u2030-\u205e\u2060-\u2fff" \
              r"\u3001\u3003-\ufefe\uff00-\uff0d\uff0f-\uff60\uff62-\U0010ffff"
_U_NA = f"[{_U_NONASCII}]"
# A label with a non-ASCII character: no length bound, since the 63-octet limit applies to its
# punycode A-label, which a regex cannot compute; ASCII labels keep the exact RFC 1123 bound.
_U_LABEL = (f"(?:{_LABEL}|(?:[A-Za-z0-9][A-Za-z0-9-]*)?{_U_NA}"
            f"(?:[A-Za-z0-9{_U_NONASCII}-]*[A-Za-z0-9{_U_NONASCII}])?)")
_IDN_HOSTNAME = rf"{_U_LABEL}(?:[.\u3002\uff0e\uff61]{_U_LABEL})*"

_ATEXT = r"A-Za-z0-9!#$%&'*+/=?^_`{|}~\-"
_QUOTED_LOCAL = r'"(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\[\x20-\x7e])*"'
_ADDRESS_LITERAL = rf"\[(?:{_IPV4}|IPv6:{_IPV6})\]"
_EMAIL = rf"(?:[{_ATEXT}]+(?:\.[{_ATEXT}]+)*|{_QUOTED_LOCAL})@(?:{_HOSTNAME}|{_ADDRESS_LITERAL})"
_IDN_ATEXT = _ATEXT + r"\x80-\U0010ffff"
_IDN_EMAIL = (rf"(?:[{_IDN_ATEXT}]+(?:\.[{_IDN_ATEXT}]+)*|{_QUOTED_LOCAL})"
              rf"@(?:{_IDN_HOSTNAME}|{_ADDRESS_LITERAL})")

# --- URIs and IRIs (RFC 3986 section 3 and appendix A; RFC 3987 section 2.2) --------------------

_UCSCHAR = (r"\xa0-\ud7ff\uf900-\ufdcf\ufdf0-\uffef"
            + "".join(rf"\U000{p:X}0000-\U000{p:X}FFFD" for p in range(1, 14))
            + r"\U000E1000-\U000EFFFD")
_IPRIVATE = r"\ue000-\uf8ff\U000F0000-\U000FFFFD\U00100000-\U0010FFFD"
_PCT = "%[0-9A-Fa-f]{2}"
_SUB_DELIMS = "!$&'()*+,;="


def _uri_patterns(iri: bool) -> tuple[str, str]:
    """(absolute URI, URI reference), or their IRI forms: the same ABNF with `ucschar` allowed
    wherever `unreserved` is and `iprivate` in queries."""
    unreserved = r"A-Za-z0-9._~\-" + (_UCSCHAR if iri else "")
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
    query = f"(?:{pchar}|[/?{_IPRIVATE if iri else ''}])*"
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
_VARCHAR = f"(?:[A-Za-z0-9_]|{_PCT})"
_VARSPEC = rf"{_VARCHAR}(?:\.?{_VARCHAR})*(?::[1-9][0-9]{{0,3}}|\*)?"
_URI_TEMPLATE = rf"(?:{_TEMPLATE_LITERAL}|\{{[+#./;?&=,!@|]?{_VARSPEC}(?:,{_VARSPEC})*\}})*"

# --- pointers (RFC 6901; draft-bhutton-relative-json-pointer-00) ---------------------------------

_JSON_POINTER = "(?:/(?:[^/~]|~[01])*)*"
_RELATIVE_JSON_POINTER = f"(?:0|[1-9][0-9]*)(?:[+-][1-9][0-9]*)?(?:#|{_JSON_POINTER})"

FORMAT_PATTERNS: dict[str, str] = {
    "date": _FULL_DATE,
    "time": _FULL_TIME,
    "date-time": _DATE_TIME,
    "duration": _DURATION,
    "email": _EMAIL,
    "idn-email": _IDN_EMAIL,
    "hostname": _HOSTNAME,
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
    "regex": r"[\x00-\U0010ffff]*",
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

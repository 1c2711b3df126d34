"""Built-in grammars written in the EBNF dialect of :mod:`xg2.grammar.ebnf`."""

from __future__ import annotations

__all__ = ["JSON_EBNF"]

JSON_EBNF: str = r"""
# ECMA-404 JSON with an object or array at the top and no whitespace around it, the same
# language as xgrammar's builtin JSON grammar (what "JSON mode" asks of a model).
root ::= object | array
value ::= object | array | string | number | "true" | "false" | "null"

object ::= "{" ws "}" | "{" ws member (ws "," ws member)* ws "}"
member ::= string ws ":" ws value
array ::= "[" ws "]" | "[" ws value (ws "," ws value)* ws "]"

# Strings: no raw control characters (U+0000-U+001F); '"' and '\' only escaped.
string ::= "\"" char* "\""
char ::= [^"\\\u0000-\u001f] | "\\" escape
escape ::= ["\\/bfnrt] | "u" hex hex hex hex
hex ::= [0-9a-fA-F]

# Numbers: optional minus, no leading zeros, optional fraction and exponent.
number ::= "-"? integer fraction? exponent?
integer ::= "0" | [1-9] [0-9]*
fraction ::= "." [0-9]+
exponent ::= [eE] [+\-]? [0-9]+

# Insignificant whitespace: space, tab, line feed, carriage return.
ws ::= [ \t\n\r]*
"""

"""JSON Schema references resolved once, before lowering: every `$ref` becomes a local pointer.

A `$ref` is a URI reference resolved against the base URI of the schema resource it sits in: the
document's, or that of the nearest enclosing subschema with an `$id` (draft 4: `id`). Its target
is a resource (by `$id`), a JSON pointer within one, or a plain-name fragment (`$anchor`,
`$dynamicAnchor`, or a draft 6/7 `$id: "#name"`). The converter reads only pointers into the
document it lowers, so this module walks the document once (an explicit stack: tenants' schemas
may nest deeper than the interpreter's), indexes resources and anchors, and rewrites each
reference into ``#/pointer``. Documents the caller registers (`schema_store`, URI to schema) are
placed in the copy under an internal key, so references into them are local too; any other
remote reference is a `SchemaError` that names it.

`$dynamicRef` is resolved statically when that is exact: when no more than one resource declares
the `$dynamicAnchor` it names, the dynamic scope cannot pick another; when the document's own
resource declares it, that one is outermost in every dynamic scope, so it wins. Otherwise (the
target depends on the path the evaluation took) it is refused, as is 2019-09's `$recursiveRef`.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, unquote, urldefrag, urljoin

from ..errors import SchemaError, SchemaWarning

#: Keywords whose values are data, not schemas: an `$id` or `$ref` key inside them names nothing.
DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples"})
#: Where registered documents sit in the rewritten copy (an annotation to the converter).
DOCUMENTS = "\x00documents"
#: The base URI of a document that names none: references relative to it stay inside it.
DEFAULT_BASE = "https://xg2.invalid/schema.json"


def _escape(key: Any) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


def _local(pointer: str) -> str:
    """A pointer as the converter's `$ref` (it percent-decodes the fragment, then splits it)."""
    return "#" + quote(pointer, safe="/~!$&'()*+,;=:@-._")


def _join(base: str, ref: str) -> str:
    """`ref` resolved against `base`; URNs and other non-hierarchical bases take fragments only."""
    if ref.startswith("#"):
        return urldefrag(base)[0] + ref
    if ":" in ref.split("/", 1)[0]:
        return ref      # absolute
    if base.startswith(("urn:", "tag:")):
        raise SchemaError(f"$ref {ref!r} is relative to the non-hierarchical base URI {base!r}", "")
    return urljoin(base, ref)


def _normal(uri: str) -> str:
    """A resource URI without an empty fragment (`x#` and `x` name the same resource)."""
    return uri.removesuffix("#")


def _needs_linking(root: Any) -> bool:
    """Whether any reference is more than a plain pointer into the document, or any subschema
    starts a resource of its own (the common document: neither, and it is left as it is)."""
    stack: list[tuple[Any, bool]] = [(root, True)]
    while stack:
        node, top = stack.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and not (ref == "#" or ref.startswith("#/")):
                return True
            if any(isinstance(node.get(k), str) for k in ("$dynamicRef", "$anchor", "$dynamicAnchor")):
                return True
            ident = node.get("$id")
            if not top and isinstance(ident, str):
                return True
            stack.extend((v, False) for k, v in node.items() if k not in DATA_KEYWORDS)
        elif isinstance(node, list):
            stack.extend((v, False) for v in node)
    return False


def _copy(node: Any) -> Any:
    """A deep copy of a JSON document without recursion (only dicts and lists are copied)."""
    if not isinstance(node, (dict, list)):
        return node
    out: Any = {} if isinstance(node, dict) else []
    stack = [(node, out)]
    while stack:
        src, dst = stack.pop()
        items = src.items() if isinstance(src, dict) else enumerate(src)
        for k, v in items:
            if isinstance(v, (dict, list)):
                child: Any = {} if isinstance(v, dict) else []
                stack.append((v, child))
            else:
                child = v
            if isinstance(dst, dict):
                dst[k] = child
            else:
                dst.append(child)
    return out


class _Index:
    def __init__(self, draft4: bool):
        self.draft4 = draft4
        self.resources: dict[str, str] = {}     # resource URI -> pointer
        self.anchors: dict[str, str] = {}       # URI#name -> pointer
        self.dynamic: dict[str, set[str]] = {}  # $dynamicAnchor name -> pointers declaring it
        self.refs: list[tuple[dict, str, str]] = []     # (node holding a reference, its pointer, base)

    def walk(self, doc: Any, pointer: str, base: str) -> None:
        self.resources.setdefault(_normal(base), pointer)
        stack: list[tuple[Any, str, str]] = [(doc, pointer, base)]
        while stack:
            node, where, base = stack.pop()
            if isinstance(node, list):
                stack.extend((v, f"{where}/{i}", base) for i, v in enumerate(node))
                continue
            if not isinstance(node, dict):
                continue
            ident = node.get("id" if self.draft4 and "$id" not in node else "$id")
            if isinstance(ident, str) and ident:
                uri = _join(base, ident)
                doc_uri, frag = urldefrag(uri)
                if ident.startswith("#"):
                    if frag and not frag.startswith("/"):
                        self.anchors.setdefault(f"{_normal(doc_uri)}#{frag}", where)    # draft 6/7 anchor
                else:
                    base = doc_uri
                    self.resources.setdefault(_normal(doc_uri), where)
                    if frag and not frag.startswith("/"):
                        self.anchors.setdefault(f"{_normal(doc_uri)}#{frag}", where)
            for key in ("$anchor", "$dynamicAnchor"):
                name = node.get(key)
                if isinstance(name, str):
                    self.anchors.setdefault(f"{_normal(base)}#{name}", where)
                    if key == "$dynamicAnchor":
                        self.dynamic.setdefault(name, set()).add(where)
            if isinstance(node.get("$ref"), str) or isinstance(node.get("$dynamicRef"), str):
                self.refs.append((node, where, base))
            stack.extend((v, f"{where}/{_escape(k)}", base) for k, v in node.items() if k not in DATA_KEYWORDS)


#: What `follow` gives for a pointer that leads nowhere.
MISSING = object()


def follow(doc: Any, pointer: str) -> Any:
    """The node a JSON pointer (decoded, ``/a/0/b``) names in `doc`, or MISSING."""
    node = doc
    for raw in pointer.split("/")[1:] if pointer else []:
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return MISSING
    return node


def _exists(doc: Any, pointer: str) -> bool:
    return follow(doc, pointer) is not MISSING


def link_references(root: Any, schema_store: Mapping[str, Any] | None = None, lenient: bool = False) -> Any:
    """`root`, or a copy of it whose references are all local pointers (see the module notes).
    `lenient`: a pointer that does not resolve within its resource but does from the document's
    root (an `$id` written as if it were a path) is read from the root, with a warning."""
    if not isinstance(root, dict) or not _needs_linking(root):
        return root
    doc = _copy(root)
    draft = root.get("$schema")
    draft4 = isinstance(draft, str) and ("draft-04/" in draft or "draft-03/" in draft)
    index = _Index(draft4)
    own = doc.get("id" if draft4 and "$id" not in doc else "$id")
    base = urldefrag(_join(DEFAULT_BASE, own))[0] if isinstance(own, str) and own else DEFAULT_BASE
    index.walk(doc, "", base)
    root_base = _normal(base)
    store = {_normal(urldefrag(k)[0]): v for k, v in (schema_store or {}).items()}
    loaded: dict[str, Any] = {}
    i = 0
    while i < len(index.refs):
        node, where, base = index.refs[i]
        i += 1
        for key in ("$ref", "$dynamicRef"):
            ref = node.get(key)
            if not isinstance(ref, str):
                continue
            ptr = f"{where}/{key}"
            uri = _join(base, ref) if ref else base
            doc_uri, frag = urldefrag(uri)
            doc_uri = _normal(doc_uri)
            if doc_uri not in index.resources:
                if doc_uri not in store:
                    raise SchemaError(f"unsupported remote $ref {ref!r} (resolves to {doc_uri!r}; register the "
                                      "document with schema_store to use it)", ptr)
                slot = str(len(loaded))
                loaded[slot] = _copy(store[doc_uri])
                doc.setdefault(DOCUMENTS, {})[slot] = loaded[slot]
                index.walk(loaded[slot], f"/{_escape(DOCUMENTS)}/{slot}", doc_uri)
                index.resources[doc_uri] = f"/{_escape(DOCUMENTS)}/{slot}"
            start = index.resources[doc_uri]
            if not frag or frag.startswith("/"):
                target = start + unquote(frag)
                if not _exists(doc, target):
                    if not (lenient and start and _exists(doc, unquote(frag))):
                        raise SchemaError(f"$ref {ref!r} does not resolve: it points at {target or '/'} within "
                                          f"the resource {doc_uri!r}", ptr)
                    warnings.warn(f"$ref {ref!r} (at {ptr}) points outside its resource {doc_uri!r}; read against "
                                  "the document's root instead", SchemaWarning, stacklevel=3)
                    target = unquote(frag)
            else:
                target = index.anchors.get(f"{doc_uri}#{frag}")
                if target is None:
                    raise SchemaError(f"$ref {ref!r}: no $anchor {frag!r} in {doc_uri!r}", ptr)
                declared = index.dynamic.get(frag, set())
                if key == "$dynamicRef" and target in declared and len(declared) > 1:
                    # The outermost resource of the dynamic scope that declares the anchor wins; the
                    # document's own resource is always outermost, so if it declares it, it wins.
                    outer = index.anchors.get(f"{root_base}#{frag}")
                    if outer is None or outer not in declared:
                        raise SchemaError(f"$dynamicRef {ref!r}: {len(declared)} resources declare the "
                                          f"$dynamicAnchor {frag!r} and the document's own does not, so the "
                                          "target depends on the evaluation path; such references are not "
                                          "supported", ptr)
                    target = outer
            if key == "$dynamicRef":
                if isinstance(node.get("$ref"), str):
                    raise SchemaError("$dynamicRef beside $ref is not supported", ptr)
                del node["$dynamicRef"]
            node["$ref"] = _local(target)
    return doc

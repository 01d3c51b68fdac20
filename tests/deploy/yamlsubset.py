"""A small reader for the block-style YAML subset deploy/ files are written in.

PyYAML is not a dependency, and the files (Prometheus rules, compose) only
need: block mappings and sequences, plain and quoted scalars, simple flow
sequences `[a, b]` and comments. Anything else (anchors, block scalars, flow
mappings) raises, so a file that drifts outside the subset fails its test
instead of being misread.
"""

from __future__ import annotations

import re
from typing import Any

Line = tuple[int, str, int]  # indent, content, line number


class YamlSubsetError(ValueError):
    pass


def _strip_comment(text: str) -> str:
    out, quote = [], ""
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1] in " \t"):
            break
        out.append(ch)
    return "".join(out).rstrip()


def _lines(text: str) -> list[Line]:
    out: list[Line] = []
    for n, raw in enumerate(text.splitlines(), 1):
        if "\t" in raw[: len(raw) - len(raw.lstrip())]:
            raise YamlSubsetError(f"line {n}: tab indentation")
        body = _strip_comment(raw)
        if body.strip():
            out.append((len(body) - len(body.lstrip(" ")), body.strip(), n))
    return out


def scalar(text: str, n: int = 0) -> Any:
    t = text.strip()
    if t == "{}":
        return {}
    if t.startswith(("&", "*", "!", "|", ">", "{")):
        raise YamlSubsetError(f"line {n}: {t[:1]!r} is outside the supported subset")
    if t.startswith("'"):
        if not t.endswith("'") or len(t) < 2:
            raise YamlSubsetError(f"line {n}: unterminated quote")
        return t[1:-1].replace("''", "'")
    if t.startswith('"'):
        if not t.endswith('"') or len(t) < 2:
            raise YamlSubsetError(f"line {n}: unterminated quote")
        return t[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    if t.startswith("["):
        if not t.endswith("]"):
            raise YamlSubsetError(f"line {n}: flow sequence must be on one line")
        inner = t[1:-1].strip()
        return [scalar(p, n) for p in _split_flow(inner)] if inner else []
    if t in ("", "~", "null"):
        return None
    if t in ("true", "false"):
        return t == "true"
    if re.fullmatch(r"-?\d+", t):
        return int(t)
    if re.fullmatch(r"-?\d+\.\d*(e-?\d+)?", t):
        return float(t)
    return t


def _split_flow(inner: str) -> list[str]:
    parts, cur, quote = [], [], ""
    for ch in inner:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == ",":
            parts.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts]


_KEY = re.compile(r"""^("[^"]*"|'[^']*'|[^\s'"#][^:]*?):(?:\s+(.*))?$""")


def _block(lines: list[Line], i: int, indent: int) -> tuple[Any, int]:
    first_indent, content, _ = lines[i]
    if content.startswith("- ") or content == "-":
        seq: list[Any] = []
        while i < len(lines) and lines[i][0] == first_indent and (lines[i][1].startswith("- ") or lines[i][1] == "-"):
            ind, body, n = lines[i]
            rest = body[1:].strip()
            if not rest:
                value, i = _block(lines, i + 1, ind + 1)
            elif _KEY.match(rest) and not rest.startswith(("'", '"', "[")):
                # a mapping starting on the dash line: re-read it at the item's indent
                lines[i] = (ind + 2, rest, n)
                value, i = _block(lines, i, ind + 2)
            else:
                value, i = scalar(rest, n), i + 1
            seq.append(value)
        return seq, i
    mapping: dict[str, Any] = {}
    while i < len(lines) and lines[i][0] == first_indent and not lines[i][1].startswith("- "):
        _, body, n = lines[i]
        m = _KEY.match(body)
        if not m:
            raise YamlSubsetError(f"line {n}: expected 'key: value', got {body!r}")
        key = str(scalar(m.group(1), n))
        if key in mapping:
            raise YamlSubsetError(f"line {n}: duplicate key {key!r}")
        if m.group(2) is not None and m.group(2) != "":
            mapping[key] = scalar(m.group(2), n)
            i += 1
        elif i + 1 < len(lines) and (lines[i + 1][0] > first_indent or
                                     (lines[i + 1][0] == first_indent and lines[i + 1][1].startswith("- "))):
            mapping[key], i = _block(lines, i + 1, first_indent + 1)
        else:
            mapping[key] = None
            i += 1
    if i < len(lines) and lines[i][0] > first_indent:
        raise YamlSubsetError(f"line {lines[i][2]}: unexpected indentation")
    return mapping, i


def loads(text: str) -> Any:
    lines = _lines(text)
    if not lines:
        return None
    value, i = _block(lines, 0, 0)
    if i != len(lines):
        raise YamlSubsetError(f"line {lines[i][2]}: unexpected content {lines[i][1]!r}")
    return value

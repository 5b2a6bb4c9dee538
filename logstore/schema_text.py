"""Typed-topic value schemas written as text: Spark DDL or Arrow schema JSON.

Accepted forms (what ``logstore topics create --schema`` and the ``schema``
topic config take):

* Spark DDL: ``"id long, name string NOT NULL, tags array<string>,
  price decimal(10,2), at timestamp, attrs map<string,int>,
  addr struct<city: string, zip: string>"``. Columns are nullable unless
  ``NOT NULL`` follows the type. Type names are Spark's (``bigint``/``long``,
  ``int``/``integer``, ``smallint``/``short``, ``tinyint``/``byte``,
  ``double``, ``float``/``real``, ``boolean``, ``string``, ``binary``,
  ``date``, ``timestamp``, ``timestamp_ntz``, ``decimal(p,s)``,
  ``array<T>``, ``map<K,V>``, ``struct<name: T, ...>``).
* Arrow schema JSON: ``[{"name": "id", "type": "int64", "nullable": false}, ...]``
  where ``type`` is a Spark or Arrow type name as above.

:func:`format_schema` writes a schema back as DDL, so the two round-trip.
Errors raise :class:`~logstore.errors.SchemaMismatchError` naming the
position and what was expected.

Thread-safety: pure functions.
"""

from __future__ import annotations

import json
import re

import pyarrow as pa

from logstore.errors import SchemaMismatchError

__all__ = ["parse_schema", "format_schema", "format_type"]

_SIMPLE: dict[str, pa.DataType] = {
    "long": pa.int64(), "bigint": pa.int64(), "int64": pa.int64(),
    "int": pa.int32(), "integer": pa.int32(), "int32": pa.int32(),
    "short": pa.int16(), "smallint": pa.int16(), "int16": pa.int16(),
    "byte": pa.int8(), "tinyint": pa.int8(), "int8": pa.int8(),
    "double": pa.float64(), "float64": pa.float64(),
    "float": pa.float32(), "real": pa.float32(), "float32": pa.float32(),
    "boolean": pa.bool_(), "bool": pa.bool_(),
    "string": pa.string(), "utf8": pa.string(), "varchar": pa.string(),
    "binary": pa.binary(),
    "date": pa.date32(), "date32": pa.date32(),
    # Spark's TimestampType is microseconds, UTC-adjusted.
    "timestamp": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"),
}
_TOKEN = re.compile(r"\s*(?:(`[^`]*`)|([A-Za-z_][A-Za-z0-9_]*)|(\d+)|(<|>|\(|\)|,|:))")


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, int]] = []
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            m = _TOKEN.match(text, pos)
            if not m or m.end() == pos:
                raise SchemaMismatchError(f"schema text: unexpected character at position {pos}: {text[pos:pos + 10]!r}")
            tok = next(g for g in m.groups() if g is not None)
            self.tokens.append((tok, m.start()))
            pos = m.end()
        self.i = 0

    def peek(self) -> str | None:
        return self.tokens[self.i][0] if self.i < len(self.tokens) else None

    def take(self, literal: str | None = None, *, what: str | None = None) -> str:
        """The next token; it must equal ``literal`` (case-insensitive) when given."""
        expected = what or repr(literal) if literal or what else "more"
        if self.i >= len(self.tokens):
            raise SchemaMismatchError(f"schema text ended early; expected {expected}")
        tok, at = self.tokens[self.i]
        if literal is not None and tok.lower() != literal:
            raise SchemaMismatchError(f"schema text: expected {expected} at position {at}, found {tok!r}")
        self.i += 1
        return tok

    def name(self) -> str:
        tok = self.take(what="a column name")
        return tok[1:-1] if tok.startswith("`") else tok

    def dtype(self) -> pa.DataType:
        word = self.take(what="a type").lower()
        if word in ("array", "list"):
            self.take("<")
            inner = self.dtype()
            self.take(">")
            return pa.list_(inner)
        if word == "map":
            self.take("<")
            key = self.dtype()
            self.take(",")
            value = self.dtype()
            self.take(">")
            return pa.map_(key, value)
        if word == "struct":
            self.take("<")
            fields = []
            while True:
                fname = self.name()
                if self.peek() == ":":
                    self.take(":")
                fields.append(self.field_rest(fname))
                if self.peek() == ",":
                    self.take(",")
                    continue
                self.take(">")
                return pa.struct(fields)
        if word in ("decimal", "numeric", "dec"):
            precision, scale = 10, 0
            if self.peek() == "(":
                self.take("(")
                precision = int(self.take(what="a precision"))
                if self.peek() == ",":
                    self.take(",")
                    scale = int(self.take(what="a scale"))
                self.take(")")
            return pa.decimal128(precision, scale)
        if word in _SIMPLE:
            return _SIMPLE[word]
        raise SchemaMismatchError(f"schema text: unknown type {word!r}; known: {', '.join(sorted(_SIMPLE))}, array, map, struct, decimal")

    def field_rest(self, fname: str) -> pa.Field:
        dtype = self.dtype()
        nullable = True
        if (self.peek() or "").lower() == "not":
            self.take("not")
            self.take("null")
            nullable = False
        return pa.field(fname, dtype, nullable=nullable)


def parse_schema(text: str) -> pa.Schema:
    """Parse Spark DDL or Arrow schema JSON (see the module docstring)."""
    stripped = text.strip()
    if not stripped:
        raise SchemaMismatchError("schema text is empty")
    if stripped.startswith("["):
        try:
            items = json.loads(stripped)
            fields = []
            for item in items:
                dtype = _Parser(item["type"]).dtype()
                fields.append(pa.field(item["name"], dtype, nullable=bool(item.get("nullable", True))))
        except (ValueError, KeyError, TypeError) as e:
            raise SchemaMismatchError(f"schema JSON is malformed: {e}") from None
        return pa.schema(fields)
    p = _Parser(stripped)
    fields = []
    while True:
        fields.append(p.field_rest(p.name()))
        if p.peek() is None:
            break
        p.take(",")
    names = [f.name for f in fields]
    if len(set(names)) != len(names):
        raise SchemaMismatchError(f"schema text has duplicate column names: {names}")
    return pa.schema(fields)


def format_type(dtype: pa.DataType) -> str:
    """Spark DDL name of an Arrow type (Arrow's own name where Spark has none)."""
    for name, t in _SIMPLE.items():
        if t == dtype and name in ("bigint", "int", "smallint", "tinyint", "double", "float",
                                   "boolean", "string", "binary", "date", "timestamp", "timestamp_ntz"):
            return name
    if pa.types.is_list(dtype):
        return f"array<{format_type(dtype.value_type)}>"
    if pa.types.is_map(dtype):
        return f"map<{format_type(dtype.key_type)},{format_type(dtype.item_type)}>"
    if pa.types.is_struct(dtype):
        inner = ", ".join(_format_field(dtype.field(i), sep=": ") for i in range(dtype.num_fields))
        return f"struct<{inner}>"
    if pa.types.is_decimal(dtype):
        return f"decimal({dtype.precision},{dtype.scale})"
    return str(dtype)


def _format_field(f: pa.Field, *, sep: str = " ") -> str:
    name = f.name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", f.name) else f"`{f.name}`"
    return f"{name}{sep}{format_type(f.type)}" + ("" if f.nullable else " NOT NULL")


def format_schema(schema: pa.Schema) -> str:
    """The schema as Spark DDL (parseable by :func:`parse_schema`)."""
    return ", ".join(_format_field(f) for f in schema)

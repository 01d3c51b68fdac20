"""Light MAVLink messages: what the framer decodes messages without strings into.

`LightMessage` subclasses are generated per message type, with `__slots__` and
an `__init__` that takes the wire values: the same attribute names and value
types as pymavlink's classes (arrays as lists) and the accessors the project
uses (`get_type`, `get_header`, `get_srcSystem`, `get_srcComponent`,
`get_seq`, `to_dict`), at a fraction of the construction cost; the header is a
`LightHeader`, the unpacked header tuple itself. They are for reading;
outgoing messages are built with pymavlink.

A module of its own, apart from the framer's loop: the framer may be compiled
with mypyc (docs/performance.md), and these classes, a tuple subclass and
classes made with `type()` at import, must stay interpreted.
tests/drivers/test_fastdecode.py holds them to pymavlink for every type.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter
from typing import Any

from mavjet.drivers.mavlink.dialect import mavlink2


class LightHeader(tuple[int, ...]):
    """A frame's header as pymavlink names its fields, built in C from one `struct` unpack.

    The tuple is what `_V2_HEADER.unpack_from` returns (length, incompat and
    compat flags, seq, system, component, msgid low 16 and high 8 bits): no
    Python `__init__` runs per frame.
    """

    __slots__ = ()

    mlen = property(itemgetter(0))
    incompat_flags = property(itemgetter(1))
    compat_flags = property(itemgetter(2))
    seq = property(itemgetter(3))
    srcSystem = property(itemgetter(4))
    srcComponent = property(itemgetter(5))

    @property
    def msgId(self) -> int:
        return int(self[6] | (self[7] << 16))


class LightMessage:
    """Base of the generated light message classes (see the module docstring)."""

    __slots__ = ("_crc", "_header")
    _type = "UNKNOWN"
    _msgid = -1
    fieldnames: tuple[str, ...] = ()
    _header: LightHeader

    def get_type(self) -> str:
        return self._type

    def get_msgId(self) -> int:
        return self._msgid

    def get_header(self) -> LightHeader:
        return self._header

    def get_srcSystem(self) -> int:
        return int(self._header.srcSystem)

    def get_srcComponent(self) -> int:
        return int(self._header.srcComponent)

    def get_seq(self) -> int:
        return int(self._header.seq)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"mavpackettype": self._type}
        for name in self.fieldnames:
            d[name] = getattr(self, name)
        return d

    def __repr__(self) -> str:
        return f"{self._type} {self.to_dict()}"


def _light_class(cls: Any) -> type[LightMessage]:
    """A slotted class whose __init__(header, crc, wire_values) assigns the fields by name.

    Wire values are the payload's `struct` unpack: one per scalar field, N in a
    row for an array field, which becomes a list as pymavlink makes it.
    """
    wire_names = list(cls.ordered_fieldnames)
    lengths = list(cls.lengths)  # per wire field
    if all(n == 1 for n in lengths):
        targets = ", ".join(f"self.{name}" for name in wire_names)
        body = f"    {targets}, = _v\n" if wire_names else "    pass\n"
    else:
        lines, k = [], 0
        for name, n in zip(wire_names, lengths, strict=True):
            lines.append(f"    self.{name} = _v[{k}]" if n == 1 else f"    self.{name} = list(_v[{k}:{k + n}])")
            k += n
        body = "\n".join(lines) + "\n"
    src = f"def __init__(self, _h, _c, _v):\n    self._header = _h\n    self._crc = _c\n{body}"
    namespace: dict[str, Any] = {}
    exec(src, namespace)
    return type(
        f"Light_{cls.msgname}", (LightMessage,),
        {"__slots__": tuple(wire_names), "__init__": namespace["__init__"], "_type": cls.msgname, "_msgid": cls.id,
         "fieldnames": tuple(cls.fieldnames)},
    )


# Per message id: (CRC extra as one byte, payload unpack and unpack_from, payload size, light class or
# None for pymavlink's decode() (strings), type name). A plain tuple: the
# hot loop unpacks it in one step instead of five attribute reads.
_MsgInfo = tuple[bytes, Callable[[bytes], tuple[Any, ...]], Callable[[bytes, int], tuple[Any, ...]], int,
                 "Callable[[LightHeader, int, tuple[Any, ...]], LightMessage] | None", str]


def _build_table() -> dict[int, _MsgInfo]:
    table: dict[int, _MsgInfo] = {}
    for msgid, cls in mavlink2.mavlink_map.items():
        # Strings (char arrays) are left to pymavlink, which trims and decodes them.
        light = "s" not in cls.unpacker.format
        table[msgid] = (bytes((cls.crc_extra,)), cls.unpacker.unpack, cls.unpacker.unpack_from, cls.unpacker.size,
                        _light_class(cls) if light else None, cls.msgname)
    return table


_TABLE = _build_table()

"""HPACK (RFC 7541): a decoder of header blocks, and the literal encoding both our sides write.

Why our own decoder: the `hpack` package spends ~60 µs on one gRPC request's header block, more
than the rest of a call's HTTP/2 and gRPC handling together (docs/proxy.md, "The HTTP/2 edge").
Here a field the client indexed is a list lookup, a Huffman string is decoded a byte at a time by
a state table (built lazily, row by row, from the code table), and decoded strings are
remembered, so the values clients repeat (client id, language, versions) cost a dict lookup.
The static table and Huffman codes are read from the `hpack` package (RFC 7541 appendices A and
B as data); none of its code runs here.

Limits: the dynamic table never grows beyond the size we announced (a client's size update above it
is a COMPRESSION_ERROR); a block's decoded header list is counted as RFC 9113 counts it (name +
value + 32 per field) and beyond `max_list_size` the rest of the block is still decoded, to keep
the table in step, but not kept (`HeaderListTooLarge` at the end: the stream is refused, the
connection goes on). Integers are at most 32 bits. Anything malformed raises `HpackError`: the
connection's decoding state is lost, so that is a connection error (COMPRESSION_ERROR).

Encoding: we never index what we send (no encoder state to keep in step with the peer), and write
every field as a literal without indexing, without Huffman.
"""

from __future__ import annotations

from collections import deque

from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH
from hpack.table import HeaderTable

ENTRY_OVERHEAD = 32
MAX_INT_BYTES = 5  # 7 bits each past the prefix: more than 2^32 is refused
STRING_CACHE_MAX = 4096  # decoded Huffman strings remembered (all connections)
_EOS = 256

Header = tuple[str, str]


class HpackError(Exception):
    """A malformed header block: the connection's decoding state can no longer be trusted."""


class HeaderListTooLarge(Exception):
    """A well-formed header block whose header list is larger than allowed."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"the header list is {size} bytes; at most {limit} are accepted")
        self.size = size


# -- Huffman (RFC 7541 5.2, appendix B) --

# The code tree: node 0 is the root; _children[node] = [child for bit 0, child for bit 1], where a
# child >= 0 is an internal node and -1 - symbol a leaf.
_children: list[list[int]] = [[0, 0]]


def _build_tree() -> None:
    for symbol, (code, length) in enumerate(zip(REQUEST_CODES, REQUEST_CODES_LENGTH, strict=True)):
        node = 0
        for i in range(length - 1, -1, -1):
            bit = (code >> i) & 1
            if i == 0:
                _children[node][bit] = -1 - symbol
            else:
                if _children[node][bit] == 0:
                    _children.append([0, 0])
                    _children[node][bit] = len(_children) - 1
                node = _children[node][bit]


_build_tree()
_FAIL = len(_children)  # the state after EOS or an unknown code: its row is never built
# A string may end at the root or on the all-ones path less than 8 bits deep (padding: the top
# bits of EOS, RFC 7541 5.2).
_VALID_END = {0}
_node = 0
for _ in range(7):
    _node = _children[_node][1]
    _VALID_END.add(_node)
del _node

# _rows[state][byte] = (next state, the bytes decoded on the way); built on first use.
_rows: list[list[tuple[int, bytes]] | None] = [None] * (_FAIL + 1)


def _build_row(state: int) -> list[tuple[int, bytes]]:
    if state == _FAIL:
        raise HpackError("a Huffman string holds the EOS symbol or an invalid code")
    row = []
    for byte in range(256):
        node, out = state, bytearray()
        for i in range(7, -1, -1):
            nxt = _children[node][(byte >> i) & 1]
            if nxt >= 0:
                node = nxt
                continue
            symbol = -1 - nxt
            if symbol == _EOS:
                node = _FAIL
                break
            out.append(symbol)
            node = 0
        row.append((node, bytes(out)))
    _rows[state] = row
    return row


_strings: dict[bytes, tuple[str, int]] = {}


def huffman_decode(data: bytes) -> tuple[str, int]:
    """The text of a Huffman-coded string and its length in octets."""
    cached = _strings.get(data)
    if cached is not None:
        return cached
    state, parts, rows = 0, [], _rows
    for byte in data:
        row = rows[state] or _build_row(state)
        state, out = row[byte]
        parts.append(out)
    if state not in _VALID_END:
        if state == _FAIL:
            _build_row(_FAIL)  # raises
        raise HpackError("a Huffman string ends with padding that is not the EOS prefix")
    octets = b"".join(parts)
    decoded = octets.decode("utf-8", "replace"), len(octets)
    if len(_strings) >= STRING_CACHE_MAX:
        _strings.clear()
    _strings[data] = decoded
    return decoded


# -- the decoder --

# (name, value, octets of both): RFC 7541 appendix A, index 1 to 61.
_STATIC: list[tuple[str, str, int]] = [("", "", 0)] + [
    (n.decode(), v.decode(), len(n) + len(v)) for n, v in HeaderTable.STATIC_TABLE
]
_STATIC_LEN = len(_STATIC) - 1
_plain: dict[bytes, str] = {}


def _plain_text(data: bytes) -> str:
    text = _plain.get(data)
    if text is None:
        text = data.decode("utf-8", "replace")
        if len(_plain) >= STRING_CACHE_MAX:
            _plain.clear()
        _plain[data] = text
    return text


class Decoder:
    """The decoding context of one connection (one dynamic table)."""

    __slots__ = ("_dynamic", "_name_octets", "_size", "_table_max", "allowed_table_size", "max_list_size")

    def __init__(self, table_size: int = 4096, max_list_size: int = 16384) -> None:
        self.allowed_table_size = table_size  # what we announced in SETTINGS_HEADER_TABLE_SIZE
        self.max_list_size = max_list_size
        self._table_max = table_size
        # newest first: (name, value, octets of both, octets of the name)
        self._dynamic: deque[tuple[str, str, int, int]] = deque()
        self._size = 0
        self._name_octets = 0  # of the last literal's name

    def decode(self, block: bytes) -> list[Header]:
        out: list[Header] = []
        pos, end, listed = 0, len(block), 0
        fields = False
        static, dynamic = _STATIC, self._dynamic
        while pos < end:
            byte = block[pos]
            if byte & 0x80:  # indexed field
                index = byte & 0x7F
                pos += 1
                if index == 0x7F:
                    index, pos = _integer(block, pos, index)
                if 0 < index <= _STATIC_LEN:
                    name, value, octets = static[index]
                else:
                    i = index - _STATIC_LEN - 1
                    if index == 0 or i >= len(dynamic):
                        raise HpackError(f"header index {index} is not in the table")
                    name, value, octets, _ = dynamic[i]
            elif byte & 0x40:  # literal, added to the table
                name, value, octets, pos = self._literal(block, pos, 0x3F)
                self._add(name, value, octets, self._name_octets)
            elif byte & 0x20:  # dynamic table size update: only before the first field
                if fields:
                    raise HpackError("a table size update after the first header field")
                size, pos = _integer(block, pos + 1, byte & 0x1F) if byte & 0x1F == 0x1F else (byte & 0x1F, pos + 1)
                if size > self.allowed_table_size:
                    raise HpackError(f"a table size update to {size} exceeds the {self.allowed_table_size} allowed")
                self._table_max = size
                self._evict(0)
                continue
            else:  # literal without indexing (0x00) or never indexed (0x10)
                name, value, octets, pos = self._literal(block, pos, 0x0F)
            fields = True
            listed += octets + ENTRY_OVERHEAD
            if listed <= self.max_list_size:
                out.append((name, value))
        if listed > self.max_list_size:
            raise HeaderListTooLarge(listed, self.max_list_size)
        return out

    def _literal(self, block: bytes, pos: int, mask: int) -> tuple[str, str, int, int]:
        """A literal field's name, value, octets of both, and the position after it."""
        index = block[pos] & mask
        pos += 1
        if index == mask:
            index, pos = _integer(block, pos, index)
        if index == 0:
            name, name_octets, pos = _string(block, pos)
        elif index <= _STATIC_LEN:
            name = _STATIC[index][0]
            name_octets = len(name)
        else:
            i = index - _STATIC_LEN - 1
            if i >= len(self._dynamic):
                raise HpackError(f"header name index {index} is not in the table")
            name, _, _, name_octets = self._dynamic[i]
        value, value_octets, pos = _string(block, pos)
        self._name_octets = name_octets
        return name, value, name_octets + value_octets, pos

    def _add(self, name: str, value: str, octets: int, name_octets: int) -> None:
        size = octets + ENTRY_OVERHEAD
        if size > self._table_max:  # RFC 7541 4.4: the table is emptied, the entry not added
            self._dynamic.clear()
            self._size = 0
            return
        self._evict(size)
        self._dynamic.appendleft((name, value, octets, name_octets))
        self._size += size

    def _evict(self, room: int) -> None:
        while self._dynamic and self._size + room > self._table_max:
            self._size -= self._dynamic.pop()[2] + ENTRY_OVERHEAD


def _integer(block: bytes, pos: int, value: int) -> tuple[int, int]:
    """The rest of an integer whose prefix was all ones (`value`), from `pos` (RFC 7541 5.1)."""
    shift = 0
    for _ in range(MAX_INT_BYTES):
        if pos >= len(block):
            raise HpackError("the header block ends inside an integer")
        byte = block[pos]
        pos += 1
        value += (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise HpackError("an integer longer than 32 bits in the header block")


def _string(block: bytes, pos: int) -> tuple[str, int, int]:
    """A string's text, its length in octets, and the position after it."""
    if pos >= len(block):
        raise HpackError("the header block ends before a string")
    first = block[pos]
    length = first & 0x7F
    pos += 1
    if length == 0x7F:
        length, pos = _integer(block, pos, length)
    end = pos + length
    if end > len(block):
        raise HpackError("a string runs past the end of the header block")
    data = block[pos:end]
    if first & 0x80:
        text, octets = huffman_decode(data)
        return text, octets, end
    return _plain_text(data), length, end


# -- encoding --


def integer(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """An HPACK integer with an N-bit prefix (RFC 7541 5.1); `first` holds the pattern bits."""
    top = (1 << prefix_bits) - 1
    if value < top:
        return bytes((first | value,))
    out = bytearray((first | top,))
    value -= top
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: str, value: str | bytes) -> bytes:
    """A header field as a literal without indexing, new name, no Huffman (RFC 7541 6.2.2)."""
    n = name.encode()
    v = value if isinstance(value, bytes) else value.encode()
    return b"\x00" + integer(len(n), 7) + n + integer(len(v), 7) + v

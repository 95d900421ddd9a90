"""Our HPACK decoder (common/http2/hpackcodec.py): RFC 7541's examples, agreement with the `hpack`
package's encoder on random header lists (the dynamic table kept in step across blocks, Huffman
or not), and every malformed block refused with HpackError, never another exception."""

from __future__ import annotations

import contextlib

import hpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.http2.hpackcodec import Decoder, HeaderListTooLarge, HpackError, huffman_decode, integer, literal


def test_rfc7541_c4_requests_with_huffman_share_one_table() -> None:
    dec = Decoder()
    first = bytes.fromhex("828684418cf1e3c2e5f23a6ba0ab90f4ff")
    assert dec.decode(first) == [(":method", "GET"), (":scheme", "http"), (":path", "/"),
                                 (":authority", "www.example.com")]  # fmt: skip
    second = bytes.fromhex("828684be5886a8eb10649cbf")
    assert dec.decode(second)[-1] == ("cache-control", "no-cache")
    third = bytes.fromhex("828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf")
    assert dec.decode(third) == [(":method", "GET"), (":scheme", "https"), (":path", "/index.html"),
                                 (":authority", "www.example.com"), ("custom-key", "custom-value")]  # fmt: skip


def test_rfc7541_c3_requests_without_huffman() -> None:
    dec = Decoder()
    block = bytes.fromhex("828684410f7777772e6578616d706c652e636f6d")
    assert dec.decode(block)[-1] == (":authority", "www.example.com")
    assert dec.decode(bytes.fromhex("828684be58086e6f2d6361636865"))[-2:] == [
        (":authority", "www.example.com"), ("cache-control", "no-cache")]  # fmt: skip


_name = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-0123456789", min_size=1, max_size=20)
_value = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=60)
_headers = st.lists(st.tuples(_name, _value), min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(blocks=st.lists(_headers, min_size=1, max_size=8), huffman=st.booleans(), table=st.sampled_from([256, 4096]))
def test_agrees_with_the_hpack_encoder_across_blocks(blocks: list[list[tuple[str, str]]], huffman: bool,
                                                     table: int) -> None:  # fmt: skip
    enc = hpack.Encoder()
    enc.header_table_size = table  # the encoder announces the size update in its next block
    dec = Decoder(table_size=4096, max_list_size=1 << 20)
    for headers in blocks:
        assert dec.decode(enc.encode(headers, huffman=huffman)) == headers


def test_values_repeated_from_the_table_and_literals_we_encode() -> None:
    dec = Decoder()
    enc = hpack.Encoder()
    for i in range(300):  # evictions: 300 distinct request ids through a 4 KiB table
        headers = [("x-mq-client-id", "host@1@0@abc"), ("x-mq-request-id", f"{i:036d}")]
        assert dec.decode(enc.encode(headers)) == headers
    assert dec.decode(literal("grpc-status", "0") + literal("x", "y" * 200)) == [("grpc-status", "0"), ("x", "y" * 200)]
    assert integer(1337, 5) == bytes([31, 154, 10])  # RFC 7541 C.1.2


def test_a_list_over_the_limit_is_refused_but_the_table_stays_in_step() -> None:
    enc = hpack.Encoder()
    dec = Decoder(max_list_size=900)  # the three fields count 999 (RFC 9113: + 32 each)
    big = [("a", "x" * 300), ("b", "y" * 300), ("c", "z" * 300)]
    with pytest.raises(HeaderListTooLarge):
        dec.decode(enc.encode(big))
    assert dec.decode(enc.encode(big[:2])) == big[:2]  # indexed from the table the refused block filled


@pytest.mark.parametrize(
    "block",
    [
        b"\x80",  # index 0
        b"\xbf\x10",  # index 78: nothing in the dynamic table
        b"\xff\xff\xff\xff\xff\xff\x01",  # an integer over 32 bits
        b"\x40\x05ab",  # a name string running past the end
        b"\x00",  # a literal with no name string
        b"\x3f\xe2\x1f",  # a table size update to 4097, over the 4096 allowed
        b"\x82\x20",  # a table size update after a field
        b"\x00\x81\xff\x00",  # Huffman: 8 one-bits of padding (EOS prefix longer than 7 bits)
        b"\x00\x84\xff\xff\xff\xff\x00",  # Huffman: the EOS symbol itself
        b"\x00\x81\x00\x00",  # Huffman: padding that is not ones
    ],
)
def test_malformed_blocks_are_hpack_errors(block: bytes) -> None:
    with pytest.raises(HpackError):
        Decoder().decode(block)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_any_bytes_decode_or_raise_hpack_errors(block: bytes) -> None:
    with contextlib.suppress(HpackError):
        Decoder(max_list_size=1 << 20).decode(block)


def test_huffman_strings_are_remembered_with_their_length() -> None:
    codes = hpack.huffman_constants
    encoded = hpack.huffman.HuffmanEncoder(codes.REQUEST_CODES, codes.REQUEST_CODES_LENGTH).encode(b"no-cache")
    assert huffman_decode(encoded) == ("no-cache", 8)
    assert huffman_decode(encoded) == ("no-cache", 8)

"""Tag filters: `*`, `TagA || TagB`, their hashes for the ConsumeQueue prefilter, and their errors."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.filter import MATCH_ALL, FilterKind, TagFilter, compile_filter
from broker.tags import NO_TAG_HASH, tag_hash
from common.codes import Code
from common.errors import IllegalFilterExpression


def tag_filter(expression: str) -> TagFilter:
    compiled = compile_filter(FilterKind.TAG, expression)
    assert isinstance(compiled, TagFilter)
    return compiled


@pytest.mark.parametrize("expression", ["*", "", "   ", " * ", "\t*\n"])
def test_match_all_spellings(expression: str) -> None:
    compiled = tag_filter(expression)
    assert compiled == MATCH_ALL
    assert compiled.kind is FilterKind.TAG
    assert compiled.expression == "*"
    assert compiled.tag_hashes is None
    for tag in (None, "", "TagA", "*"):
        assert compiled.matches(tag, {})


@pytest.mark.parametrize(
    ("expression", "tag", "expected"),
    [
        ("TagA", "TagA", True),
        ("TagA", "TagB", False),
        ("TagA", "taga", False),  # tags are case-sensitive
        ("TagA", None, False),  # a message without a tag matches only *
        ("TagA", "", False),
        ("TagA || TagB", "TagB", True),
        ("TagA||TagB||TagC", "TagC", True),
        ("  TagA   ||   TagB  ", "TagA", True),
        ("TagA || TagB", "TagA || TagB", False),
        ("TagA || TagB", "TagAB", False),
        ("Tag A || B", "Tag A", True),  # whitespace inside a tag is part of it
        ("**", "**", True),  # only a lone * means everything
        ("订单 || 支付", "支付", True),
    ],
)
def test_matches(expression: str, tag: str | None, expected: bool) -> None:
    assert tag_filter(expression).matches(tag, {"TAGS": "TagA"}) is expected


@pytest.mark.parametrize(
    ("expression", "normalised", "tags"),
    [
        ("TagA", "TagA", {"TagA"}),
        (" TagB||TagA ", "TagA || TagB", {"TagA", "TagB"}),
        ("TagA || TagA || TagB", "TagA || TagB", {"TagA", "TagB"}),
    ],
)
def test_normalised_expression_and_tag_hashes(expression: str, normalised: str, tags: set[str]) -> None:
    compiled = tag_filter(expression)
    assert compiled.expression == normalised
    assert compiled.tags == tags
    assert compiled.tag_hashes == {tag_hash(tag) for tag in tags}
    assert NO_TAG_HASH not in compiled.tag_hashes


def test_equality_and_hash_follow_the_normalised_expression() -> None:
    assert tag_filter("B || A") == tag_filter("A||B||A")
    assert hash(tag_filter("B || A")) == hash(tag_filter("A||B"))
    assert tag_filter("A") != tag_filter("B")
    assert len({tag_filter("A || B"), tag_filter("B || A"), tag_filter("A")}) == 2
    # Same text, different kind: different filters.
    assert compile_filter(FilterKind.SQL, "TRUE") != compile_filter(FilterKind.TAG, "TRUE")


def test_kind_accepts_the_protocol_number() -> None:
    assert compile_filter(1, "TagA") == tag_filter("TagA")


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("A || || B", "alternative 2 is empty"),
        ("|| A", "alternative 1 is empty"),
        ("A ||", "alternative 2 is empty"),
        ("||", "alternative 1 is empty"),
        ("A || *", "'*', which must be the whole expression"),
        ("A | B", "contains '|'; separate alternatives with '||'"),
        ("A ||| B", "contains '|'"),
        ("A || \ud800", "not valid Unicode"),
        ("A" * 4097, "4097 characters long; the limit is 4096"),
    ],
)
def test_illegal_expressions(expression: str, fragment: str) -> None:
    with pytest.raises(IllegalFilterExpression) as caught:
        compile_filter(FilterKind.TAG, expression)
    assert fragment in caught.value.message
    assert caught.value.code is Code.ILLEGAL_FILTER_EXPRESSION
    caught.value.message.encode("utf-8")  # fit for a gRPC status, even with a lone surrogate in the input


def test_length_limit_is_a_parameter() -> None:
    assert tag_filter("A" * 4096).expression == "A" * 4096
    with pytest.raises(IllegalFilterExpression, match="limit is 8"):
        compile_filter(FilterKind.TAG, "TagA || TagB", chars_max=8)


@pytest.mark.parametrize("kind", [0, 3, -1])
def test_unknown_kind(kind: int) -> None:
    with pytest.raises(IllegalFilterExpression, match=f"unknown filter type {kind}"):
        compile_filter(kind, "*")


_tags = st.text(st.characters(exclude_characters="|", categories=("L", "M", "N", "P", "S", "Zs")), min_size=1).filter(
    lambda tag: tag.strip() == tag and tag not in ("", "*")
)


@settings(max_examples=200, deadline=None)
@given(tags=st.lists(_tags, min_size=1, max_size=5), probe=st.one_of(st.none(), _tags))
def test_generated_tag_lists(tags: list[str], probe: str | None) -> None:
    compiled = tag_filter(" || ".join(tags))
    assert compiled.tag_hashes == {tag_hash(tag) for tag in tags}
    for tag in tags:
        assert compiled.matches(tag, {})
        assert tag_hash(tag) in compiled.tag_hashes
    assert compiled.matches(probe, {}) is (probe in tags)
    assert tag_filter(compiled.expression) == compiled


@settings(max_examples=300, deadline=None)
@given(expression=st.text(st.sampled_from("ab *|\t\ud800")) | st.text())
def test_any_text_compiles_or_raises_illegal_filter_expression(expression: str) -> None:
    try:
        compiled = compile_filter(FilterKind.TAG, expression)
    except IllegalFilterExpression as error:
        error.message.encode("utf-8")
        return
    assert compiled.matches(None, {}) is (compiled.tag_hashes is None)

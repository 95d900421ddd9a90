"""`require_field_order`: the import-time guard of dataclasses that hot paths build positionally."""

from dataclasses import dataclass

import pytest

from common.model import require_field_order
from common.record import RECORD_FIELDS, MessageRecord


@dataclass
class _Pair:
    first: int
    second: int


def test_the_declared_order_passes() -> None:
    require_field_order(_Pair, ("first", "second"))
    require_field_order(MessageRecord, RECORD_FIELDS)


def test_another_order_or_a_missing_field_fails_naming_the_class() -> None:
    with pytest.raises(ImportError, match="_Pair's fields changed"):
        require_field_order(_Pair, ("second", "first"))
    with pytest.raises(ImportError, match="MessageRecord's fields changed"):
        require_field_order(MessageRecord, ("topic",))

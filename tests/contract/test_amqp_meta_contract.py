"""The AMQP metadata document against both broker implementations: versioned compare-and-set.

The remote broker is shared by the whole session, so each test starts from whatever version it
holds. A write must carry exactly the next version; a stale or skipping one is PRECONDITION_FAILED
and changes nothing; a read newer than the held version carries no document.
"""

from __future__ import annotations

from broker.client.amqpmeta import AmqpMetaApi
from broker.client.api import BrokerApi
from common.errors import PreconditionFailed
from tests.contract.test_broker_contract import expect_error


async def test_amqp_meta_compare_and_set(broker: BrokerApi) -> None:
    api = broker
    assert isinstance(api, AmqpMetaApi)
    version, _ = await api.get_amqp_meta()
    await api.put_amqp_meta(version + 1, b'{"first": 1}')
    assert await api.get_amqp_meta() == (version + 1, b'{"first": 1}')
    with expect_error(PreconditionFailed):
        await api.put_amqp_meta(version + 1, b"stale")
    with expect_error(PreconditionFailed):
        await api.put_amqp_meta(version + 3, b"skipping")
    assert await api.get_amqp_meta() == (version + 1, b'{"first": 1}')
    assert await api.get_amqp_meta(newer_than=version + 1) == (version + 1, b"")
    assert await api.get_amqp_meta(newer_than=version) == (version + 1, b'{"first": 1}')

"""What the AMQP gateway needs of a broker, against both implementations: the metadata document
(versioned compare-and-set) and exact ready counts.

The remote broker is shared by the whole session, so each test starts from whatever version it
holds. A write must carry exactly the next version; a stale or skipping one is PRECONDITION_FAILED
and changes nothing; a read newer than the held version carries no document.
"""

from __future__ import annotations

from broker.client.amqpmeta import AmqpMetaApi
from broker.client.api import BrokerApi, ConsumeFrom
from common.errors import PreconditionFailed
from tests.contract.conftest import Scope
from tests.contract.test_broker_contract import expect_error, new_group, new_topic, out, pop_n


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


async def test_ready_counts_what_a_pop_would_hand_out(broker: BrokerApi, scope: Scope) -> None:
    """`GroupQueueStatus.ready` (an AMQP queue's depth): never delivered plus delivered ones whose
    invisibility ended; acknowledged and invisible ones are not counted, wherever they are."""
    topic = await new_topic(broker, scope)
    group = await new_group(broker, scope, consume_from=ConsumeFrom.EARLIEST)

    async def counts() -> tuple[int, int]:
        """(ready, unacked): `ready`, and in flight less due."""
        status = await broker.group_status(group, [topic])
        mine = [q for q in status.queues if q.topic == topic]
        return sum(q.ready for q in mine), sum(q.in_flight - q.due for q in mine)

    await broker.send(topic, 0, [out(scope, f"m{i}") for i in range(4)])
    assert await counts() == (4, 0)
    first, second = await pop_n(broker, group, topic, 2, invisible_ms=60_000)
    assert await counts() == (2, 2)
    await broker.ack(group, topic, [second.receipt_handle])  # acknowledged above an unacked one
    assert await counts() == (2, 1)
    await broker.change_invisible_duration(group, topic, first.receipt_handle, 0)  # requeued
    assert await counts() == (3, 0)

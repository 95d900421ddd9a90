"""The broker's copy of the AMQP gateway's metadata document (exchanges, queues, bindings).

Like the security document, the broker does not interpret it (broker/documents.py): the proxies
encode it (proxy/amqp/meta.py). It is kept in the column family `amqp_meta`. A write must carry
exactly the next version (compare-and-set): two proxies that change the metadata at once cannot
both win, the loser re-reads and applies its change again.
"""

from __future__ import annotations

from broker.documents import VersionedDocument
from broker.store.index import Index

CF_AMQP_META = "amqp_meta"
AMQP_META_CFS = (CF_AMQP_META,)


class AmqpMetaStore(VersionedDocument):
    def __init__(self, index: Index) -> None:
        super().__init__(index, CF_AMQP_META, what="AMQP metadata", next_only=True,
                         retry="read it again and retry")  # fmt: skip

"""The broker's copy of the cluster security document (users, access rules, limits).

The broker does not interpret the document (common/security.py is its codec); it keeps the
newest version (broker/documents.py) in the column family `security` and refuses a write whose
version is not above the one held, so a slow or repeated write can never roll the document back.
Every broker holds a copy: `sluice admin` writes each one, proxies read the highest version they
can reach.
"""

from __future__ import annotations

from broker.documents import VersionedDocument
from broker.store.index import Index

CF_SECURITY = "security"
SECURITY_CFS = (CF_SECURITY,)


class SecurityStore(VersionedDocument):
    def __init__(self, index: Index) -> None:
        super().__init__(index, CF_SECURITY, what="security document", next_only=False,
                         retry="run the command again")  # fmt: skip

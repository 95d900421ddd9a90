"""Objects frozen out of the cyclic garbage collector, and garbage the freeze must not keep.

A server process freezes what exists once it has started (`freeze`: modules, config, servers) so
full collections stop walking them: they stalled the event loop ~20 ms each. Frozen objects are
never collected as cycles, though. A broker's store graph is full of cycles (the store's writer
calls back into the store, a replicated primary's recorder and gate into its store), and RocksDB
keeps its lock while any column family handle of that graph lives: a member that ended a term
begun before the freeze could never open its data directory again in the same process.
`collect_frozen` collects such garbage and freezes the survivors again; call it when a large
object graph that may predate the freeze has been dropped (a store closed, to be reopened)."""

from __future__ import annotations

import gc


def freeze() -> None:
    """Collect, then move every surviving object out of the collector's reach."""
    gc.collect()
    gc.freeze()


def collect_frozen() -> None:
    """Collect garbage among frozen objects too (one full collection), then freeze what lives."""
    gc.unfreeze()
    freeze()

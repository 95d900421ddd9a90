"""`sluice cluster`: run a whole topology on this machine as supervised child processes.

    topology.py   the model: processes, their ports, probes, command lines and config files
    loader.py     TOML topology file → Topology, with errors that name the file, entry and key
    tomlwrite.py  the config tables written for each process (`--config` files)
    state.py      `<run-dir>/cluster.json`: what the supervisor started, read by status and down
    probe.py      is a pid alive, does a port answer, what does `/readyz` say
    supervisor.py start in dependency order, wait until ready, restart with backoff, stop in reverse
    control.py    status and down: read the state file, probe, signal the supervisor

See docs/deployment.md for the topology schema and the commands.
"""

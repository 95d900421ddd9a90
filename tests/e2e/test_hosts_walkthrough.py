"""docs/deployment.md's "Several machines" walkthrough, run as written on network-namespace hosts.

The test reads the section: every ```sh and ```python block starts with `# on <address>`, the
machine it runs on. Each documented machine becomes a host of a Lab (tests/helpers/hosts.py), its
documented address rewritten to the host's own wherever it appears; the only other rewrites are
`sluice` (this worktree's `python -m sluice`) and `--data-dir data/...` (under the test's temporary
directory). Server commands (`sluice nameserver|broker|proxy|...`) are started in their host and
awaited on their port there; every other command must exit 0; the client program must print that
it received its messages.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

from tests.e2e.support.hostlab import HostCluster
from tests.helpers.hosts import Host, Lab, unavailable
from tests.helpers.procs import REPO_ROOT

DOC = REPO_ROOT / "docs" / "deployment.md"
SECTION = "## Several machines"
SERVERS = {"nameserver": 9876, "broker": 10911, "proxy": 8081, "navigation": 9877, "node": 8081, "up": 8081}
COMMAND_TIMEOUT_S = 120.0
_FENCE = re.compile(r"^```(sh|python)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
_ON = re.compile(r"^# on (\d+\.\d+\.\d+\.\d+)")


def walkthrough() -> list[tuple[str, str, str]]:
    """(language, documented address, body) of each block of the section, in order."""
    text = DOC.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    blocks = []
    for language, body in _FENCE.findall(text[start : end if end > 0 else len(text)]):
        found = _ON.match(body)
        assert found, f"a block of {SECTION!r} does not say which machine it runs on:\n{body}"
        blocks.append((language, found.group(1), body))
    return blocks


def _port(argv: list[str]) -> int:
    return int(argv[argv.index("--port") + 1]) if "--port" in argv else SERVERS[argv[1]]


def test_the_multi_host_walkthrough_runs_as_written(tmp_path: Path) -> None:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    blocks = walkthrough()
    assert any(lang == "python" for lang, _, _ in blocks) and len(blocks) >= 5, blocks
    documented = list(dict.fromkeys(address for _, address, _ in blocks))
    with Lab() as lab:
        hosts: dict[str, Host] = {address: lab.add_host(f"h{i + 1}") for i, address in enumerate(documented)}
        cluster = HostCluster(lab, tmp_path, hosts[documented[-1]])

        def rewrite(text: str) -> str:
            for address, host in hosts.items():
                text = re.sub(rf"\b{re.escape(address)}\b", host.address, text)
            return text.replace("--data-dir data/", f"--data-dir {tmp_path}/data/")

        for language, address, body in blocks:
            host = hosts[address]
            if language == "python":
                done = host.run([sys.executable, "-c", rewrite(body)], timeout_s=COMMAND_TIMEOUT_S)
                assert "received 10 messages" in done.stdout, done.stdout
                continue
            for line in rewrite(body.replace("\\\n", " ")).splitlines():
                argv = shlex.split(line, comments=True)
                if not argv:
                    continue
                assert argv[0] == "sluice", line
                if argv[1] in SERVERS:
                    cluster.start(host, f"{argv[1]}-{host.name}", *argv[1:], port=_port(argv))
                else:
                    host.run([sys.executable, "-m", "sluice", *argv[1:]], timeout_s=COMMAND_TIMEOUT_S)

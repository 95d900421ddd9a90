"""Where a process listens and the address it gives others: two settings, the second checked.

A server listens on `host` (a wildcard, `0.0.0.0` or `::`, listens on every address of the
machine) and is reached by others at its **advertised** address: what a broker registers with the
NameServer, what a proxy puts in routes and navigation answers, what a replica dials. The rule
(`advertised`):

- `advertise` given: it, as `host:port`, or a host alone, with the process's own port (so one
  setting serves a process with several ports, `sluice up`'s shards); a wildcard host there is
  refused (no machine can dial `0.0.0.0`);
- else a specific listening host (an address or a host name): that host with the port;
- else (a wildcard) the machine's one address other hosts can reach (`machine_addresses`: the IPv4
  addresses of its interfaces that are up, loopback aside); a machine with several is ambiguous and
  refused, naming the setting to give; a machine with none but loopback advertises loopback (no
  other machine can reach it anyway).

So no process bound to a wildcard hands out `0.0.0.0` or `127.0.0.1` to a client on another machine.
"""

from __future__ import annotations

import fcntl
import functools
import ipaddress
import socket
import struct

from common.config import ConfigError

WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})
LOOPBACK = "127.0.0.1"
# Linux ioctls (linux/sockios.h): an interface's flags and its IPv4 address.
_SIOCGIFFLAGS = 0x8913
_SIOCGIFADDR = 0x8915
_IFF_UP = 0x1
_IFF_LOOPBACK = 0x8
_IFREQ_BYTES = 40  # struct ifreq: a 16-byte name and a 24-byte union
_NAME_BYTES = 16
_SOCKADDR_IN_ADDR = slice(20, 24)  # sin_addr within the ifreq answer
# Distinct (host, port, advertise) triples a process resolves: a handful (its own ports).
_RESOLVED_MAX = 64
ADVERTISE_HINT = "give the address other machines reach it at: --advertise (or `advertise` in its config table)"


def is_wildcard(host: str) -> bool:
    return host.strip("[]") in WILDCARD_HOSTS


def is_loopback(host: str) -> bool:
    name = host.strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split_host_port(text: str) -> tuple[str, int]:
    """`host:port` (IPv6 in brackets) as (host without brackets, port); ValueError when malformed."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{text!r} is not host:port")
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise ValueError(f"{text!r}: put an IPv6 host in brackets, e.g. [::1]:{port}")
    return host.strip("[]"), int(port)


def parse_advertise(text: str) -> tuple[str, int | None]:
    """An advertise setting: `host:port`, or a host alone (its process's own port goes with it);
    IPv6 in brackets when a port follows. ValueError when malformed."""
    text = text.strip()
    try:
        return str(ipaddress.ip_address(text.strip("[]"))), None
    except ValueError:
        pass
    if ":" not in text:
        if not text:
            raise ValueError("the address is empty")
        return text, None
    return split_host_port(text)


def check_advertise(advertise: str, what: str = "advertise") -> None:
    """ValueError unless `advertise` is empty or an address another machine can dial."""
    if not advertise:
        return
    try:
        host, _ = parse_advertise(advertise)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}; use HOST:PORT or HOST") from None
    if is_wildcard(host):
        raise ValueError(f"{what} {advertise!r}: {host or 'an empty host'} is where a process listens, not an "
                         "address anyone can dial; give this machine's address (or host name)")  # fmt: skip


@functools.cache
def machine_addresses() -> tuple[str, ...]:
    """The IPv4 addresses of this machine's interfaces that are up, loopback aside, sorted. Read
    once per process (a process's advertised address does not move while it runs)."""
    found: set[str] = set()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            request = struct.pack(f"{_IFREQ_BYTES}s", name.encode()[: _NAME_BYTES - 1])
            try:
                flags = struct.unpack_from("H", fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, request), _NAME_BYTES)[0]
                if not flags & _IFF_UP or flags & _IFF_LOOPBACK:
                    continue
                answer = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)
            except OSError:  # no IPv4 address on it, or gone meanwhile
                continue
            found.add(socket.inet_ntoa(answer[_SOCKADDR_IN_ADDR]))
    return tuple(sorted(found))


@functools.lru_cache(maxsize=_RESOLVED_MAX)
def advertised(host: str, port: int, advertise: str = "") -> str:
    """The address others reach a server listening on `host`:`port` at (the rule above); a
    ConfigError when a wildcard host leaves it ambiguous."""
    if advertise:
        try:
            check_advertise(advertise)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        named, named_port = parse_advertise(advertise)
        return host_port(named, port if named_port is None else named_port)
    return host_port(reachable_host(host), port)


def reachable_host(host: str) -> str:
    """The host others reach a server listening on `host` at: `host` itself unless it is a
    wildcard, else the machine's one address (ConfigError if it has several)."""
    if not is_wildcard(host):
        return host.strip("[]")
    addresses = machine_addresses()
    if not addresses:
        return LOOPBACK
    if len(addresses) > 1:
        raise ConfigError(f"listening on {host or 'every address'}, this machine has several addresses "
                          f"({', '.join(addresses)}) and others could be handed any: {ADVERTISE_HINT}")  # fmt: skip
    return addresses[0]

"""`NotPrimary` crosses the internal RPC: (code, message) rebuilds it, so a proxy can tell "this
member is not the group's primary" (wait for the new one and retry there) from other refusals."""

from __future__ import annotations

import grpc

from common.codes import Code
from common.errors import NotPrimary, TooFewInSync, Unavailable, Unreachable, code_of, error_for_code
from proto.rpc import CODE_KEY, error_from_rpc


def test_not_primary_survives_the_internal_rpc() -> None:
    sent = NotPrimary("broker b1 is a replica of group g1, not its primary")
    assert code_of(sent) is Code.HA_NOT_AVAILABLE and sent.retriable
    got = error_for_code(code_of(sent), sent.message)
    assert type(got) is NotPrimary and got.message == sent.message
    assert NotPrimary(sent.message).message == sent.message  # the suffix is added once


def test_other_unavailable_refusals_stay_unavailable() -> None:
    got = error_for_code(Code.HA_NOT_AVAILABLE, "group g1 has 1 member(s) in sync, fewer than min_insync 2")
    assert type(got) is Unavailable


def test_a_transport_failure_is_unreachable_and_a_broker_refusal_is_not() -> None:
    """A proxy waits for a moved broker on transport failures (the broker's process is gone), not
    on a refusal the broker itself answered (the refusal's class comes back from its code)."""

    def _failed(status: grpc.StatusCode, *trailing: tuple[str, str]) -> grpc.aio.AioRpcError:
        return grpc.aio.AioRpcError(status, grpc.aio.Metadata(), grpc.aio.Metadata(*trailing), "failed to connect")

    assert type(error_from_rpc(_failed(grpc.StatusCode.UNAVAILABLE), "broker g1")) is Unreachable
    assert type(error_from_rpc(_failed(grpc.StatusCode.DEADLINE_EXCEEDED))) is Unavailable
    refused = _failed(grpc.StatusCode.UNAVAILABLE, (CODE_KEY, str(int(Code.HA_NOT_AVAILABLE))))
    assert type(error_from_rpc(refused)) is Unavailable


def test_too_few_in_sync_survives_the_internal_rpc() -> None:
    """A proxy retries a send the group's primary refused for too few members in sync (the replicas
    come back); it must tell that refusal from others."""
    sent = TooFewInSync("group g1 has 1 member(s) in sync, fewer than min_insync 2")
    assert code_of(sent) is Code.HA_NOT_AVAILABLE and sent.retriable
    got = error_for_code(code_of(sent), sent.message)
    assert type(got) is TooFewInSync and got.message == sent.message

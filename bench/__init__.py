"""`sluice bench`: a load generator speaking the RocketMQ 5 gRPC protocol, and an echo ceiling.

Modules, one concern each:

- `client`: a minimal protocol client (headers, QueryRoute, SendMessage with N messages per
  call, ReceiveMessage, AckMessage with many entries) over either transport: `http2` or grpc.aio.
- `http2`: the bench's own gRPC-over-HTTP/2 connection, the least CPU per call (`--generator`).
- `errors`: `CallError`, a failed call with a short code name.
- `payload`: pre-serialised SendMessageRequest bytes (fresh message ids and born times per call).
- `stats`: counters, an HDR-like latency histogram, the once-a-second progress line.
- `cpu`: CPU time of the generator, of watched server processes and of the machine while measuring.
- `workloads`: the produce, consume and echo loops (open-loop pacing or as fast as possible).
- `runner`: options, wiring of clients, workloads and progress for one bounded run.
- `echo`: a bare grpc.aio server answering SendMessage-shaped calls, the serialisation ceiling.
- `report`: the final table and JSON.
"""

"""HTTP/2 (RFC 9113) and gRPC over it, written for Sluice's gRPC edges (docs/proxy.md, "The HTTP/2
edge"): the frame codec (`frames.py`), the HPACK decoder and header encoder (`hpackcodec.py`), the
server connection (`server.py`: streams, flow control and the limits a public server needs) and
the gRPC layer on it (`grpcserver.py`). The load generator's client (bench/http2.py) shares the
codec.
"""

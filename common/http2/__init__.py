"""HTTP/2 (RFC 9113) and gRPC over it, written for Sluice's gRPC edges (docs/proxy.md, "The HTTP/2
edge"; docs/broker-service.md): the frame codec (`frames.py`), the HPACK decoder and header encoder
(`hpackcodec.py`), what both sides of gRPC agree on (`grpcwire.py`), the server connection
(`server.py`: streams, flow control and the limits a public server needs), the gRPC layer on it
(`grpcserver.py`: the proxy's client port and the brokers' internal service) and the client
(`client.py`: the proxies' and admin's calls to the brokers, and the load generator's).
"""

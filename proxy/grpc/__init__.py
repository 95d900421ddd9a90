"""The gRPC edge of the proxy: the only code that sees `apache.rocketmq.v2` protobuf messages."""

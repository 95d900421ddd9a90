"""What one HTTP/2 connection of our servers announces and accepts (`[proxy.http2]`,
docs/configuration.md; docs/proxy.md, "The HTTP/2 edge", says what each defends against)."""

from __future__ import annotations

from dataclasses import dataclass

from common.http2.frames import DEFAULT_MAX_FRAME, DEFAULT_WINDOW, MAX_FRAME_LIMIT, MAX_WINDOW


@dataclass(frozen=True)
class Http2Limits:
    """`[proxy.http2]`: the limits of each client connection of the gRPC edge."""

    # Streams a client may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS); streams it reset
    # count until their work has ended. Beyond: the stream is refused (REFUSED_STREAM).
    max_concurrent_streams: int = 1000
    # Each stream's receive window (SETTINGS_INITIAL_WINDOW_SIZE): a request message up to this
    # size arrives without waiting for a WINDOW_UPDATE; a larger one is granted window when its
    # length is known.
    initial_window_bytes: int = DEFAULT_WINDOW
    # The connection's receive window, given back as data arrives.
    connection_window_bytes: int = 16 * 1024 * 1024
    # Window granted beyond the initial one for large messages, at once, per connection (a large
    # request beyond it: RESOURCE_EXHAUSTED).
    max_granted_bytes: int = 64 * 1024 * 1024
    # SETTINGS_MAX_FRAME_SIZE: a larger frame closes the connection (FRAME_SIZE_ERROR).
    max_frame_bytes: int = DEFAULT_MAX_FRAME
    # SETTINGS_MAX_HEADER_LIST_SIZE, and the most bytes of one encoded header block: a larger
    # decoded list refuses its stream, a larger block closes the connection (ENHANCE_YOUR_CALM).
    max_header_list_bytes: int = 16 * 1024
    # SETTINGS_HEADER_TABLE_SIZE: the HPACK dynamic table the client may fill.
    header_table_bytes: int = 4096
    # HEADERS + CONTINUATION frames of one header block (a CONTINUATION flood: ENHANCE_YOUR_CALM).
    max_header_frames: int = 16
    # A bucket of tokens spent by stream resets, refused streams, SETTINGS, PRIORITY, empty DATA
    # and PINGs without a request between them; empty: GOAWAY ENHANCE_YOUR_CALM.
    abuse_burst: int = 1000
    abuse_per_s: float = 100.0
    # A connection must send the HTTP/2 preface within this.
    handshake_timeout_s: float = 10.0
    # A connection with no stream open this long is closed (GOAWAY NO_ERROR; clients reconnect).
    idle_timeout_s: float = 600.0
    # A client that reads none of its answers for this long is disconnected.
    write_stall_s: float = 30.0

    def __post_init__(self) -> None:
        if not DEFAULT_MAX_FRAME <= self.max_frame_bytes <= MAX_FRAME_LIMIT:
            raise ValueError(f"http2 max_frame_bytes must be {DEFAULT_MAX_FRAME} to {MAX_FRAME_LIMIT}")
        if not 0 < self.initial_window_bytes <= MAX_WINDOW:
            raise ValueError("http2 initial_window_bytes must be 1 to 2^31-1")
        if not DEFAULT_WINDOW <= self.connection_window_bytes <= MAX_WINDOW:
            raise ValueError("http2 connection_window_bytes must be 65535 to 2^31-1")
        if min(self.max_concurrent_streams, self.max_header_list_bytes, self.max_header_frames, self.abuse_burst,
               self.max_granted_bytes) < 1 or self.header_table_bytes < 0:  # fmt: skip
            raise ValueError("http2 stream, header, grant and abuse limits must be positive")
        if min(self.abuse_per_s, self.handshake_timeout_s, self.idle_timeout_s, self.write_stall_s) <= 0:
            raise ValueError("http2 rates and timeouts must be positive")

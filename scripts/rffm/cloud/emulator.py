"""A Cloud Storage emulator on 127.0.0.1 for dry runs and tests of the Batch profile (gcp-storage-emulator, in memory)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def gcs_emulator() -> Iterator[str]:
    """gcp-storage-emulator on 127.0.0.1 (in memory) while the block runs; yields its URL."""
    from gcp_storage_emulator.server import create_server

    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()

"""Count open/read events on a file with Linux inotify (ctypes; no extra dependency)."""

from __future__ import annotations

import ctypes
import os
import struct
from pathlib import Path

IN_ACCESS = 0x001
IN_OPEN = 0x020
IN_NONBLOCK = 0o4000
EVENT = struct.Struct("iIII")


class FileWatch:
    """Records every open and read of one file (by any process) until closed."""

    def __init__(self, path: Path):
        self.libc = ctypes.CDLL("libc.so.6", use_errno=True)
        self.fd = self.libc.inotify_init1(IN_NONBLOCK)
        if self.fd < 0 or self.libc.inotify_add_watch(self.fd, str(path).encode(), IN_OPEN | IN_ACCESS) < 0:
            raise OSError(ctypes.get_errno(), f"inotify on {path}")

    def events(self) -> int:
        """Number of open/read events since the last call."""
        count = 0
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return count
            offset = 0
            while offset < len(data):
                _, _, _, name_length = EVENT.unpack_from(data, offset)
                offset += EVENT.size + name_length
                count += 1

    def close(self) -> None:
        os.close(self.fd)

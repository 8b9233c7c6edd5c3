"""The output of `hetccl run --tag-output`: every rank's stdout and stderr
read through pipes and written to the launcher's own as whole lines, each
behind its rank's tag, so that two ranks' lines never splice.

The tag is Open MPI's (`mpirun --tag-output`), so that what parses one
parses the other: `[1,R]<stdout>:` or `[1,R]<stderr>:` in front of the
line, R the rank (the 1 is Open MPI's job number; a `hetccl run` is one
job).

Thread: the launcher's main loop only; `pump` never blocks longer than its
timeout. A rank's partial last line is written, tagged, when its pipe
ends; a line longer than LINE_LIMIT is written in pieces of that size.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import time
from typing import BinaryIO, Dict

LINE_LIMIT = 1 << 16
DRAIN_S = 2.0   # after the ranks end, how long their pipes may stay open (a child holding them)


def tag(rank: int, stream: str) -> bytes:
    return f"[1,{rank}]<{stream}>:".encode()


class RankLines:
    def __init__(self) -> None:
        self._sel = selectors.DefaultSelector()
        self._partial: Dict[int, bytes] = {}

    def add(self, rank: int, proc: subprocess.Popen) -> None:
        """Follow `proc`'s stdout and stderr (both made with PIPE)."""
        for name, pipe, out in (("stdout", proc.stdout, sys.stdout.buffer),
                                ("stderr", proc.stderr, sys.stderr.buffer)):
            assert pipe is not None
            os.set_blocking(pipe.fileno(), False)
            self._partial[pipe.fileno()] = b""
            self._sel.register(pipe, selectors.EVENT_READ, (tag(rank, name), out))

    def pump(self, timeout: float) -> None:
        """Write the whole lines that arrived within `timeout` seconds."""
        if not self._sel.get_map():
            time.sleep(timeout)
            return
        for key, _ in self._sel.select(timeout):
            prefix, out = key.data
            fd = key.fileobj.fileno()  # type: ignore[union-attr]
            try:
                chunk = os.read(fd, LINE_LIMIT)
            except BlockingIOError:
                continue
            if not chunk:
                self._write(out, prefix, self._partial.pop(fd), end=True)
                self._sel.unregister(key.fileobj)
                key.fileobj.close()  # type: ignore[union-attr]
                continue
            data = self._partial[fd] + chunk
            cut = data.rfind(b"\n") + 1
            if cut == 0 and len(data) >= LINE_LIMIT:
                cut = len(data)
            self._write(out, prefix, data[:cut])
            self._partial[fd] = data[cut:]

    def drain(self) -> None:
        """After the ranks ended: the rest of their output, for DRAIN_S at most."""
        deadline = time.monotonic() + DRAIN_S
        while self._sel.get_map() and time.monotonic() < deadline:
            self.pump(0.05)
        for key in list(self._sel.get_map().values()):
            prefix, out = key.data
            self._write(out, prefix, self._partial.pop(key.fileobj.fileno(), b""), end=True)  # type: ignore[union-attr]
            self._sel.unregister(key.fileobj)
            key.fileobj.close()  # type: ignore[union-attr]

    @staticmethod
    def _write(out: BinaryIO, prefix: bytes, data: bytes, end: bool = False) -> None:
        if not data:
            return
        if end and not data.endswith(b"\n"):
            data += b"\n"
        lines = data.splitlines(keepends=True)
        out.write(b"".join(prefix + line if line.endswith(b"\n") else prefix + line + b"\n"
                           for line in lines))
        out.flush()


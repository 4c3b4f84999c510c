"""Ctrl-C in the `attngen` command: exit code 130 and one line, `attngen: interrupted`, soon
after the key even while a long step sits in C code (docs/cli.md, Exit codes)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

EXIT_INTERRUPTED = 130

_SAID = threading.Event()  # main() said it: the watcher below does not say it again


def interrupted(by_watcher: bool = False) -> None:
    """Say "attngen: interrupted" on standard error (the watcher: unless main() already did)."""
    if by_watcher and _SAID.is_set():
        return
    _SAID.set()
    try:
        print("attngen: interrupted", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


class PromptInterrupt:
    """Ctrl-C during a long command (run, tune) ends it within GRACE_S seconds.

    Python raises KeyboardInterrupt only when the main thread runs Python code again, and a step
    of `attngen run` can sit for many seconds in one call of C code (drawing gigabytes of inputs,
    a GPU call that waits, the float64 reference). The signal's C handler also writes its number
    to a wake-up pipe (signal.set_wakeup_fd); a thread reading it gives the main thread GRACE_S
    seconds to unwind (main() says "interrupted" and returns 130), then says it and ends the
    process with 130 itself. The disk cache writes its entries to temporary files and renames
    them into place (runtime/cache.py), so an entry cut short is never read; a stray temporary
    file can stay. Only from the main thread (elsewhere it does nothing)."""

    GRACE_S = 1.0

    def __enter__(self):
        self.fds, self.done = None, threading.Event()
        _SAID.clear()
        if threading.current_thread() is not threading.main_thread():
            return self
        r, w = os.pipe()
        os.set_blocking(w, False)
        try:
            self.old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except ValueError:  # not the main interpreter
            os.close(r)
            os.close(w)
            return self
        self.fds = (r, w)
        threading.Thread(target=self._watch, args=(r,), name="attngen-interrupt", daemon=True).start()
        return self

    def _watch(self, r: int) -> None:
        while True:
            try:
                data = os.read(r, 64)
            except OSError:
                break
            if not data:  # the command ended: __exit__ closed the pipe
                break
            if signal.SIGINT in data:
                time.sleep(self.GRACE_S)
                if self.done.is_set():  # ended normally meanwhile (a caller of main() goes on)
                    break
                interrupted(by_watcher=True)
                os._exit(EXIT_INTERRUPTED)
        os.close(r)

    def __exit__(self, kind, value, tb):
        if self.fds is not None:
            if kind is None or not issubclass(kind, KeyboardInterrupt):
                self.done.set()  # interrupted: the watcher still ends a slow unwinding
            signal.set_wakeup_fd(self.old)
            os.close(self.fds[1])  # the watcher reads the end of the pipe, closes its end, ends
        return False

"""The future a transfer returns."""

from __future__ import annotations


class TransferFuture:
    """Completes when every chunk of a transfer has finished; carries the first
    error. A transfer that did not fully happen never reports success."""

    def __init__(self, core_future):
        self._core = core_future  # its tasks own what they touch (the C++ block mover's owners)

    def done(self) -> bool:
        return self._core.done()

    def result(self, timeout: float | None = None) -> None:
        """Wait, then return None or raise the transfer's first error
        (kvref.DeviceError for a failed DMA). TimeoutError if it runs longer."""
        if not self._core.wait(-1.0 if timeout is None else float(timeout)):
            raise TimeoutError(f"transfer still running after {timeout}s")
        self._core.rethrow()

    def exception(self, timeout: float | None = None) -> BaseException | None:
        try:
            self.result(timeout)
        except TimeoutError:
            raise
        except Exception as e:  # the transfer's own error, handed back
            return e
        return None

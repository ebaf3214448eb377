"""The future a transfer returns."""

from __future__ import annotations

from kvref.settings import check_timeout


class TransferFuture:
    """Completes when every chunk of a transfer has finished; carries the first
    error. A transfer that did not fully happen never reports success."""

    def __init__(self, core_future, default_timeout: float | None = None):
        self._core = core_future  # its tasks own what they touch (the C++ block mover's owners)
        self._default_timeout = default_timeout

    def done(self) -> bool:
        return self._core.done()

    def wait_landed(self) -> None:
        """Wait until every copy has ended, whatever its outcome (errors stay
        for result())."""
        self._core.wait(-1.0)

    def result(self, timeout: float | None = None) -> None:
        """Wait, then return None or raise the transfer's first error
        (kvref.DeviceError for a failed DMA). TimeoutError if it runs longer
        than `timeout` (default: the manager's timeout_s, else no limit)."""
        timeout = self._default_timeout if timeout is None else check_timeout(timeout, "timeout")
        if not self._core.wait(-1.0 if timeout is None else timeout):
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

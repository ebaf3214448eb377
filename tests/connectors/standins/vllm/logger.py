"""Stand-in for vllm.logger: tpu_inference.logger builds every module's logger with init_logger (plain `logging` loggers here, so the driver can count what the connectors log at ERROR)."""

import logging


class _VllmLogger(logging.LoggerAdapter):
    """A logging.Logger with vllm's *_once helpers."""

    _said: set = set()

    def process(self, msg, kwargs):
        return msg, kwargs

    def _once(self, level, msg, *args):
        if (level, msg) not in self._said:
            self._said.add((level, msg))
            self.log(level, msg, *args)

    def info_once(self, msg, *args, **_):
        self._once(logging.INFO, msg, *args)

    def warning_once(self, msg, *args, **_):
        self._once(logging.WARNING, msg, *args)

    def debug_once(self, msg, *args, **_):
        self._once(logging.DEBUG, msg, *args)


def init_logger(name: str) -> _VllmLogger:
    return _VllmLogger(logging.getLogger(name), {})

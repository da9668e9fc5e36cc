"""Silence known, harmless notices of the OpenMMLab stack, one message at a time."""
import logging
from contextlib import contextmanager
from typing import Iterator

__all__ = ['without_log_messages', 'without_onedl_notice']


@contextmanager
def without_log_messages(*fragments: str) -> Iterator[None]:
    """Inside the block, drop the records of mmengine's current logger whose message contains one
    of ``fragments`` (every other message is logged as usual).

    Args:
        *fragments (str): parts of the messages to drop.
    """
    from mmengine.logging import MMLogger

    def keep(record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(fragment in message for fragment in fragments)

    logger = MMLogger.get_current_instance()
    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


#: what mmpretrain, mmseg and mmdet print on import when their optional OneDL data sets are not
#: installed: a DEBUG-level note, printed with ``print`` because no logger is given
ONEDL_NOTICE = 'Could not import OneDL'


class _DropPrintedLine:
    """A stdout proxy that drops ``print`` calls containing ``text`` (and their newline)."""

    def __init__(self, stream, text: str):
        self._stream, self._text, self._dropped = stream, text, False

    def write(self, data: str) -> int:
        if self._text in data or (self._dropped and data == '\n'):
            self._dropped = self._text in data
            return len(data)
        self._dropped = False
        return self._stream.write(data)

    def __getattr__(self, name):
        return getattr(self._stream, name)


@contextmanager
def without_onedl_notice() -> Iterator[None]:
    """Inside the block, drop the "Could not import OneDL" line that importing mmpretrain, mmseg
    or mmdet prints (everything else printed goes through)."""
    import sys
    stdout = sys.stdout
    sys.stdout = _DropPrintedLine(stdout, ONEDL_NOTICE)
    try:
        yield
    finally:
        sys.stdout = stdout

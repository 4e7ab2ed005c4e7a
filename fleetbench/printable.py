"""Text from elsewhere (a node's report, a registry's answer, a plan an admin wrote) made safe
for a terminal or a log line: control characters (ESC sequences that clear a screen or
recolour it, a newline that forges a log line, a carriage return that overwrites one) are
shown escaped, as Python writes them, and never acted on. Printable text, in any script,
is left as it is."""

from __future__ import annotations

import logging
import re

__all__ = ["EscapingFormatter", "printable"]

# C0 and C1 controls, DEL, and the Unicode line and paragraph separators and bidi overrides
# (text that reads differently from what it holds)
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escaped(found: re.Match[str]) -> str:
    character = found.group()
    return repr(character)[1:-1] if ord(character) < 0x100 else f"\\u{ord(character):04x}"


def printable(text: object) -> str:
    """`text` as a string with every control character escaped (`\\x1b`, `\\n`)."""
    return _UNSAFE.sub(_escaped, str(text))


class EscapingFormatter(logging.Formatter):
    """A log formatter whose message is one line whatever its arguments hold: the message
    is escaped after its arguments are put in; a traceback, written by the formatter
    itself, keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = printable(record.message)
        return super().formatMessage(record)

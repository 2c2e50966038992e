"""CSV for spreadsheets: every CSV export of the project writes through here.

A spreadsheet runs a cell that starts with ``=``, ``+``, ``-`` or ``@`` as a formula (and some treat a
leading tab or carriage return the same way), so operator text such as a credential named
``=HYPERLINK("http://evil.example/", "open")`` would run on the machine of whoever opens the export
(OWASP, "CSV Injection"). Such a cell is written with a single quote before it, which the spreadsheet shows
as text. Numbers are left alone: ``-5`` is a number, not a formula. Delimiters, quotes and line breaks
inside a cell are quoted by the ``csv`` module as usual. A test (apps/observability/tests/test_csv_export.py)
refuses any other ``csv.writer`` in the project.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TextIO

# OWASP's list: the four formula prefixes, and tab and carriage return.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def formula_safe(value: Any) -> Any:
    """``value``, with a single quote before it when it is text a spreadsheet would read as a formula."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


class SafeWriter:
    """``csv.writer`` whose every cell passes through ``formula_safe``."""

    def __init__(self, out: TextIO) -> None:
        self._writer = csv.writer(out)

    def writerow(self, row: Iterable[Any]) -> None:
        self._writer.writerow([formula_safe(value) for value in row])

    def writerows(self, rows: Iterable[Iterable[Any]]) -> None:
        for row in rows:
            self.writerow(row)


def write_table(out: TextIO, columns: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> None:
    """A header of ``columns``, then one line per row (a column a row lacks is empty, others ignored)."""
    writer = SafeWriter(out)
    writer.writerow(columns)
    writer.writerows([row.get(column, "") for column in columns] for row in rows)

"""The client table: a scrolling view that draws only the rows on screen.

Textual's DataTable measures every cell through Rich each time rows are added, which costs tens of
milliseconds for a few hundred clients refreshed every second. Here the cells are plain strings,
column widths come from their lengths, and ``render_line`` builds only the visible lines, so a
refresh costs about the same for 5 clients or 500. The header line stays put while rows scroll.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

MAX_COLUMN = 48
GAP = "  "


def _fit(text: str, width: int, right: bool) -> str:
    if cell_len(text) > width:
        text = text[: max(0, width - 1)] + "…"
    pad = " " * max(0, width - cell_len(text))
    return pad + text if right else text + pad


class ClientTable(ScrollView, can_focus=True):
    """Rows of ``(key, cells, highlighted)``; highlighted rows use the ``--fallback`` style."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "client-table--header",
        "client-table--fallback",
        "client-table--stripe",
    }
    DEFAULT_CSS = """
    ClientTable > .client-table--header { text-style: bold; color: $text-accent; }
    ClientTable > .client-table--fallback { text-style: bold; color: $text-warning; }
    ClientTable > .client-table--stripe { background: $surface-lighten-1; }
    """

    def __init__(self, columns: Sequence[str], right: set[int], **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.columns = list(columns)
        self.right = right
        self.rows: list[tuple[str, list[str], bool]] = []
        self._natural = [cell_len(c) for c in self.columns]
        self._widths = list(self._natural)

    def set_rows(self, rows: list[tuple[str, list[str], bool]]) -> None:
        """Replace every row; redraws only when something on screen could change."""
        if rows == self.rows:
            return
        self.rows = rows
        widths = [cell_len(c) for c in self.columns]
        for _key, cells, _hl in rows:
            for i, cell in enumerate(cells):
                n = cell_len(cell)
                if n > widths[i]:
                    widths[i] = min(n, MAX_COLUMN)
        self._natural = widths
        self._fit_widths()
        self.refresh()

    def _fit_widths(self) -> None:
        """Shrink the last column (the free-text one) so the table fits the view when it can."""
        widths = list(self._natural)
        overhead = len(GAP) * (len(widths) - 1) + 2
        spare = self.scrollable_content_region.width - (sum(widths) + overhead)
        if spare < 0:
            widths[-1] = max(cell_len(self.columns[-1]), widths[-1] + spare)
        self._widths = widths
        self.virtual_size = Size(sum(widths) + overhead, len(self.rows) + 1)

    def on_resize(self) -> None:
        self._fit_widths()

    def line_text(self, cells: Sequence[str]) -> str:
        """One table line as plain text (also what tests read back)."""
        return " " + GAP.join(
            _fit(c, w, i in self.right) for i, (c, w) in enumerate(zip(cells, self._widths, strict=True))
        )

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.size.width
        base = self.rich_style
        if y == 0:
            text, style = self.line_text(self.columns), self.get_component_rich_style("client-table--header")
        else:
            index = y - 1 + scroll_y
            if index >= len(self.rows):
                return Strip.blank(width, base)
            _key, cells, highlighted = self.rows[index]
            text = self.line_text(cells)
            style = Style()
            if index % 2:
                style += self.get_component_rich_style("client-table--stripe")
            if highlighted:
                style += self.get_component_rich_style("client-table--fallback")
        strip = Strip([Segment(text, base + style)], cell_len(text))
        return strip.crop_extend(scroll_x, scroll_x + width, base)


__all__ = ["ClientTable"]

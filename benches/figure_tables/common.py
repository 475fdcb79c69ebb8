"""What every renderer of the docs' tables shares: the markdown table and the units as the
pages write them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

Cells = Sequence[str]


def markdown(header: Cells, rows: Iterable[Cells]) -> str:
    """A markdown table, as docs/ writes them."""
    line = "| {} |".format
    return "\n".join(
        [line(" | ".join(header)), "|" + "---|" * len(header)]
        + [line(" | ".join(row)) for row in rows]
    )


def printed_json(results: dict[str, Any], command: int = 0) -> list[Any]:
    """The JSON lines one of a figure's commands printed (`run` keeps them)."""
    found: list[Any] = results["runs"][command]["json"]
    return found


def ms(value: float, decimals: int = 1) -> str:
    return f"{value:,.{decimals}f} ms"


def mode_label(mode: str) -> str:
    """`peer_open-model_http_full` -> `peer (open-model), http_full`."""
    if not mode.startswith("peer_"):
        return mode
    peer, rest = mode.removeprefix("peer_").split("_", 1)
    return f"peer ({peer}), {rest}"


def tokens(n: float) -> str:
    """1231 -> `1.2k`, 1000400 -> `1.0M`."""
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}k".replace(".0k", "k")


def microseconds(value: float) -> str:
    return f"{value:,.0f} us" if value >= 100 else f"{value:.1f} us"


def times(ratio: float) -> str:
    """A ratio at the precision its size needs: 2,451x, 13.9x, 0.62x."""
    return f"{ratio:,.0f}x" if ratio >= 100 else f"{ratio:.1f}x" if ratio >= 10 else f"{ratio:.2f}x"


def span(values: Sequence[float], unit: str = "ms") -> str:
    low, high = min(values), max(values)
    return f"{low:.0f}-{high:.0f} {unit}" if round(low) != round(high) else f"{low:.0f} {unit}"


STORES = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}

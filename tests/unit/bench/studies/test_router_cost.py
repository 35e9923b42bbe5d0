"""bench/studies/router_cost.py's table: medians per path and what the router adds."""

from __future__ import annotations

from bench.studies.router_cost import Turn, table


def test_the_table_gives_each_paths_medians_and_what_the_router_adds():
    turns = [
        Turn("direct", 5.0, 0.0),
        Turn("router", 5.8, 0.5),
        Turn("direct", 6.0, 0.0),
        Turn("router", 6.4, 0.7),
        Turn("direct", 5.5, 0.0),
        Turn("router", 6.1, 0.6),
    ]
    text = table(turns, "# header")
    assert "| direct | 5.50 | 0.000 |" in text and "| router | 6.10 | 0.600 |" in text
    assert text.rstrip().endswith("The router adds 0.60 ms a request and 0.600 ms of its own CPU.")

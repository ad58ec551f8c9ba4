"""analyzer.load.insert_rows: one statement puts in exactly what a row-by-row insert does."""

from __future__ import annotations

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.load import insert_rows

DDL = "node VARCHAR, idx BIGINT, first DOUBLE, absurd BIGINT"
_row = st.tuples(
    st.one_of(st.none(), st.text(max_size=12)),  # quotes, NULs, any text: values, never SQL
    st.one_of(st.none(), st.integers(min_value=-(2**62), max_value=2**62)),
    st.one_of(st.none(), st.floats(allow_nan=False)),
    st.one_of(st.none(), st.integers(min_value=0, max_value=10)),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_row, max_size=30))
def test_the_same_rows_in_the_same_order_as_row_by_row(rows) -> None:
    con = duckdb.connect()
    con.execute(f"CREATE TABLE a ({DDL}); CREATE TABLE b ({DDL})")
    if rows:
        con.executemany("INSERT INTO a VALUES (?, ?, ?, ?)", rows)
    insert_rows(con, "b", rows, 4)
    assert con.execute("SELECT * FROM b").fetchall() == con.execute("SELECT * FROM a").fetchall()


def test_rows_of_the_wrong_width_are_refused() -> None:
    con = duckdb.connect()
    con.execute(f"CREATE TABLE a ({DDL})")
    with pytest.raises(ValueError, match="rows of 3 values, not 4"):
        insert_rows(con, "a", [("n", 1, 2.0)], 4)
    assert con.execute("SELECT count(*) FROM a").fetchone() == (0,)

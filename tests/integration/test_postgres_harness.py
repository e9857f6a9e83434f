"""The private PostgreSQL the harness starts answers, and each test gets its own database."""

from __future__ import annotations

import sqlalchemy as sa


def test_private_postgres_answers(pg_url: str) -> None:
    engine = sa.create_engine(pg_url)
    with engine.connect() as conn:
        version = conn.execute(sa.text("select version()")).scalar_one()
        conn.execute(sa.text("create table t (x int)"))
        conn.execute(sa.text("insert into t values (1)"))
        assert conn.execute(sa.text("select count(*) from t")).scalar_one() == 1
    engine.dispose()
    assert "PostgreSQL" in version


def test_each_test_gets_a_fresh_database(pg_url: str) -> None:
    engine = sa.create_engine(pg_url)
    with engine.connect() as conn:
        assert not sa.inspect(conn).get_table_names()
    engine.dispose()

"""Every plan, run, point, request, guard result, capacity and verdict: SQLAlchemy + Alembic."""

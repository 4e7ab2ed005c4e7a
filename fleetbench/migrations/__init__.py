"""Alembic migrations of the registry's schema (see registry/db.py for how they are run)."""

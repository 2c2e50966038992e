"""Shared pytest fixtures live in tests/fixtures.py so that tests/ and apps/*/tests/ both see them."""

pytest_plugins = ["tests.fixtures"]

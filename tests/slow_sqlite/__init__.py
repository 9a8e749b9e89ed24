"""A SQLite database backend whose commits are slow, for tests/test_transactions.py."""

"""Transactional messages: half messages, EndTransaction, orphan check-back (docs/transactions.md)."""

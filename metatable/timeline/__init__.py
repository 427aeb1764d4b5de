"""The timeline and its primitives: instants and their states (`instant`), the timeline directory
(`timeline`), the table lock, heartbeats, `Transactions` (begin, commit, abort, rollback and recovery of
instants, for the data table and the metadata table alike), the lifecycle of table services, and the
replay of a completed timeline into its live files (`replay`).

May import: `storage`, the foundation and `indexes`.
"""

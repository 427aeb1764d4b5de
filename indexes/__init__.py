"""Index logic, pure (no storage): key encoding and hashing, bloom filters, column statistics, the
multi-level lookup, and the assigners that place incoming keys (bucket, bloom)."""

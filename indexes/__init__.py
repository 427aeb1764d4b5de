"""Index logic: key encoding, hashing and (later) bucket, bloom and consistent-hashing assignment."""

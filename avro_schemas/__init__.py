"""Avro schemas (.avsc) for every record metatable writes; loaded by metatable.schemas."""

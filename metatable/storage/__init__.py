"""Where a table's bytes live. `base.Storage` is everything the engine asks of a store (whole-file reads,
atomic publishes, create-if-absent, listings, deletes); `local.LocalStorage` is a local or mounted file
system; `paths.TablePaths` names every path of a table, once.

May import: the foundation (`metatable.errors`, `config`, ...) and `indexes`.
"""

"""The data table's transaction layer: an opened table (`context.TableContext`), what a snapshot sees
(`timeline_view.TimelineView`), the one conflict rule (`conflicts`), publishing a data commit with its
metadata records (`data_commit`, `index_records`, `dual_writes`), the metadata indexes' states
(`index_states`), undoing an instant (`data_undo`), and what dead processes leave behind (`leftovers`).

May import: `metadata`, `file_group`, `formats`, `timeline`, `storage`, the foundation and `indexes`.
"""

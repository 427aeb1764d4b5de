"""A data file group and its files: file names (`base_file`), file slices (`file_slice`: a base file and
its logs), a slice read merged (`slice_reader`, with `record_merge` choosing the surviving version of each
key), a base file written laid out for point lookups (`base_file_writer`), the markers of the partitions an
instant writes into (`markers`), and what writing reports (`written`).

May import: `formats`, `timeline`, `storage`, the foundation and `indexes`.
"""

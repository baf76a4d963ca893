"""Wire contracts: each shape that crosses a process boundary, defined once for the side that
writes it and the side that reads it."""

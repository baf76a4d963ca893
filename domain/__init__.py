"""Wingsmith's domain: pure aggregates that decide and record past-tense events. No I/O here."""

# The serving configuration's pod needs import the values they are built of; importing the
# values first settles which of the two completes the other (see the end of values.py).
from wingsmith.domain import values as _values  # noqa: F401

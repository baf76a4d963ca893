"""Wingsmith's domain: pure aggregates that decide and record past-tense events. No I/O here."""

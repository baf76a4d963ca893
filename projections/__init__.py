"""Projections: pure folds of the event stream into the views a fleet team reads."""

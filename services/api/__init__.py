"""The REST API: HTTP in front of the hub's commands and the projections' views."""

"""The per-cluster operator: turn render objects into Dynamo resources, observe, discover."""

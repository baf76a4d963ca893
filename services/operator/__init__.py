"""The per-cluster operator: render desired state into Dynamo resources, observe, discover."""

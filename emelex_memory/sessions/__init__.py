"""Sessions: workspace identity and the workspace registry, leases, transcript encoding and appending."""

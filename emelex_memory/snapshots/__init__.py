"""Installed model snapshots on disk, the snapshot lock, and the Sessions' references to them."""

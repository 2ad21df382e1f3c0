"""Housekeeping: retention (`maintain`), deleting a Session, and the `doctor` health report."""

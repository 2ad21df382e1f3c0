"""Imports and exports: other agents' histories become Sessions with provenance (`history.py`), an Emelex export is
read back exactly (`restore.py`), and the store is read out for an export (`export.py`); `service.py` is the store's
face for all three (`store.interchange`)."""

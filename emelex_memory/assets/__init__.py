"""Content-addressed media assets: refs, files, the catalog, links from transcript events, and collection."""

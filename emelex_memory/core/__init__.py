"""The mechanisms every feature builds on: the connection factory, first open and migrations, cursors, private
files and directories, I/O errors, canonical JSON, retry. Imports no feature package."""

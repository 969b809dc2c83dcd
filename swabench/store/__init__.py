"""The run folder: its format (schema) and the store that writes and reads it."""

"""Numbers made from run tables: derived columns, paths against the reference, replays, comparisons."""

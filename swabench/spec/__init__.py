"""What to measure: scenario files and their axes, skip rules, model presets, server traces."""

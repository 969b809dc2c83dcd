"""What a user gives the suite: scenario files and their axes, skip rules, model presets, server traces,
and FlashInfer's own API log read as a trace."""

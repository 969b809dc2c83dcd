"""The semantics and the gate: cases, window arithmetic, workloads, the reference and the probes."""

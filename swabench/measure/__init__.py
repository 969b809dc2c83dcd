"""How time is taken: CUDA-graph and host timers, NVTX ranges, the node's measured peaks."""

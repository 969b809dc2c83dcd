"""swabench: which way of running sliding-window attention is correct, and what each way costs."""

__version__ = "0.1.0"
